"""Non-blocking proposals through the MCP SDK's own client (as tests/test_mcp.py): ``propose`` with
``wait: false`` answers a handle at once, ``candidate_status`` reaches the decision, one candidate runs at a
time, and a client that leaves while one runs leaves it rolled back as a blocking propose's would be. Also the
loop lock, taken with the run and not at the server's start.

Every server is a child of `stdio_client`, which closes its stdin and kills it at the end of the
``async with``; every call is bounded by `anyio.fail_after`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest

from optimizer.errors import UserError
from optimizer.judge.prompts import RUBRIC_MD
from optimizer.ledger import Ledger
from optimizer.workspace import gitops
from optimizer.workspace.workspace import Workspace, command_lock
from tests.support.fakeserver import FakeLLMServer
from tests.support.loop import GOOD_ENTRY, FakeJudge, labels_of, wait_for
from tests.support.mcp_client import call, client, conforms, data, drive, judged_session, settled, text
from tests.support.mcp_workspace import ledger_state, library_text, make_mcp_template, rubric_with
from tests.support.scripted import assert_clean


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_mcp_template(tmp_path_factory.mktemp("template"))


def _lock_free(root: Path) -> str | None:
    """None when the workspace's loop lock can be taken now (it is let go at once), else the refusal."""
    try:
        with command_lock(Workspace.open(root), "test"):
            return None
    except UserError as exc:
        return str(exc)


@pytest.mark.slow
def test_a_non_blocking_propose_answers_a_handle_and_candidate_status_reaches_the_decision(
    ws: Path, tmp_path: Path
) -> None:
    good = library_text(ws, GOOD_ENTRY)
    seen: dict[str, Any] = {}

    async def body() -> None:
        async with judged_session(ws, tmp_path) as session:
            tools = {t.name: t for t in (await session.list_tools()).tools}
            seen["tools"] = tools
            seen["lock_at_start"] = _lock_free(ws)
            data(await call(session, "disagreements"))
            seen["lock_with_run"] = _lock_free(ws)
            pending = await call(
                session,
                "propose",
                files={RUBRIC_MD: rubric_with(ws, good)},
                rationale="Check that typed text matches the request exactly.",
                wait=False,
            )
            seen["pending"] = conforms(tools["propose"], pending)
            handle = seen["pending"]["handle"]
            # While it runs: a second propose and the tools that judge or read the prompts are refused,
            # the reading of status is not.
            seen["second"] = await call(session, "propose", files={RUBRIC_MD: "x"}, rationale="r", wait=False)
            seen["blocking"] = await call(session, "propose", files={RUBRIC_MD: "x"}, rationale="r")
            seen["listing"] = await call(session, "disagreements")
            seen["status_during"] = conforms(tools["status"], await call(session, "status"))
            seen["decided"] = await settled(session, handle)
            seen["final"] = conforms(
                tools["candidate_status"], await call(session, "candidate_status", handle=handle)
            )
            seen["unknown"] = await call(session, "candidate_status", handle="c99")

    drive(body)
    assert seen["lock_at_start"] is None  # a server that only listed tools holds no lock
    assert seen["lock_with_run"] is not None and "mcp" in seen["lock_with_run"]
    pending = seen["pending"]
    assert (
        pending["state"] == "running" and pending["result"] is None and "candidate_status" in pending["next"]
    )
    handle = pending["handle"]
    for refused in (seen["second"], seen["blocking"], seen["listing"]):
        assert refused.is_error and f"candidate {handle} is being evaluated" in text(refused), text(refused)
    assert seen["status_during"]["run"] is not None
    final = seen["final"]
    assert final == seen["decided"] and final["state"] == "decided" and final["error"] is None
    result = final["result"]
    assert result["outcome"] == "kept" and result["kappa"]["candidate"] > result["kappa"]["incumbent"]
    progress = final["progress"]
    assert progress is not None and progress["progress"] > 0 and "judge" in progress["message"]
    assert seen["unknown"].is_error and "no candidate has handle 'c99'" in text(seen["unknown"])
    runs, exps = ledger_state(ws)
    (run,) = runs
    assert [e.status for e in exps[run.id]] == ["baseline", "kept"] and run.status == "finished"
    assert good in (ws / RUBRIC_MD).read_text(encoding="utf-8")
    assert _lock_free(ws) is None  # let go when the session ended
    assert_clean(ws)


@pytest.mark.slow
def test_a_client_that_leaves_while_a_background_candidate_runs_leaves_it_rolled_back(
    ws: Path, tmp_path: Path
) -> None:
    good = library_text(ws, GOOD_ENTRY)
    n_items = len(labels_of(ws))
    start = gitops.rev_parse(ws, "HEAD")
    # The baseline's calls are answered; the candidate's hang until the test lets them go.
    judge = FakeJudge(ws, gate_after=n_items + 2, abandon_gated=True)
    seen: dict[str, Any] = {}

    def running_candidate() -> bool:
        with Ledger(ws / "experiments" / "ledger.sqlite") as led:
            return any(e.seq > 0 and e.commit_sha for e in led.experiments_with_status("running"))

    async def body() -> None:
        with FakeLLMServer(default=judge) as server, (tmp_path / "err.log").open("w") as errlog:
            try:
                async with client(ws, server.openai_base_url, errlog) as session:
                    data(await call(session, "disagreements"))
                    seen["pending"] = data(
                        await call(
                            session,
                            "propose",
                            files={RUBRIC_MD: rubric_with(ws, good)},
                            rationale="Check typed text.",
                            wait=False,
                        )
                    )
                    await anyio.to_thread.run_sync(
                        lambda: wait_for(running_candidate, "the candidate's evaluation", timeout_s=120)
                    )
                    seen["status"] = data(
                        await call(session, "candidate_status", handle=seen["pending"]["handle"])
                    )
                # The client has left: the server stopped the candidate on its way out.
            finally:
                judge.gate.set()
                judge.gate_after = None

    drive(body)
    assert seen["status"]["state"] == "running"
    runs, exps = ledger_state(ws)
    (run,) = runs
    base, cand = exps[run.id]
    assert base.status == "baseline" and cand.status == "error" and run.status == "finished"
    assert gitops.rejected_refs(ws) == {cand.id: cand.commit_sha}
    assert gitops.rev_parse(ws, "HEAD") == start == run.start_rev
    assert good not in (ws / RUBRIC_MD).read_text(encoding="utf-8")
    assert _lock_free(ws) is None
    assert_clean(ws)
