"""`judgeloop mcp` through the MCP SDK's own client: `stdio_client` spawns the real command over stdio and
a `ClientSession` drives it, as Claude Code or Codex would. The judge is the deterministic fake judge
(OpenAI wire, through the real SDK); the MCP client plays the coding agent.

Every server is a child of `stdio_client`, which closes its stdin and kills it at the end of the
``async with``; every call is bounded by `anyio.fail_after`.
"""

from __future__ import annotations

import itertools
import os
import re
import signal
import threading
from pathlib import Path
from typing import Any

import anyio
import pytest

from optimizer.cli import main
from optimizer.judge.prompts import RUBRIC_MD
from optimizer.ledger import Ledger
from optimizer.workspace import gitops
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
    wait_for,
)
from tests.support.mcp_client import KEY, Progress, call, client, conforms, data, drive, judged_session, text
from tests.support.mcp_workspace import ledger_state, library_text, make_mcp_template, rubric_with
from tests.support.scripted import assert_clean


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A sample workspace: the 32-item dev split ``small`` and a held-out split ``held`` of 4 other items."""
    return make_mcp_template(tmp_path_factory.mktemp("template"))


@pytest.mark.slow
def test_a_client_session_drives_status_disagreements_propose_and_decide_end_to_end(
    ws: Path, tmp_path: Path
) -> None:
    labels = labels_of(ws)
    good, bad = library_text(ws, GOOD_ENTRY), library_text(ws, BAD_ENTRY)
    start = gitops.rev_parse(ws, "HEAD")
    seen: dict[str, Any] = {}

    async def body() -> None:
        async with judged_session(ws, tmp_path) as session:
            tools = {t.name: t for t in (await session.list_tools()).tools}
            seen["tools"] = tools
            seen["results"] = results = []

            async def structured(
                name: str, collect: Progress | None = None, **arguments: Any
            ) -> dict[str, Any]:
                result = await call(session, name, collect, **arguments)
                results.append((name, result))
                return data(result)

            status = await structured("status")
            assert status["incumbent"] is None and status["budget"]["budget_usd"] == 100
            assert status["split"] == "small" and status["items"] == len(labels)
            seen["baseline_progress"] = []
            listing = data(await call(session, "disagreements", collect=seen["baseline_progress"]))
            seen["listing"] = listing
            assert (await structured("status"))["baseline"] is not None
            first = listing["items"][0]["trajectory_id"]
            item = data(await call(session, "read_item", trajectory_id=first))
            assert item["disagreement"]["trajectory_id"] == first and item["steps"] > 0
            steps = await call(session, "read_steps", trajectory_id=first, start=0, end=2)
            assert not steps.is_error and "step 0:" in text(steps)
            rubric = text(await call(session, "read_file", path=RUBRIC_MD))
            assert rubric == (ws / RUBRIC_MD).read_text(encoding="utf-8")
            seen["propose_progress"] = []
            kept = await structured(
                "propose",
                seen["propose_progress"],
                files={RUBRIC_MD: rubric_with(ws, good)},
                rationale="Check that typed text matches the request exactly.",
            )
            seen["kept"] = kept
            # The reading tools' context follows the new incumbent (built once per incumbent, not stale).
            seen["after_keep"] = data(await call(session, "disagreements"))
            # A change that raises FPR, evaluated in full and left to the client: it discards it.
            waiting = await structured(
                "propose",
                files={RUBRIC_MD: rubric_with(ws, bad)},
                rationale="Accept saved work when it was confirmed.",
                propose_only=True,
            )
            seen["waiting"] = waiting
            again = await call(session, "propose", files={RUBRIC_MD: rubric}, rationale="anything")
            assert again.is_error and f"experiment {waiting['experiment']} is waiting" in text(again)
            seen["decided"] = await structured("decide", experiment=waiting["experiment"], decision="discard")
            seen["attribute_progress"] = []
            seen["attribution"] = data(await call(session, "attribute", collect=seen["attribute_progress"]))
            seen["history"] = await structured("history")
            seen["report"] = await structured("report")

    drive(body)
    # The baseline's judging reached the client as MCP progress, ending with every item judged.
    assert seen["baseline_progress"] and seen["baseline_progress"][-1][:2] == (len(labels), len(labels))
    assert all(m is not None and m.startswith("judge ") for _, _, m in seen["baseline_progress"])
    # Within one call, over every pass (the first pass, re-judging, attribution's evaluations), progress
    # only increases, and each notification is at least one more item judged.
    for key in ("baseline_progress", "propose_progress", "attribute_progress"):
        values = [p for p, _, _ in seen[key]]
        assert values and all(b > a for a, b in itertools.pairwise(values)), (key, seen[key])
        assert len(values) <= values[-1], (key, seen[key])
        assert all(total is not None and p <= total for p, total, _ in seen[key]), (key, seen[key])
    assert {
        "status",
        "history",
        "disagreements",
        "read_item",
        "read_steps",
        "view_screenshot",
        "propose",
        "decide",
        "report",
    } <= set(seen["tools"])
    # The listing is the agent strategy's: every item the baseline got wrong, each with its direction.
    runs, exps = ledger_state(ws)
    (run,) = runs
    baseline, cand1, cand2 = exps[run.id]
    with Ledger(ws / "experiments" / "ledger.sqlite") as led:
        wrong = {
            v.trajectory_id
            for v in led.item_verdicts(baseline.id)
            if v.success != labels[v.trajectory_id].is_positive
        }
    listed = seen["listing"]["items"]
    assert wrong and {i["trajectory_id"] for i in listed} == wrong
    with Ledger(ws / "experiments" / "ledger.sqlite") as led:
        wrong_after = {
            v.trajectory_id
            for v in led.item_verdicts(cand1.id)
            if v.success != labels[v.trajectory_id].is_positive
        }
    assert {i["trajectory_id"] for i in seen["after_keep"]["items"]} == wrong_after != wrong
    assert all(
        (i["direction"] == "missed_failure") == (not labels[i["trajectory_id"]].is_positive) for i in listed
    )
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
    assert good in (ws / RUBRIC_MD).read_text(encoding="utf-8") and bad not in (ws / RUBRIC_MD).read_text(
        "utf-8"
    )
    assert set(gitops.rejected_refs(ws)) == {cand2.id}
    # Every structured answer conforms to its tool's output schema; history and report name each candidate.
    assert {name for name, _ in seen["results"]} == {"status", "propose", "decide", "history", "report"}
    for name, result in seen["results"]:
        conforms(seen["tools"][name], result)
    history, report = seen["history"], seen["report"]
    assert [(e["experiment"], e["outcome"]) for e in history["experiments"]] == [
        (cand1.id, "kept"),
        (cand2.id, "rolled_back"),
    ]
    assert history["experiments"][0]["diff"] and history["incumbent"] == cand1.id
    assert (
        history["experiments"][0]["kappa"] == kept["kappa"]
        and history["experiments"][0]["flips"] == kept["flips"]
    )
    assert report["run"] == run.id and report["kept"] == [cand1.id] and run.id in report["text"]
    assert [e["experiment"] for e in report["experiments"]] == [baseline.id, cand1.id, cand2.id]
    assert seen["decided"]["kappa"]["candidate"] == cand2.kappa and seen["decided"]["said"]
    # The kept edit's contribution, measured on the dev split and recorded under the session's run.
    attribution = seen["attribution"]
    assert attribution["status"] == "complete" and [e["experiment"] for e in attribution["attribution"]] == [
        cand1.id
    ]
    with Ledger(ws / "experiments" / "ledger.sqlite") as led:
        recorded = led.latest_attribution(run.id)
    assert recorded is not None and recorded.id == attribution["attribution_meta"]["id"]
    assert (ws / "experiments" / "runs" / run.id / "report.md").is_file()
    assert_clean(ws)


@pytest.mark.slow
def test_the_budget_refuses_what_would_cross_it_and_names_what_is_left(
    ws: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", KEY)  # the in-process `eval`
    cfg = ws / "judgeloop.toml"
    cfg.write_text(
        cfg.read_text(encoding="utf-8") + '\n[prices."fake-judge"]\ninput = 10.0\noutput = 10.0\n',
        encoding="utf-8",
    )
    commit_all(ws, "prices")
    good = library_text(ws, GOOD_ENTRY)
    seen: dict[str, Any] = {}

    async def body(server: FakeLLMServer) -> None:
        with (tmp_path / "err.log").open("w") as errlog:
            paid_before = len(server.inference_requests())
            async with client(ws, server.openai_base_url, errlog, budget="0.0001") as session:
                data(await call(session, "disagreements"))
                seen["first"] = data(
                    await call(
                        session,
                        "propose",
                        files={RUBRIC_MD: rubric_with(ws, good)},
                        rationale="Check typed text exactly.",
                    )
                )
                seen["second"] = await call(
                    session,
                    "propose",
                    files={RUBRIC_MD: rubric_with(ws, good + " Always.")},
                    rationale="Again.",
                )
                seen["status"] = data(await call(session, "status"))
            seen["paid"] = len(server.inference_requests()) - paid_before

    with FakeLLMServer(default=FakeJudge(ws)) as server:
        # The baseline is judged (and cached) first, so the session's baseline costs nothing.
        assert (
            main(
                [
                    "eval",
                    "-w",
                    str(ws),
                    "--provider",
                    "openai",
                    "--base-url",
                    server.openai_base_url,
                    "--model",
                    "fake-judge",
                    "--concurrency",
                    "8",
                ]
            )
            == 0
        )
        anyio.run(body, server)
    # No judge call could fit: none was made, the candidate is recorded as not decided and rolled back.
    assert seen["paid"] == 0
    first = seen["first"]
    assert first["outcome"] == "error" and "budget" in first["reason"] and first["budget"]["spent_usd"] == 0
    second = seen["second"]
    assert second.is_error
    assert re.search(
        r"budget: a new candidate is refused: spent \$0\.0000 of the session's \$0\.0001 budget, "
        r"\$0\.0001 left",
        text(second),
    ), text(second)
    assert seen["status"]["budget"]["stopped"] is not None
    runs, exps = ledger_state(ws)
    assert [e.status for e in exps[runs[0].id]] == ["baseline", "error"]  # the refused call recorded nothing
    assert gitops.rev_parse(ws, "HEAD") == exps[runs[0].id][0].commit_sha
    assert_clean(ws)


@pytest.mark.slow
def test_a_budget_too_small_for_the_baseline_stops_it_uncrossed_and_refuses_what_follows(
    ws: Path, tmp_path: Path
) -> None:
    cfg = ws / "judgeloop.toml"
    cfg.write_text(
        cfg.read_text(encoding="utf-8") + '\n[prices."fake-judge"]\ninput = 10.0\noutput = 10.0\n',
        encoding="utf-8",
    )
    commit_all(ws, "prices")
    seen: dict[str, Any] = {}

    async def body() -> None:
        async with judged_session(ws, tmp_path, budget="0.3") as session:
            seen["listing"] = await call(session, "disagreements")
            seen["propose"] = await call(
                session, "propose", files={RUBRIC_MD: rubric_with(ws, "Be exact.")}, rationale="exact"
            )
            seen["status"] = data(await call(session, "status"))

    drive(body)
    listing = seen["listing"]
    assert (
        listing.is_error
        and "the baseline could not be evaluated" in text(listing)
        and "budget" in text(listing)
    )
    assert seen["propose"].is_error and "budget: a new candidate is refused" in text(seen["propose"])
    runs, exps = ledger_state(ws)
    (baseline,) = exps[runs[0].id]
    # Some calls were paid, none crossed the budget, and the session's figure is the ledger's.
    assert 0 < baseline.cost_usd <= 0.3 + 1e-9 and baseline.status == "error"
    assert seen["status"]["budget"]["spent_usd"] == pytest.approx(baseline.cost_usd)
    assert gitops.rev_parse(ws, "HEAD") == runs[0].start_rev
    assert_clean(ws)


@pytest.mark.slow
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
                        seen["killed_call"] = await call(
                            session,
                            "propose",
                            files={RUBRIC_MD: rubric_with(ws, good)},
                            rationale="Check typed text.",
                        )
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
                seen["before_run"] = data(await call(session, "status"))
                data(await call(session, "disagreements"))  # the session's run starts here (lazily)
                seen["status"] = data(await call(session, "status"))

    drive(body)
    assert seen["before_run"]["run"] is None
    assert "killed_call" not in seen or seen["killed_call"].is_error
    runs, exps = seen["after_kill"]
    (killed,) = runs
    assert killed.status == "running"  # as a killed run: every state change before the kill is on record
    assert [e.status for e in exps[killed.id]] == ["baseline", "running"]
    assert (
        seen["resume"][0] == 2
        and f"run {killed.id} was a `judgeloop mcp` session that was killed" in seen["resume"][1]
    )
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


@pytest.mark.slow
def test_a_client_that_leaves_while_a_candidate_waits_leaves_it_decidable_by_judgeloop_decide(
    ws: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """No orphans: the session's end resets the branch to the incumbent, but the waiting candidate's commit
    stays under refs/judgeloop/waiting/<id>, and `judgeloop decide N keep` keeps it (a person agreeing with
    the policy: no overrule)."""
    good = library_text(ws, GOOD_ENTRY)
    seen: dict[str, Any] = {}

    async def body() -> None:
        async with judged_session(ws, tmp_path) as session:
            data(await call(session, "disagreements"))
            seen["waiting"] = data(
                await call(
                    session,
                    "propose",
                    files={RUBRIC_MD: rubric_with(ws, good)},
                    rationale="Check typed text exactly.",
                    propose_only=True,
                )
            )

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
    assert gitops.read_file_at(ws, present(kept.commit_sha), RUBRIC_MD) == (ws / RUBRIC_MD).read_text(
        encoding="utf-8"
    )
    assert good in (ws / RUBRIC_MD).read_text(encoding="utf-8")
    assert git(ws, "for-each-ref", "refs/judgeloop/waiting/").strip() == ""
    assert_clean(ws)


@pytest.mark.slow
def test_when_re_judging_at_a_look_hits_the_budget_the_session_spend_is_every_billed_call(
    ws: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Futility's first look is judged and paid, then re-judging its disagreements (20 more judgements
    under each prompt) runs into the session's budget. The session's spend (status) is what the fake
    server billed for every call of the session, first look included; it used to leave out the look."""
    monkeypatch.setenv("OPENAI_API_KEY", KEY)  # the in-process `eval`
    cfg = ws / "judgeloop.toml"
    cfg.write_text(
        cfg.read_text(encoding="utf-8") + '\n[prices."fake-judge"]\ninput = 10.0\noutput = 10.0\n',
        encoding="utf-8",
    )
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
                seen["propose"] = data(
                    await call(
                        session,
                        "propose",
                        files={RUBRIC_MD: rubric_with(ws, good)},
                        rationale="Check typed text exactly.",
                    )
                )
                seen["status"] = data(await call(session, "status"))
            seen["billed"] = billed(server.replies[before:])

    with FakeLLMServer(default=FakeJudge(ws)) as server:
        # The baseline is judged (and cached) first, so the session pays only for the candidate.
        assert (
            main(
                [
                    "eval",
                    "-w",
                    str(ws),
                    "--provider",
                    "openai",
                    "--base-url",
                    server.openai_base_url,
                    "--model",
                    "fake-judge",
                    "--concurrency",
                    "8",
                ]
            )
            == 0
        )
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
