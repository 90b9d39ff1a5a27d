"""What a `judgeloop mcp` session refuses, through the MCP SDK's own client (as in tests/test_mcp.py): hostile
calls, memory edits and cases through ``propose``, corrections and the suspects queue, the agent's own
commits, ``decide keep`` against the policy and a rationale over the cap. The judge is the deterministic fake
judge (OpenAI wire, through the real SDK); the MCP client plays the coding agent.

Every server is a child of `stdio_client`, which closes its stdin and kills it at the end of the
``async with``; every call is bounded by `anyio.fail_after`.
"""

from __future__ import annotations

import functools
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import types
from mcp.shared.exceptions import MCPError

from optimizer.cli import main
from optimizer.devset.split import open_split
from optimizer.judge.memory import parse_cases
from optimizer.judge.prompts import RUBRIC_MD
from optimizer.ledger import Ledger
from optimizer.workspace import gitops
from optimizer.workspace.paths import MAX_PROMPT_FILE_CHARS
from optimizer.workspace.workspace import Workspace
from tests.support.fakeserver import FakeLLMServer
from tests.support.loop import (
    BAD_ENTRY,
    GOOD_ENTRY,
    FakeJudge,
    commit_all,
    git,
    labels_of,
    present,
    set_toml_key,
)
from tests.support.mcp_client import call, client, data, drive, judged_session, server_env, text
from tests.support.mcp_workspace import (
    CORRECTIONS,
    ledger_state,
    library_text,
    make_mcp_template,
    rubric_with,
)
from tests.support.paths import REPO_ROOT
from tests.support.scripted import assert_clean


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A sample workspace: the 32-item dev split ``small`` and a held-out split ``held`` of 4 other items."""
    return make_mcp_template(tmp_path_factory.mktemp("template"))


@pytest.mark.boundary
def test_hostile_calls_are_refused_and_nothing_reaches_git_or_the_held_out_split(
    ws: Path, tmp_path: Path
) -> None:
    labels = labels_of(ws)
    dev_id = sorted(labels)[0]
    held = open_split(Workspace.open(ws), "held")
    held_id = held.ids[0]
    held_instruction = held.trajectory(held_id).task.instruction.strip()
    labels_file = (ws / "devset" / "small" / "labels.jsonl").resolve()
    fix = "failure" if labels[dev_id].is_positive else "success"
    assert main(["label-fix", "-w", str(ws), dev_id, "--label", fix, "--reason", "a person's"]) == 0
    corrections = (ws / CORRECTIONS).read_bytes()
    start = gitops.rev_parse(ws, "HEAD")
    seen: dict[Any, Any] = {}

    async def body() -> None:
        with FakeLLMServer(default=FakeJudge(ws)) as server, (tmp_path / "err.log").open("w") as errlog:
            async with client(ws, server.openai_base_url, errlog) as session:
                seen["schemas"] = [t.input_schema for t in (await session.list_tools()).tools]
                rubric = text(await call(session, "read_file", path=RUBRIC_MD))
                seen["read_corrections"] = await call(session, "read_file", path=CORRECTIONS)
                for path in (
                    "judgeloop.toml",
                    "prompts/../devset/small/labels.jsonl",
                    "/" + RUBRIC_MD,
                    str(labels_file),
                    CORRECTIONS,
                ):
                    seen[path] = await call(session, "propose", files={path: "x\n"}, rationale="mine now")
                seen["huge"] = await call(
                    session,
                    "propose",
                    files={RUBRIC_MD: "x" * (MAX_PROMPT_FILE_CHARS + 1)},
                    rationale="everything",
                )
                seen["mixed"] = await call(
                    session,
                    "propose",
                    files={RUBRIC_MD: rubric + "\n- be strict\n", "devset/held/labels.jsonl": ""},
                    rationale="two files",
                )
                # An edit made on disk beside the session: never judged unseen, never lost to a rollback.
                (ws / RUBRIC_MD).write_text(rubric + "\n- edited by hand\n", encoding="utf-8")
                seen["dirty"] = await call(
                    session, "propose", files={RUBRIC_MD: rubric_with(ws, "Be strict.")}, rationale="strict"
                )
                seen["dirty_status"] = data(await call(session, "status"))
                (ws / RUBRIC_MD).write_text(rubric, encoding="utf-8")
                seen["copy"] = data(
                    await call(
                        session,
                        "propose",
                        files={RUBRIC_MD: rubric_with(ws, f"Item {dev_id} is a failure.")},
                        rationale="Remember a hard case.",
                    )
                )
                for tid in (held_id, f"../held/{held_id}", "../../judgeloop.toml", f"{dev_id}/../{held_id}"):
                    seen[("item", tid)] = await call(session, "read_item", trajectory_id=tid)
                    seen[("steps", tid)] = await call(session, "read_steps", trajectory_id=tid)
                    seen[("shot", tid)] = await call(session, "view_screenshot", trajectory_id=tid, step=0)
                with pytest.raises(MCPError) as unknown:  # a protocol error: no tool answers it
                    await call(session, "read_split", split="held")
                seen["unknown"] = unknown.value
                seen["attribute"] = await call(session, "attribute")
                # A second session's run and a `run` while this one's run is open: refused in one line (the
                # second server itself starts: it takes the lock only with its run).
                async with client(ws, server.openai_base_url, errlog, budget="5") as second:
                    seen["second_status"] = await call(second, "status")
                    seen["second"] = await call(second, "disagreements")
                for name, argv in (("run", ["-m", "optimizer.cli", "-w", str(ws), "run"]),):
                    seen[name] = await anyio.to_thread.run_sync(
                        functools.partial(
                            subprocess.run,
                            [sys.executable, *argv],
                            env={**os.environ, **server_env()},
                            cwd=REPO_ROOT,
                            stdin=subprocess.DEVNULL,
                            capture_output=True,
                            text=True,
                            timeout=120,
                        )
                    )
                seen["status"] = data(await call(session, "status"))

    drive(body)
    read_corrections = seen["read_corrections"]
    assert read_corrections.is_error and "not an allowed file" in text(read_corrections)
    assert "a person's" not in text(read_corrections)
    assert (ws / CORRECTIONS).read_bytes() == corrections  # a person's file: never read nor written
    (ws / CORRECTIONS).unlink()  # (untracked: assert_clean below counts every untracked file)
    for path in (
        "judgeloop.toml",
        "prompts/../devset/small/labels.jsonl",
        "/" + RUBRIC_MD,
        str(labels_file),
        "mixed",
        CORRECTIONS,
    ):
        out = seen[path]
        assert (
            out.is_error
            and "nothing was proposed or committed" in text(out)
            and "not an allowed file" in text(out)
        )
    huge = seen["huge"]
    assert (
        huge.is_error
        and f"the limit is {MAX_PROMPT_FILE_CHARS}" in text(huge)
        and "nothing was proposed" in text(huge)
    )
    dirty = seen["dirty"]
    assert dirty.is_error and f"the working tree has changes not made through propose ({RUBRIC_MD})" in text(
        dirty
    )
    # `status` says the tree was touched beside the session (and names the file).
    assert (
        f"the working tree has changes not made through propose: {RUBRIC_MD}"
        == seen["dirty_status"]["touched"]
    )
    copy = seen["copy"]
    assert copy["outcome"] == "guard_rejected" and f"the dev id {dev_id!r}" in copy["reason"]
    for key, out in seen.items():
        if isinstance(key, tuple) and key[0] in ("item", "steps", "shot"):
            assert out.is_error and "is not in the dev split" in text(out), (key, text(out))
            assert held_instruction not in text(out)
            assert not any(isinstance(c, types.ImageContent) for c in out.content)
    assert "unknown tool 'read_split'" in seen["unknown"].message
    assert seen["attribute"].is_error and "kept no edit; nothing to attribute" in text(seen["attribute"])
    # No tool takes an argument that could name a split.
    assert all("split" not in json.dumps(schema.get("properties", {})) for schema in seen["schemas"])
    assert not seen["second_status"].is_error
    second = seen["second"]
    assert (
        second.is_error
        and "another judgeloop command is working in this workspace (judgeloop mcp, pid" in text(second)
    )
    run_cmd = seen["run"]
    assert run_cmd.returncode == 2 and "(judgeloop mcp, pid" in run_cmd.stderr
    # Nothing was committed; the rejected candidate is on the record; one session, one run.
    runs, exps = ledger_state(ws)
    assert len(runs) == 1 and [e.status for e in exps[runs[0].id]] == ["baseline", "guard_rejected"]
    assert seen["status"]["candidates"] == {"guard_rejected": 1}
    assert gitops.rev_parse(ws, "HEAD") == start and gitops.rejected_refs(ws) == {}
    assert_clean(ws)


@pytest.mark.slow
def test_memory_edits_through_propose_are_the_agents_memory_tools_and_refuse_alike(
    ws: Path, tmp_path: Path
) -> None:
    """``propose``'s memory edits run the agent strategy's memory tools: a case naming a held-out item, a case
    without sources and principles naming a dev item are refused, nothing committed, the files untouched; a
    valid case is a candidate like any other (guards, commit, evaluation, decision)."""
    set_toml_key(
        ws,
        "optimizer",
        "allowed_files",
        '["prompts/judge.md", "prompts/rubric.md", "prompts/memory/principles.md", "prompts/memory/cases.jsonl"]',
    )
    toml = ws / "prompts" / "judge.toml"
    toml.write_text(
        re.sub(r"(?m)^memory = .*$", 'memory = "retrieve"', toml.read_text(encoding="utf-8")),
        encoding="utf-8",
    )
    commit_all(ws, "the memory is allowed")
    held_id = open_split(Workspace.open(ws), "held").ids[0]
    dev_id = sorted(labels_of(ws))[0]
    start = gitops.rev_parse(ws, "HEAD")
    seen: dict[str, types.CallToolResult] = {}

    async def body() -> None:
        async with judged_session(ws, tmp_path) as session:
            edits = {
                "heldout": [{"tool": "add_case", "arguments": {"text": "t", "source_items": [held_id]}}],
                "nosource": [{"tool": "add_case", "arguments": {"text": "t", "source_items": []}}],
                "second_bad": [
                    {"tool": "add_case", "arguments": {"text": "fine", "source_items": [dev_id]}},
                    {"tool": "edit_principles", "arguments": {"text": f"- {dev_id} is a failure."}},
                ],
            }
            for name, memory in edits.items():
                seen[name] = await call(session, "propose", memory=memory, rationale="remember")
            seen["empty"] = await call(session, "propose", rationale="nothing")
            seen["valid"] = await call(
                session,
                "propose",
                rationale="a format case",
                memory=[
                    {
                        "tool": "add_case",
                        "arguments": {
                            "text": "PDF was required; a DOCX is a failure.",
                            "source_items": [dev_id],
                        },
                    }
                ],
            )

    drive(body)
    heldout = text(seen["heldout"])
    assert (
        seen["heldout"].is_error and "nothing was proposed or committed: memory edit 1 (add_case)" in heldout
    )
    assert f"names {held_id!r}, which is not an item of the dev split" in heldout
    assert seen["nosource"].is_error and "names no source_items" in text(seen["nosource"])
    assert seen["second_bad"].is_error and "memory edit 2 (edit_principles)" in text(seen["second_bad"])
    assert seen["empty"].is_error and "nothing to propose" in text(seen["empty"])
    # The fake judge ignores memory: the valid case changes no verdict and is rolled back, its commit kept aside.
    valid = data(seen["valid"])
    assert valid["outcome"] == "rolled_back", valid
    runs, exps = ledger_state(ws)
    base, cand = exps[runs[0].id]
    assert base.status == "baseline" and cand.files_changed == ["prompts/memory/cases.jsonl"]
    (case,) = parse_cases(
        present(gitops.read_file_at(ws, gitops.rejected_refs(ws)[cand.id], "prompts/memory/cases.jsonl"))
    )
    assert case.source_items == (dev_id,)
    assert not (ws / "prompts" / "memory").exists()
    assert gitops.rev_parse(ws, "HEAD") == start
    assert_clean(ws)


@pytest.mark.slow
def test_a_case_about_another_folds_item_is_refused_through_propose_naming_the_case_and_the_item(
    ws: Path, tmp_path: Path
) -> None:
    """The red team's MCP path: ``propose`` with a case whose text carries dev item B's instruction and label,
    declared as distilled from an item of another fold, as a file or as an add_case edit. Both are refused with
    the reason (the case and the item); nothing is judged, committed or kept."""
    set_toml_key(
        ws,
        "optimizer",
        "allowed_files",
        '["prompts/judge.md", "prompts/rubric.md", "prompts/memory/principles.md", "prompts/memory/cases.jsonl"]',
    )
    toml = ws / "prompts" / "judge.toml"
    toml.write_text(
        re.sub(r"(?m)^memory = .*$", 'memory = "retrieve"', toml.read_text(encoding="utf-8")),
        encoding="utf-8",
    )
    commit_all(ws, "the memory is allowed")
    from optimizer.judge.memory import split_folds

    split = open_split(Workspace.open(ws), "small")
    folds = split_folds(split, 5).of
    b = next(t for t in split.ids if "memo.md" in split.trajectory(t).task.instruction)
    instruction = split.trajectory(b).task.instruction
    same_instruction = {t for t in split.ids if split.trajectory(t).task.instruction == instruction}
    a = next(t for t in split.ids if folds[t] != folds[b])
    evil_text = f"Task: {instruction} Label: negative, the verdict is success false."
    evil = {"id": "c-evil", "text": evil_text, "source_items": [a]}
    start = gitops.rev_parse(ws, "HEAD")
    seen: dict[str, types.CallToolResult] = {}

    async def body() -> None:
        async with judged_session(ws, tmp_path) as session:
            seen["file"] = await call(
                session,
                "propose",
                rationale="remember",
                files={"prompts/memory/cases.jsonl": json.dumps(evil) + "\n"},
            )
            seen["tool"] = await call(
                session,
                "propose",
                rationale="remember",
                memory=[
                    {
                        "tool": "add_case",
                        "arguments": {"id": "c-evil", "text": evil_text, "source_items": [a]},
                    }
                ],
            )

    drive(body)
    for how, out in seen.items():
        message = text(out)
        assert out.is_error and "nothing was proposed or committed" in message, (how, message)
        assert "case c-evil" in message and any(f"item {t}" in message for t in same_instruction), message
    runs, exps = ledger_state(ws)
    assert all(e.status == "baseline" for run in runs for e in exps[run.id])  # nothing judged as a candidate
    assert gitops.rev_parse(ws, "HEAD") == start and gitops.rejected_refs(ws) == {}
    assert not (ws / "prompts" / "memory").exists()
    assert_clean(ws)


@pytest.mark.slow
def test_no_tool_of_the_session_shows_a_correction_or_the_suspects_queue(
    ws: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A person's corrections are answers: status, disagreements, read_item on the corrected item, history
    and report (whose human version lists them) say nothing of them or of the label-suspects queue."""
    dev_id = sorted(labels_of(ws))[0]
    fix = "failure" if labels_of(ws)[dev_id].is_positive else "success"
    reason = "SECRET-step-9-shows-the-file-saved"
    assert main(["label-fix", "-w", str(ws), dev_id, "--label", fix, "--reason", reason, "--by", "ana"]) == 0
    seen: dict[str, str] = {}

    async def body() -> None:
        async with judged_session(ws, tmp_path) as session:
            seen["status"] = text(await call(session, "status"))
            seen["disagreements"] = text(await call(session, "disagreements"))
            seen["read_item"] = text(await call(session, "read_item", trajectory_id=dev_id))
            seen["history"] = text(await call(session, "history"))
            seen["report"] = text(await call(session, "report"))
            seen["tools"] = json.dumps(
                [t.model_dump(mode="json") for t in (await session.list_tools()).tools]
            )

    drive(body)
    assert "run " in seen["report"] and "guard rejections" in seen["report"]  # the audit itself is there
    for name, said in seen.items():
        assert reason not in said, name
        assert "correction" not in said.lower() and "suspect" not in said.lower(), name
    # The same run's report for a person does list the correction: the omission is the MCP server's.
    capsys.readouterr()
    assert main(["report", "-w", str(ws)]) == 0
    human = capsys.readouterr().out
    assert "1 correction(s) in devset/small/corrections.jsonl" in human
    (ws / CORRECTIONS).unlink()


