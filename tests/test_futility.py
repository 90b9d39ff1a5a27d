"""Futility screening (`optimizer.stats.futility`): the screen, P(clear), a rollback and never a keep, and its
two keys in judgeloop.toml."""

from __future__ import annotations

import itertools
import math
import random
import re
from pathlib import Path

import pytest

from optimizer.cli import main
from optimizer.models import Label
from optimizer.stats.decision import decide_adaptive
from optimizer.stats.futility import (
    make_looks,
    make_screen,
    p_clear,
    p_clear_rejudged,
    screen_decision,
    screen_decision_rejudged,
)
from optimizer.stats.metrics import Answer, is_correct
from optimizer.workspace.config import LoopSection

FUTILE = re.compile(r"^futile: P\(clear\) = (\d\.\d{3}) < (\S+) after (\d+) of (\d+) items ")
LOOP = LoopSection(futility=True, futility_threshold=0.05)


def _labels(n_pos: int, n_neg: int) -> dict[str, Label]:
    out = {
        f"p{i:02d}": Label(trajectory_id=f"p{i:02d}", label="positive", original_id="r") for i in range(n_pos)
    }
    out |= {
        f"n{i:02d}": Label(trajectory_id=f"n{i:02d}", label="negative", original_id="r") for i in range(n_neg)
    }
    return out


def _answer(label: Label, right: bool) -> Answer:
    return Answer(success=label.is_positive if right else not label.is_positive)


def _incumbent(
    labels: dict[str, Label], rng: random.Random, accuracy: float = 0.7
) -> dict[str, list[Answer]]:
    return {t: [_answer(lab, rng.random() < accuracy)] for t, lab in labels.items()}


def test_the_screen_holds_every_incumbent_error_and_a_seeded_share_of_each_class() -> None:
    labels = _labels(20, 30)
    inc = _incumbent(labels, random.Random(3))
    answers = {t: js[0] for t, js in inc.items()}
    screen = make_screen(labels, answers, seed=11, share=0.3)
    wrong = {t for t in labels if not is_correct(labels[t], answers[t])}
    assert set(screen.wrong) == wrong
    for positive in (True, False):
        right = [t for t in labels if labels[t].is_positive is positive and t not in wrong]
        drawn = [t for t in screen.sampled if labels[t].is_positive is positive]
        assert set(drawn) <= set(right) and len(drawn) == math.ceil(0.3 * len(right))
    assert make_screen(labels, answers, seed=11, share=0.3) == screen  # replays from its seed
    assert any(
        make_screen(labels, answers, seed=s, share=0.3).sampled != screen.sampled for s in range(12, 20)
    )
    order = screen.order(labels, sorted(labels))
    assert set(order[: len(screen.ids)]) == screen.ids and sorted(order) == sorted(labels)


def test_a_no_op_candidate_is_futile_after_the_screen_with_the_reason_recorded() -> None:
    labels = _labels(20, 30)
    inc = _incumbent(labels, random.Random(5))
    screen = make_screen(labels, {t: js[0] for t, js in inc.items()}, seed=1)
    same = {t: list(inc[t]) for t in screen.ids}  # judged exactly as the incumbent: nothing to gain
    decision = screen_decision(labels, screen, inc, same, LOOP, level=0.1, seed=2)
    assert decision is not None and not decision.keep and decision.early_stopped
    m = FUTILE.match(decision.reason)
    assert m and float(m.group(1)) == 0.0 and m.group(2) == "0.05", decision.reason
    assert (int(m.group(3)), int(m.group(4))) == (len(screen.ids), len(labels))


