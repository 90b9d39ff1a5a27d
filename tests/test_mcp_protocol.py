"""`judgeloop mcp` on the wire, through the MCP SDK's own client (as tests/test_mcp.py): the tools' titles,
annotations and output schemas, a stable tool order, an unknown tool as a protocol error and arguments
refused by the tools' input schemas before anything runs.

Every server is a child of `stdio_client`, which closes its stdin and kills it at the end of the
``async with``; every call is bounded by `anyio.fail_after`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from mcp import types
from mcp.shared.exceptions import MCPError

from optimizer.judge.prompts import RUBRIC_MD
from optimizer.workspace import gitops
from tests.support.fakeserver import FakeLLMServer
from tests.support.loop import FakeJudge, git, labels_of
from tests.support.mcp_client import call, client, conforms, data, drive, text
from tests.support.mcp_workspace import ledger_state, make_mcp_template
from tests.support.scripted import assert_clean

STRUCTURED = {"status", "history", "propose", "decide", "report", "candidate_status"}
READ_ONLY = {
    "status",
    "history",
    "read_item",
    "read_steps",
    "view_screenshot",
    "read_file",
    "report",
    "candidate_status",
}


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_mcp_template(tmp_path_factory.mktemp("template"))


@pytest.mark.slow
def test_tools_have_titles_annotations_a_stable_order_and_unknown_tools_and_arguments_are_refused(
    ws: Path, tmp_path: Path
) -> None:
    start = gitops.rev_parse(ws, "HEAD")
    seen: dict[str, Any] = {}

    async def body() -> None:
        with FakeLLMServer(default=FakeJudge(ws)) as server, (tmp_path / "err.log").open("w") as errlog:
            async with client(ws, server.openai_base_url, errlog) as session:
                first = (await session.list_tools()).tools
                second = (await session.list_tools()).tools
                seen["orders"] = [t.name for t in first], [t.name for t in second]
                seen["tools"] = {t.name: t for t in first}
                seen["status"] = await call(session, "status")
                seen["history"] = await call(session, "history")
                try:
                    await call(session, "read_split", split="held")
                except MCPError as exc:
                    seen["unknown"] = exc
                seen["limit"] = await call(session, "disagreements", limit=2)
                seen["typed"] = await call(session, "read_steps", trajectory_id="x", start="3")
                seen["missing"] = await call(session, "decide", experiment=1)
                seen["extra_status"] = await call(session, "status", verbose=True)
                seen["memory_tool"] = await call(
                    session, "propose", rationale="r", memory=[{"tool": "nuke", "arguments": {}}]
                )
                seen["memory_args"] = await call(
                    session,
                    "propose",
                    rationale="r",
                    memory=[{"tool": "add_case", "arguments": {"text": "t"}}],
                )
            seen["paid"] = len(server.inference_requests())

    drive(body)
    first, second = seen["orders"]
    assert first == second and len(first) == len(set(first))
    tools: dict[str, types.Tool] = seen["tools"]
    for tool in tools.values():
        assert tool.title and tool.annotations is not None, tool.name
        assert tool.annotations.read_only_hint == (tool.name in READ_ONLY), tool.name
        assert (tool.output_schema is not None) == (tool.name in STRUCTURED), tool.name
        if not tool.annotations.read_only_hint:
            assert (
                tool.annotations.destructive_hint is not None and tool.annotations.idempotent_hint is not None
            )
    status = conforms(tools["status"], seen["status"])
    assert status["budget"]["budget_usd"] == 100 and status["split"] == "small"
    assert conforms(tools["history"], seen["history"])["experiments"] == []
    # An unknown tool is a JSON-RPC error (invalid params), not a tool result.
    unknown: MCPError = seen["unknown"]
    assert unknown.code == types.INVALID_PARAMS and "unknown tool 'read_split'" in unknown.message
    # Arguments outside a tool's schema are refused by the server, naming the argument, before any work.
    limit = seen["limit"]
    assert limit.is_error and "unknown argument 'limit'" in text(limit) and "direction" in text(limit)
    typed = seen["typed"]
    assert typed.is_error and "argument 'start'" in text(typed) and "integer" in text(typed)
    missing = seen["missing"]
    assert missing.is_error and "missing argument 'decision'" in text(missing)
    assert seen["extra_status"].is_error and "unknown argument 'verbose'" in text(seen["extra_status"])
    # A memory edit is one of the memory tools' shapes: the error names the edit's own field.
    memory_tool, memory_args = text(seen["memory_tool"]), text(seen["memory_args"])
    assert "argument 'memory.0.tool': 'nuke' is not one of add_case, edit_case" in memory_tool, memory_tool
    assert "argument 'memory.0.arguments': 'source_items' is a required property" in memory_args, memory_args
    assert seen["paid"] == 0  # disagreements {"limit": 2} evaluated no baseline
    runs, _ = ledger_state(ws)
    assert runs == []  # nothing needed a run: none was started
    assert gitops.rev_parse(ws, "HEAD") == start
    assert_clean(ws)


@pytest.mark.slow
def test_a_connection_that_lists_tools_and_reads_leaves_no_run_branch_or_checkout(
    ws: Path, tmp_path: Path
) -> None:
    """Hosts start their servers at every launch: connecting, listing tools, reading status, history, report
    and the dev items creates no run row and no branch and moves no HEAD; the first disagreements does."""
    start, branch = gitops.rev_parse(ws, "HEAD"), gitops.current_branch(ws)
    branches = git(ws, "for-each-ref", "--format=%(refname)", "refs/heads/")
    labels = labels_of(ws)
    first = sorted(labels)[0]
    seen: dict[str, Any] = {}

    async def body() -> None:
        with FakeLLMServer(default=FakeJudge(ws)) as server, (tmp_path / "err.log").open("w") as errlog:
            async with client(ws, server.openai_base_url, errlog) as session:
                tools = {t.name: t for t in (await session.list_tools()).tools}
                for name in ("status", "history", "report"):
                    seen[name] = conforms(tools[name], await call(session, name))
                seen["read_file"] = await call(session, "read_file", path=RUBRIC_MD)
                seen["read_item"] = await call(session, "read_item", trajectory_id=first)
                seen["read_steps"] = await call(session, "read_steps", trajectory_id=first, start=0, end=1)
            seen["after_reads"] = (
                ledger_state(ws),
                git(ws, "for-each-ref", "--format=%(refname)", "refs/heads/"),
            )
            seen["head_after_reads"] = gitops.rev_parse(ws, "HEAD"), gitops.current_branch(ws)
            seen["paid"] = len(server.inference_requests())
            # The positive control: the first call that needs a run starts it.
            async with client(ws, server.openai_base_url, errlog) as session:
                data(await call(session, "disagreements"))
                seen["started"] = data(await call(session, "status"))

    drive(body)
    status = seen["status"]
    assert status["run"] is None and status["branch"] is None and status["incumbent"] is None
    assert status["split"] == "small" and status["items"] == len(labels) and status["replicates"] >= 1
    assert "starts the session's run" in status["next"]
    assert seen["history"]["experiments"] == [] and seen["report"]["run"] is None
    assert text(seen["read_file"]) == (ws / RUBRIC_MD).read_text(encoding="utf-8")
    assert f'"trajectory_id": "{first}"' in text(seen["read_item"]) and "step 0:" in text(seen["read_steps"])
    (runs, _), heads = seen["after_reads"]
    assert runs == [] and heads == branches and seen["paid"] == 0
    assert seen["head_after_reads"] == (start, branch)
    runs, _ = ledger_state(ws)
    (run,) = runs
    assert seen["started"]["run"] == run.id and run.status == "finished" and run.start_rev == start
    assert git(ws, "for-each-ref", "--format=%(refname)", "refs/heads/") != branches
    assert_clean(ws)
