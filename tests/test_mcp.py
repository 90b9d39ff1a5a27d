"""`judgeloop mcp` through the MCP SDK's own client: `stdio_client` spawns the real command over stdio and
a `ClientSession` drives it, as Claude Code or Codex would. The judge is the deterministic fake judge
(OpenAI wire, through the real SDK); the MCP client plays the coding agent.

Every server is a child of `stdio_client`, which closes its stdin and kills it at the end of the
``async with``; every call is bounded by `anyio.fail_after`.
"""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import types

from optimizer.cli import main
from optimizer.devset.split import open_split
from optimizer.judge.memory import parse_cases
from optimizer.judge.prompts import LIBRARY_MD, RUBRIC_MD, parse_library
from optimizer.ledger import Experiment, Ledger, Run
from optimizer.scaffold import bundled_dir
from optimizer.workspace import gitops
from optimizer.workspace.paths import MAX_PROMPT_FILE_CHARS
from optimizer.workspace.workspace import Workspace
from tests.support.fakeserver import FakeLLMServer
from tests.support.loop import (
    BAD_ENTRY,
    GOOD_ENTRY,
    FakeJudge,
    add_small_dev_split,
    commit_all,
    git,
    labels_of,
    make_workspace,
    present,
    set_toml_key,
    wait_for,
)
from tests.support.mcp_client import KEY, call, client, data, drive, server_args, server_env, text
from tests.support.paths import REPO_ROOT
from tests.support.scripted import assert_clean

