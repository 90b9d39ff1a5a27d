"""Waves in the TUI: rows grouped into waves (numbered rows, old rows without a number, an invalid member,
single candidates beside waves, malformed records), the history's wave column and filter, the
experiment view's wave line, and the live strip summing a wave's interleaved members.

The ledgers are written with the ledger's own API, decided by the real `optimizer.stats.decision.decide_wave`;
the real loop's `run --wave 2` is in tests/loop/test_loop_wave_number.py."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

import pytest
from textual.widgets import DataTable, Input

from optimizer.ledger import Event, Experiment, ExperimentOutcome, Ledger, ProposedEdit, RunSpec
from optimizer.ledger.waves import holm_rank, next_wave_number, wave_meta, waves, waves_by_member
from optimizer.stats.decision import AdaptiveTest, Decision, decide_wave
from optimizer.vocab import EventKind, ExperimentStatus
from tests.support.tui_driving import drive, svg_text
from tui.app import JudgeloopApp, settle
from tui.data import load_experiment, load_history, matches_filter
from tui.views import ExperimentView, HistoryView
from tui.views.history import history_cells
from tui.watch import LiveState, apply_events

ALPHA = 0.1
HOLM = re.compile(r"wave of (\d+) \(Holm\): rank (\d+), level ([0-9.e-]+)")

# -- grouping, on rows made here ------------------------------------------------------------------


def row(
    exp_id: int,
    parent: int | None,
    wave: object = None,
    status: ExperimentStatus = "rolled_back",
    **extra: Any,
) -> Experiment:
    meta = {} if wave is None else {"wave": wave}
    return Experiment(
        id=exp_id,
        run_id="r",
        seq=exp_id - 1,
        parent_id=parent,
        created=datetime.now(UTC),
        status=status,
        proposal_meta=meta,
        **extra,
    )


def w(size: int, incumbent: int, number: int | None = None) -> dict[str, Any]:
    return {"size": size, "alpha": ALPHA, "incumbent": incumbent} | ({"number": number} if number else {})


def groups(rows: list[Experiment]) -> list[tuple[int, tuple[int, ...]]]:
    return [(g.number, g.members) for g in waves(rows)]


def test_numbered_rows_group_by_their_number_and_singles_stay_alone() -> None:
    rows = [
        row(1, None, status="baseline"),
        row(2, 1, w(3, 1, 1)),
        row(3, 1, w(3, 1, 1), status="kept"),
        row(4, 1, w(3, 1, 1), status="error"),  # a member that could not be evaluated is still a member
        row(5, 3),
        row(6, 3),  # two single candidates
        row(7, 3, w(2, 3, 2)),
        row(8, 3, w(2, 3, 2)),
    ]
    assert groups(rows) == [(1, (2, 3, 4)), (2, (7, 8))]
    by_member = waves_by_member(rows)
    assert set(by_member) == {2, 3, 4, 7, 8}
    assert [by_member[i].tag(i) for i in (2, 3, 4, 7, 8)] == [
        "w1 1/3",
        "w1 2/3",
        "w1 3/3",
        "w2 1/2",
        "w2 2/2",
    ]
    assert next_wave_number(rows) == 3


def test_old_rows_without_a_number_fall_back_to_runs_of_one_incumbent_and_size_chunked_by_size() -> None:
    # Two waves of 3 on the baseline (no keep in the first), the first with an optimiser failure in
    # the middle that carries no record (as rows of that time); then a wave of 3 on experiment 7.
    rows = [
        row(1, None, status="baseline"),
        row(2, 1, w(3, 1)),
        row(3, 1, status="error"),
        row(4, 1, w(3, 1)),
        row(5, 1, w(3, 1)),
        row(6, 1, w(3, 1)),
        row(7, 1, w(3, 1), status="kept"),
        row(8, 7, w(3, 7)),
        row(9, 7, w(3, 7)),
        row(10, 7, status="error"),
    ]  # a failure ending the run
    assert groups(rows) == [(1, (2, 3, 4)), (2, (5, 6, 7)), (3, (8, 9, 10))]
    # A resumed run counts on after them: its next wave is the 4th, and its numbered rows keep that.
    assert next_wave_number(rows) == 4
    resumed = [*rows, row(11, 7, w(3, 7, 4)), row(12, 7, w(3, 7, 4))]
    assert groups(resumed)[-1] == (4, (11, 12))
    # An error without a record that is not between rows of a wave (another parent) stays alone.
    assert waves_by_member([*rows, row(13, 1, status="error")]).get(13) is None


@pytest.mark.parametrize(
    "bad",
    [
        "w3",
        7,
        None,
        [],
        {"size": -2, "incumbent": 1},
        {"size": 10**40, "incumbent": 1, "alpha": ALPHA},
        {"incumbent": 1, "alpha": ALPHA},
        {"size": 3},
        {"size": True, "incumbent": 1},
        {"size": "3", "incumbent": 1},
        {"size": 3, "incumbent": 99},
        {"size": 3, "incumbent": 1, "number": 10**30},
        {"size": 3, "incumbent": 1, "number": 0},
        {"size": 3, "incumbent": 1, "number": "1"},
        {"size": 1, "incumbent": 1},
    ],
)
def test_a_malformed_wave_record_reads_as_a_single_candidate(bad: object) -> None:
    crafted = row(2, 1, bad)
    assert wave_meta(crafted, 10) is None
    rows = [row(1, None, status="baseline"), crafted, row(3, 1, w(2, 1, 1)), row(4, 1, w(2, 1, 1))]
    assert groups(rows) == [(1, (3, 4))]
    assert waves_by_member(rows).get(2) is None


def test_a_bad_level_is_dropped_not_the_wave() -> None:
    for alpha in (float("nan"), -1, 7, "0.1", True):
        meta = wave_meta(row(2, 1, {"size": 2, "incumbent": 1, "alpha": alpha}), 5)
        assert meta is not None and meta.alpha is None


def test_a_wave_holds_at_most_its_size_however_many_rows_claim_its_number() -> None:
    rows = [row(1, None, status="baseline"), *(row(i, 1, w(2, 1, 1)) for i in range(2, 7))]
    assert [len(g.members) for g in waves(rows)] == [2, 2, 1]


# -- a ledger with waves, decided by decide_wave ----------------------------------------------------------


def decision(p: float, *, early: bool = False, gain: float = 1.0) -> Decision:
    test = AdaptiveTest(
        first_pass=24,
        rejudge=0,
        alpha=ALPHA,
        statistic=gain,
        p_value=p,
        seed=0,
        draws=0,
        mcnemar_p=p,
        items=[],
    )
    keep = p < ALPHA and not early
    return Decision(
        keep=keep,
        reason=f"p={p} alone",
        literal_keep=keep,
        paired_keep=keep,
        p_value=p,
        policy="adaptive",
        early_stopped=early,
        adaptive_keep=keep,
        alpha=ALPHA,
        test=None if early else test,
    )


def write_wave(
    led: Ledger,
    run_id: str,
    incumbent: int,
    number: int | None,
    decisions: list[Decision | None],
    *,
    invalid: int | None = None,
) -> list[int]:
    """One wave of ``len(decisions)`` (+1 when ``invalid``: a member recorded as an error before it was
    judged, at that place) decided by decide_wave and recorded as `optimizer.loop.settle.settle` records it."""
    size = len(decisions) + (invalid is not None)
    meta = {"size": size, "alpha": ALPHA, "incumbent": incumbent} | ({"number": number} if number else {})
    ids = [
        led.start_experiment(
            run_id,
            parent_id=incumbent,
            strategy="library",
            edit=ProposedEdit(rationale=f"edit {i}", proposal_meta={"wave": meta}),
        ).id
        for i in range(size)
    ]
    judged = [i for n, i in enumerate(ids) if n != invalid]
    if invalid is not None:
        led.record_error(ids[invalid], "cannot be evaluated: a broken rubric; rolled back")
    decided = decide_wave(decisions, ALPHA, size, [f"experiment {i}" for i in judged])
    for exp_id, d in zip(judged, decided, strict=True):
        if d is None:
            led.record_error(exp_id, "not decided: an error; rolled back")
            continue
        led.record_decision(
            exp_id,
            ExperimentOutcome(
                status="kept" if d.keep else "rolled_back",
                reason=d.reason,
                p_value=d.p_value,
                alpha=d.alpha,
                test=d.test,
                early_stopped=d.early_stopped,
                literal_keep=d.literal_keep,
                paired_keep=d.paired_keep,
                adaptive_keep=d.adaptive_keep,
            ),
        )
        if d.keep:
            led.set_incumbent(run_id, exp_id)
    return ids


@pytest.fixture
def wave_ws(empty_workspace: Any) -> Path:
    """A run: baseline; wave 1 of 3 (the second kept); wave 2 of 3 (an invalid member, an early stop, a
    rolled-back one); a single candidate; a row whose wave record is crafted (a string)."""
    root = Path(empty_workspace.root)
    with Ledger(root / "experiments" / "ledger.sqlite") as led:
        run = led.create_run(
            RunSpec(strategy="library", policy="adaptive", split="dev", split_fingerprint="f", start_rev="s")
        )
        base = led.start_experiment(run.id, parent_id=None, seq=0)
        led.record_decision(base.id, ExperimentOutcome(status="baseline", reason="baseline"))
        led.set_incumbent(run.id, base.id)
        first = write_wave(led, run.id, base.id, 1, [decision(0.5), decision(0.01, gain=7), decision(0.2)])
        write_wave(led, run.id, first[1], 2, [decision(0.3), decision(0.04, early=True)], invalid=0)
        single = led.start_experiment(
            run.id, parent_id=first[1], strategy="library", edit=ProposedEdit(rationale="alone")
        )
        led.record_decision(single.id, ExperimentOutcome(status="rolled_back", reason="no gain", p_value=0.7))
        crafted = led.start_experiment(
            run.id,
            parent_id=first[1],
            strategy="library",
            edit=ProposedEdit(rationale="crafted", proposal_meta={"wave": "w9 of everything"}),
        )
        led.record_decision(
            crafted.id, ExperimentOutcome(status="rolled_back", reason="crafted", p_value=0.9)
        )
    return root


def test_holm_rank_recomputed_from_the_rows_is_the_one_decide_wave_wrote_in_the_reason(wave_ws: Path) -> None:
    with Ledger.open_readonly(wave_ws / "experiments" / "ledger.sqlite") as led:
        run = led.latest_run()
        assert run is not None
        rows = led.experiments(run.id)
    found = waves(rows)
    assert [(g.number, len(g.members)) for g in found] == [(1, 3), (2, 3)]
    checked = 0
    for g in found:
        members = [e for e in rows if e.id in g.members]
        for e in members:
            m = HOLM.search(e.reason or "")
            rank = holm_rank(e, members)
            if rank is not None:
                assert (
                    m is not None
                    and int(m.group(2)) == rank
                    and e.alpha == pytest.approx(float(m.group(3)), rel=1e-2)
                )
                checked += 1
    assert (
        checked == 4
    )  # wave 1's three and wave 2's fully tested one; no rank for the early stop or the error


@pytest.mark.slow
def test_history_shows_the_wave_column_keeps_waves_together_and_filters_by_the_tag(wave_ws: Path) -> None:
    with Ledger.open_readonly(wave_ws / "experiments" / "ledger.sqlite") as led:
        history = load_history(led)
    tags = {r.id: r.wave_tag for r in history.rows}
    ids = sorted(tags)
    base, w1, w2, single, crafted = ids[0], ids[1:4], ids[4:7], ids[7], ids[8]
    assert [tags[i] for i in w1] == ["w1 1/3", "w1 2/3", "w1 3/3"] and [tags[i] for i in w2] == [
        "w2 1/3",
        "w2 2/3",
        "w2 3/3",
    ]
    assert tags[base] == tags[single] == tags[crafted] == ""
    assert [r.id for r in history.rows if matches_filter(r, "w2")] == w2
    # The wave's kept member stands out from its rolled-back siblings in the wave column too.
    by_id = {r.id: r for r in history.rows}
    styles = {i: str(history_cells(by_id[i], waves=True)[4].style) for i in w1}
    assert styles == {w1[0]: "dim", w1[1]: "bold green", w1[2]: "dim"}
    assert len(history_cells(by_id[single])) == len(history_cells(by_id[single], waves=True)) - 1
    app = JudgeloopApp(wave_ws, image_mode="halfcell", watch=False)

    async def scenario(pilot: Any) -> None:
        screen = app.screen
        assert isinstance(screen, HistoryView)
        table = cast(DataTable[Any], screen.query_one("#history-table"))
        assert "wave" in [str(c.label) for c in table.columns.values()]
        assert table.row_count == len(ids)
        text = svg_text(app)
        assert "w1 2/3" in text and "w2 3/3" in text
        # Sorting by id (the default) keeps each wave's rows adjacent, in id order.
        assert [int(str(r.key.value)) for r in table.ordered_rows] == ids
        await pilot.press("slash")
        cast(Input, screen.query_one("#history-filter")).value = "w1"
        await pilot.press("enter")
        assert sorted(int(str(r.key.value)) for r in table.ordered_rows) == w1
        # The kept member opens the experiment view with its wave.
        table.move_cursor(row=[int(str(r.key.value)) for r in table.ordered_rows].index(w1[1]))
        await pilot.press("enter")
        await settle(app, pilot)
        assert isinstance(app.screen, ExperimentView) and app.experiment_id == w1[1]
        shown = " ".join(svg_text(app).split())
        assert (
            f"wave: w1, member 2 of 3 against experiment {base} · Holm over 3 at 0.1: rank 1, level 0.0333, "
            "p = 0.0100"
        ) in shown
        assert f"its wave: {w1[0]} rolled back (p 0.5000) · {w1[2]} rolled back (p 0.2000)" in shown

    drive(app, scenario, size=(140, 40))


@pytest.mark.slow
def test_experiment_view_of_an_invalid_member_an_early_stop_and_a_crafted_record(wave_ws: Path) -> None:
    with Ledger.open_readonly(wave_ws / "experiments" / "ledger.sqlite") as led:
        run = led.latest_run()
        assert run is not None
        ids = [e.id for e in led.experiments(run.id)]
        invalid, rolled, early, crafted = ids[4], ids[5], ids[6], ids[8]
        detail = load_experiment(led, invalid)
        assert detail.wave is not None and detail.wave.rank is None
        assert [(s.id, s.status) for s in detail.wave.siblings] == [
            (rolled, "rolled_back"),
            (early, "rolled_back"),
        ]
        assert load_experiment(led, crafted).wave is None
    for exp_id, says in (
        (early, "no full test (counted as p = 1, below no level)"),
        (invalid, f"its wave: {rolled} rolled back (p 0.3000) · {early} rolled back (p ≥ 0.0400)"),
    ):
        assert says in experiment_screen(wave_ws, exp_id)
    assert "wave:" not in experiment_screen(wave_ws, crafted)


def experiment_screen(ws: Path, exp_id: int) -> str:
    """The experiment view of ``exp_id`` as text, one space between words."""
    app = JudgeloopApp(ws, image_mode="halfcell", watch=False, experiment_id=exp_id, start_view="experiment")
    shown: list[str] = []

    async def scenario(pilot: Any) -> None:
        assert isinstance(app.screen, ExperimentView)
        shown.append(" ".join(svg_text(app).split()))

    drive(app, scenario, size=(140, 40))
    assert "decision:" in shown[0]
    return shown[0]


# -- the live strip -------------------------------------------------------------------------------------


def ev(n: int, kind: EventKind, exp_id: int | None, payload: dict[str, Any], run_id: str = "r1") -> Event:
    return Event(
        id=n, run_id=run_id, experiment_id=exp_id, created=datetime.now(UTC), kind=kind, payload=payload
    )


def progress(n: int, exp_id: int, done: int, total: int, **more: Any) -> Event:
    return ev(n, "progress", exp_id, {"done": done, "total": total, "input_tokens": 10 * done, **more})


def test_the_strip_sums_a_waves_interleaved_members_into_one_figure() -> None:
    started = [ev(i, "stage", 5 + i, {"stage": "experiment_started"}) for i in range(4)]
    evaluating = [ev(10 + i, "stage", 5 + i, {"stage": "evaluating"}) for i in range(4)]
    # Interleaved, each member with its own done/total; the later event of a member replaces its earlier one.
    feed = [
        progress(20, 5, 10, 162),
        progress(21, 7, 30, 162),
        progress(22, 6, 20, 162),
        progress(23, 5, 60, 162),
        progress(24, 8, 40, 162),
        progress(25, 7, 70, 162, cost_usd=0.5),
        progress(26, 6, 80, 162, cost_usd=0.3),
    ]
    state = apply_events(LiveState(run_id="r1", run_status="running"), [*started, *evaluating, *feed])
    latest = {5: 60, 6: 80, 7: 70, 8: 40}
    assert f"wave exps 5–8: judged {sum(latest.values())}/{4 * 162}" in state.line()
    assert "(exp" not in state.line() and f"{10 * sum(latest.values()):,} tokens" in state.line()
    assert "$0.5000" in state.line()  # never back to a smaller member's figure
    # A member decided early while the others go on: out of the sum, the rest still one figure.
    state = apply_events(state, [ev(30, "decision", 6, {"status": "error"}), progress(31, 8, 90, 162)])
    assert f"wave exps 5, 7, 8: judged {60 + 70 + 90}/{3 * 162}" in state.line()
    assert "stage decided: error" in state.line()
    # The others decided: no item count, as after one candidate.
    state = apply_events(state, [ev(40 + i, "decision", i, {"status": "rolled_back"}) for i in (5, 7, 8)])
    assert "judged" not in state.line() and "wave" not in state.line()
    # The next wave's first start empties the members.
    state = apply_events(
        state,
        [
            *(ev(50 + i, "stage", 9 + i, {"stage": "experiment_started"}) for i in range(2)),
            progress(60, 9, 5, 162),
        ],
    )
    assert "wave" not in state.line() and "judged 5/162" in state.line()


def test_a_new_run_resets_the_waves_members() -> None:
    state = apply_events(LiveState(), [progress(1, 5, 10, 100), progress(2, 6, 20, 100)])
    assert "wave exps 5–6: judged 30/200" in state.line()
    state = apply_events(state, [ev(3, "progress", 9, {"done": 1, "total": 50}, run_id="r2")])
    assert state.run_id == "r2" and "wave" not in state.line() and "judged 1/50" in state.line()


def test_one_candidate_reads_as_before_waves() -> None:
    payload = {
        "done": 3,
        "total": 88,
        "errors": 1,
        "input_tokens": 900,
        "output_tokens": 100,
        "cost_usd": 0.25,
        "elapsed_s": 12.0,
    }
    state = apply_events(
        LiveState(), [ev(1, "stage", 6, {"stage": "evaluating"}), ev(2, "progress", 6, payload)]
    )
    assert state.line() == (
        "run r1 · ? · stage evaluating (exp 6) · judged 3/88 · 1 errors · 1,000 tokens · $0.2500 · 12s"
    )
    # Its re-judging pass's progress replaces the first pass's, as before.
    state = apply_events(state, [ev(3, "progress", 6, payload | {"done": 2, "total": 5})])
    assert "judged 2/5" in state.line()
    state = apply_events(state, [ev(4, "decision", 6, {"status": "kept"})])
    assert (
        state.line() == "run r1 · ? · stage decided: kept (exp 6) · 1 errors · 1,000 tokens · $0.2500 · 12s"
    )
