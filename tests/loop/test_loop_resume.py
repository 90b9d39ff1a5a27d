"""``kill -9`` mid-evaluation then ``run --resume``, and the interactive ``--propose-only`` / ``decide`` mode.

Same fixtures as tests/loop/test_loop_run.py: fresh copies of an ``init --sample`` workspace whose dev
split is a 32-item subset, a deterministic fake judge, the real openai SDK.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

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
    body_digest,
    futility_off,
    git,
    present,
    run_args,
    run_loop,
    wait_for,
)
from tests.support.processes import killed_cli
from tests.support.scripted import ScriptedStrategy, assert_clean, install, latest, toggle
from tests.support.signals import (
    cache_rows,
    gated_judge,
    kill_hand_edit_then_resume,
    release,
    running_candidate_with_progress,
)


@pytest.mark.slow
def test_kill_9_mid_candidate_then_resume_pays_for_nothing_twice(ws: Path) -> None:
    judge = gated_judge(ws, 10)  # the baseline and 10 candidate calls are answered, then the server stalls
    with FakeLLMServer(default=judge) as server:
        args = run_args(ws, server.openai_base_url, "--strategy", "library", "--max-experiments", "2")

        def mid_candidate() -> None:
            wait_for(lambda: len(judge.answered) >= present(judge.gate_after), "the gated calls", 60)
            wait_for(lambda: running_candidate_with_progress(ws), "a running candidate with progress events")
            # Every answered call is in the cache before the kill (the rest are stuck at the gate).
            wait_for(lambda: cache_rows(ws)[0] == len(judge.answered), "the answered calls to be cached")

        killed_cli(args, mid_candidate)
        answered_before = set(judge.answered)
        assert len(answered_before) == judge.gate_after
        release(judge, abandon=True)  # stalled handlers now answer a dead socket, unrecorded

        _, before = latest(ws)
        interrupted = next(e for e in before if e.status == "running")
        assert interrupted.seq == 1 and interrupted.commit_sha == gitops.rev_parse(ws, "HEAD")

        requests_before = len(server.inference_requests())
        assert run_loop(ws, server.openai_base_url, "--resume") == 0
        resumed_digests = [
            body_digest(r.body) for r in server.inference_requests()[requests_before:] if r.body
        ]
    # No call answered before the kill was paid for again: every one came back from the cache. A
    # re-judging call repeats a request body on purpose (replicate 1 of the same prompt), so the
    # measure is the cache: every answered call is its own cache entry, none answered twice.
    assert set(resumed_digests) - answered_before
    assert len(judge.answered) == cache_rows(ws)[0]

    run, exps = latest(ws)
    assert run.status == "finished" and "max-experiments 2" in (run.stop_reason or "")
    assert not [e for e in exps if e.status == "running"]
    assert [e.seq for e in exps] == [0, 1, 2]
    resumed = next(e for e in exps if e.id == interrupted.id)
    assert resumed.status in ("kept", "rolled_back")
    assert resumed.cache_hits >= 10  # the ten calls answered before the kill
    with Ledger(ws / "experiments" / "ledger.sqlite") as led:
        assert led.get_run(run.id).incumbent_experiment == next(
            e.id for e in reversed(exps) if e.status in ("baseline", "kept")
        )
    expected_tip = next(e.commit_sha for e in reversed(exps) if e.status in ("baseline", "kept"))
    assert gitops.rev_parse(ws, run.branch) == expected_tip
    assert_clean(ws)


@pytest.mark.slow
def test_propose_only_waits_and_decide_keeps_or_discards(
    ws: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    strategy = ScriptedStrategy([toggle(GOOD_ENTRY), toggle(GOOD_ENTRY, BAD_ENTRY)])
    install(monkeypatch, strategy)
    with FakeLLMServer(default=FakeJudge(ws)) as server:
        assert run_loop(ws, server.openai_base_url, "--propose-only") == 0
        run, exps = latest(ws)
        assert run.status == "waiting" and [e.status for e in exps] == ["baseline", "waiting"]
        waiting = exps[1]
        assert gitops.rev_parse(ws, run.branch) == waiting.commit_sha
        assert (
            gitops.parse_trailers(gitops.commit_message(ws, waiting.commit_sha))["Judgeloop-Decision"]
            != "kept"
        )
        assert "the adaptive policy says" in (waiting.reason or "")

        # Nothing else may start while a candidate waits.
        assert run_loop(ws, server.openai_base_url, "--max-experiments", "1") == 2
        assert f"experiment {waiting.id} is waiting" in capsys.readouterr().err

        assert main(["decide", "-w", str(ws), str(waiting.id), "keep"]) == 0
        _, exps = latest(ws)
        kept = exps[1]
        assert kept.status == "kept" and kept.commit_sha != waiting.commit_sha
        assert gitops.rev_parse(ws, run.branch) == kept.commit_sha
        trailers = gitops.parse_trailers(gitops.commit_message(ws, kept.commit_sha))
        assert trailers == {
            "Judgeloop-Experiment": str(kept.id),
            "Judgeloop-Kappa": f"{kept.kappa:.3f}",
            "Judgeloop-FPR": f"{kept.fpr:.3f}",
            "Judgeloop-Decision": "kept",
        }
        assert main(["decide", "-w", str(ws), str(kept.id), "discard"]) == 2  # already decided

        assert run_loop(ws, server.openai_base_url, "--resume", "--propose-only") == 0
        run, exps = latest(ws)
        assert run.status == "waiting" and [e.status for e in exps] == ["baseline", "kept", "waiting"]
        second = exps[2]
        assert second.parent_id == kept.id and gitops.rev_parse(ws, run.branch) == second.commit_sha
        # A human decides on complete evidence: no early stop in propose-only mode, even for an FPR rise.
        assert (
            not second.early_stopped and second.kappa is not None and present(second.fpr) > present(kept.fpr)
        )
        assert second.items_evaluated == 32 and "FPR" in (second.reason or "")

        assert main(["decide", "-w", str(ws), str(second.id), "discard"]) == 0
    _, exps = latest(ws)
    discarded = exps[2]
    assert discarded.status == "rolled_back"
    assert gitops.rejected_refs(ws)[discarded.id] == discarded.commit_sha
    assert (
        gitops.parse_trailers(gitops.commit_message(ws, discarded.commit_sha))["Judgeloop-Decision"]
        == "rolled_back"
    )
    assert gitops.rev_parse(ws, run.branch) == kept.commit_sha
    assert (ws / RUBRIC_MD).read_text(encoding="utf-8") == gitops.read_file_at(ws, kept.commit_sha, RUBRIC_MD)
    assert git(ws, "log", "--format=%H", f"{run.start_rev}..{run.branch}").split() == [kept.commit_sha]
    assert_clean(ws)


@pytest.mark.slow
def test_resume_after_a_crash_keeps_the_optimisers_spend_on_the_experiment(
    ws: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.support.scripted import priced

    strategy = ScriptedStrategy([priced(toggle(GOOD_ENTRY), 0.25)])
    install(monkeypatch, strategy)
    import optimizer.loop.evaluate as loop_module

    real_evaluate = loop_module.evaluate_items
    calls = {"n": 0}

    async def crash_on_the_candidate(*args: Any, **kwargs: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == 2:  # the baseline ran; the candidate's evaluation dies (a crash, not an outage)
            raise RuntimeError("simulated crash mid-evaluation")
        return await real_evaluate(*args, **kwargs)

    with FakeLLMServer(default=FakeJudge(ws)) as server:
        monkeypatch.setattr(loop_module, "evaluate_items", crash_on_the_candidate)
        with pytest.raises(RuntimeError, match="simulated crash"):
            run_loop(ws, server.openai_base_url, "--max-experiments", "1")
        run, exps = latest(ws)
        assert run.status == "crashed" and exps[1].status == "running" and exps[1].cost_usd == 0.25
        monkeypatch.setattr(loop_module, "evaluate_items", real_evaluate)
        assert run_loop(ws, server.openai_base_url, "--resume") == 0
    run, exps = latest(ws)
    assert run.status == "finished" and exps[1].status == "kept"
    assert exps[1].cost_usd == pytest.approx(0.25)  # the optimiser's spend survives the resume
    assert_clean(ws)


@pytest.mark.slow
def test_kill_9_while_rejudging_then_resume_repeats_no_answered_call(ws: Path) -> None:
    from tests.support.scripted import hand_edit

    futility_off(ws)  # the final re-judging after a whole first pass (test_loop_futility.py: a look's)
    judge = FakeJudge(ws)
    n_items = len(judge.neg_rank) + len(judge.pos_rank)
    # The baseline, the candidate's first pass and 5 re-judging calls are answered; then the server stalls.
    judge.gate_after = 2 * n_items + 5
    hand_edit(ws, BAD_ENTRY)  # every positive right, some negatives broken: many items disagree
    with FakeLLMServer(default=judge) as server:
        # Every answered call is its own cache entry: none of the 5 re-judging calls (nor any other) is
        # asked again after the resume, and the re-judging goes on from where it stopped.
        kill_hand_edit_then_resume(ws, judge, server, "rejudging")
    run, exps = latest(ws)
    assert [e.status for e in exps] == ["baseline", "rolled_back"] and run.status == "finished"
    cand = exps[1]
    assert cand.test is not None and cand.rejudge_calls > 0
    n_rejudged = sum(1 for item in cand.test["items"] if item["rejudged"])
    # Both prompts re-judged twice per disagreeing item; 5 of those calls were paid before the kill.
    assert cand.rejudge_calls == 4 * n_rejudged - 5
    assert_clean(ws)


@pytest.mark.slow
def test_kill_9_mid_candidate_then_a_plain_run_closes_the_old_run_and_starts_from_its_last_kept_commit(
    ws: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """No orphans: a plain `run` after a `kill -9` mid-candidate never starts from the undecided candidate's
    commit. It closes the old run first — the candidate rolled back under refs/judgeloop/rejected/<id> with
    its reason, the run marked stopped — and the new run's baseline is the last kept commit (here the old
    run's baseline), judged with the same kappa."""
    judge = gated_judge(ws, 10)  # the baseline and 10 candidate calls are answered, then the server stalls
    with FakeLLMServer(default=judge) as server:
        args = run_args(ws, server.openai_base_url, "--strategy", "library", "--max-experiments", "2")

        def mid_candidate() -> None:
            wait_for(lambda: len(judge.answered) >= present(judge.gate_after), "the gated calls", 60)
            wait_for(lambda: running_candidate_with_progress(ws), "a running candidate with progress events")

        killed_cli(args, mid_candidate)
        release(judge, abandon=True)
        old, before = latest(ws)
        old_base, cut = before
        assert old.status == "running" and cut.status == "running"
        assert cut.commit_sha == gitops.rev_parse(ws, "HEAD") != old_base.commit_sha
        capsys.readouterr()
        assert run_loop(ws, server.openai_base_url, "--strategy", "library", "--max-experiments", "1") == 0
        said = capsys.readouterr().out
    assert f"closed run {old.id}" in said
    with Ledger(ws / "experiments" / "ledger.sqlite") as led:
        closed = led.get_run(old.id)
        cut_after = led.get_experiment(cut.id)
        new = next(r for r in led.runs() if r.id != old.id)
        new_base = led.experiments(new.id)[0]
    assert closed.status == "stopped" and "closed" in (closed.stop_reason or "")
    assert cut_after.status == "error" and "rolled back" in (cut_after.reason or "")
    assert gitops.rejected_refs(ws)[cut.id] == cut.commit_sha
    assert new.start_rev == old_base.commit_sha != cut.commit_sha
    assert new_base.seq == 0 and new_base.commit_sha == old_base.commit_sha
    assert new_base.kappa == old_base.kappa
    assert_clean(ws)