def test_a_clear_fix_is_not_futile_and_an_unfinished_screen_is_never_judged() -> None:
    labels = _labels(20, 30)
    inc = _incumbent(labels, random.Random(5))
    screen = make_screen(labels, {t: js[0] for t, js in inc.items()}, seed=1)
    fixed = {t: [_answer(labels[t], True)] for t in screen.ids}  # every incumbent error fixed, nothing broken
    est = p_clear(labels, screen, inc, fixed, LOOP, level=0.1, seed=2)
    assert est is not None and est.p_clear > 0.9
    assert screen_decision(labels, screen, inc, fixed, LOOP, level=0.1, seed=2) is None
    one_short = dict(list(fixed.items())[1:])
    assert p_clear(labels, screen, inc, one_short, LOOP, level=0.1, seed=2) is None


@pytest.mark.slow
def test_futility_never_keeps_and_a_keep_with_it_is_a_keep_without_it() -> None:
    """Random splits and judges, thresholds up to 0.99: the screen returns a rollback or nothing, so
    the decision with screening (the screen's rollback, else the full decision) keeps only where
    the full decision keeps — false keeps cannot rise."""
    rng = random.Random(0)
    stops = keeps = 0
    for trial in range(60):
        labels = _labels(rng.randint(3, 10), rng.randint(3, 10))
        loop = LoopSection(futility=True, futility_threshold=rng.choice([0.01, 0.2, 0.5, 0.99]), rejudge=0)
        inc = _incumbent(labels, rng)
        cand = {t: [_answer(lab, rng.random() < rng.choice([0.5, 0.9, 1.0]))] for t, lab in labels.items()}
        screen = make_screen(
            labels, {t: js[0] for t, js in inc.items()}, seed=trial, share=rng.choice([0.2, 0.5])
        )
        early = screen_decision(
            labels, screen, inc, {t: cand[t] for t in screen.ids}, loop, level=0.1, seed=trial
        )
        full = decide_adaptive(labels, inc, cand, loop, first_pass=1)
        with_screen = early if early is not None else full
        assert early is None or not early.keep
        assert not with_screen.keep or full.keep
        stops += early is not None
        keeps += with_screen.keep
    assert stops and keeps, (stops, keeps)  # both branches exercised


def test_the_looks_are_nested_screens_each_holding_every_incumbent_error() -> None:
    labels = _labels(20, 30)
    answers = {t: js[0] for t, js in _incumbent(labels, random.Random(3)).items()}
    looks = make_looks(labels, answers, seed=11, shares=(0.1, 0.4, 0.7))
    wrong = {t for t in labels if not is_correct(labels[t], answers[t])}
    for earlier, later in itertools.pairwise(looks):
        assert earlier.ids < later.ids
    for look, share in zip(looks, (0.1, 0.4, 0.7), strict=True):
        assert set(look.wrong) == wrong
        for positive in (True, False):
            right = [t for t in labels if labels[t].is_positive is positive and t not in wrong]
            drawn = [t for t in look.sampled if labels[t].is_positive is positive]
            assert set(drawn) <= set(right) and len(drawn) == math.ceil(share * len(right))
    assert make_looks(labels, answers, seed=11, shares=(0.1, 0.4, 0.7)) == looks  # replays from its seed
    for bad in [(), (0.3, 0.3), (0.5, 0.2), (0.0, 0.5), (0.5, 1.0)]:
        with pytest.raises(ValueError, match="increasing shares"):
            make_looks(labels, answers, seed=11, shares=bad)


def _rejudged(
    labels: dict[str, Label],
    inc: dict[str, list[Answer]],
    cand: dict[str, list[Answer]],
    items: set[str],
    rng: random.Random,
    accuracy: float,
) -> tuple[dict[str, list[Answer]], dict[str, list[Answer]]]:
    """``inc``/``cand`` with two more judgements under each prompt on the items in ``items`` that disagree."""
    inc2, cand2 = {t: list(js) for t, js in inc.items()}, {t: list(js) for t, js in cand.items()}
    for t in items:
        if inc[t][0].success != cand[t][0].success:
            inc2[t] += [_answer(labels[t], rng.random() < 0.6) for _ in range(2)]
            cand2[t] += [_answer(labels[t], rng.random() < accuracy) for _ in range(2)]
    return inc2, cand2


