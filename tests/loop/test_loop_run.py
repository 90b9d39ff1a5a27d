"""End-to-end tests of ``judgeloop run`` through the real openai SDK against the fake server.

Every test works in a fresh copy of one ``init --sample`` workspace (text-only requests) and a
deterministic fake judge (tests/support/loop.py): its answers depend only on the trajectory and
on which library entries the system prompt contains, so the tests know which candidates must be
kept and which must be rolled back.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from optimizer.devset.split import open_split
from optimizer.judge.prompts import RUBRIC_MD
from optimizer.ledger import Run
from optimizer.loop.strategies import Proposal, ProposalContext, ProposalError
from optimizer.stats.metrics import Answer, score
from optimizer.workspace import gitops
from tests.support.fakeserver import Behaviour, FakeLLMServer, RecordedRequest, Usage, reply
from tests.support.loop import (
    BAD_ENTRY,
    GOOD_ENTRY,
    FakeJudge,
    commit_all,
    futility_off,
    git,
    present,
    report_json,
    run_loop,
    set_toml_key,
)
from tests.support.scripted import (
    ScriptedStrategy,
    add_heldout_split,
    assert_clean,
    assert_no_kept_candidate_raised_fpr,
    install,
    latest,
    ledger_of,
    priced,
    toggle,
)

# -- the full library run --------------------------------------------------------------------------


@pytest.mark.slow
def test_library_run_git_ledger_and_report_agree(ws: Path, capsys: pytest.CaptureFixture[str]) -> None:
    set_toml_key(
        ws, "workspace", "dev_split", '"sample"'
    )  # the whole bundled sample, as after `init --sample`
    commit_all(ws, "dev split: sample")
    judge = FakeJudge(ws)
    with FakeLLMServer(default=judge) as server:
        assert run_loop(ws, server.openai_base_url, "--strategy", "library", "--max-experiments", "3") == 0
    run, exps = latest(ws)
    assert run.status == "finished" and "max-experiments 3" in (run.stop_reason or "")
    assert [e.seq for e in exps] == [0, 1, 2, 3] and exps[0].status == "baseline"
    statuses = {e.status for e in exps[1:]}
    # The judge is built so the library's first move (GOOD_ENTRY) is a real improvement.
    assert "kept" in statuses and "rolled_back" in statuses

    # The branch holds the start revision's history plus only the kept candidates, with final trailers.
    log = gitops.branch_log(ws, run.branch, since=run.start_rev)
    kept = [e for e in exps if e.status == "kept"]
    assert [sha for sha, _ in log] == [e.commit_sha for e in reversed(kept)]
    for (_sha, message), exp in zip(log, reversed(kept), strict=True):
        trailers = gitops.parse_trailers(message)
        assert trailers["Judgeloop-Experiment"] == str(exp.id)
        assert trailers["Judgeloop-Decision"] == "kept"
        assert trailers["Judgeloop-Kappa"] == f"{exp.kappa:.3f}"
        assert trailers["Judgeloop-FPR"] == f"{exp.fpr:.3f}"
    assert gitops.rev_parse(ws, run.branch) == (kept[-1].commit_sha if kept else run.start_rev)

    # Every rolled-back candidate is preserved under refs/judgeloop/rejected/<id>, off the branch.
    rejected = gitops.rejected_refs(ws)
    rolled = [e for e in exps if e.status in ("rolled_back", "error")]
    assert set(rejected) == {e.id for e in rolled}
    for exp in rolled:
        assert rejected[exp.id] == exp.commit_sha
        trailers = gitops.parse_trailers(gitops.commit_message(ws, exp.commit_sha))
        assert trailers["Judgeloop-Decision"] == "rolled_back"
        assert trailers["Judgeloop-Experiment"] == str(exp.id)
        ancestor = git(ws, "branch", "--contains", exp.commit_sha).strip()
        assert run.branch not in ancestor

    # report --json agrees with both: ids, decisions and commits, baseline first.
    report = report_json(ws, capsys, "--run", run.id)
    assert report["run"] == run.id and report["branch"] == run.branch and report["policy"] == "adaptive"
    assert [(x["id"], x["decision"], x["commit"]) for x in report["experiments"]] == [
        (e.id, e.status, e.commit_sha) for e in exps
    ]
    assert report["experiments"][0]["decision"] == "baseline" and report["experiments"][0]["parent"] is None
    assert_no_kept_candidate_raised_fpr(ws)
    assert_clean(ws)


# -- decisions -------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["paired", "adaptive"])
def test_kappa_gain_is_kept_and_fpr_rise_is_rolled_back(
    ws: Path, monkeypatch: pytest.MonkeyPatch, policy: str
) -> None:
    judge = FakeJudge(ws)
    # BAD_ENTRY alone would *raise* kappa (it fixes every false negative) — only the FPR guard stops it.
    labels = judge.labels

    def full_kappa(enabled: set[str]) -> tuple[float, float]:
        answers = {
            t: Answer(success=lab.is_positive if judge.correct(t, enabled) else not lab.is_positive)
            for t, lab in labels.items()
        }
        m = score(labels, answers)
        return present(m.kappa), present(m.fpr)

    base_kappa, base_fpr = full_kappa(set())
    bad_kappa, bad_fpr = full_kappa({BAD_ENTRY})
    assert bad_kappa > base_kappa and bad_fpr > base_fpr
    futility_off(ws)  # adaptive judged in full (tests/loop/test_loop_futility.py: the same edit screened)

    strategy = ScriptedStrategy([toggle(BAD_ENTRY), toggle(GOOD_ENTRY), toggle(GOOD_ENTRY, BAD_ENTRY)])
    install(monkeypatch, strategy)
    with FakeLLMServer(default=judge) as server:
        assert run_loop(ws, server.openai_base_url, "--max-experiments", "3", "--policy", policy) == 0
    run, exps = latest(ws)
    base, bad, good, both = exps
    assert bad.status == "rolled_back" and "FPR rose" in (bad.reason or "")
    if policy == "paired":  # negatives first: stopped as soon as the false positives were certain
        assert bad.early_stopped and bad.rejudge_calls == 0
    else:  # re-judging could still have overturned any first-pass false positive: judged in full
        assert not bad.early_stopped and bad.rejudge_calls > 0 and bad.test is not None
        assert good.adaptive_keep and good.test is not None and good.test["p_value"] < 0.1
    assert (
        good.status == "kept"
        and present(good.kappa) > present(base.kappa)
        and present(good.fpr) < present(base.fpr)
    )
    assert good.parent_id == base.id
    assert both.status == "rolled_back" and both.parent_id == good.id and "FPR" in (both.reason or "")
    with ledger_of(ws) as led:
        assert led.get_run(run.id).incumbent_experiment == good.id
    assert present(gitops.read_file_at(ws, run.branch, RUBRIC_MD)).count(judge.entry_text[GOOD_ENTRY]) == 1
    assert judge.entry_text[BAD_ENTRY] not in present(gitops.read_file_at(ws, run.branch, RUBRIC_MD))
    assert_no_kept_candidate_raised_fpr(ws)
    assert_clean(ws)


# -- guards ----------------------------------------------------------------------------------------


@pytest.mark.slow
def test_guard_rejections_spend_no_judge_call_and_the_run_continues(
    ws: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from optimizer.workspace.workspace import Workspace

    judge = FakeJudge(ws)
    split = open_split(Workspace.open(ws), Workspace.open(ws).config.workspace.dev_split)
    instructions = [split.trajectory(t).task.instruction for t in split.ids]
    long_instruction = next(i for i in instructions if len(i.split()) >= 10)

    def outside(ctx: ProposalContext) -> Proposal:
        return Proposal(
            files={"prompts/judge.toml": 'mode = "direct"\nreplicates = 3\n'}, rationale="outside"
        )

    def copies_instruction(ctx: ProposalContext) -> Proposal:
        rubric = ctx.current_files[RUBRIC_MD] + f"\n- Remember the task: {long_instruction}\n"
        return Proposal(files={RUBRIC_MD: rubric}, rationale="copy a dev instruction")

    def touches_protected(ctx: ProposalContext) -> Proposal:
        text = ctx.current_files["prompts/judge.md"]
        begin = text.index("<!-- judgeloop:protected:begin -->")
        end = text.index("<!-- judgeloop:protected:end -->")
        inside = text[begin:end]
        changed = inside.replace("success", "succes", 1)
        assert changed != inside
        return Proposal(
            files={"prompts/judge.md": text[:begin] + changed + text[end:]}, rationale="protected"
        )

    with FakeLLMServer(default=judge) as server:
        strategy = ScriptedStrategy(
            [outside, copies_instruction, touches_protected, toggle(GOOD_ENTRY)], server
        )
        install(monkeypatch, strategy)
        assert run_loop(ws, server.openai_base_url, "--max-experiments", "4") == 0
        total = len(server.inference_requests())
    _run, exps = latest(ws)
    assert [e.status for e in exps] == [
        "baseline",
        "guard_rejected",
        "guard_rejected",
        "guard_rejected",
        "kept",
    ]
    # judge.toml is a structure move's file: with [optimizer] structure_moves empty, its edit is refused.
    assert "structure_moves is empty (structure moves are off)" in present(exps[1].reason)
    assert "copies" in present(exps[2].reason) and "dev instruction" in present(exps[2].reason)
    assert "protected region" in present(exps[3].reason)
    # The request count did not move between the baseline and the first real candidate.
    baseline_calls = exps[0].calls
    assert strategy.request_counts == [baseline_calls] * 4
    assert all(e.calls == 0 and e.commit_sha is None for e in exps[1:4])
    assert total == baseline_calls + exps[4].calls
    # Nothing rejected by a guard was written or committed.
    assert set(gitops.rejected_refs(ws)) == set()
    assert "replicates = 3" not in (ws / "prompts" / "judge.toml").read_text(encoding="utf-8")
    assert_clean(ws)


@pytest.mark.slow
def test_each_experiment_records_exactly_the_events_of_what_happened_to_it(
    ws: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One decision event per experiment, when its outcome is recorded; committing a candidate and
    starting its evaluation is not a decision (the TUI's strip would read "decided: running")."""

    def outside(ctx: ProposalContext) -> Proposal:
        return Proposal(files={"prompts/judge.toml": 'mode = "direct"\n'}, rationale="outside")

    def fails(ctx: ProposalContext) -> Proposal:
        raise ProposalError("the optimiser's model is down", calls=1, cost_usd=0.01)

    strategy = ScriptedStrategy([outside, fails, toggle(GOOD_ENTRY)])
    install(monkeypatch, strategy)
    futility_off(
        ws
    )  # one evaluating stage, then one re-judging (the looks add theirs: test_loop_futility.py)
    with FakeLLMServer(default=FakeJudge(ws)) as server:
        assert run_loop(ws, server.openai_base_url, "--max-experiments", "3") == 0
    run, exps = latest(ws)
    assert [e.status for e in exps] == ["baseline", "guard_rejected", "error", "kept"]
    with ledger_of(ws) as led:
        events = [e for e in led.events_since(0, run_id=run.id) if e.kind != "progress"]
    happened = {
        exp.id: [
            (e.kind, e.payload.get("stage") or e.payload.get("status"))
            for e in events
            if e.experiment_id == exp.id
        ]
        for exp in exps
    }
    base, rejected, failed, kept = (e.id for e in exps)
    assert happened[base] == [
        ("stage", "experiment_started"),
        ("stage", "baseline"),
        ("decision", "baseline"),
    ]
    assert happened[rejected] == [
        ("stage", "experiment_started"),
        ("stage", "guards"),
        ("decision", "guard_rejected"),
    ]
    assert happened[failed] == [("stage", "experiment_started"), ("decision", "error")]
    # (The adaptive policy re-judges the items the two prompts disagree on.)
    assert happened[kept] == [
        ("stage", "experiment_started"),
        ("stage", "guards"),
        ("stage", "evaluating"),
        ("stage", "rejudging"),
        ("decision", "kept"),
    ]
    # The rows are what they were: the rejection and the failure cost the optimiser's spend only.
    assert exps[2].cost_usd == 0.01 and exps[2].calls == 0 and "optimiser failed" in (exps[2].reason or "")
    assert exps[3].decision == "kept" and exps[3].finished is not None and exps[3].calls > 0


