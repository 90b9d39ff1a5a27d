"""The night benchmark's loop (`benchmarks/night.py`): one night of candidates under one keep rule, each
evaluated the way `optimizer.loop.evaluate` evaluates it and decided by the real decision code.

What is real: every decision and every stop — `optimizer.stats.decision.EarlyStopper` after each first-pass
judgement (negatives first, `optimizer.loop.records.evaluation_order`), futility's looks
(`optimizer.stats.futility.make_looks`, the look's disagreements re-judged, then
`screen_decision_rejudged`), the skip of hopeless re-judging (`adaptive_stopped_decision`), the
re-judging of the disagreements (`disagreements`, ``[loop] rejudge`` more judgements under each prompt)
and the decision itself (`decide_adaptive`, which the loop calls for every policy), all with the
``[loop]`` defaults of `optimizer.workspace.config.LoopSection` (alpha, rejudge, futility threshold).
What is simulated: the judge (each call a fresh draw with the item's probability of a right answer,
`benchmarks._night_model`), the edits, and the loop's bookkeeping around the decision: no git, no ledger,
no provider. The incumbent's extra judgements are drawn once per incumbent (the judge cache makes them
one call each); a kept candidate's judgements become the incumbent's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from benchmarks._night_model import Dist, Edit, Items, draw_edit, make_items, right_odds, true_metrics
from optimizer.loop.records import evaluation_order
from optimizer.models import Label
from optimizer.stats.decision import (
    EarlyStopper,
    adaptive_stopped_decision,
    decide_adaptive,
    disagreements,
)
from optimizer.stats.futility import Screen, make_looks, screen_decision_rejudged
from optimizer.stats.metrics import Answer
from optimizer.stats.policies import policy_for
from optimizer.stats.pooling import points_right_way
from optimizer.stats.rules import Decision
from optimizer.workspace.config import LoopSection

# The keep rules compared: the three policies, adaptive with and without futility (on by default), and
# adaptive with stacking (`[loop] stack = 3`: rolled-back candidates that point the right way,
# `optimizer.stats.pooling.points_right_way`, pooled and tested three at a time as one merged candidate),
# without futility and with it (futility's early rollbacks are never pooled: they are not fully decided).
RULES: dict[str, dict[str, object]] = {
    "literal": {"policy": "literal"},
    "paired": {"policy": "paired"},
    "adaptive": {"policy": "adaptive", "futility": False},
    "adaptive+futility": {"policy": "adaptive", "futility": True},
    "stack3": {"policy": "adaptive", "futility": False, "stack": 3},
    "stack3+futility": {"policy": "adaptive", "futility": True, "stack": 3},
}
MAX_CANDIDATES = 2000  # a bound on one night's loop, far above what any budget buys


def loop_for(rule: str) -> LoopSection:
    """The ``[loop]`` section of ``rule``: the defaults, with its policy and futility."""
    return LoopSection.model_validate(RULES[rule])


class Split:
    """The dev items as the decision code sees them: labels and the two answers each item can get."""

    def __init__(self, positive: np.ndarray) -> None:
        self.ids = [f"i{k:03d}" for k in range(len(positive))]
        self.index = {t: k for k, t in enumerate(self.ids)}
        self.labels = {
            t: Label(trajectory_id=t, label="positive" if pos else "negative", original_id=t)
            for t, pos in zip(self.ids, positive, strict=True)
        }
        self.right = [Answer(success=bool(pos)) for pos in positive]
        self.wrong = [Answer(success=not pos) for pos in positive]

    def answer(self, k: int, right: bool) -> Answer:
        return self.right[k] if right else self.wrong[k]

    def answers(self, k: int, rights: Sequence[bool]) -> list[Answer]:
        return [self.answer(k, r) for r in rights]


@dataclass
class Incumbent:
    """The incumbent prompt: its logits (dev, held-out), first-pass judgements (right or not, per dev
    item) and the extra judgements drawn so far (item index → right or not, replicates 1, 2, ...)."""

    dev: np.ndarray
    held: np.ndarray
    first: np.ndarray
    extra: dict[int, list[bool]] = field(default_factory=dict)


@dataclass
class Candidate:
    """One candidate's evaluation as it goes: judgements, extras, calls, re-judged ids."""

    q_i: np.ndarray
    q_c: np.ndarray
    first: dict[int, bool] = field(default_factory=dict)
    extra: dict[int, list[bool]] = field(default_factory=dict)
    calls: int = 0
    rejudged: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Outcome:
    """A candidate's decision (early stops and futility's screen included) and the judge calls it cost."""

    kept: bool
    calls: int
    candidate: Candidate
    decision: Decision | None = None


class Judge:
    """Draws judgements: each call a fresh draw, right with the item's probability."""

    def __init__(self, rng: np.random.Generator) -> None:
        self.rng = rng

    def right(self, q: float) -> bool:
        return bool(self.rng.random() < q)