@pytest.mark.slow
def test_a_commit_the_agent_made_on_the_session_branch_is_refused_by_name_and_nothing_is_judged(
    ws: Path, tmp_path: Path
) -> None:
    """The red team's hole: a coding agent with a shell commits on the session's branch (a dev id in rubric.md
    and an edit of judge.toml, not an allowed file), then proposes a one-line edit. The loop trusts only the
    commits it made: the proposal is refused in one line naming the commit, no judge call is made, nothing is
    kept, `status` says the branch was touched, and the agent's commit is not destroyed by the session's end."""
    dev_id = sorted(labels_of(ws))[0]
    good = library_text(ws, GOOD_ENTRY)
    seen: dict[str, Any] = {}

    async def body() -> None:
        with FakeLLMServer(default=FakeJudge(ws)) as server, (tmp_path / "err.log").open("w") as errlog:
            async with client(ws, server.openai_base_url, errlog) as session:
                data(await call(session, "disagreements"))
                (ws / RUBRIC_MD).write_text(rubric_with(ws, f"Item {dev_id} is a failure."), encoding="utf-8")
                toml = ws / "prompts" / "judge.toml"
                toml.write_text(toml.read_text(encoding="utf-8") + "\n# tuned\n", encoding="utf-8")
                git(ws, "commit", "-q", "-a", "-m", "tune the rubric and the judge")
                seen["hostile"] = gitops.rev_parse(ws, "HEAD")
                before = len(server.inference_requests())
                seen["propose"] = await call(
                    session,
                    "propose",
                    files={RUBRIC_MD: rubric_with(ws, good)},
                    rationale="Check that typed text matches the request exactly.",
                )
                seen["paid"] = len(server.inference_requests()) - before
                seen["status"] = data(await call(session, "status"))

    drive(body)
    hostile = seen["hostile"]
    refused = text(seen["propose"])
    assert seen["propose"].is_error, refused
    assert f'{hostile[:12]} "tune the rubric and the judge"' in refused and "\n" not in refused.strip()
    assert seen["paid"] == 0  # refused before any judge call
    assert hostile[:12] in seen["status"]["touched"]
    runs, exps = ledger_state(ws)
    (run,) = runs
    assert [e.status for e in exps[run.id]] == ["baseline"]
    with Ledger(ws / "experiments" / "ledger.sqlite") as led:
        assert led.get_run(run.id).incumbent_experiment == exps[run.id][0].id
    # Nothing is lost: the session's end does not reset the branch over a commit it did not make.
    assert gitops.rev_parse(ws, run.branch) == hostile