@pytest.mark.slow
def test_the_library_gets_its_tried_sets_back_from_the_ledger_as_data(
    ws: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from optimizer.judge.prompts import enabled_entries
    from optimizer.loop.strategies.library import LibraryStrategy

    contexts: list[ProposalContext] = []

    class Recording(LibraryStrategy):
        async def propose(self, ctx: ProposalContext) -> Proposal:
            contexts.append(ctx)
            return await super().propose(ctx)

    monkeypatch.setattr("optimizer.loop.session.make_strategy", lambda *a, **k: Recording())
    with FakeLLMServer(default=FakeJudge(ws)) as server:
        assert run_loop(ws, server.openai_base_url, "--max-experiments", "2") == 0
    _, exps = latest(ws)
    first = exps[1]
    rubric = git(ws, "show", f"{first.commit_sha}:{RUBRIC_MD}")
    assert first.proposal_meta == {"library_enabled": sorted(enabled_entries(rubric))}
    assert "[library:" not in (first.rationale or "")  # no machine tag in the prose any more
    # The second proposal's history holds the first one's record, read back from the ledger.
    (past,) = contexts[1].history
    assert past.id == first.id and past.meta == first.proposal_meta


@pytest.mark.slow
def test_a_new_library_run_from_the_same_prompts_does_not_repeat_what_an_earlier_run_decided(
    ws: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A new user's second `judgeloop run` (the demo's "three more candidates") used to re-propose the
    # very sets the first run had rolled back from the same prompts, answered from the cache.
    with FakeLLMServer(default=FakeJudge(ws)) as server:
        assert run_loop(ws, server.openai_base_url, "--strategy", "library", "--max-experiments", "3") == 0
        first_run, first = latest(ws)
        git(ws, "checkout", "-q", first_run.branch)
        assert run_loop(ws, server.openai_base_url, "--strategy", "library", "--max-experiments", "3") == 0
        second_run, second = latest(ws)
    assert second_run.id != first_run.id

    def tried(exps: list[Any]) -> set[tuple[str | None, tuple[str, ...]]]:
        by_id = {e.id: e for e in exps}
        return {
            (
                gitops.prompts_tree(ws, by_id[e.parent_id].commit_sha),
                tuple(e.proposal_meta["library_enabled"]),
            )
            for e in exps
            if e.seq > 0 and e.parent_id in by_id and e.decision in {"kept", "rolled_back"}
        }

    assert tried(second) and not tried(first) & tried(second)


# -- failures that must not stop the run ----------------------------------------------------------


@pytest.mark.slow
def test_malformed_optimiser_reply_is_recorded_and_the_run_continues(
    ws: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def malformed(ctx: ProposalContext) -> Proposal:
        raise ProposalError(
            "the optimiser's reply was not valid JSON", calls=1, input_tokens=10, output_tokens=3
        )

    strategy = ScriptedStrategy([malformed, toggle(GOOD_ENTRY)])
    install(monkeypatch, strategy)
    with FakeLLMServer(default=FakeJudge(ws)) as server:
        assert run_loop(ws, server.openai_base_url, "--max-experiments", "2") == 0
    run, exps = latest(ws)
    assert run.status == "finished"
    assert [e.status for e in exps] == ["baseline", "error", "kept"]
    assert "not valid JSON" in present(exps[1].reason) and exps[1].commit_sha is None
    # What the failed proposal spent is the optimiser's, recorded apart from the judge's (none).
    assert (exps[1].optimizer_calls, exps[1].optimizer_input_tokens, exps[1].optimizer_output_tokens) == (
        1,
        10,
        3,
    )
    assert exps[1].calls == 0 and exps[1].input_tokens == 0
    assert_clean(ws)


@pytest.mark.slow
def test_an_llm_optimiser_run_records_its_usage_apart_from_the_judges(
    ws: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``reflect`` through the real openai SDK and the fake server: the optimiser's calls, tokens and
    dollars land in their own columns; the row's calls/tokens stay the judge's; cost_usd is the total."""
    optimiser_usage = Usage(input_tokens=1000, output_tokens=200, cache_read_tokens=300)
    edit = json.dumps(
        {
            "file": "prompts/rubric.md",
            "section_heading": "## Telling the types apart",
            "new_section": "## Telling the types apart\n\nName the type that explains the first wrong step.",
            "rationale": "A simpler rule for naming the mistake type.",
        }
    )
    judge = FakeJudge(ws)

    def answer(request: RecordedRequest) -> Behaviour:
        return reply(edit, usage=optimiser_usage) if request.model == "opt-model" else judge(request)

    cfg = ws / "judgeloop.toml"
    cfg.write_text(
        cfg.read_text(encoding="utf-8") + '\n[prices."fake-judge"]\ninput = 10.0\noutput = 10.0\n'
        '\n[prices."opt-model"]\ninput = 3.0\noutput = 15.0\ncache_read = 0.3\n',
        encoding="utf-8",
    )
    with FakeLLMServer(default=answer) as server:
        set_toml_key(ws, "optimizer", "provider", '"openai"')
        set_toml_key(ws, "optimizer", "model", '"opt-model"')
        text = cfg.read_text(encoding="utf-8")
        cfg.write_text(
            text.replace("[optimizer]\n", f'[optimizer]\nbase_url = "{server.openai_base_url}"\n', 1),
            encoding="utf-8",
        )
        commit_all(ws, "reflect through the fake server")
        assert run_loop(ws, server.openai_base_url, "--strategy", "reflect", "--max-experiments", "1") == 0
        requests = server.inference_requests()
    run, exps = latest(ws)
    assert run.status == "finished" and [e.seq for e in exps] == [0, 1]
    baseline, candidate = exps
    # The fake judge answers by the library entries in its prompt; the edit names none, so nothing changes.
    assert candidate.status == "rolled_back" and candidate.items_evaluated > 0, candidate.reason
    optimiser_requests = [r for r in requests if r.model == "opt-model"]
    judge_requests = [r for r in requests if r.model == "fake-judge"]
    assert len(optimiser_requests) == 1
    # (an early stop may abandon calls already sent: the ledger counts the answered ones)
    assert 0 < baseline.calls + candidate.calls <= len(judge_requests) and candidate.calls > 0

    # The optimiser's own columns, in the providers' token convention (cached prompt tokens apart).
    assert (
        candidate.optimizer_calls,
        candidate.optimizer_input_tokens,
        candidate.optimizer_output_tokens,
    ) == (1, 1000, 200)
    optimiser_cost = (1000 * 3.0 + 300 * 0.3 + 200 * 15.0) / 1e6
    assert candidate.optimizer_cost_usd == pytest.approx(optimiser_cost)
    # The row's calls and tokens are the judge's alone; its cost is judge + optimiser.
    judge_cost = (candidate.input_tokens + candidate.output_tokens) * 10.0 / 1e6
    assert candidate.judge_cost_usd == pytest.approx(judge_cost)
    assert candidate.cost_usd == pytest.approx(judge_cost + optimiser_cost)
    assert baseline.optimizer_calls == 0 and baseline.optimizer_cost_usd == 0.0

    data = report_json(ws, capsys)
    row = next(r for r in data["experiments"] if r["id"] == candidate.id)
    assert row["calls"] == candidate.calls and row["optimizer_calls"] == 1
    assert row["optimizer_cost_usd"] == pytest.approx(optimiser_cost)
    assert row["cost_usd"] == pytest.approx(judge_cost + optimiser_cost)
    assert_clean(ws)


@pytest.mark.slow
def test_provider_outage_during_a_candidate_is_an_error_rolled_back(
    ws: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    set_toml_key(ws, "judge", "max_retries", "0")
    commit_all(ws, "no retries")
    judge = FakeJudge(ws)
    judge.fail_after = len(judge.neg_rank) + len(judge.pos_rank)  # the baseline succeeds, then only 500s
    strategy = ScriptedStrategy([toggle(GOOD_ENTRY), toggle(BAD_ENTRY)])
    install(monkeypatch, strategy)
    with FakeLLMServer(default=judge) as server:
        assert run_loop(ws, server.openai_base_url, "--max-experiments", "2") == 0
    run, exps = latest(ws)
    assert run.status == "finished"
    assert [e.status for e in exps] == ["baseline", "error", "error"]
    rejected = gitops.rejected_refs(ws)
    for exp in exps[1:]:
        assert "infrastructure errors" in present(exp.reason) and "rolled back" in present(exp.reason)
        assert rejected[exp.id] == exp.commit_sha
        assert exp.metrics is None
    assert gitops.rev_parse(ws, run.branch) == run.start_rev
    assert_clean(ws)


# -- budgets ---------------------------------------------------------------------------------------


@pytest.mark.slow
def test_budget_is_enforced_before_a_call_would_cross_it(ws: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = ws / "judgeloop.toml"
    cfg.write_text(
        cfg.read_text(encoding="utf-8") + '\n[prices."fake-judge"]\ninput = 10.0\noutput = 10.0\n',
        encoding="utf-8",
    )
    commit_all(ws, "prices")
    judge = FakeJudge(ws)
    with FakeLLMServer(default=judge) as server:
        # Measure what the baseline costs, then allow 1.5 baselines (optimiser spending included).
        assert run_loop(ws, server.openai_base_url, "--max-experiments", "1") == 0
        _, first = latest(ws)
        baseline_cost = first[0].cost_usd
        assert baseline_cost > 0
        budget = round(baseline_cost * 1.5, 6)
        for suffix in ("", "-wal", "-shm"):  # the second run pays for its baseline again (no stale WAL)
            (ws / "experiments" / f"cache.sqlite{suffix}").unlink(missing_ok=True)
        strategy = ScriptedStrategy(
            [
                priced(toggle(BAD_ENTRY), baseline_cost * 0.1),
                toggle(GOOD_ENTRY),
                toggle(GOOD_ENTRY, BAD_ENTRY),
            ]
        )
        install(monkeypatch, strategy)
        assert (
            run_loop(ws, server.openai_base_url, "--max-experiments", "5", "--budget-usd", str(budget)) == 0
        )
    run, exps = latest(ws)
    spent = sum(e.cost_usd for e in exps)
    assert spent <= budget + 1e-9
    assert run.status == "finished" and "budget" in (run.stop_reason or "")
    assert exps[1].cost_usd >= baseline_cost * 0.1  # the optimiser's spend is recorded and counted
    # The candidate that met the budget is recorded as not decided, and no further candidate started.
    assert exps[-1].status == "error" and "budget" in (exps[-1].reason or "")
    assert len(strategy.contexts) == len(exps) - 1
    assert_clean(ws)


# -- stopping --------------------------------------------------------------------------------------


@pytest.mark.slow
def test_stop_file_stops_after_the_current_step(ws: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def good_then_stop(ctx: ProposalContext) -> Proposal:
        (ctx.workspace_root / "experiments" / "STOP").write_text("", encoding="utf-8")
        return toggle(GOOD_ENTRY)(ctx)

    strategy = ScriptedStrategy([good_then_stop, toggle(BAD_ENTRY)])
    install(monkeypatch, strategy)
    with FakeLLMServer(default=FakeJudge(ws)) as server:
        assert run_loop(ws, server.openai_base_url, "--max-experiments", "5") == 0
    run, exps = latest(ws)
    assert [e.status for e in exps] == ["baseline", "kept"]  # the current candidate finished, then stop
    assert run.status == "stopped" and "stop file" in (run.stop_reason or "")
    assert not (ws / "experiments" / "STOP").exists()
    assert_clean(ws)


@pytest.mark.slow
def test_patience_stops_after_k_candidates_without_a_keep(ws: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    noop = next(e for e in ("lib-final-state", "lib-scope-words") if e not in (GOOD_ENTRY, BAD_ENTRY))
    strategy = ScriptedStrategy([toggle(noop), toggle(BAD_ENTRY), toggle(GOOD_ENTRY)])
    install(monkeypatch, strategy)
    with FakeLLMServer(default=FakeJudge(ws)) as server:
        assert run_loop(ws, server.openai_base_url, "--patience", "2", "--max-experiments", "10") == 0
    run, exps = latest(ws)
    assert [e.status for e in exps] == ["baseline", "rolled_back", "rolled_back"]
    assert "patience 2" in (run.stop_reason or "")
    # A no-op candidate: no flips; decided in full ("not significant"), stopped early by the bound, or
    # by futility screening (on by default: every draw fails on kappa).
    assert re.search(
        r"is not significant|could not be significant|^futile: .*kappa did not rise", present(exps[1].reason)
    )


# -- refusals --------------------------------------------------------------------------------------


def test_run_refuses_a_dirty_tree(ws: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (ws / "prompts" / "rubric.md").write_text("edited by hand\n", encoding="utf-8")
    assert run_loop(ws, "http://127.0.0.1:9/v1", "--max-experiments", "1") == 2
    assert "prompts/rubric.md" in capsys.readouterr().err
    assert not (ws / "experiments" / "ledger.sqlite").exists() or latest_or_none(ws) is None


def latest_or_none(root: Path) -> Run | None:
    with ledger_of(root) as led:
        return led.latest_run()


def test_run_refuses_a_heldout_split(ws: Path, capsys: pytest.CaptureFixture[str]) -> None:
    set_toml_key(ws, "workspace", "heldout_splits", '["sample"]')
    commit_all(ws, "hold out the sample")
    assert run_loop(ws, "http://127.0.0.1:9/v1", "--split", "sample") == 2
    assert "held out" in capsys.readouterr().err
    assert latest_or_none(ws) is None


@pytest.mark.boundary
def test_optimiser_never_sees_heldout_data_and_confirm_is_capped(
    ws: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    dev, held = add_heldout_split(ws)
    set_toml_key(ws, "confirm", "max_uses", "1")
    commit_all(ws, "one confirmation")
    judge = FakeJudge(ws)  # knows every split's items, so confirm's held-out calls are answered too
    strategy = ScriptedStrategy([toggle(GOOD_ENTRY), toggle(BAD_ENTRY)])
    install(monkeypatch, strategy)
    with FakeLLMServer(default=judge) as server:
        assert run_loop(ws, server.openai_base_url, "--max-experiments", "2") == 0
        run, exps = latest(ws)
        assert exps[0].items_evaluated == len(dev)
        for ctx in strategy.contexts:
            assert ctx.split.name == "small" and ctx.split.ids == dev
            ids = {d.trajectory_id for d in ctx.disagreements}
            assert ids and ids <= set(dev) and not ids & set(held)
        # Only dev items were ever sent to the judge.
        sent = {judge.trajectory_of(body_user(r.body)) for r in server.inference_requests() if r.body}
        assert sent <= set(dev)

        # confirm refuses the dev split, evaluates the held-out split once, then refuses a second use.
        capsys.readouterr()
        assert _confirm(ws, server, "small") == 2
        assert "dev split" in capsys.readouterr().err
        assert _confirm(ws, server, "held") == 0
        assert _confirm(ws, server, "held") == 2
        assert "max_uses" in capsys.readouterr().err
    with ledger_of(ws) as led:
        confirmations = led.confirmations("held")
    assert len(confirmations) == 1
    assert confirmations[0].revision == gitops.rev_parse(ws, run.branch)


def body_user(body: object) -> str:
    from tests.support.loop import request_texts

    return request_texts(body)[1]


def _confirm(root: Path, server: FakeLLMServer, split: str, *extra: str) -> int:
    from optimizer.cli import main

    return main(
        [
            "confirm",
            "-w",
            str(root),
            "--split",
            split,
            "--provider",
            "openai",
            "--base-url",
            server.openai_base_url,
            "--model",
            "fake-judge",
            "--concurrency",
            "8",
            *extra,
        ]
    )


@pytest.mark.slow
def test_a_proposal_for_a_labels_file_is_rejected_without_reading_it_into_the_ledger(
    ws: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from optimizer.workspace.workspace import Workspace

    split_name = Workspace.open(ws).config.workspace.dev_split
    labels_path = f"devset/{split_name}/labels.jsonl"
    secret_line = (ws / labels_path).read_text(encoding="utf-8").splitlines()[0]

    def grab_labels(ctx: ProposalContext) -> Proposal:
        return Proposal(
            files={labels_path: "", "prompts/rubric.md": ctx.current_files[RUBRIC_MD] + "\n"},
            rationale="overwrite the labels",
        )

    judge = FakeJudge(ws)
    with FakeLLMServer(default=judge) as server:
        install(monkeypatch, ScriptedStrategy([grab_labels], server))
        assert run_loop(ws, server.openai_base_url, "--max-experiments", "1") == 0
    _, exps = latest(ws)
    assert exps[1].status == "guard_rejected" and "outside the allowed files" in present(exps[1].reason)
    with ledger_of(ws) as ledger:
        stored = ledger.get_experiment(exps[1].id).diff_text or ""
    assert secret_line not in stored and '"label"' not in stored
    assert (ws / labels_path).read_text(encoding="utf-8").splitlines()[0] == secret_line


@pytest.mark.slow
def test_the_incumbents_extra_judgements_are_paid_once_across_candidates(
    ws: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.support.loop import body_digest

    noop = next(e for e in ("lib-final-state", "lib-scope-words") if e not in (GOOD_ENTRY, BAD_ENTRY))
    # Two candidates that disagree with the baseline on the same items (the no-op entry changes nothing).
    install(monkeypatch, ScriptedStrategy([toggle(BAD_ENTRY), toggle(BAD_ENTRY, noop)]))
    futility_off(ws)  # both judged in full, so both re-judge the same items
    judge = FakeJudge(ws)
    with FakeLLMServer(default=judge) as server:
        assert run_loop(ws, server.openai_base_url, "--max-experiments", "2") == 0
        requests = server.inference_requests()
    _run, exps = latest(ws)
    base, first, second = exps
    assert first.status == second.status == "rolled_back" and first.parent_id == second.parent_id == base.id
    rejudged = [i["trajectory_id"] for i in (first.test or {})["items"] if i["rejudged"]]
    assert rejudged == [i["trajectory_id"] for i in (second.test or {})["items"] if i["rejudged"]]
    # The first candidate paid for both prompts' extra judgements, the second for its own only.
    assert first.rejudge_calls == 4 * len(rejudged) and second.rejudge_calls == 2 * len(rejudged)
    # Counted at the server: each of the baseline's request bodies went out 1 + 2 times in all.
    baseline_digests = {body_digest(r.body) for r in requests[: len(judge.neg_rank) + len(judge.pos_rank)]}
    counts: dict[str, int] = {}
    for r in requests:
        d = body_digest(r.body)
        if d in baseline_digests:
            counts[d] = counts.get(d, 0) + 1
    assert sorted(counts.values()) == sorted(
        [3] * len(rejudged) + [1] * (len(baseline_digests) - len(rejudged))
    )
    # A stored decision replays from the ledger to the same p-value.
    from optimizer.stats.decision import AdaptiveTest

    for exp in (first, second):
        assert (
            AdaptiveTest.model_validate(exp.test).replay().p_value
            == exp.p_value
            == (exp.test or {})["p_value"]
        )
    # The decision record: what was re-judged, its draws, and the run's accounting.
    report = report_json(ws, capsys)
    entry = report["experiments"][1]
    assert entry["rejudge_calls"] == first.rejudge_calls and len(entry["rejudged"]) == len(rejudged)
    assert all(" → " in r["draws"] for r in entry["rejudged"]) and entry["alpha"] == 0.1
    assert report["accounting"]["tested"] == 2 and report["accounting"][
        "expected_false_keeps"
    ] == pytest.approx(0.2)


@pytest.mark.slow
def test_online_fdr_tests_each_candidate_at_its_lord_level_and_reports_the_sum(
    ws: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from optimizer.stats.decision import lord_level

    set_toml_key(ws, "loop", "rejudge", "2\nfdr = 0.1")
    commit_all(ws, "loop: online FDR")
    noop = next(e for e in ("lib-final-state", "lib-scope-words") if e not in (GOOD_ENTRY, BAD_ENTRY))
    install(monkeypatch, ScriptedStrategy([toggle(GOOD_ENTRY), toggle(noop), toggle(BAD_ENTRY)]))
    with FakeLLMServer(default=FakeJudge(ws)) as server:
        assert run_loop(ws, server.openai_base_url, "--max-experiments", "3") == 0
    _, exps = latest(ws)
    decided = [e for e in exps[1:] if e.status in ("kept", "rolled_back")]
    assert len(decided) == 3 and decided[0].alpha == pytest.approx(0.025)  # γ₁·W₀ = ½ · 0.05
    past: list[bool] = []
    for exp in decided:  # each level from the outcomes before it (LORD++), recorded with the decision
        assert exp.alpha == pytest.approx(lord_level(0.1, past))
        # (a candidate the exact bound stopped has no test record, only its level)
        assert exp.test is None or exp.test["alpha"] == pytest.approx(exp.alpha)
        past.append(exp.status == "kept")
    report = report_json(ws, capsys)
    assert report["accounting"]["fdr"] == 0.1
    assert report["accounting"]["expected_false_keeps"] == pytest.approx(sum(e.alpha or 0 for e in decided))


@pytest.mark.slow
def test_confirm_in_batch_mode_gives_the_direct_figures_and_fills_the_cache(
    ws: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from optimizer.workspace.workspace import Workspace
    from tests.support.config import write_config

    add_heldout_split(ws)
    cfg = Workspace.open(ws).config
    write_config(
        ws,
        cfg.model_copy(
            update={"judge": cfg.judge.model_copy(update={"batch_poll_s": 0.01, "batch_poll_max_s": 0.04})}
        ),
    )
    commit_all(ws, "poll batches quickly")
    install(monkeypatch, ScriptedStrategy([toggle(GOOD_ENTRY)]))
    with FakeLLMServer(default=FakeJudge(ws), batch_polls=1) as server:
        assert run_loop(ws, server.openai_base_url, "--max-experiments", "1") == 0
        assert _confirm(ws, server, "held", "--batch") == 0
        assert len(server.batch_creations) == 1
        n_requests = len(server.inference_requests())
        assert _confirm(ws, server, "held") == 0  # direct now: every call comes from the cache
        assert len(server.inference_requests()) == n_requests and len(server.batch_creations) == 1
    with ledger_of(ws) as led:
        batch, direct = led.confirmations("held")
    assert batch.metrics == direct.metrics and batch.revision == direct.revision