def _rejudge(
    split: Split, inc: Incumbent, cand: Candidate, items: Sequence[str], judge: Judge, rejudge: int
) -> None:
    """``rejudge`` more judgements of ``items`` under each prompt; the incumbent's drawn once per incumbent."""
    for t in items:
        k = split.index[t]
        have = inc.extra.setdefault(k, [])
        while len(have) < rejudge:
            have.append(judge.right(cand.q_i[k]))
            cand.calls += 1
        cand.extra[k] = [judge.right(cand.q_c[k]) for _ in range(rejudge)]
        cand.calls += rejudge
        cand.rejudged.append(t)


def _judgements(
    split: Split, inc: Incumbent, cand: Candidate, rejudge: int
) -> tuple[dict[str, list[Answer]], dict[str, list[Answer]]]:
    """Every judgement so far of both prompts on the items the candidate has judged (incumbent: all)."""
    rejudged = set(cand.rejudged)
    inc_j = {
        t: split.answers(k, [bool(inc.first[k]), *(inc.extra[k][:rejudge] if t in rejudged else [])])
        for k, t in enumerate(split.ids)
    }
    cand_j = {split.ids[k]: split.answers(k, [ok, *cand.extra.get(k, [])]) for k, ok in cand.first.items()}
    return inc_j, cand_j


def evaluate_candidate(
    split: Split, inc: Incumbent, edit: Edit, loop: LoopSection, judge: Judge, seed: int
) -> Outcome:
    """One candidate (the incumbent plus ``edit``) evaluated and decided as the loop does (module docstring)."""
    policy = policy_for(loop)
    rejudge = policy.rejudge(loop)
    cand = Candidate(q_i=right_odds(inc.dev), q_c=right_odds(inc.dev + edit.dev))
    labels = split.labels
    inc_answers = {t: split.answer(k, bool(inc.first[k])) for k, t in enumerate(split.ids)}
    inc_first_j = {t: [a] for t, a in inc_answers.items()}
    looks: list[Screen] = make_looks(labels, inc_answers, seed) if policy.screens_futility(loop) else []
    order = looks[-1].order(labels, split.ids) if looks else evaluation_order(labels, split.ids)
    phases, seen = [], set[str]()
    for look in looks:
        phases.append([t for t in order if t in look.ids and t not in seen])
        seen |= look.ids
    phases.append([t for t in order if t not in seen])
    stopper = EarlyStopper(labels, inc_answers, inc_first_j, loop)
    for index, phase in enumerate(phases):
        for t in phase:
            k = split.index[t]
            ok = judge.right(cand.q_c[k])
            cand.first[k] = ok
            cand.calls += 1
            answer = split.answer(k, ok)
            if (stopped := stopper.add(t, answer, [answer])) is not None:
                return Outcome(False, cand.calls, cand, stopped)
        if index >= len(looks):
            break
        judged = {split.ids[k]: split.answer(k, ok) for k, ok in cand.first.items()}
        done = set(cand.rejudged)
        fresh = [t for t in disagreements({t: inc_answers[t] for t in judged}, judged) if t not in done]
        if fresh and rejudge > 0:
            _rejudge(split, inc, cand, fresh, judge, rejudge)
        inc_now, cand_now = _judgements(split, inc, cand, rejudge)
        if screened := screen_decision_rejudged(
            labels, looks[index], inc_now, cand_now, loop, level=loop.alpha, seed=seed
        ):
            return Outcome(False, cand.calls, cand, screened)
    inc_now, cand_now = _judgements(split, inc, cand, rejudge)
    if rejudge > 0:
        if not cand.rejudged and (stopped := adaptive_stopped_decision(labels, cand_now, inc_first_j, loop)):
            return Outcome(False, cand.calls, cand, stopped)
        answers = {t: js[0] for t, js in cand_now.items()}
        done = set(cand.rejudged)
        to_rejudge = [t for t in disagreements(inc_answers, answers) if t not in done]
        _rejudge(split, inc, cand, to_rejudge, judge, rejudge)
        inc_now, cand_now = _judgements(split, inc, cand, rejudge)
    decision = decide_adaptive(
        labels, inc_now, cand_now, loop, first_pass=1, rejudged=cand.rejudged, seed=seed
    )
    return Outcome(bool(decision.keep), cand.calls, cand, decision)


@dataclass
class NightResult:
    """One night under one rule: the true gains of the final prompt (kappa; FPR, negative = better) on
    dev and held-out items, and the counts of the night."""

    dev_kappa: float = 0.0
    held_kappa: float = 0.0
    dev_fpr: float = 0.0
    held_fpr: float = 0.0
    decided: int = 0
    kept: int = 0
    helpful_kept: int = 0
    harmful_kept: int = 0
    dev_only_kept: int = 0
    calls: int = 0
    budget_cut: int = 0  # candidates the budget cut before their decision (never kept, as in the loop)
    merged: int = 0  # merged candidates tested (stacking; each counted in decided)
    merged_kept: int = 0  # of which kept
    pooled: int = 0  # rolled-back candidates that pointed the right way and joined a pool


