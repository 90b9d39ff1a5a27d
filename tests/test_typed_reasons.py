"""A decision's reason is data (`Reason`), set where the reason is built: every rule's `Reason.text()` is
the reason stored and shown, byte for byte; the advice given to the person who decides (--propose-only)
and the report's count of cheaper tests read its fields; the ledger stores it (schema 13), and a row
decided before that is read from its text (issue 30: retire the parsing of display strings)."""

from __future__ import annotations

import random
import sqlite3
from pathlib import Path
from types import SimpleNamespace
from typing import cast

from optimizer.ledger import SCHEMA_VERSION, ExperimentOutcome, Ledger
from optimizer.ledger.rows import Experiment
from optimizer.loop.context import RunContext
from optimizer.loop.costs import cost_rules
from optimizer.loop.records import as_advice, stored_advice
from optimizer.models import Label
from optimizer.report.data import cheaper_tested
from optimizer.stats.decision import (
    AdaptiveTest,
    Decision,
    Reason,
    adaptive_stopped_decision,
    decide_adaptive,
    decide_cheaper,
    decide_wave,
    stopped_decision,
)
from optimizer.stats.futility import make_screen, screen_decision
from optimizer.stats.metrics import Answer
from optimizer.vocab import POLICIES, PolicyName
from optimizer.workspace.config import LoopSection
from tests.support.ledger import make_run

YES, NO = Answer(success=True), Answer(success=False)


def _labels(rng: random.Random, lo: int = 4, hi: int = 14) -> dict[str, Label]:
    n = rng.randint(lo, hi)
    n_pos = rng.randint(1, n - 1)
    return {
        f"t{i:02d}": Label(
            trajectory_id=f"t{i:02d}", label="positive" if i < n_pos else "negative", original_id="r"
        )
        for i in range(n)
    }


def _answer(rng: random.Random, label: Label, p_right: float) -> Answer:
    return YES if label.is_positive == (rng.random() < p_right) else NO


def _typed(d: Decision) -> Reason:
    """``d``'s reason as data, checked to be the reason it stores."""
    assert d.why is not None, d.reason
    assert d.why.text() == d.reason
    assert d.why.kept == d.keep
    return d.why


def test_every_rule_sets_its_reason_as_data_and_the_advice_reads_it() -> None:
    rng = random.Random("typed-reasons")
    seen: set[str] = set()
    for _ in range(150):
        labels = _labels(rng)
        policy: PolicyName = rng.choice(POLICIES)
        loop = LoopSection(policy=policy, alpha=rng.choice((0.05, 0.1)), rejudge=rng.choice((0, 2)))
        inc = {t: [_answer(rng, lab, 0.7) for _ in range(3)] for t, lab in labels.items()}
        cand = {t: [_answer(rng, lab, 0.75) for _ in range(3)] for t, lab in labels.items()}
        decisions: list[Decision | None] = [decide_adaptive(labels, inc, cand, loop, first_pass=3)]
        so_far: dict[str, list[Answer]] = {}
        for tid in labels:
            so_far[tid] = cand[tid]
            decisions.append(
                stopped_decision(
                    labels, {t: a[0] for t, a in so_far.items()}, {t: a[0] for t, a in inc.items()}, loop
                )
            )
            if policy == "adaptive":
                decisions.append(adaptive_stopped_decision(labels, so_far, inc, loop))
        for d in decisions:
            if d is None:
                continue
            why = _typed(d)
            seen.add(why.rule)
            unmet = f" ({'; '.join(why.unmet)})" if why.unmet else ""
            if why.bound:
                # "… it could not be kept (…)": the text's parse could only quote it; the fields advise.
                assert stored_advice(d.reason).startswith("says: ")
                assert as_advice(why, d.reason) == f"would roll it back{unmet}{why.after}: {why.evidence}"
            else:
                # "…: kept" / "…: rolled back (…)": the same advice as the text's parse gave.
                assert as_advice(why, d.reason) == stored_advice(d.reason)
    assert seen == {"literal", "paired", "adaptive", "fpr_bound", "kappa_bound", "adaptive_bound"}, seen


def test_a_futility_stop_and_a_wave_state_their_rule_and_the_reason_they_rewrite() -> None:
    rng = random.Random(5)
    labels = _labels(rng, 50, 50)
    inc = {t: [_answer(rng, lab, 0.7)] for t, lab in labels.items()}
    screen = make_screen(labels, {t: js[0] for t, js in inc.items()}, seed=1)
    loop = LoopSection(futility=True, futility_threshold=0.05)
    futile = screen_decision(
        labels, screen, inc, {t: list(inc[t]) for t in screen.ids}, loop, level=0.1, seed=2
    )
    assert futile is not None
    assert _typed(futile).rule == "futility" and as_advice(futile.why, futile.reason) == stored_advice(
        futile.reason
    )

    def alone(p: float, keep: bool, gain: float) -> Decision:
        why = Reason(
            rule="adaptive", kept=keep, evidence=f"gain {gain:+.2f}", unmet=() if keep else ("FPR rose",)
        )
        test = AdaptiveTest(
            first_pass=1,
            rejudge=2,
            alpha=0.1,
            statistic=gain,
            p_value=p,
            seed=0,
            draws=0,
            mcnemar_p=p,
            items=[],
        )
        return Decision(
            keep=keep,
            reason=why.text(),
            why=why,
            literal_keep=keep,
            paired_keep=keep,
            p_value=p,
            policy="adaptive",
            test=test,
        )

    wave = decide_wave(
        [alone(0.001, True, 2.0), alone(0.002, True, 3.0), alone(0.5, False, 0.0)], 0.1, 3, ["a", "b", "c"]
    )
    whys = [_typed(d) for d in wave if d is not None]
    assert [w.kept for w in whys] == [False, True, False]
    assert all(w.rules() == ("adaptive", "wave") for w in whys)
    assert whys[0].unmet == ("b of the wave has the larger gain", "at most one keep per wave")
    assert as_advice(whys[1], wave[1].reason if wave[1] else "").startswith(
        "would keep it (the largest gain of 2 "
    )