@pytest.mark.slow
def test_decide_keep_from_the_client_against_the_policy_is_refused_and_a_person_overrules_it(
    ws: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A keep is the policy's: the client's `decide keep` on a propose_only candidate the policy rolls back
    (FPR rose) is refused with the policy's reason. When the client leaves, the waiting candidate is kept under
    refs/judgeloop/waiting/<id> (the branch back at the incumbent) and `judgeloop decide` — a person — keeps it;
    the ledger, the report and the commit's trailer say a person overruled the policy."""
    bad = library_text(ws, BAD_ENTRY)
    seen: dict[str, Any] = {}

    async def body() -> None:
        async with judged_session(ws, tmp_path) as session:
            data(await call(session, "disagreements"))
            seen["waiting"] = data(
                await call(
                    session,
                    "propose",
                    files={RUBRIC_MD: rubric_with(ws, bad)},
                    rationale="Accept saved work when it was confirmed.",
                    propose_only=True,
                )
            )
            seen["keep"] = await call(
                session, "decide", experiment=seen["waiting"]["experiment"], decision="keep"
            )
            seen["status"] = data(await call(session, "status"))

    drive(body)
    waiting = seen["waiting"]
    assert waiting["outcome"] == "waiting" and waiting["fpr"]["candidate"] > waiting["fpr"]["incumbent"]
    refused = text(seen["keep"])
    assert seen["keep"].is_error and "policy rolls it back" in refused and "FPR" in refused, refused
    assert seen["status"]["waiting"] == waiting["experiment"]
    runs, exps = ledger_state(ws)
    (run,) = runs
    base, cand = exps[run.id]
    assert run.status == "waiting" and cand.status == "waiting"
    # The client left: the candidate's commit is under a ref, the branch at the incumbent.
    waiting_ref = git(ws, "rev-parse", f"refs/judgeloop/waiting/{cand.id}").strip()
    assert waiting_ref == cand.commit_sha and gitops.rev_parse(ws, run.branch) == base.commit_sha
    capsys.readouterr()
    assert (
        main(["decide", "-w", str(ws), str(cand.id), "keep"]) == 2
    )  # against the policy: no terminal, no --force
    assert "--force" in capsys.readouterr().err
    assert main(["decide", "-w", str(ws), str(cand.id), "keep", "--force"]) == 0
    said = capsys.readouterr()
    assert "over the policy's roll back" in said.out + said.err
    with Ledger(ws / "experiments" / "ledger.sqlite") as led:
        kept = led.get_experiment(cand.id)
        assert led.get_run(run.id).incumbent_experiment == cand.id
    assert kept.status == "kept" and kept.decided_by == "person" and kept.policy_keep is False
    assert kept.overrule is not None and kept.overrule.startswith(
        "kept by a person over the policy's roll back: "
    )
    assert "FPR" in kept.overrule
    assert gitops.rev_parse(ws, run.branch) == kept.commit_sha
    trailers = gitops.parse_trailers(gitops.commit_message(ws, present(kept.commit_sha)))
    assert trailers["Judgeloop-Decision"] == "kept"
    assert trailers["Judgeloop-Overrule"].startswith("kept by a person over the policy's roll back: ")
    assert git(ws, "for-each-ref", "refs/judgeloop/waiting/").strip() == ""
    capsys.readouterr()
    assert main(["report", "-w", str(ws), "--run", run.id]) == 0
    assert "kept by a person over the policy's roll back: " in capsys.readouterr().out
    assert_clean(ws)


@pytest.mark.slow
def test_a_proposal_whose_rationale_is_over_the_cap_is_rejected_by_the_guards_in_one_line(
    ws: Path, tmp_path: Path
) -> None:
    """MCP propose goes through the loop's guards: a rationale of 50,000 characters is refused with one
    line, nothing is committed, and the ledger keeps it clipped."""
    from optimizer.loop.guards import MAX_RATIONALE_CHARS

    good = library_text(ws, GOOD_ENTRY)
    start = gitops.rev_parse(ws, "HEAD")
    rationale = "Check typed text exactly. " + "y" * 50_000
    seen: dict[str, Any] = {}

    async def body() -> None:
        async with judged_session(ws, tmp_path) as session:
            seen["long"] = data(
                await call(session, "propose", files={RUBRIC_MD: rubric_with(ws, good)}, rationale=rationale)
            )

    drive(body)
    long = seen["long"]
    assert long["outcome"] == "guard_rejected", long
    assert long["reason"] == (
        f"the rationale is {len(rationale):,} characters, over the cap of "
        f"{MAX_RATIONALE_CHARS:,}; say why in one paragraph"
    ), long
    runs, exps = ledger_state(ws)
    _base, cand = exps[runs[0].id]
    assert cand.commit_sha is None and len(cand.rationale or "") < MAX_RATIONALE_CHARS + 100
    assert gitops.rev_parse(ws, "HEAD") == start
    assert_clean(ws)