@dataclass(frozen=True)
class NightPlan:
    """A night: its effect distribution, judge-call budget (baseline included) and seed."""

    dist: Dist
    budget: int
    seed: int


class EditStream:
    """The night's edits in proposal order, the same for every rule (drawn once, on demand)."""

    def __init__(self, rng: np.random.Generator, dist: Dist, items: tuple[Items, Items]) -> None:
        self.rng, self.dist, self.items = rng, dist, items
        self.edits: list[Edit] = []

    def __getitem__(self, k: int) -> Edit:
        while len(self.edits) <= k:
            self.edits.append(draw_edit(self.rng, self.dist, self.items))
        return self.edits[k]


def night_world(plan: NightPlan) -> tuple[Items, Items, EditStream]:
    """The night's dev and held-out items and its edit stream (the same under every rule)."""
    rng = np.random.default_rng([plan.seed, 1])
    dev, held = make_items(rng), make_items(rng, 3)
    return dev, held, EditStream(np.random.default_rng([plan.seed, 2]), plan.dist, (dev, held))


def merge_edits(parts: Sequence[Edit]) -> Edit:
    """The pooled edits merged onto the incumbent: their shifts add (effects add in logit space; the
    simulation has no text, so no edit conflicts)."""
    first = parts[0]
    return Edit(
        "helpful" if all(p.direction == "helpful" for p in parts) else "neutral",
        any(p.fpr_raising for p in parts),
        all(p.transfers for p in parts),
        sum((p.dev for p in parts), np.zeros_like(first.dev)),
        sum((p.held for p in parts), np.zeros_like(first.held)),
    )


def _count_keep(out: NightResult, parts: Sequence[Edit]) -> None:
    """A keep: one candidate, its edits counted by kind (a merged keep's parts each)."""
    out.kept += 1
    for edit in parts:
        out.helpful_kept += edit.direction == "helpful"
        out.harmful_kept += edit.direction == "harmful"
        out.dev_only_kept += edit.dev_only


def run_night(
    plan: NightPlan,
    rule: str,
    world: tuple[Items, Items, EditStream],
    on_candidate: Callable[[Edit, Outcome], None] | None = None,
) -> NightResult:
    """One night under ``rule``: a baseline pass, then candidates until the budget of judge calls is spent.
    With ``[loop] stack = K``, a rolled-back candidate that points the right way joins the incumbent's pool;
    a full pool is merged and tested as the next candidate (counted as a test); any keep empties the pool,
    and so does the merged candidate's test (its parts are never pooled again)."""
    dev, held, edits = world
    loop = loop_for(rule)
    split = Split(dev.positive)
    judge = Judge(np.random.default_rng([plan.seed, 3, list(RULES).index(rule)]))
    q0 = right_odds(dev.logit)
    inc = Incumbent(dev.logit.copy(), held.logit.copy(), np.array([judge.right(q) for q in q0]))
    out = NightResult(calls=len(q0))
    pool: list[Edit] = []
    drawn = 0
    for number in range(MAX_CANDIDATES):
        if out.calls >= plan.budget:
            break
        merging = loop.stack > 0 and len(pool) >= loop.stack
        parts = list(pool) if merging else [edits[drawn]]
        edit = merge_edits(parts) if merging else parts[0]
        outcome = evaluate_candidate(split, inc, edit, loop, judge, seed=plan.seed * 10_007 + number)
        if out.calls + outcome.calls > plan.budget:
            out.budget_cut += 1  # the loop's budget stops the evaluation: undecided, rolled back
            out.calls = plan.budget
            break
        drawn += not merging
        out.calls += outcome.calls
        out.decided += 1
        out.merged += merging
        if on_candidate is not None:
            on_candidate(edit, outcome)
        if merging:
            pool = []
        if outcome.kept:
            out.merged_kept += merging
            _count_keep(out, parts)
            pool = []
            first = np.array([outcome.candidate.first[k] for k in range(len(q0))])
            inc = Incumbent(inc.dev + edit.dev, inc.held + edit.held, first, outcome.candidate.extra)
        elif (
            loop.stack > 0
            and not merging
            and outcome.decision is not None
            and points_right_way(outcome.decision)
        ):
            pool.append(edit)
            out.pooled += 1
    start_dev, end_dev = true_metrics(dev.logit, dev.positive), true_metrics(inc.dev, dev.positive)
    start_held, end_held = true_metrics(held.logit, held.positive), true_metrics(inc.held, held.positive)
    out.dev_kappa, out.dev_fpr = end_dev.kappa - start_dev.kappa, end_dev.fpr - start_dev.fpr
    out.held_kappa, out.held_fpr = end_held.kappa - start_held.kappa, end_held.fpr - start_held.fpr
    return out