def _ctx(labels: dict[str, Label], loop: LoopSection, cap: float | None) -> RunContext:
    """The part of a run's context the cost rules read: the labels, [loop], the seed and max_cost_ratio."""
    return cast(
        RunContext,
        SimpleNamespace(
            labels=labels,
            settings=SimpleNamespace(loop=loop),
            decision_seed=lambda _exp: 0,
            ws=SimpleNamespace(config=SimpleNamespace(optimizer=SimpleNamespace(max_cost_ratio=cap))),
        ),
    )


def test_the_cost_rules_chain_their_reason_and_a_cheaper_keep_is_advised_as_a_keep() -> None:
    rng = random.Random(7)
    labels = _labels(rng, 30, 30)
    inc = {t: [_answer(rng, lab, 0.8) for _ in range(3)] for t, lab in labels.items()}
    loop = LoopSection(cheaper_margin_items=3, cheaper_min_saving=0.2)
    same = decide_adaptive(labels, inc, inc, loop, first_pass=3)
    assert not same.keep
    incumbent = Experiment.model_construct(verdict_cost_usd=1.0)
    kept = cost_rules(
        _ctx(labels, loop, None), same, incumbent, 0.5, (inc, inc), level=0.1, experiment_id=1, cheaper=True
    )
    why = _typed(kept)
    assert kept.keep and kept.keep_kind == "cheaper" and why.rules() == ("adaptive", "cheaper")
    # The text's parse found the first pass's ": rolled back" and advised a roll back of a cheaper keep.
    assert stored_advice(kept.reason).startswith("would roll it back")
    assert as_advice(why, kept.reason) == f"would keep it as cheaper, not worse: {why.evidence}"
    test = decide_cheaper(labels, inc, inc, loop, saving=0.5)
    assert test.why.text() == test.reason and why.evidence == same.reason + "; " + test.why.evidence

    capped = cost_rules(
        _ctx(labels, loop, 1.5), kept, incumbent, 2.0, (inc, inc), level=0.1, experiment_id=1, cheaper=False
    )
    cap_why = _typed(capped)
    assert not capped.keep and cap_why.rules() == ("adaptive", "cheaper", "cost_cap")
    assert capped.reason.endswith("max_cost_ratio 1.5: rolled back") and as_advice(
        cap_why, capped.reason
    ) == stored_advice(capped.reason)


def test_the_ledger_keeps_the_typed_reason_and_reads_an_older_row_from_its_text(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite"
    why = Reason(
        rule="cheaper",
        kept=False,
        evidence="cheaper: 50% less per verdict",
        unmet=("FPR rose",),
        rolled_back_word="not kept",
    )
    text = "kappa 0.5 → 0.5: rolled back (kappa did not rise); cheaper: …, non-inferiority (margin 3 item(s)) …: not kept (FPR rose)"
    with Ledger(path) as ledger:
        run = make_run(ledger)
        base = ledger.start_experiment(run.id, parent_id=None, strategy="baseline")
        new = ledger.start_experiment(run.id, parent_id=base.id, strategy="scripted", seq=1)
        old = ledger.start_experiment(run.id, parent_id=base.id, strategy="scripted", seq=2)
        for exp_id, typed in ((new.id, why), (old.id, None)):
            ledger.record_decision(
                exp_id,
                ExperimentOutcome(
                    status="rolled_back", reason=text, policy_keep=False, policy_reason=text, policy_why=typed
                ),
            )
        got = ledger.get_experiment(new.id)
    assert got.policy_why == why and cheaper_tested(got)
    conn = sqlite3.connect(path)  # what a schema-12 judgeloop wrote: no typed reason
    conn.execute("ALTER TABLE experiments DROP COLUMN policy_why")
    conn.execute("PRAGMA user_version = 12")
    conn.close()
    with Ledger.open_readonly(path) as ro:
        before = ro.get_experiment(old.id)
    assert before.policy_why is None and before.policy_reason == text
    assert cheaper_tested(before)  # read from the text, as before
    assert as_advice(before.policy_why, text).startswith("would roll it back (kappa did not rise); cheaper: ")
    # A typed reason is read from its fields, never its text: a rule other than the cheaper test is not one.
    assert not cheaper_tested(
        got.model_copy(update={"policy_why": why.model_copy(update={"rule": "paired"})})
    )
    with Ledger(path) as ledger:  # upgraded when written
        ledger.record_decision(old.id, ExperimentOutcome(status="rolled_back", reason=text, policy_why=why))
        assert ledger.get_experiment(old.id).policy_why == why
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 13
    conn.close()