OLD = "## Decision rules"
CORRECTIONS = "devset/small/corrections.jsonl"


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A sample workspace: the 32-item dev split ``small`` and a held-out split ``held`` of 4 other items."""
    root = make_workspace(tmp_path_factory.mktemp("template"))
    dev = add_small_dev_split(root)
    rest = [t for t in open_split(Workspace.open(root), "sample").ids if t not in dev][:4]
    manifest = root / "held.txt"
    manifest.write_text("\n".join(rest) + "\n", encoding="utf-8")
    assert main(["devset", "import", str(bundled_dir() / "devset" / "sample"), "-w", str(root),
                 "--name", "held", "--manifest", str(manifest), "--link"]) == 0
    manifest.unlink()
    set_toml_key(root, "workspace", "heldout_splits", '["held"]')
    commit_all(root, "held-out split")
    return root


@pytest.fixture
def ws(template: Path, tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    shutil.copytree(template, root, symlinks=True)
    return root


def ledger_state(root: Path) -> tuple[list[Run], dict[str, list[Experiment]]]:
    with Ledger(root / "experiments" / "ledger.sqlite") as led:
        runs = led.runs()
        return runs, {r.id: led.experiments(r.id) for r in runs}


def rubric_with(root: Path, rule: str) -> str:
    text_ = (root / RUBRIC_MD).read_text(encoding="utf-8")
    assert OLD in text_
    return text_.replace(OLD, f"{OLD}\n\n- {rule}", 1)


def library_text(root: Path, entry: str) -> str:
    return {e.id: e.text for e in parse_library((root / LIBRARY_MD).read_text(encoding="utf-8"))}[entry]


@pytest.mark.slow
def test_a_client_session_drives_status_disagreements_propose_and_decide_end_to_end(
    ws: Path, tmp_path: Path
) -> None:
    labels = labels_of(ws)
    good, bad = library_text(ws, GOOD_ENTRY), library_text(ws, BAD_ENTRY)
    start = gitops.rev_parse(ws, "HEAD")
    seen: dict[str, Any] = {}

    async def body() -> None:
        with FakeLLMServer(default=FakeJudge(ws)) as server, (tmp_path / "err.log").open("w") as errlog:
            async with client(ws, server.openai_base_url, errlog) as session:
                tools = {t.name: t for t in (await session.list_tools()).tools}
                seen["tools"] = tools
                status = data(await call(session, "status"))
                assert status["incumbent"] is None and status["budget"]["budget_usd"] == 100
                assert status["split"] == "small" and status["items"] == len(labels)
                seen["baseline_progress"] = []
                listing = data(await call(session, "disagreements", collect=seen["baseline_progress"]))
                seen["listing"] = listing
                assert data(await call(session, "status"))["baseline"] is not None
                first = listing["items"][0]["trajectory_id"]
                item = data(await call(session, "read_item", trajectory_id=first))
                assert item["disagreement"]["trajectory_id"] == first and item["steps"] > 0
                steps = await call(session, "read_steps", trajectory_id=first, start=0, end=2)
                assert not steps.is_error and "step 0:" in text(steps)
                rubric = text(await call(session, "read_file", path=RUBRIC_MD))
                assert rubric == (ws / RUBRIC_MD).read_text(encoding="utf-8")
                kept = data(await call(session, "propose", files={RUBRIC_MD: rubric_with(ws, good)},
                                       rationale="Check that typed text matches the request exactly."))
                seen["kept"] = kept
                # A change that raises FPR, evaluated in full and left to the client: it discards it.
                waiting = data(await call(session, "propose", files={RUBRIC_MD: rubric_with(ws, bad)},
                                          rationale="Accept saved work when it was confirmed.", propose_only=True))
                seen["waiting"] = waiting
                again = await call(session, "propose", files={RUBRIC_MD: rubric}, rationale="anything")
                assert again.is_error and f"experiment {waiting['experiment']} is waiting" in text(again)
                seen["decided"] = data(await call(session, "decide", experiment=waiting["experiment"],
                                                  decision="discard"))
                seen["attribution"] = data(await call(session, "attribute"))
                seen["history"] = text(await call(session, "history"))
                seen["report"] = text(await call(session, "report"))

    drive(body)
    # The baseline's judging reached the client as MCP progress, ending with every item judged.
    assert seen["baseline_progress"] and seen["baseline_progress"][-1][:2] == (len(labels), len(labels))
    assert all(m is not None and m.startswith("judge ") for _, _, m in seen["baseline_progress"])
    assert {"status", "history", "disagreements", "read_item", "read_steps", "view_screenshot", "propose",
            "decide", "report"} <= set(seen["tools"])
    # The listing is the agent strategy's: every item the baseline got wrong, each with its direction.
    runs, exps = ledger_state(ws)
    (run,) = runs
    baseline, cand1, cand2 = exps[run.id]
    with Ledger(ws / "experiments" / "ledger.sqlite") as led:
        wrong = {v.trajectory_id for v in led.item_verdicts(baseline.id)
                 if v.success != labels[v.trajectory_id].is_positive}
    listed = seen["listing"]["items"]
    assert wrong and {i["trajectory_id"] for i in listed} == wrong
    assert all((i["direction"] == "missed_failure") == (not labels[i["trajectory_id"]].is_positive) for i in listed)
    assert run.strategy == "mcp" and run.status == "finished" and run.budgets["budget_usd"] == 100
    assert baseline.status == "baseline"
    # The kept candidate went through the loop's path: a commit on the run branch, recorded as a run's would be.
    kept = seen["kept"]
    assert kept["outcome"] == "kept" and kept["experiment"] == cand1.id and cand1.status == "kept"
    assert kept["kappa"]["candidate"] > kept["kappa"]["incumbent"] == baseline.kappa
    assert kept["p_value"] == cand1.p_value is not None and kept["flips"] == cand1.flip_counts()
    assert cand1.strategy == "mcp" and cand1.rationale == "Check that typed text matches the request exactly."
    assert kept["budget"]["left_usd"] == pytest.approx(100 - kept["budget"]["spent_usd"])
    assert seen["waiting"]["outcome"] == "waiting" and seen["waiting"]["fpr"]["candidate"] > cand1.fpr
    assert seen["decided"]["outcome"] == "rolled_back" and cand2.status == "rolled_back"
    assert "discarded by the MCP client" in (cand2.reason or "")
    assert gitops.rev_parse(ws, "HEAD") == cand1.commit_sha != start
    assert gitops.current_branch(ws) == run.branch
    assert good in (ws / RUBRIC_MD).read_text(encoding="utf-8") and bad not in (ws / RUBRIC_MD).read_text("utf-8")
    assert set(gitops.rejected_refs(ws)) == {cand2.id}
    assert f"Experiment {cand1.id}: kept" in seen["history"] and run.id in seen["report"]
    # The kept edit's contribution, measured on the dev split and recorded under the session's run.
    attribution = seen["attribution"]
    assert attribution["status"] == "complete" and [e["experiment"] for e in attribution["attribution"]] == [cand1.id]
    with Ledger(ws / "experiments" / "ledger.sqlite") as led:
        recorded = led.latest_attribution(run.id)
    assert recorded is not None and recorded.id == attribution["attribution_meta"]["id"]
    assert (ws / "experiments" / "runs" / run.id / "report.md").is_file()
    assert_clean(ws)


def test_the_budget_refuses_what_would_cross_it_and_names_what_is_left(
    ws: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", KEY)  # the in-process `eval`
    cfg = ws / "judgeloop.toml"
    cfg.write_text(cfg.read_text(encoding="utf-8") + '\n[prices."fake-judge"]\ninput = 10.0\noutput = 10.0\n',
                   encoding="utf-8")
    commit_all(ws, "prices")
    good = library_text(ws, GOOD_ENTRY)
    seen: dict[str, Any] = {}

    async def body(server: FakeLLMServer) -> None:
        with (tmp_path / "err.log").open("w") as errlog:
            paid_before = len(server.inference_requests())
            async with client(ws, server.openai_base_url, errlog, budget="0.0001") as session:
                data(await call(session, "disagreements"))
                seen["first"] = data(await call(session, "propose", files={RUBRIC_MD: rubric_with(ws, good)},
                                                rationale="Check typed text exactly."))
                seen["second"] = await call(session, "propose", files={RUBRIC_MD: rubric_with(ws, good + " Always.")},
                                            rationale="Again.")
                seen["status"] = data(await call(session, "status"))
            seen["paid"] = len(server.inference_requests()) - paid_before

    with FakeLLMServer(default=FakeJudge(ws)) as server:
        # The baseline is judged (and cached) first, so the session's baseline costs nothing.
        assert main(["eval", "-w", str(ws), "--provider", "openai", "--base-url", server.openai_base_url,
                     "--model", "fake-judge", "--concurrency", "8"]) == 0
        anyio.run(body, server)
    # No judge call could fit: none was made, the candidate is recorded as not decided and rolled back.
    assert seen["paid"] == 0
    first = seen["first"]
    assert first["outcome"] == "error" and "budget" in first["reason"] and first["budget"]["spent_usd"] == 0
    second = seen["second"]
    assert second.is_error
    assert re.search(r"budget: a new candidate is refused: spent \$0\.0000 of the session's \$0\.0001 budget, "
                     r"\$0\.0001 left", text(second)), text(second)
    assert seen["status"]["budget"]["stopped"] is not None
    runs, exps = ledger_state(ws)
    assert [e.status for e in exps[runs[0].id]] == ["baseline", "error"]  # the refused call recorded nothing
    assert gitops.rev_parse(ws, "HEAD") == exps[runs[0].id][0].commit_sha
    assert_clean(ws)


def test_a_budget_too_small_for_the_baseline_stops_it_uncrossed_and_refuses_what_follows(
    ws: Path, tmp_path: Path
) -> None:
    cfg = ws / "judgeloop.toml"
    cfg.write_text(cfg.read_text(encoding="utf-8") + '\n[prices."fake-judge"]\ninput = 10.0\noutput = 10.0\n',
                   encoding="utf-8")
    commit_all(ws, "prices")
    seen: dict[str, Any] = {}

    async def body() -> None:
        with FakeLLMServer(default=FakeJudge(ws)) as server, (tmp_path / "err.log").open("w") as errlog:
            async with client(ws, server.openai_base_url, errlog, budget="0.3") as session:
                seen["listing"] = await call(session, "disagreements")
                seen["propose"] = await call(session, "propose", files={RUBRIC_MD: rubric_with(ws, "Be exact.")},
                                             rationale="exact")
                seen["status"] = data(await call(session, "status"))

    drive(body)
    listing = seen["listing"]
    assert listing.is_error and "the baseline could not be evaluated" in text(listing) and "budget" in text(listing)
    assert seen["propose"].is_error and "budget: a new candidate is refused" in text(seen["propose"])
    runs, exps = ledger_state(ws)
    (baseline,) = exps[runs[0].id]
    # Some calls were paid, none crossed the budget, and the session's figure is the ledger's.
    assert 0 < baseline.cost_usd <= 0.3 + 1e-9 and baseline.status == "error"
    assert seen["status"]["budget"]["spent_usd"] == pytest.approx(baseline.cost_usd)
    assert gitops.rev_parse(ws, "HEAD") == runs[0].start_rev
    assert_clean(ws)


@pytest.mark.slow
def test_hostile_calls_are_refused_and_nothing_reaches_git_or_the_held_out_split(ws: Path, tmp_path: Path) -> None:
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
                for path in ("judgeloop.toml", "prompts/../devset/small/labels.jsonl", "/" + RUBRIC_MD,
                             str(labels_file), CORRECTIONS):
                    seen[path] = await call(session, "propose", files={path: "x\n"}, rationale="mine now")
                seen["huge"] = await call(session, "propose", files={RUBRIC_MD: "x" * (MAX_PROMPT_FILE_CHARS + 1)},
                                          rationale="everything")
                seen["mixed"] = await call(session, "propose", files={RUBRIC_MD: rubric + "\n- be strict\n",
                                                                      "devset/held/labels.jsonl": ""},
                                           rationale="two files")
                # An edit made on disk beside the session: never judged unseen, never lost to a rollback.
                (ws / RUBRIC_MD).write_text(rubric + "\n- edited by hand\n", encoding="utf-8")
                seen["dirty"] = await call(session, "propose", files={RUBRIC_MD: rubric_with(ws, "Be strict.")},
                                           rationale="strict")
                (ws / RUBRIC_MD).write_text(rubric, encoding="utf-8")
                seen["copy"] = data(await call(session, "propose",
                                               files={RUBRIC_MD: rubric_with(ws, f"Item {dev_id} is a failure.")},
                                               rationale="Remember a hard case."))
                for tid in (held_id, f"../held/{held_id}", "../../judgeloop.toml", f"{dev_id}/../{held_id}"):
                    seen[("item", tid)] = await call(session, "read_item", trajectory_id=tid)
                    seen[("steps", tid)] = await call(session, "read_steps", trajectory_id=tid)
                    seen[("shot", tid)] = await call(session, "view_screenshot", trajectory_id=tid, step=0)
                seen["unknown"] = await call(session, "read_split", split="held")
                seen["attribute"] = await call(session, "attribute")
                # A second session, a `run` and a `decide` while this one is open: refused in one line.
                for name, argv in (("second", server_args(ws, server.openai_base_url, "5")),
                                   ("run", ["-m", "optimizer.cli", "-w", str(ws), "run"])):
                    seen[name] = await anyio.to_thread.run_sync(functools.partial(
                        subprocess.run, [sys.executable, *argv], env={**os.environ, **server_env()}, cwd=REPO_ROOT,
                        stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120))
                seen["status"] = data(await call(session, "status"))

    drive(body)
    read_corrections = seen["read_corrections"]
    assert read_corrections.is_error and "not an allowed file" in text(read_corrections)
    assert "a person's" not in text(read_corrections)
    assert (ws / CORRECTIONS).read_bytes() == corrections  # a person's file: never read nor written
    (ws / CORRECTIONS).unlink()  # (untracked: assert_clean below counts every untracked file)
    for path in ("judgeloop.toml", "prompts/../devset/small/labels.jsonl", "/" + RUBRIC_MD, str(labels_file), "mixed",
                 CORRECTIONS):
        out = seen[path]
        assert out.is_error and "nothing was proposed or committed" in text(out) and "not an allowed file" in text(out)
    huge = seen["huge"]
    assert huge.is_error and f"the limit is {MAX_PROMPT_FILE_CHARS}" in text(huge) and "nothing was proposed" in text(huge)
    dirty = seen["dirty"]
    assert dirty.is_error and f"the working tree has changes not made through propose ({RUBRIC_MD})" in text(dirty)
    copy = seen["copy"]
    assert copy["outcome"] == "guard_rejected" and f"the dev id {dev_id!r}" in copy["reason"]
    for key, out in seen.items():
        if isinstance(key, tuple) and key[0] in ("item", "steps", "shot"):
            assert out.is_error and "is not in the dev split" in text(out), (key, text(out))
            assert held_instruction not in text(out)
            assert not any(isinstance(c, types.ImageContent) for c in out.content)
    assert seen["unknown"].is_error and "unknown tool 'read_split'" in text(seen["unknown"])
    assert seen["attribute"].is_error and "kept no edit; nothing to attribute" in text(seen["attribute"])
    # No tool takes an argument that could name a split.
    assert all("split" not in json.dumps(schema.get("properties", {})) for schema in seen["schemas"])
    second = seen["second"]
    assert second.returncode == 2 and "another judgeloop command is working in this workspace (judgeloop mcp, pid" \
        in second.stderr and "Traceback" not in second.stderr
    run_cmd = seen["run"]
    assert run_cmd.returncode == 2 and "(judgeloop mcp, pid" in run_cmd.stderr
    # Nothing was committed; the rejected candidate is on the record; one session, one run.
    runs, exps = ledger_state(ws)
    assert len(runs) == 1 and [e.status for e in exps[runs[0].id]] == ["baseline", "guard_rejected"]
    assert seen["status"]["candidates"] == {"guard_rejected": 1}
    assert gitops.rev_parse(ws, "HEAD") == start and gitops.rejected_refs(ws) == {}
    assert_clean(ws)


@pytest.mark.slow
def test_memory_edits_through_propose_are_the_agents_memory_tools_and_refuse_alike(ws: Path, tmp_path: Path) -> None:
    """``propose``'s memory edits run the agent strategy's memory tools: a case naming a held-out item, a case
    without sources and principles naming a dev item are refused, nothing committed, the files untouched; a
    valid case is a candidate like any other (guards, commit, evaluation, decision)."""
    set_toml_key(ws, "optimizer", "allowed_files",
                 '["prompts/judge.md", "prompts/rubric.md", "prompts/memory/principles.md", "prompts/memory/cases.jsonl"]')
    toml = ws / "prompts" / "judge.toml"
    toml.write_text(re.sub(r"(?m)^memory = .*$", 'memory = "retrieve"', toml.read_text(encoding="utf-8")),
                    encoding="utf-8")
    commit_all(ws, "the memory is allowed")
    held_id = open_split(Workspace.open(ws), "held").ids[0]
    dev_id = sorted(labels_of(ws))[0]
    start = gitops.rev_parse(ws, "HEAD")
    seen: dict[str, types.CallToolResult] = {}

    async def body() -> None:
        with FakeLLMServer(default=FakeJudge(ws)) as server, (tmp_path / "err.log").open("w") as errlog:
            async with client(ws, server.openai_base_url, errlog) as session:
                edits = {
                    "heldout": [{"tool": "add_case", "arguments": {"text": "t", "source_items": [held_id]}}],
                    "nosource": [{"tool": "add_case", "arguments": {"text": "t", "source_items": []}}],
                    "second_bad": [{"tool": "add_case", "arguments": {"text": "fine", "source_items": [dev_id]}},
                                   {"tool": "edit_principles", "arguments": {"text": f"- {dev_id} is a failure."}}],
                }
                for name, memory in edits.items():
                    seen[name] = await call(session, "propose", memory=memory, rationale="remember")
                seen["empty"] = await call(session, "propose", rationale="nothing")
                seen["valid"] = await call(session, "propose", rationale="a format case", memory=[
                    {"tool": "add_case", "arguments": {"text": "PDF was required; a DOCX is a failure.",
                                                       "source_items": [dev_id]}}])

    drive(body)
    heldout = text(seen["heldout"])
    assert seen["heldout"].is_error and "nothing was proposed or committed: memory edit 1 (add_case)" in heldout
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
    (case,) = parse_cases(present(gitops.read_file_at(ws, gitops.rejected_refs(ws)[cand.id],
                                                      "prompts/memory/cases.jsonl")))
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
    set_toml_key(ws, "optimizer", "allowed_files",
                 '["prompts/judge.md", "prompts/rubric.md", "prompts/memory/principles.md", "prompts/memory/cases.jsonl"]')
    toml = ws / "prompts" / "judge.toml"
    toml.write_text(re.sub(r"(?m)^memory = .*$", 'memory = "retrieve"', toml.read_text(encoding="utf-8")),
                    encoding="utf-8")
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
        with FakeLLMServer(default=FakeJudge(ws)) as server, (tmp_path / "err.log").open("w") as errlog:
            async with client(ws, server.openai_base_url, errlog) as session:
                seen["file"] = await call(session, "propose", rationale="remember",
                                          files={"prompts/memory/cases.jsonl": json.dumps(evil) + "\n"})
                seen["tool"] = await call(session, "propose", rationale="remember", memory=[
                    {"tool": "add_case", "arguments": {"id": "c-evil", "text": evil_text, "source_items": [a]}}])

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


def test_a_killed_session_leaves_a_consistent_ledger_and_the_next_one_closes_it(
    ws: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good = library_text(ws, GOOD_ENTRY)
    n_items = len(labels_of(ws))
    start = gitops.rev_parse(ws, "HEAD")
    seen: dict[str, Any] = {}
    # The baseline's calls are answered; the candidate's first calls hang until the server is killed.
    judge = FakeJudge(ws, gate_after=n_items + 2, abandon_gated=True)

    def running_candidate() -> bool:
        path = ws / "experiments" / "ledger.sqlite"
        if not path.exists():
            return False
        with Ledger(path) as led:
            return any(e.seq > 0 and e.commit_sha for e in led.experiments_with_status("running"))

    async def body() -> None:
        with FakeLLMServer(default=judge) as server, (tmp_path / "err.log").open("w") as errlog:
            try:
                async with client(ws, server.openai_base_url, errlog) as session:
                    data(await call(session, "disagreements"))
                    runs, _ = ledger_state(ws)
                    pid = runs[0].pid
                    assert pid is not None and pid != os.getpid()

                    def kill_mid_evaluation() -> None:
                        wait_for(running_candidate, "the candidate's evaluation", timeout_s=120)
                        os.kill(pid, signal.SIGKILL)

                    killer = threading.Thread(target=kill_mid_evaluation)
                    killer.start()
                    try:
                        seen["killed_call"] = await call(session, "propose", files={RUBRIC_MD: rubric_with(ws, good)},
                                                         rationale="Check typed text.")
                    finally:
                        await anyio.to_thread.run_sync(lambda: killer.join(timeout=130))
            except Exception as exc:  # noqa: BLE001 - the client reports its dead server in its own way
                seen["client_error"] = exc
            seen["after_kill"] = ledger_state(ws)
            capsys.readouterr()
            seen["resume"] = main(["run", "-w", str(ws), "--resume"]), capsys.readouterr().err
            judge.gate.set()
            judge.gate_after = None
            async with client(ws, server.openai_base_url, errlog) as session:
                seen["status"] = data(await call(session, "status"))

    drive(body)
    assert "killed_call" not in seen or seen["killed_call"].is_error
    runs, exps = seen["after_kill"]
    (killed,) = runs
    assert killed.status == "running"  # as a killed run: every state change before the kill is on record
    assert [e.status for e in exps[killed.id]] == ["baseline", "running"]
    assert seen["resume"][0] == 2 and f"run {killed.id} was a `judgeloop mcp` session that was killed" in seen["resume"][1]
    runs, exps = ledger_state(ws)
    new, old = runs
    assert old.id == killed.id and old.status == "stopped" and "killed" in (old.stop_reason or "")
    cand = exps[old.id][1]
    assert cand.status == "error" and "killed" in (cand.reason or "")
    assert gitops.rejected_refs(ws) == {cand.id: cand.commit_sha}
    assert new.status == "finished" and new.start_rev == start == gitops.rev_parse(ws, "HEAD")
    assert seen["status"]["run"] == new.id
    assert good not in (ws / RUBRIC_MD).read_text(encoding="utf-8")
    assert_clean(ws)


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
        with FakeLLMServer(default=FakeJudge(ws)) as server, (tmp_path / "err.log").open("w") as errlog:
            async with client(ws, server.openai_base_url, errlog) as session:
                seen["status"] = text(await call(session, "status"))
                seen["disagreements"] = text(await call(session, "disagreements"))
                seen["read_item"] = text(await call(session, "read_item", trajectory_id=dev_id))
                seen["history"] = text(await call(session, "history"))
                seen["report"] = text(await call(session, "report"))
                seen["tools"] = json.dumps([t.model_dump(mode="json") for t in (await session.list_tools()).tools])

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
                seen["propose"] = await call(session, "propose", files={RUBRIC_MD: rubric_with(ws, good)},
                                             rationale="Check that typed text matches the request exactly.")
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
        with FakeLLMServer(default=FakeJudge(ws)) as server, (tmp_path / "err.log").open("w") as errlog:
            async with client(ws, server.openai_base_url, errlog) as session:
                data(await call(session, "disagreements"))
                seen["waiting"] = data(await call(session, "propose", files={RUBRIC_MD: rubric_with(ws, bad)},
                                                  rationale="Accept saved work when it was confirmed.",
                                                  propose_only=True))
                seen["keep"] = await call(session, "decide", experiment=seen["waiting"]["experiment"],
                                          decision="keep")
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
    assert main(["decide", "-w", str(ws), str(cand.id), "keep"]) == 2  # against the policy: no terminal, no --force
    assert "--force" in capsys.readouterr().err
    assert main(["decide", "-w", str(ws), str(cand.id), "keep", "--force"]) == 0
    said = capsys.readouterr()
    assert "over the policy's roll back" in said.out + said.err
    with Ledger(ws / "experiments" / "ledger.sqlite") as led:
        kept = led.get_experiment(cand.id)
        assert led.get_run(run.id).incumbent_experiment == cand.id
    assert kept.status == "kept" and kept.decided_by == "person" and kept.policy_keep is False
    assert kept.overrule is not None and kept.overrule.startswith("kept by a person over the policy's roll back: ")
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


def test_a_client_that_leaves_while_a_candidate_waits_leaves_it_decidable_by_judgeloop_decide(
    ws: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """No orphans: the session's end resets the branch to the incumbent, but the waiting candidate's commit
    stays under refs/judgeloop/waiting/<id>, and `judgeloop decide N keep` keeps it (a person agreeing with
    the policy: no overrule)."""
    good = library_text(ws, GOOD_ENTRY)
    seen: dict[str, Any] = {}

    async def body() -> None:
        with FakeLLMServer(default=FakeJudge(ws)) as server, (tmp_path / "err.log").open("w") as errlog:
            async with client(ws, server.openai_base_url, errlog) as session:
                data(await call(session, "disagreements"))
                seen["waiting"] = data(await call(session, "propose", files={RUBRIC_MD: rubric_with(ws, good)},
                                                  rationale="Check typed text exactly.", propose_only=True))

    drive(body)
    runs, exps = ledger_state(ws)
    (run,) = runs
    base, cand = exps[run.id]
    assert seen["waiting"]["outcome"] == "waiting" and cand.status == "waiting" and run.status == "waiting"
    assert git(ws, "rev-parse", f"refs/judgeloop/waiting/{cand.id}").strip() == cand.commit_sha
    assert gitops.rev_parse(ws, "HEAD") == base.commit_sha
    capsys.readouterr()
    assert main(["decide", "-w", str(ws), str(cand.id), "keep"]) == 0, capsys.readouterr().err
    with Ledger(ws / "experiments" / "ledger.sqlite") as led:
        kept = led.get_experiment(cand.id)
    assert kept.status == "kept" and kept.decided_by == "person" and kept.overrule is None
    assert gitops.rev_parse(ws, run.branch) == kept.commit_sha
    assert gitops.read_file_at(ws, present(kept.commit_sha), RUBRIC_MD) == (ws / RUBRIC_MD).read_text(encoding="utf-8")
    assert good in (ws / RUBRIC_MD).read_text(encoding="utf-8")
    assert git(ws, "for-each-ref", "refs/judgeloop/waiting/").strip() == ""
    assert_clean(ws)


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
        with FakeLLMServer(default=FakeJudge(ws)) as server, (tmp_path / "err.log").open("w") as errlog:
            async with client(ws, server.openai_base_url, errlog) as session:
                seen["long"] = data(await call(session, "propose", files={RUBRIC_MD: rubric_with(ws, good)},
                                               rationale=rationale))

    drive(body)
    long = seen["long"]
    assert long["outcome"] == "guard_rejected", long
    assert long["reason"] == (f"the rationale is {len(rationale):,} characters, over the cap of "
                              f"{MAX_RATIONALE_CHARS:,}; say why in one paragraph"), long
    runs, exps = ledger_state(ws)
    _base, cand = exps[runs[0].id]
    assert cand.commit_sha is None and len(cand.rationale or "") < MAX_RATIONALE_CHARS + 100
    assert gitops.rev_parse(ws, "HEAD") == start
    assert_clean(ws)


def test_when_re_judging_at_a_look_hits_the_budget_the_session_spend_is_every_billed_call(
    ws: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Futility's first look is judged and paid, then re-judging its disagreements (20 more judgements
    under each prompt) runs into the session's budget. The session's spend (status) is what the fake
    server billed for every call of the session, first look included; it used to leave out the look."""
    monkeypatch.setenv("OPENAI_API_KEY", KEY)  # the in-process `eval`
    cfg = ws / "judgeloop.toml"
    cfg.write_text(cfg.read_text(encoding="utf-8") + '\n[prices."fake-judge"]\ninput = 10.0\noutput = 10.0\n',
                   encoding="utf-8")
    set_toml_key(ws, "loop", "rejudge", "20")
    commit_all(ws, "prices; re-judging 20 times")
    good = library_text(ws, GOOD_ENTRY)
    seen: dict[str, Any] = {}

    def billed(replies: list[Any]) -> float:
        return sum(10.0 * (usage.input_tokens + usage.output_tokens) for _request, usage in replies) / 1e6

    async def body(server: FakeLLMServer, budget: float) -> None:
        with (tmp_path / "err.log").open("w") as errlog:
            before = len(server.replies)
            async with client(ws, server.openai_base_url, errlog, budget=f"{budget:.6f}") as session:
                seen["propose"] = data(await call(session, "propose", files={RUBRIC_MD: rubric_with(ws, good)},
                                                  rationale="Check typed text exactly."))
                seen["status"] = data(await call(session, "status"))
            seen["billed"] = billed(server.replies[before:])

    with FakeLLMServer(default=FakeJudge(ws)) as server:
        # The baseline is judged (and cached) first, so the session pays only for the candidate.
        assert main(["eval", "-w", str(ws), "--provider", "openai", "--base-url", server.openai_base_url,
                     "--model", "fake-judge", "--concurrency", "8"]) == 0
        per_item = billed(server.replies) / len(server.replies)
        # The first look is about 15 of the 32 items; re-judging its 4 disagreements would be 160 calls.
        anyio.run(body, server, per_item * 26)
    outcome = seen["propose"]
    assert outcome["outcome"] == "error" and "re-judging incomplete" in outcome["reason"], outcome
    assert 0 < outcome["items_evaluated"] < 32, outcome
    assert seen["billed"] > 0
    assert seen["status"]["budget"]["spent_usd"] == pytest.approx(seen["billed"], abs=1e-5), seen
    runs, exps = ledger_state(ws)
    assert exps[runs[0].id][1].cost_usd == pytest.approx(seen["billed"], abs=1e-5)
    assert_clean(ws)