def test_after_re_judging_a_look_a_no_op_is_futile_and_a_clear_fix_is_not() -> None:
    labels = _labels(20, 30)
    inc = _incumbent(labels, random.Random(5))
    look = make_looks(labels, {t: js[0] for t, js in inc.items()}, seed=1)[0]
    same = {t: list(inc[t]) for t in look.ids}
    decision = screen_decision_rejudged(labels, look, inc, same, LOOP, level=0.1, seed=2)
    assert decision is not None and not decision.keep and FUTILE.match(decision.reason), decision
    # Every incumbent error fixed on re-judging too, nothing broken: P(clear) 1.
    fixed = {t: [_answer(labels[t], True)] * (3 if t in look.wrong else 1) for t in look.ids}
    inc_rj = {t: inc[t] * (3 if t in look.wrong else 1) for t in labels}
    est = p_clear_rejudged(labels, look, inc_rj, fixed, LOOP, level=0.1, seed=2)
    assert est is not None and est.p_clear == 1.0 and est.judged == len(look.ids)
    assert screen_decision_rejudged(labels, look, inc_rj, fixed, LOOP, level=0.1, seed=2) is None
    assert (
        p_clear_rejudged(labels, look, inc_rj, dict(list(fixed.items())[1:]), LOOP, level=0.1, seed=2) is None
    )


@pytest.mark.slow
def test_futility_after_re_judged_looks_never_keeps_and_a_keep_with_it_is_a_keep_without_it() -> None:
    """As above, with the loop's looks: each look's disagreements re-judged, P(clear) checked after each;
    the decision with screening keeps only where the full adaptive decision (same judgements) keeps."""
    rng = random.Random(1)
    stops = keeps = 0
    for trial in range(40):
        labels = _labels(rng.randint(4, 12), rng.randint(4, 12))
        loop = LoopSection(futility=True, futility_threshold=rng.choice([0.01, 0.2, 0.5, 0.99]))
        inc = _incumbent(labels, rng)
        accuracy = rng.choice([0.5, 0.9, 1.0])
        cand = {t: [_answer(lab, rng.random() < accuracy)] for t, lab in labels.items()}
        inc_all, cand_all = _rejudged(labels, inc, cand, set(labels), rng, accuracy)
        looks = make_looks(labels, {t: js[0] for t, js in inc.items()}, seed=trial, shares=(0.2, 0.5))
        early = None
        for look in looks:
            inc_now = {t: inc_all[t] if t in look.ids else inc[t] for t in labels}
            early = screen_decision_rejudged(
                labels, look, inc_now, {t: cand_all[t] for t in look.ids}, loop, level=0.1, seed=trial
            )
            if early is not None:
                break
        moved = [t for t in labels if inc[t][0].success != cand[t][0].success]
        full = decide_adaptive(labels, inc_all, cand_all, loop, first_pass=1, rejudged=moved)
        with_screen = early if early is not None else full
        assert early is None or not early.keep
        assert not with_screen.keep or full.keep
        stops += early is not None
        keeps += with_screen.keep
    assert stops and keeps, (stops, keeps)  # both branches exercised


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("futility_threshold = 1.5", "[loop.futility_threshold]"),
        ("futility_threshold = 0", "[loop.futility_threshold]"),
        ('futility = "maybe"', "[loop] futility"),
    ],
)
def test_a_bad_futility_key_is_refused_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], line: str, expected: str
) -> None:
    from optimizer.scaffold import init_workspace

    root = init_workspace(tmp_path / "ws", sample=False).root
    cfg = root / "judgeloop.toml"
    key = line.split(" =")[0]
    text, n = re.subn(rf"(?m)^{key} = .*$", line, cfg.read_text(encoding="utf-8"), count=1)
    assert n == 1
    cfg.write_text(text, encoding="utf-8")
    capsys.readouterr()
    assert main(["-w", str(root), "devset", "list"]) == 2
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err and "\n" not in err and str(cfg) in err and expected in err, err
