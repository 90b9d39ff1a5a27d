"""`judgeloop run --wave K` through the real CLI against the fake judge: K candidates per round parked
on one incumbent, judged together, decided by Holm (at most one keep), the others rolled back with
their p-value and Holm level; refusals; a duplicate or a short wave; a stopped wave resumed."""

from __future__ import annotations

import re
import signal
from pathlib import Path

import pytest

from optimizer.cli import main
from optimizer.judge.prompts import LIBRARY_MD, parse_library
from optimizer.loop.strategies import IN_WAVE, Proposal, ProposalContext, ProposalError
from optimizer.workspace import gitops
from tests.support.fakeserver import FakeLLMServer, Usage
from tests.support.loop import (
    BAD_ENTRY,
    GOOD_ENTRY,
    FakeJudge,
    commit_all,
    git,
    report_json,
    run_loop,
    set_toml_key,
    wait_for,
)
from tests.support.scripted import ScriptedStrategy, assert_clean, install, latest, ledger_of, toggle
from tests.support.signals import CliRun, cache_rows, gated_judge, release

NEUTRAL = "lib-harmless-exploration"  # changes nothing the fake judge answers: a no-op candidate
HOLM = re.compile(r"wave of (\d+) \(Holm\): rank (\d+), level ([0-9.e-]+), (p=\S+|no full test)")


@pytest.mark.slow
def test_wave_of_three_keeps_the_fix_and_rolls_back_the_rest(
    ws: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    strategy = ScriptedStrategy([toggle(NEUTRAL), toggle(GOOD_ENTRY), toggle(BAD_ENTRY)])
    install(monkeypatch, strategy)
    # A fix of 7 negatives: clear at alpha/3 (p = 1/128), as a 4-item one (p = 1/16) would not be.
    with FakeLLMServer(default=FakeJudge(ws, good_fixes_neg=0.45)) as server:
        assert run_loop(ws, server.openai_base_url, "--wave", "3", "--max-experiments", "3") == 0
    run, exps = latest(ws)
    cands = [e for e in exps if e.seq > 0]
    assert [e.seq for e in exps] == [0, 1, 2, 3] and run.status == "finished"
    # All three were proposed against the baseline, each told about the earlier ones of its wave.
    assert {e.parent_id for e in cands} == {exps[0].id}
    assert [[h.id for h in ctx.history if h.decision == IN_WAVE] for ctx in strategy.contexts] == [
        [],
        [cands[0].id],
        [cands[0].id, cands[1].id],
    ]
    assert [e.status for e in cands] == ["rolled_back", "kept", "rolled_back"]
    # Holm over the wave of 3: the three levels are alpha/3, alpha/2, alpha by rank, each in the reason.
    alpha = 0.1
    found = {e.id: HOLM.search(e.reason or "") for e in cands}
    assert all(m is not None and m.group(1) == "3" for m in found.values())
    ranks = {e.id: int(m.group(2)) for e, m in zip(cands, found.values(), strict=True) if m}
    assert sorted(ranks.values()) == [1, 2, 3]
    for e in cands:
        assert e.alpha == pytest.approx(alpha / (3 - ranks[e.id] + 1))
    kept = cands[1]
    assert kept.p_value is not None and kept.p_value < present_alpha(kept)
    # Git: three commits on the baseline; the branch ends at the kept one, the others under rejected refs.
    assert gitops.rev_parse(ws, run.branch) == kept.commit_sha
    assert git(ws, "rev-parse", f"{kept.commit_sha}^").strip() == run.start_rev
    rejected = gitops.rejected_refs(ws)
    assert set(rejected) == {cands[0].id, cands[2].id}
    for e in (cands[0], cands[2]):
        assert git(ws, "rev-parse", f"{rejected[e.id]}^").strip() == run.start_rev
        assert (
            gitops.parse_trailers(gitops.commit_message(ws, rejected[e.id]))["Judgeloop-Decision"]
            == "rolled_back"
        )
    assert gitops.parked_candidates(ws) == {}
    assert_clean(ws)
    # The run's accounting: a wave of 3 tested at alpha counts alpha/3 per test, alpha in all.
    acc = report_json(ws, capsys)["accounting"]
    assert acc["tested"] == 3 and acc["expected_false_keeps"] == pytest.approx(alpha)


def present_alpha(e: object) -> float:
    alpha = getattr(e, "alpha", None)
    assert isinstance(alpha, float)
    return alpha


# -- refusals and hostile proposals -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        (["--wave", "0"], "argument --wave: 0 is out of range: use a whole number from 1 to 16"),
        (["--wave", "-3"], "argument --wave: -3 is out of range"),
        (["--wave", "17"], "argument --wave: 17 is out of range"),
        (["--wave", "2", "--policy", "literal"], "the literal policy runs no test"),
        (["--wave", "2", "--propose-only"], "drop --propose-only or use --wave 1"),
    ],
)
@pytest.mark.slow
def test_a_wave_it_cannot_run_is_refused_in_one_line_before_any_run(
    ws: Path, capsys: pytest.CaptureFixture[str], extra: list[str], says: str
) -> None:
    assert (
        main(
            [
                "run",
                "-w",
                str(ws),
                "--provider",
                "openai",
                "--base-url",
                "http://127.0.0.1:9/v1",
                "--model",
                "fake-judge",
                *extra,
            ]
        )
        == 2
    )
    err = capsys.readouterr().err.strip()
    assert says in err and len(err.splitlines()) == 1
    assert not (ws / "experiments" / "ledger.sqlite").exists() or latest_or_none(ws) is None
    assert_clean(ws)