@pytest.mark.slow
def test_decide_refuses_a_waiting_candidate_under_a_commit_the_loop_did_not_make(
    ws: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The loop trusts only its commits at `decide` too: an agent with a shell commits on the run branch over
    the waiting candidate (a dev id in rubric.md); `judgeloop decide N keep` is refused in one line naming
    that commit, nothing is decided or reset (the agent's commit stays the tip), and once a person puts the
    branch back the same decision goes through."""
    install(monkeypatch, ScriptedStrategy([toggle(GOOD_ENTRY)]))
    with FakeLLMServer(default=FakeJudge(ws)) as server:
        assert run_loop(ws, server.openai_base_url, "--propose-only") == 0
    run, exps = latest(ws)
    base, waiting = exps
    assert waiting.status == "waiting" and gitops.rev_parse(ws, run.branch) == waiting.commit_sha
    rubric = ws / RUBRIC_MD
    rubric.write_text(
        rubric.read_text(encoding="utf-8") + "\n- Item ahd-0001 is a failure.\n", encoding="utf-8"
    )
    git(ws, "commit", "-q", "-a", "-m", "remember a hard case")
    slipped = gitops.rev_parse(ws, "HEAD")
    capsys.readouterr()
    assert main(["decide", "-w", str(ws), str(waiting.id), "keep"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in err[0], err
    assert f'{slipped[:12]} "remember a hard case"' in err[0] and "nothing was judged or committed" in err[0]
    assert f"on top of its incumbent {present(base.commit_sha)[:12]}" in err[0], err
    # The loop's own waiting commit is not named as foreign, and the advice resets the branch to it.
    assert present(waiting.commit_sha)[:12] not in err[0].split("nothing was judged")[0], err
    assert f"git reset --hard {present(waiting.commit_sha)[:12]}`" in err[0], err
    _, after = latest(ws)
    assert [e.status for e in after] == ["baseline", "waiting"]
    assert gitops.rev_parse(ws, run.branch) == slipped, "a refused decide reset the branch over a commit"
    assert gitops.rejected_refs(ws) == {}
    # A person puts the branch back (their commit kept elsewhere): the decision is the loop's again.
    git(ws, "branch", "mine", slipped)
    git(ws, "reset", "-q", "--hard", present(waiting.commit_sha))
    assert main(["decide", "-w", str(ws), str(waiting.id), "keep"]) == 0, capsys.readouterr().err
    _, decided = latest(ws)
    assert decided[1].status == "kept" and gitops.rev_parse(ws, run.branch) == decided[1].commit_sha
    assert "ahd-0001" not in rubric.read_text(encoding="utf-8")
    assert_clean(ws)
