"""An early-stopped candidate's reason says what was observed first (items judged, fixed, broken) and
labels the best-case completion as a bound; the figures are checked against an independent count over
random splits and judgements, for the paired and the adaptive bounds."""

from __future__ import annotations

import random
import re

import pytest

from optimizer.models import Label
from optimizer.stats.decision import adaptive_stopped_decision, stopped_decision
from optimizer.stats.metrics import Answer, is_correct, majority_answer, score
from optimizer.workspace.config import LoopSection

YES, NO = Answer(success=True), Answer(success=False)
OBSERVED = re.compile(r"^stopped early after (\d+)/(\d+) items: (\d+) fixed, (\d+) broken; even if ")


def _labels(rng: random.Random) -> dict[str, Label]:
    n = rng.randint(4, 14)
    n_pos = rng.randint(1, n - 1)
    return {
        f"t{i}": Label(
            trajectory_id=f"t{i}", label="positive" if i < n_pos else "negative", original_id=f"t{i}"
        )
        for i in range(n)
    }


def _answer(rng: random.Random, label: Label, p_right: float) -> Answer:
    right = rng.random() < p_right
    return YES if label.is_positive == right else NO


def test_a_paired_early_stop_states_the_observed_flips_then_the_bound() -> None:
    rng = random.Random("reasons-paired")
    checked = 0
    for _ in range(300):
        labels = _labels(rng)
        incumbent = {t: _answer(rng, lab, 0.7) for t, lab in labels.items()}
        loop = LoopSection(policy="paired", alpha=rng.choice((0.05, 0.1)))
        order = list(labels)
        rng.shuffle(order)
        so_far: dict[str, Answer] = {}
        for tid in order:
            so_far[tid] = _answer(rng, labels[tid], 0.5)
            d = stopped_decision(labels, so_far, incumbent, loop)
            if d is None or "false positive(s) already" in d.reason:
                continue
            m = OBSERVED.match(d.reason)
            assert m, d.reason
            fixed = sum(
                1
                for t, a in so_far.items()
                if is_correct(labels[t], a) and not is_correct(labels[t], incumbent[t])
            )
            broken = sum(
                1
                for t, a in so_far.items()
                if not is_correct(labels[t], a) and is_correct(labels[t], incumbent[t])
            )
            assert tuple(map(int, m.groups())) == (len(so_far), len(labels), fixed, broken), d.reason
            # The best case, completed here independently: every unjudged item answered correctly.
            best = {**{t: YES if lab.is_positive else NO for t, lab in labels.items()}, **so_far}
            kappa, kappa_inc = score(labels, best).kappa, score(labels, incumbent).kappa
            assert kappa is not None and kappa_inc is not None
            assert f"(bound: kappa ≤ {kappa:.3f} vs {kappa_inc:.3f}, " in d.reason, d.reason
            assert (
                d.reason.index("broken") < d.reason.index("bound:") and "it could not be kept (" in d.reason
            )
            checked += 1
            break
    assert checked > 50, checked


@pytest.mark.slow
def test_an_adaptive_early_stop_states_the_observed_flips_on_first_pass_majorities() -> None:
    rng = random.Random("reasons-adaptive")
    checked = rejudge_skips = 0
    for _ in range(300):
        labels = _labels(rng)
        inc = {t: [_answer(rng, lab, 0.7)] for t, lab in labels.items()}
        loop = LoopSection(policy="adaptive", alpha=0.1, rejudge=rng.choice((0, 1, 2)))
        order = list(labels)
        rng.shuffle(order)
        so_far: dict[str, list[Answer]] = {}
        for tid in order:
            so_far[tid] = [_answer(rng, labels[tid], 0.5)]
            d = adaptive_stopped_decision(labels, so_far, inc, loop)
            if d is None:
                continue
            right = {t: is_correct(labels[t], majority_answer(js)) for t, js in so_far.items()}
            inc_right = {t: is_correct(labels[t], majority_answer(js)) for t, js in inc.items()}
            fixed = sum(1 for t in so_far if right[t] and not inc_right[t])
            broken = sum(1 for t in so_far if inc_right[t] and not right[t])
            if len(so_far) == len(labels):  # every item judged: only re-judging was left
                assert d.reason.startswith("not re-judged (") and not d.early_stopped
                assert f"judged all {len(labels)} items, {fixed} fixed, {broken} broken; even if " in d.reason
                rejudge_skips += 1
            else:
                m = OBSERVED.match(d.reason)
                assert m, d.reason
                assert tuple(map(int, m.groups())) == (len(so_far), len(labels), fixed, broken), d.reason
                checked += 1
            assert "(bound: sign-flip p ≥ " in d.reason and "it could not be kept (" in d.reason
            break
    assert checked > 50 and rejudge_skips > 0, (checked, rejudge_skips)