def test_fdr_cheaper_or_a_hand_edit_with_a_wave_is_refused_in_one_line(
    ws: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    set_toml_key(ws, "loop", "patience", "5\nfdr = 0.1")
    commit_all(ws, "fdr on")
    assert (
        main(
            [
                "run",
                "-w",
                str(ws),
                "--provider",
                "openai",
                "--base-url",
                "http://127.0.0.1:9/v1",
                "--model",
                "fake-judge",
                "--wave",
                "3",
            ]
        )
        == 2
    )
    err = capsys.readouterr().err.strip()
    assert "[loop] fdr (LORD++) levels are per candidate" in err and len(err.splitlines()) == 1
    git(ws, "reset", "-q", "--hard", "HEAD~1")
    set_toml_key(ws, "loop", "patience", "5\ncheaper_margin_items = 1")
    commit_all(ws, "cheaper on")
    assert (
        main(
            [
                "run",
                "-w",
                str(ws),
                "--provider",
                "openai",
                "--base-url",
                "http://127.0.0.1:9/v1",
                "--model",
                "fake-judge",
                "--wave",
                "3",
            ]
        )
        == 2
    )
    err = capsys.readouterr().err.strip()
    assert "cheaper-not-worse keeps ([loop] cheaper_margin_items)" in err and len(err.splitlines()) == 1
    git(ws, "reset", "-q", "--hard", "HEAD~1")
    (ws / "prompts" / "rubric.md").write_text((ws / "prompts" / "rubric.md").read_text() + "\nA hand rule.\n")
    assert (
        main(
            [
                "run",
                "-w",
                str(ws),
                "--provider",
                "openai",
                "--base-url",
                "http://127.0.0.1:9/v1",
                "--model",
                "fake-judge",
                "--wave",
                "3",
                "--strategy",
                "manual",
            ]
        )
        == 2
    )
    err = capsys.readouterr().err.strip()
    assert "--strategy manual judges one hand edit: drop --wave" in err and len(err.splitlines()) == 1
    assert latest_or_none(ws) is None


def latest_or_none(ws: Path) -> object:
    with ledger_of(ws) as led:
        return led.latest_run()


def fails(ctx: ProposalContext) -> Proposal:
    raise ProposalError("no idea left")


@pytest.mark.slow
def test_a_duplicate_and_a_missing_proposal_still_count_in_the_wave_family(
    ws: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The strategy repeats its first candidate and then fails: the wave tests one candidate, yet Holm's
    # family stays the wave's 3 (the candidate is compared at alpha/3, not alpha).
    strategy = ScriptedStrategy([toggle(GOOD_ENTRY), toggle(GOOD_ENTRY), fails])
    install(monkeypatch, strategy)
    with FakeLLMServer(default=FakeJudge(ws, good_fixes_neg=0.45)) as server:
        assert run_loop(ws, server.openai_base_url, "--wave", "3", "--max-experiments", "3") == 0
    run, exps = latest(ws)
    first, dup, failed = exps[1:]
    assert (
        dup.status == "guard_rejected"
        and dup.reason == f"the same edit as experiment {first.id} of this wave"
    )
    assert failed.status == "error" and "no idea left" in (failed.reason or "")
    assert first.status == "kept" and first.alpha == pytest.approx(0.1 / 3)
    m = HOLM.search(first.reason or "")
    assert m is not None and m.groups()[:2] == ("3", "1")
    assert gitops.rev_parse(ws, run.branch) == first.commit_sha
    assert gitops.rejected_refs(ws) == {} and gitops.parked_candidates(ws) == {}
    assert_clean(ws)


@pytest.mark.slow
def test_a_wave_larger_than_the_library_proposes_each_set_once(ws: Path) -> None:
    # Two library entries: three distinct sets (each alone, both) for a wave of 5; the other two fail.
    library = parse_library((ws / LIBRARY_MD).read_text(encoding="utf-8"))
    keep = {GOOD_ENTRY, NEUTRAL}
    text = (ws / LIBRARY_MD).read_text(encoding="utf-8")
    for entry in library:
        if entry.id not in keep:
            text = re.sub(rf"(?ms)^## {re.escape(entry.id)}\n.*?(?=^## |\Z)", "", text)
    (ws / LIBRARY_MD).write_text(text, encoding="utf-8")
    assert {e.id for e in parse_library(text)} == keep
    commit_all(ws, "a two-entry library")
    with FakeLLMServer(default=FakeJudge(ws, good_fixes_neg=0.45)) as server:
        assert (
            run_loop(
                ws, server.openai_base_url, "--strategy", "library", "--wave", "5", "--max-experiments", "5"
            )
            == 0
        )
    run, exps = latest(ws)
    cands = exps[1:]
    assert len(cands) == 5
    sets = [
        frozenset(e.proposal_meta["library_enabled"]) for e in cands if "library_enabled" in e.proposal_meta
    ]
    assert len(sets) == 3 == len(set(sets))
    assert sum(e.status == "error" for e in cands) == 2
    assert sum(e.status == "kept" for e in cands) <= 1
    assert all(e.proposal_meta.get("wave", {}).get("size") == 5 for e in cands if e.status != "error")
    kept = [e for e in cands if e.status == "kept"]
    assert gitops.rev_parse(ws, run.branch) == (kept[0].commit_sha if kept else run.start_rev)
    assert gitops.parked_candidates(ws) == {}
    assert_clean(ws)


# -- a stopped wave, resumed -----------------------------------------------------------------------------


@pytest.mark.slow
def test_ctrl_c_mid_wave_then_resume_decides_every_candidate_once_and_pays_nothing_twice(ws: Path) -> None:
    judge = gated_judge(ws, candidate_calls=9)
    with FakeLLMServer(default=judge) as server:
        with CliRun(ws, server, "--strategy", "library", "--wave", "3", "--max-experiments", "3") as cli:
            wait_for(
                lambda: len(judge.answered) >= judge.gate_after if judge.gate_after else False,
                "the gated calls",
                60,
            )
            wait_for(lambda: cli.said("wave: evaluating experiments"), "the wave's evaluation")
            cli.proc.send_signal(signal.SIGINT)
            wait_for(
                lambda: cli.said("judgeloop: Ctrl-C: the run stops after the judge calls in flight"),
                "the stop to be announced",
            )
            release(judge, abandon=False)
            assert cli.wait() == 130, "".join(cli.lines)
        run, exps = latest(ws)
        assert run.status == "stopped"
        # Left for --resume: three parked commits on the baseline, the tree at the baseline.
        assert [e.status for e in exps] == ["baseline", "running", "running", "running"]
        parked = gitops.parked_candidates(ws)
        assert set(parked) == {e.id for e in exps[1:]}
        assert all(git(ws, "rev-parse", f"{sha}^").strip() == run.start_rev for sha in parked.values())
        assert gitops.rev_parse(ws, "HEAD") == run.start_rev
        assert_clean(ws)
        assert cache_rows(ws)[0] == len(judge.answered)

        assert run_loop(ws, server.openai_base_url, "--resume") == 0
    run, exps = latest(ws)
    assert run.status == "finished" and "max-experiments 3" in (run.stop_reason or "")
    # Each of the three decided once, as one wave of 3; no new candidate, no call paid twice.
    assert [e.seq for e in exps] == [0, 1, 2, 3]
    assert all(e.status in ("kept", "rolled_back") for e in exps[1:])
    assert sum(e.status == "kept" for e in exps[1:]) <= 1
    assert all((m := HOLM.search(e.reason or "")) is not None and m.group(1) == "3" for e in exps[1:])
    assert len(judge.answered) == cache_rows(ws)[0]
    assert gitops.parked_candidates(ws) == {}
    kept = [e for e in exps[1:] if e.status == "kept"]
    assert gitops.rev_parse(ws, run.branch) == (kept[0].commit_sha if kept else run.start_rev)
    assert set(gitops.rejected_refs(ws)) == {e.id for e in exps[1:] if e.status != "kept"}
    assert_clean(ws)


# -- --batch: one batch per wave pass --------------------------------------------------------------------


@pytest.mark.slow
def test_a_batch_wave_sends_one_batch_per_wave_pass_and_decides_as_direct_calls(
    ws: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import shutil

    path = ws / "judgeloop.toml"
    path.write_text(
        path.read_text(encoding="utf-8").replace(
            "\n[judge]\n", "\n[judge]\nbatch_poll_s = 0.01\nbatch_poll_max_s = 0.04\n", 1
        ),
        encoding="utf-8",
    )
    commit_all(ws, "poll batches fast")
    direct_ws = tmp_path / "direct"
    shutil.copytree(ws, direct_ws, symlinks=True)
    steps = [toggle(NEUTRAL), toggle(GOOD_ENTRY), toggle(BAD_ENTRY)]
    outcomes = {}
    for root, extra in ((direct_ws, []), (ws, ["--batch"])):
        install(monkeypatch, ScriptedStrategy(list(steps)))
        with FakeLLMServer(default=FakeJudge(root, good_fixes_neg=0.45), batch_polls=2) as server:
            assert (
                run_loop(root, server.openai_base_url, "--wave", "3", "--max-experiments", "3", *extra) == 0
            )
            creations = list(server.batch_creations)
        run, exps = latest(root)
        outcomes[root] = [e.status for e in exps]
        if extra:
            with ledger_of(root) as led:
                records = led.batches(run.id)
            # The baseline's batch, then the wave's first pass as ONE batch for its three candidates, then
            # each re-judging pass (the incumbent's and the candidates', per side) merged across the wave.
            first_pass = [r for r in records if r.experiment_id in {e.id for e in exps[1:]}]
            assert len({r.batch_id for r in first_pass}) < len(first_pass)  # candidates share batches
            by_batch: dict[str | None, set[int | None]] = {}
            for r in records:
                by_batch.setdefault(r.batch_id, set()).add(r.experiment_id)
            assert any(len(members) == 3 for members in by_batch.values())
            assert set(by_batch) == set(creations) and all(r.status == "collected" for r in records)
            assert len(creations) <= 1 + 3  # baseline + at most three wave passes (first, re-judging sides)
        else:
            assert creations == []
    assert outcomes[ws] == outcomes[direct_ws] and outcomes[ws][1:].count("kept") == 1
    assert gitops.parked_candidates(ws) == {}
    assert_clean(ws)


# -- an LLM optimiser told about the wave --------------------------------------------------------------


@pytest.mark.slow
def test_reflect_proposes_a_wave_in_one_conversation_and_a_repeat_is_rejected(ws: Path) -> None:
    import json

    from tests.support.fakeserver import Behaviour, RecordedRequest, reply

    def edit(text: str) -> str:
        return json.dumps(
            {
                "file": "prompts/rubric.md",
                "section_heading": "## Telling the types apart",
                "new_section": f"## Telling the types apart\n\n{text}",
                "rationale": f"rule: {text}",
            }
        )

    # The model repeats its first edit, then proposes another one.
    edits = [
        edit("Name the type of the first wrong step."),
        edit("Name the type of the first wrong step."),
        edit("Name the type that explains the final state."),
    ]
    judge = FakeJudge(ws)
    bodies: list[dict[str, object]] = []

    def answer(request: RecordedRequest) -> Behaviour:
        if request.model != "opt-model":
            return judge(request)
        assert isinstance(request.body, dict)
        bodies.append(request.body)
        return reply(edits[len(bodies) - 1], usage=Usage(input_tokens=100 * len(bodies), output_tokens=50))

    cfg = ws / "judgeloop.toml"
    cfg.write_text(
        cfg.read_text(encoding="utf-8") + '\n[prices."opt-model"]\ninput = 3.0\noutput = 15.0\n',
        encoding="utf-8",
    )
    with FakeLLMServer(default=answer) as server:
        set_toml_key(ws, "optimizer", "provider", '"openai"')
        set_toml_key(ws, "optimizer", "model", '"opt-model"')
        cfg.write_text(
            cfg.read_text(encoding="utf-8").replace(
                "[optimizer]\n", f'[optimizer]\nbase_url = "{server.openai_base_url}"\n', 1
            ),
            encoding="utf-8",
        )
        commit_all(ws, "reflect through the fake server")
        assert (
            run_loop(
                ws, server.openai_base_url, "--strategy", "reflect", "--wave", "3", "--max-experiments", "3"
            )
            == 0
        )
    _, exps = latest(ws)
    first, repeat, other = exps[1:]
    # One conversation: each later turn holds the model's earlier answers and asks for a different edit.
    assert len(bodies) == 3
    turns = [json.dumps(b["messages"]) for b in bodies]
    assert "Candidate 1 of 3" in turns[0] and "Candidate 2 of 3" not in turns[0]
    assert "Candidate 2 of 3: propose a different edit" in turns[1] and "first wrong step" in turns[1]
    assert "Candidate 3 of 3" in turns[2] and turns[2].count("first wrong step") >= 2
    assert (
        repeat.status == "guard_rejected"
        and repeat.reason == f"the same edit as experiment {first.id} of this wave"
    )
    assert first.status == other.status == "rolled_back"  # the fake judge ignores both rules
    assert all((m := HOLM.search(e.reason or "")) is not None and m.group(1) == "3" for e in (first, other))
    # Each candidate carries its own turn's spend.
    assert [e.optimizer_calls for e in (first, repeat, other)] == [1, 1, 1]
    assert [e.optimizer_input_tokens for e in (first, repeat, other)] == [100, 200, 300]
    assert other.optimizer_cost_usd == pytest.approx((300 * 3.0 + 50 * 15.0) / 1e6)
    assert_clean(ws)


@pytest.mark.slow
def test_a_resumed_run_keeps_its_wave_size_and_refuses_another_in_one_line(
    ws: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.support.loop import stop_after_baseline

    with FakeLLMServer(default=FakeJudge(ws)) as server:
        with stop_after_baseline():
            assert run_loop(ws, server.openai_base_url, "--strategy", "library", "--wave", "2") == 0
        run, _ = latest(ws)
        assert run.status == "stopped" and run.budgets["wave"] == 2
        capsys.readouterr()
        assert run_loop(ws, server.openai_base_url, "--resume", "--wave", "3") == 2
        err = capsys.readouterr().err.strip()
        assert err.endswith(
            f"run {run.id} proposes 2 candidate(s) per wave; --wave 3 would change how its "
            "candidates are decided mid-run — drop it, or start a new run"
        )
        assert len(err.splitlines()) == 1
        # Without --wave (or with its own) it goes on in waves of 2.
        assert run_loop(ws, server.openai_base_url, "--resume", "--max-experiments", "2") == 0
    _, exps = latest(ws)
    assert [e.proposal_meta["wave"]["size"] for e in exps[1:]] == [2, 2]
    assert_clean(ws)


@pytest.mark.slow
def test_a_patience_below_the_wave_size_is_said_and_stops_after_one_wave_without_a_keep(
    ws: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    install(monkeypatch, ScriptedStrategy([toggle(NEUTRAL), toggle(NEUTRAL, BAD_ENTRY), toggle(BAD_ENTRY)]))
    with FakeLLMServer(default=FakeJudge(ws)) as server:
        assert (
            run_loop(ws, server.openai_base_url, "--wave", "2", "--patience", "1", "--max-experiments", "6")
            == 0
        )
    err = capsys.readouterr().err
    assert (
        "note: patience 1 is fewer candidates than a wave of 2: the run stops after the first wave without a "
        "keep (--patience 4 allows two)" in err
    )
    run, exps = latest(ws)
    assert [e.status for e in exps[1:]] == ["rolled_back", "rolled_back"]  # one wave, then patience
    assert "patience 1" in (run.stop_reason or "")


@pytest.mark.slow
def test_a_waves_candidates_share_one_futility_look_order_so_their_calls_go_out_item_by_item_together(
    ws: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Futility is on by default: two no-ops of one wave are screened on the same looks (one seed, the
    wave's first id), so their first passes judge the same items (in one order: negatives first within
    each look); with a seed each, the looks' random parts would differ."""
    other = "lib-final-state"  # another entry the fake judge ignores
    install(monkeypatch, ScriptedStrategy([toggle(NEUTRAL), toggle(other)]))
    with FakeLLMServer(default=FakeJudge(ws)) as server:
        assert run_loop(ws, server.openai_base_url, "--wave", "2", "--max-experiments", "2") == 0
    _run, exps = latest(ws)
    a, b = exps[1:]
    seeds = [re.search(r"seed (\d+)\)", e.reason or "") for e in (a, b)]
    assert seeds[0] is not None and seeds[1] is not None and seeds[0].group(1) == seeds[1].group(1), (
        a.reason,
        b.reason,
    )
    assert a.status == b.status == "rolled_back" and a.items_evaluated == b.items_evaluated < 32
    with ledger_of(ws) as led:
        judged = [set(led.item_answers(e.id)) for e in (a, b)]
    assert judged[0] == judged[1] and len(judged[0]) == a.items_evaluated
