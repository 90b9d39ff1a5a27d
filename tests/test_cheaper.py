"""Cheaper, not worse: the non-inferiority test and the keep rule (pure; the loop in tests/loop/test_loop_cheaper.py)."""

from __future__ import annotations

import itertools
from fractions import Fraction

from optimizer.models import Label
from optimizer.stats.decision import FprStopper, decide_cheaper, noninferiority_test
from optimizer.stats.metrics import Answer
from optimizer.workspace.config import LoopSection


def brute_p(values: list[Fraction]) -> Fraction:
    """P(Σ s_i|x_i| ≥ Σ x_i) over every sign vector, counted one by one."""
    stat = sum(values, Fraction(0))
    hits = sum(
        1
        for signs in itertools.product((1, -1), repeat=len(values))
        if sum((s * abs(x) for s, x in zip(signs, values, strict=True)), Fraction(0)) >= stat
    )
    return Fraction(hits, 2 ** len(values))


def test_the_shifted_sign_flip_p_value_equals_an_enumeration() -> None:
    for diffs, n, margin in (
        ([Fraction(-1), Fraction(-1)], 8, 1),
        ([Fraction(1, 3), Fraction(-2, 3)], 7, 2),
        ([], 9, 1),
        ([Fraction(-1)] * 3 + [Fraction(1)], 10, 1),
    ):
        shift = Fraction(margin, n)
        expected = brute_p([d + shift for d in diffs] + [shift] * (n - len(diffs)))
        assert noninferiority_test(diffs, n, margin).p_exact == expected


def labels(n_pos: int, n_neg: int) -> dict[str, Label]:
    out = {f"p{i}": Label(trajectory_id=f"p{i}", label="positive", original_id=f"p{i}") for i in range(n_pos)}
    out |= {
        f"n{i}": Label(trajectory_id=f"n{i}", label="negative", original_id=f"n{i}") for i in range(n_neg)
    }
    return out


def answers(labs: dict[str, Label], wrong: set[str]) -> dict[str, list[Answer]]:
    return {
        t: [Answer(success=lab.is_positive != (t in wrong), mistake_type=None)] for t, lab in labs.items()
    }


LOOP = LoopSection(cheaper_margin_items=1)


def test_equal_and_cheaper_is_kept_worse_by_two_or_fpr_up_or_too_small_a_saving_is_not() -> None:
    labs = labels(12, 12)
    inc = answers(labs, {"p0", "n0"})
    equal = decide_cheaper(labs, inc, answers(labs, {"p0", "n0"}), LOOP, saving=0.5)
    assert equal.keep and equal.gain == 0 and "kept as cheaper, not worse" in equal.reason
    worse = decide_cheaper(labs, inc, answers(labs, {"p0", "n0", "p1", "p2"}), LOOP, saving=0.5)
    assert not worse.keep and worse.gain == -2 and "not shown within 1 item(s)" in worse.reason
    fpr_up = decide_cheaper(labs, inc, answers(labs, {"n0", "n1"}), LOOP, saving=0.5)  # one better, FPR up
    assert not fpr_up.keep and "FPR rose" in fpr_up.reason
    small = decide_cheaper(labs, inc, answers(labs, {"p0", "n0"}), LOOP, saving=0.1)
    assert not small.keep and "under cheaper_min_saving 20%" in small.reason
    off = decide_cheaper(labs, inc, answers(labs, {"p0", "n0"}), LoopSection(), saving=0.5)
    assert not off.keep


def test_the_fpr_stopper_stops_exactly_when_fpr_has_provably_risen() -> None:
    labs = labels(4, 4)
    inc = {t: a[0] for t, a in answers(labs, {"n0"}).items()}
    stopper = FprStopper(labs, inc, LoopSection())
    assert stopper.add("n0", Answer(success=True, mistake_type=None)) is None  # 1 FP, as the incumbent
    assert stopper.add("p0", Answer(success=False, mistake_type=None)) is None  # positives never stop it
    assert stopper.add("n0", Answer(success=False, mistake_type=None)) is None  # replaced: 0 FP
    stopper.add("n1", Answer(success=True, mistake_type=None))
    stopped = stopper.add("n2", Answer(success=True, mistake_type=None))
    assert stopped is not None and not stopped.keep and "(FPR rose)" in stopped.reason


def test_the_tui_history_marks_a_cheaper_keep() -> None:
    from datetime import UTC, datetime

    from optimizer.ledger import Experiment
    from tui.data import HistoryRow
    from tui.views.history import history_cells

    def row(kind: str | None) -> str:
        exp = Experiment(id=3, run_id="r", seq=2, created=datetime.now(UTC), status="kept", keep_kind=kind)
        return history_cells(HistoryRow(exp, None, None, None, in_chain=True))[3].plain

    assert row("cheaper") == "kept cheaper"
    assert "cheaper" not in row("improved")
