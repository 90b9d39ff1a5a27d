"""One progress line per wave, and a first pass that reads as one under futility's looks: the wave's
aggregator (`WaveProgress`) and the offsetting of a look's snapshots, then through `judgeloop run` (real
openai SDK, fake server): the ledger's first-pass progress events of a candidate never go back and keep
one total; a wave's terminal line is the wave's, summed over its candidates."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from optimizer.cli.progress import progress_line
from optimizer.evaluation.results import EvalRun
from optimizer.events import Event, Progress, ProgressSnapshot
from optimizer.judge.providers import Usage
from optimizer.ledger import Ledger
from optimizer.loop.progress import WaveProgress, pass_figures
from tests.support.fakeserver import FakeLLMServer
from tests.support.loop import GOOD_ENTRY, FakeJudge, commit_all, run_loop, set_toml_key
from tests.support.scripted import ScriptedStrategy, install, latest, toggle

NO_OP = "lib-final-state"  # the fake judge ignores it: every answer stays the incumbent's
ITEMS = 32  # the sample workspace's dev split


def _snap(done: int, total: int, calls: int, hits: int, cost: float, *, errors: int = 0) -> ProgressSnapshot:
    return ProgressSnapshot(
        done=done,
        total=total,
        infra_errors=errors,
        parse_errors=0,
        calls_made=calls,
        cache_hits=hits,
        input_tokens=10 * calls,
        output_tokens=2 * calls,
        cost_usd=cost,
        elapsed_s=float(done),
    )


def _shown(events: list[Event]) -> list[ProgressSnapshot]:
    return [e.snapshot for e in events if isinstance(e, Progress)]


def test_the_wave_line_sums_each_members_latest_snapshot_and_keeps_a_stopped_ones() -> None:
    events: list[Event] = []
    wave = WaveProgress([5, 6, 7, 8], 162, events.append)
    wave.MIN_INTERVAL_S = 0.0
    assert wave.snapshot().total == 4 * 162 and wave.snapshot().done == 0  # the whole wave from the start
    wave.update(5, _snap(40, 162, 80, 0, 0.40))
    wave.update(6, _snap(30, 162, 60, 0, 0.30, errors=1))
    wave.update(5, _snap(50, 162, 100, 0, 0.50))  # a member's later snapshot replaces its earlier one
    wave.update(7, _snap(12, 162, 20, 4, 0.20))  # member 7 stops early here: its figures stay in the sum
    wave.update(8, _snap(70, 162, 140, 0, 0.70))
    wave.rejudged(
        8,
        [
            EvalRun(
                items=[],
                usage=Usage(calls=6, input_tokens=60, output_tokens=12, cost_usd=0.06),
                cache_hits=2,
                duration_s=9.0,
            )
        ],
    )
    snap = _shown(events)[-1]
    assert (snap.done, snap.total) == (50 + 30 + 12 + 70, 648)
    assert (snap.calls_made, snap.cache_hits, snap.infra_errors) == (100 + 60 + 20 + 140 + 6, 4 + 2, 1)
    assert snap.input_tokens + snap.output_tokens == 12 * (100 + 60 + 20 + 140 + 6)
    assert snap.cost_usd == pytest.approx(0.50 + 0.30 + 0.20 + 0.70 + 0.06)
    assert snap.elapsed_s < 60  # the wave's own clock, not the members' seconds summed
    assert progress_line(snap).startswith(
        "wave of 4 (experiments 5–8): judged 162/648 items · 326 calls + 6 cached"
    )
    assert "ETA" in progress_line(snap)
    assert [s.done for s in _shown(events)] == sorted(s.done for s in _shown(events))
    assert WaveProgress([3, 5], 10, events.append).label == "wave of 2 (experiments 3, 5)"


def test_a_later_phase_is_offset_by_the_earlier_ones_so_the_first_pass_reads_as_one() -> None:
    before = EvalRun(
        items=[],
        usage=Usage(calls=9, input_tokens=90, output_tokens=18, cost_usd=0.09),
        cache_hits=3,
        duration_s=4.0,
    )
    base = pass_figures(before)
    phase = _snap(5, 20, 7, 1, 0.07)
    snap = base.plus(phase)
    assert (snap.calls_made, snap.cache_hits, snap.elapsed_s) == (16, 4, 9.0)
    assert snap.cost_usd == pytest.approx(0.16)
    calls_only = pass_figures(before, items=False)
    assert (calls_only.done, calls_only.total, calls_only.elapsed_s, calls_only.calls_made) == (0, 0, 0.0, 9)
    assert ProgressSnapshot.summed([]).plus(phase) == phase


def _first_pass_progress(root: Path, run_id: str, experiment_id: int) -> list[dict[str, object]]:
    """The experiment's progress events while its first pass ran (its stage was ``evaluating``)."""
    stage = None
    out: list[dict[str, object]] = []
    with Ledger(root / "experiments" / "ledger.sqlite") as led:
        for e in led.events_since(0, run_id=run_id):
            if e.experiment_id != experiment_id:
                continue
            if e.kind == "stage":
                stage = e.payload.get("stage")
            elif e.kind == "progress" and stage == "evaluating":
                out.append(e.payload)
    return out


def _assert_one_first_pass(events: list[dict[str, object]], *, judged: int) -> None:
    assert events, "no progress event in the first pass"
    for key in ("done", "calls", "cost_usd"):
        seen = [float(str(p[key])) for p in events]
        assert seen == sorted(seen), (key, seen)
    assert {p["total"] for p in events} == {ITEMS}
    assert events[-1]["done"] == judged


@pytest.mark.slow
def test_under_futility_a_candidates_first_pass_progress_never_goes_back_over_its_looks(
    ws: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    set_toml_key(ws, "loop", "futility", "true")
    commit_all(ws, "futility on")
    install(monkeypatch, ScriptedStrategy([toggle(GOOD_ENTRY)]))
    with FakeLLMServer(default=FakeJudge(ws)) as server:
        assert run_loop(ws, server.openai_base_url, "--max-experiments", "1") == 0
    run, (_base, good) = latest(ws)
    assert (
        good.rejudge_calls > 0 and good.items_evaluated == ITEMS
    )  # re-judged at a look, then judged in full
    events = _first_pass_progress(ws, run.id, good.id)
    _assert_one_first_pass(events, judged=ITEMS)
    assert int(str(events[-1]["calls"])) == good.calls - good.rejudge_calls  # every phase's calls, once


_WAVE_LINE = re.compile(r"^wave of 2 \(experiments (\d+)–(\d+)\): judged (\d+)/(\d+) items · (\d+) calls")


@pytest.mark.slow
def test_a_wave_shows_one_line_summed_over_its_candidates(
    ws: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    set_toml_key(ws, "loop", "futility", "true")
    commit_all(ws, "futility on")
    install(monkeypatch, ScriptedStrategy([toggle(GOOD_ENTRY), toggle(NO_OP)]))
    with FakeLLMServer(default=FakeJudge(ws, good_fixes_neg=0.45)) as server:
        capsys.readouterr()
        assert run_loop(ws, server.openai_base_url, "--wave", "2", "--max-experiments", "2") == 0
    err = capsys.readouterr().err.splitlines()
    run, (_base, good, noop) = latest(ws)
    assert noop.early_stopped and noop.items_evaluated < ITEMS  # stopped at a look: its items stay counted
    lines = [m for m in map(_WAVE_LINE.match, err) if m]
    assert lines, err
    assert {(int(m.group(1)), int(m.group(2))) for m in lines} == {(good.id, noop.id)}
    assert {int(m.group(4)) for m in lines} == {2 * ITEMS}
    for group in (3, 5):
        seen = [int(m.group(group)) for m in lines]
        assert seen == sorted(seen), seen
    # From the wave's first line on, no candidate's own line (first pass or re-judging) reaches the terminal.
    start = next(i for i, line in enumerate(err) if _WAVE_LINE.match(line))
    assert not [line for line in err[start:] if line.startswith("judged ")]
    for exp in (good, noop):
        _assert_one_first_pass(_first_pass_progress(ws, run.id, exp.id), judged=exp.items_evaluated)
