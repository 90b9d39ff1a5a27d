"""The decision-power benchmark's simulated rows (`benchmarks/decision_power.py`): the loop's runs replayed
in numpy with the real decision functions (`simulate`, `simulate_fresh`), cheaper-not-worse
(`simulate_cheaper`) and futility screening (`simulate_futility`, its oracle floor)."""

from __future__ import annotations

import random
import sys
from collections.abc import Sequence
from fractions import Fraction
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._judge_model import STABLE_Q as STABLE_RIGHT_Q
from benchmarks._power_common import (
    FIX_SIZES,
    KINDS,
    Extra,
    Odds,
    PolicyResult,
    RunPlan,
    SimJudge,
    Tallies,
    Trial,
    calls_per_pass,
    confusion_counts,
    keep_rate,
    parse_policy,
)
from optimizer.models import Label
from optimizer.stats.binomial import clopper_pearson_interval
from optimizer.stats.decision import (
    adaptive_test,
    decide_adaptive,
    decide_cheaper,
    decide_counts,
    lord_level,
)
from optimizer.stats.metrics import Answer
from optimizer.workspace.config import LoopSection

# --- the pure simulation ------------------------------------------------------------------------


def sign_flip_below(diffs: Sequence[int], judgements: int, alpha: float) -> bool:
    """p < alpha for per-item differences ``diffs`` in correct judgements out of ``judgements`` each,
    by `optimizer.stats.signflip` on the exact shares (as the loop decides)."""
    return adaptive_test([Fraction(int(d), judgements) for d in diffs if d]).below(
        Fraction(repr(float(alpha)))
    )


def adaptive_keep(
    inc_total: np.ndarray,
    cand_total: np.ndarray,
    judgements: np.ndarray,
    positive: np.ndarray,
    loop: LoopSection,
) -> bool:
    """The adaptive rule on per-item totals of correct judgements out of ``judgements``: the
    literal rule on per-item majorities, and the sign-flip test on the per-item differences."""
    # A tied majority is "failure" (`metrics.majority_answer`): right on a negative, wrong on a positive.
    tie_ok = ~positive
    maj_i = (inc_total * 2 > judgements) | ((inc_total * 2 == judgements) & tie_ok)
    maj_c = (cand_total * 2 > judgements) | ((cand_total * 2 == judgements) & tie_ok)
    improved, worsened = int((~maj_i & maj_c).sum()), int((maj_i & ~maj_c).sum())
    literal = decide_counts(
        confusion_counts(maj_i, positive),
        confusion_counts(maj_c, positive),
        improved,
        worsened,
        loop.model_copy(update={"policy": "literal"}),
    )
    if not literal.literal_keep:
        return False
    # Items judged once were judged alike (d = 0): the test sees the re-judged items, all with the
    # same number of judgements.
    rejudged = judgements > 1
    if not rejudged.any():
        return False
    diffs = (cand_total - inc_total)[rejudged]
    return sign_flip_below([int(x) for x in diffs], int(judgements[rejudged][0]), loop.alpha)


def engine_adaptive_keep(
    inc_first: np.ndarray,
    cand_first: np.ndarray,
    inc_j: dict[int, list[bool]],
    cand_j: dict[int, list[bool]],
    positive: np.ndarray,
    rejudge: int,
    alpha: float,
) -> bool:
    """The same decision by `optimizer.stats.decision.decide_adaptive` on labels and answers, as the loop
    makes it. ``inc_j``/``cand_j``: the re-judged items' judgements (correct or not)."""
    labels = {
        f"i{k:03d}": Label(
            trajectory_id=f"i{k:03d}", label="positive" if pos else "negative", original_id="r"
        )
        for k, pos in enumerate(positive)
    }

    def answers(k: int, correct: list[bool]) -> list[Answer]:
        return [Answer(success=bool(positive[k]) if ok else not positive[k]) for ok in correct]

    inc = {f"i{k:03d}": answers(k, inc_j.get(k, [bool(inc_first[k])])) for k in range(len(positive))}
    cand = {f"i{k:03d}": answers(k, cand_j.get(k, [bool(cand_first[k])])) for k in range(len(positive))}
    loop = LoopSection.model_validate({"policy": "adaptive", "alpha": alpha, "rejudge": rejudge})
    decision = decide_adaptive(labels, inc, cand, loop, first_pass=1, rejudged=[f"i{k:03d}" for k in cand_j])
    return bool(decision.keep)


def sim_rejudge(
    rng: np.random.Generator, disagree: np.ndarray, rejudge: int, odds: Odds, extra: Extra, tallies: Tallies
) -> np.ndarray:
    """The adaptive re-judging of the items in ``disagree``, simulated: the incumbent's extra judgements
    drawn once per incumbent (``extra.inc``, reused by its later candidates), ``rejudge`` new ones for
    the candidate (into ``extra.cand``); the ``tallies`` updated in place. Returns the incumbent's new
    calls per item (the candidate's are ``rejudge`` per item)."""
    q_i, q_c = odds
    inc_extra, cand_extra = extra
    inc_total, cand_total, judgements = tallies
    new_inc = np.zeros(len(q_i), int)
    for i in disagree:
        have = inc_extra.setdefault(int(i), [])
        while len(have) < rejudge:
            have.append(bool(rng.random() < q_i[i]))
            new_inc[i] += 1
        mine = [bool(x) for x in rng.random(rejudge) < q_c[i]]
        cand_extra[int(i)] = mine
        inc_total[i] += sum(have[:rejudge])
        cand_total[i] += sum(mine)
        judgements[i] = 1 + rejudge
    return new_inc


def simulate(
    policy: str,
    judge: SimJudge,
    plan: RunPlan,
    *,
    rejudge: int = 2,
    alpha: float = 0.1,
    check_engine: int = 0,
) -> PolicyResult:
    """The loop's runs replayed in numpy: same odds, schedule and incumbent handling; the first pass
    is judged in full (no early stopping); decisions by `optimizer.stats.decision`."""
    q, fixable, positive, seed = judge.q, judge.fixable, judge.positive, plan.seed
    base_policy, fdr = parse_policy(policy)
    rng = np.random.default_rng(seed)
    sched_rng = random.Random(seed)
    n = len(q)
    loop = LoopSection(policy="literal", alpha=alpha)
    result = PolicyResult(policy)
    fixable_idx = np.flatnonzero(fixable)
    for run_no in range(plan.runs):
        inc_fixed = np.zeros(n, bool)
        inc_first = rng.random(n) < q
        inc_extra: dict[int, list[bool]] = {}
        past_keeps: list[bool] = []
        result.baseline_calls += n
        for kind in plan.kinds(sched_rng):
            cand_fixed = inc_fixed.copy()
            if kind != "noop":
                pool = [i for i in fixable_idx if not inc_fixed[i]]
                chosen = rng.choice(pool, min(int(kind[3:]), len(pool)), replace=False)
                cand_fixed[chosen] = True
            q_c = np.where(cand_fixed, 1.0, q)
            q_i = np.where(inc_fixed, 1.0, q)
            cand_first = rng.random(n) < q_c
            calls = n
            cand_extra: dict[int, list[bool]] = {}
            level = alpha if fdr is None else lord_level(fdr, past_keeps)
            if base_policy in ("literal", "paired"):
                improved = int((~inc_first & cand_first).sum())
                worsened = int((inc_first & ~cand_first).sum())
                d = decide_counts(
                    confusion_counts(inc_first, positive),
                    confusion_counts(cand_first, positive),
                    improved,
                    worsened,
                    loop.model_copy(update={"alpha": level}),
                )
                kept = d.literal_keep if base_policy == "literal" else d.paired_keep
            else:
                disagree = np.flatnonzero(inc_first != cand_first)
                judgements = np.ones(n, int)
                inc_total = inc_first.astype(int)
                cand_total = cand_first.astype(int)
                calls += int(
                    sim_rejudge(
                        rng,
                        disagree,
                        rejudge,
                        Odds(q_i, q_c),
                        Extra(inc_extra, cand_extra),
                        Tallies(inc_total, cand_total, judgements),
                    ).sum()
                ) + rejudge * len(disagree)
                kept = adaptive_keep(
                    inc_total, cand_total, judgements, positive, loop.model_copy(update={"alpha": level})
                )
                if result.engine_checked < check_engine and fdr is None:
                    inc_j = {
                        int(i): [bool(inc_first[i]), *inc_extra.get(int(i), [])[:rejudge]] for i in disagree
                    }
                    cand_j = {int(i): [bool(cand_first[i])] + cand_extra[int(i)] for i in disagree}
                    engine = engine_adaptive_keep(
                        inc_first, cand_first, inc_j, cand_j, positive, rejudge, alpha
                    )
                    assert engine == kept, (
                        "the simulation's adaptive rule and optimizer.stats.decision disagree"
                    )
                    result.engine_checked += 1
            result.trials.append(Trial(kind, kept, calls, run=f"sim{seed}-{run_no}"))
            past_keeps.append(kept)
            if kept:
                inc_fixed, inc_first, inc_extra = cand_fixed, cand_first, cand_extra
    return result


def simulate_fresh(
    policy: str, judge: SimJudge, trials: int, seed: int, *, rejudge: int = 2, alpha: float = 0.1
) -> PolicyResult:
    """``trials`` candidates of every kind, each against a fresh incumbent (the issue's simulation)."""
    result = PolicyResult(policy)
    for k, kind in enumerate(KINDS):
        result.merge(
            simulate(
                policy,
                judge,
                RunPlan(trials, 1, 0, seed * 10 + k, schedule=[kind]),
                rejudge=rejudge,
                alpha=alpha,
            )
        )
    return result


# --- cheaper, not worse ([loop] cheaper_margin_items) ------------------------------------------
#
# The non-inferiority rule on the same judge: a cheaper candidate that is *worse* by ``worse_by`` items
# (that many positives the judge always got right, q = 0.99, now always wrong: FPR unchanged, so only
# the test can refuse it) or *equal* (worse_by = 0: the same odds, fresh draws). Each trial: a fresh
# incumbent first pass and the candidate's, the items they disagree on re-judged ``rejudge`` more
# times under each (as the loop does for a candidate estimated cheaper), then the engine's own rule,
# `optimizer.stats.decision.decide_cheaper`, with a saving of 50%. A keep of a worse-by-2 candidate at
# margin 1 is a false keep: their share should stay below alpha.


def simulate_cheaper(
    q: np.ndarray,
    positive: np.ndarray,
    worse_by: int,
    trials: int,
    seed: int,
    *,
    margin: int = 1,
    rejudge: int = 2,
    alpha: float = 0.1,
) -> tuple[int, int, float]:
    """(keeps, trials, judge calls per candidate / items) of cheaper candidates worse by ``worse_by`` items."""
    rng = np.random.default_rng(seed)
    n = len(q)
    labels = {
        f"i{i}": Label(
            trajectory_id=f"i{i}", label="positive" if positive[i] else "negative", original_id=f"i{i}"
        )
        for i in range(n)
    }
    loop = LoopSection(alpha=alpha, rejudge=rejudge, cheaper_margin_items=margin)
    steady_right = np.flatnonzero(positive & (q >= STABLE_RIGHT_Q))
    kept = calls = 0

    def answers(correct: Sequence[bool], pos: bool) -> list[Answer]:
        return [Answer(success=pos == c, mistake_type=None) for c in correct]

    for _ in range(trials):
        q_c = q.copy()
        q_c[rng.choice(steady_right, worse_by, replace=False)] = 0.0
        inc = [[bool(x)] for x in rng.random(n) < q]
        cand = [[bool(x)] for x in rng.random(n) < q_c]
        calls += n
        for i in range(n):
            if inc[i][0] != cand[i][0]:
                inc[i] += [bool(x) for x in rng.random(rejudge) < q[i]]
                cand[i] += [bool(x) for x in rng.random(rejudge) < q_c[i]]
                calls += 2 * rejudge
        test = decide_cheaper(
            labels,
            {f"i{i}": answers(inc[i], bool(positive[i])) for i in range(n)},
            {f"i{i}": answers(cand[i], bool(positive[i])) for i in range(n)},
            loop,
            saving=0.5,
        )
        kept += test.keep
    return kept, trials, calls / max(1, trials) / n


def cheaper_rows(
    q: np.ndarray,
    positive: np.ndarray,
    trials: int,
    seed: int,
    *,
    rejudge: int = 2,
    margins: Sequence[int] = (1, 2),
) -> list[str]:
    """The non-inferiority table: keep shares of worse-by-2 and equal cheaper candidates, on the
    benchmark's noisy judge and on a steady one (its unstable items made stable, q = 0.99 / 0.01)."""
    steady = np.where(q >= 0.5, STABLE_RIGHT_Q, 1 - STABLE_RIGHT_Q)
    head = f"{'judge':<7} {'margin':>6} {'worse by 2 kept':>26} {'equal kept':>26} {'calls/162':>9}"
    lines = [head, "-" * len(head)]
    for name, odds in (("noisy", q), ("steady", steady)):
        for margin in margins:
            cells = []
            per = 0.0
            for k, worse in enumerate((2, 0)):
                keeps, total, per = simulate_cheaper(
                    odds,
                    positive,
                    worse,
                    trials,
                    seed * 100 + margin * 10 + k,
                    margin=margin,
                    rejudge=rejudge,
                )
                lo, hi = clopper_pearson_interval(keeps, total)
                cells.append(f"{keeps / total:>6.1%} [{lo:>5.1%},{hi:>5.1%}] n={total:<5}")
            lines.append(f"{name:<7} {margin:>6} {cells[0]:>26} {cells[1]:>26} {per:>9.2f}")
    return lines


# --- futility screening (optimizer.stats.futility) ----------------------------------------------------

FUTILITY_THRESHOLDS = (0.01, 0.02, 0.05, 0.1)


def oracle_p_clear(
    inside: np.ndarray,
    tallies: Tallies,
    inc_first: np.ndarray,
    odds: Odds,
    positive: np.ndarray,
    loop: LoopSection,
    rng: np.random.Generator,
    draws: int = 200,
) -> float:
    """P(clear) as an oracle knows it: the items ``inside`` the look as judged (first pass and re-judging,
    ``tallies``), every other item's judgements drawn from the true ``odds`` of both prompts — the
    candidate's first pass, and where it differs from the incumbent's the re-judging of both. No screen
    that learns the odds from the judged items can do better with the same looks: its row is the floor."""
    inc_total, cand_total, judgements = tallies
    q_i, q_c = odds
    from optimizer.stats.decision import exact_fraction
    from optimizer.stats.futility import Tally, _clears, _right

    out = np.flatnonzero(~inside)
    negative = ~positive
    alpha = exact_fraction(loop.alpha)
    clears = 0
    for _ in range(draws):
        cc, cn, ic, in_ = cand_total.copy(), judgements.copy(), inc_total.copy(), judgements.copy()
        first = rng.random(len(out)) < q_c[out]
        cc[out], cn[out], ic[out], in_[out] = first, 1, inc_first[out], 1
        d = out[first != inc_first[out]]
        cc[d] += rng.binomial(loop.rejudge, q_c[d])
        ic[d] += rng.binomial(loop.rejudge, q_i[d])
        cn[d] += loop.rejudge
        in_[d] += loop.rejudge
        tally = Tally(cc, cn, ic, in_, _right(cc, cn, negative), _right(ic, in_, negative))
        clears += _clears(tally, positive, loop, alpha) is None
    return clears / draws


def simulate_futility(
    judge: SimJudge,
    plan: RunPlan,
    *,
    rejudge: int = 2,
    alpha: float = 0.1,
    thresholds: Sequence[float] = FUTILITY_THRESHOLDS,
    first_pass_threshold: float = 0.02,
    oracle: bool = True,
) -> tuple[PolicyResult, dict[str, PolicyResult]]:
    """The adaptive runs of `simulate`, each candidate also screened as the loop screens it: the
    looks of `optimizer.stats.futility.make_looks` (the incumbent's wrong items and growing stratified
    shares of the rest), each look's disagreements re-judged, `optimizer.stats.futility.p_clear_rejudged`
    checked after each look. Coupled: one set of draws per candidate; "with futility at T" keeps a
    candidate iff the full decision keeps it and no look's P(clear) is below T, and pays, when a look
    stops it, that look's first-pass and re-judging calls (the incumbent's counted where this
    candidate is the first to need them). The incumbent follows the decisions without futility (so
    the rows differ only by the screen; a blocked keep changes no later incumbent). One more row,
    "first pass only", is the earlier screen: one look at 30%, no re-judging (`p_clear`); ``oracle``
    adds the floor (`oracle_p_clear`: the same looks, the unjudged items drawn from the true odds) at
    the first threshold."""
    from optimizer.stats.futility import SCREEN_SHARE, make_looks, make_screen, p_clear, p_clear_rejudged

    q, fixable, positive, seed = judge.q, judge.fixable, judge.positive, plan.seed
    ids = [f"i{k:03d}" for k in range(len(positive))]
    labels = {
        t: Label(trajectory_id=t, label="positive" if pos else "negative", original_id="r")
        for t, pos in zip(ids, positive, strict=True)
    }
    loop = LoopSection.model_validate({"policy": "adaptive", "alpha": alpha, "rejudge": rejudge})
    right_answer = {t: Answer(success=bool(pos)) for t, pos in zip(ids, positive, strict=True)}
    wrong_answer = {t: Answer(success=not pos) for t, pos in zip(ids, positive, strict=True)}

    def answers(t: str, correct: Sequence[bool]) -> list[Answer]:
        return [right_answer[t] if ok else wrong_answer[t] for ok in correct]

    rng = np.random.default_rng(seed)
    sched_rng = random.Random(seed)
    n = len(q)
    base = PolicyResult("adaptive")
    first_name = f"first pass only, T = {first_pass_threshold:g}"
    screened = {first_name: PolicyResult("adaptive+futility-first-pass")}
    screened |= {f"on, T = {t:g}": PolicyResult(f"adaptive+futility{t:g}") for t in thresholds}
    oracle_name = f"oracle (true odds), T = {thresholds[0]:g}"
    if oracle:
        screened[oracle_name] = PolicyResult("adaptive+futility-oracle")
    oracle_rng = np.random.default_rng(seed + 17)
    fixable_idx = np.flatnonzero(fixable)
    n_cand = 0
    for run_no in range(plan.runs):
        inc_fixed = np.zeros(n, bool)
        inc_first = rng.random(n) < q
        inc_extra: dict[int, list[bool]] = {}
        for kind in plan.kinds(sched_rng):
            n_cand += 1
            cand_fixed = inc_fixed.copy()
            if kind != "noop":
                pool = [i for i in fixable_idx if not inc_fixed[i]]
                cand_fixed[rng.choice(pool, min(int(kind[3:]), len(pool)), replace=False)] = True
            q_c, q_i = np.where(cand_fixed, 1.0, q), np.where(inc_fixed, 1.0, q)
            cand_first = rng.random(n) < q_c
            calls = n
            judgements = np.ones(n, int)
            inc_total, cand_total = inc_first.astype(int), cand_first.astype(int)
            cand_extra: dict[int, list[bool]] = {}
            disagree = np.flatnonzero(inc_first != cand_first)
            new_inc_calls = sim_rejudge(
                rng,
                disagree,
                rejudge,
                Odds(q_i, q_c),
                Extra(inc_extra, cand_extra),
                Tallies(inc_total, cand_total, judgements),
            )
            calls += int(new_inc_calls.sum()) + rejudge * len(disagree)
            kept = adaptive_keep(inc_total, cand_total, judgements, positive, loop)
            run = f"fut{seed}-{run_no}"
            base.trials.append(Trial(kind, kept, calls, run=run))
            inc_j = {t: answers(t, [bool(inc_first[k])]) for k, t in enumerate(ids)}
            decision_seed = seed * 100_003 + n_cand
            # The earlier screen: first pass only, one look.
            screen = make_screen(labels, {t: js[0] for t, js in inc_j.items()}, decision_seed, SCREEN_SHARE)
            first_j = {t: answers(t, [bool(cand_first[k])]) for k, t in enumerate(ids) if t in screen.ids}
            est = p_clear(labels, screen, inc_j, first_j, loop, level=alpha, seed=seed * 7 + n_cand)
            stopped = est is not None and est.p_clear < first_pass_threshold
            screened[first_name].trials.append(
                Trial(kind, kept and not stopped, len(first_j) if stopped else calls, run=run)
            )
            # The looks, each one's disagreements re-judged (the same draws the full decision used).
            inc_now = {
                t: answers(t, [bool(inc_first[k]), *(inc_extra[k][:rejudge] if judgements[k] > 1 else [])])
                for k, t in enumerate(ids)
            }
            stop_at: list[tuple[float, int]] = []  # per look: P(clear), the calls paid by then
            oracle_stop: int | None = None
            for look in make_looks(labels, {t: js[0] for t, js in inc_j.items()}, decision_seed):
                inside = [k for k, t in enumerate(ids) if t in look.ids]
                cand_j = {
                    ids[k]: answers(ids[k], [bool(cand_first[k]), *cand_extra.get(k, [])]) for k in inside
                }
                inc_look = {t: (inc_now[t] if t in look.ids else inc_j[t]) for t in ids}
                est = p_clear_rejudged(
                    labels, look, inc_look, cand_j, loop, level=alpha, seed=seed * 7 + n_cand
                )
                paid = len(inside) + sum(rejudge + int(new_inc_calls[k]) for k in inside if judgements[k] > 1)
                stop_at.append((1.0 if est is None else est.p_clear, paid))
                if oracle and oracle_stop is None:
                    mask = np.zeros(n, bool)
                    mask[inside] = True
                    if (
                        oracle_p_clear(
                            mask,
                            Tallies(inc_total, cand_total, judgements),
                            inc_first,
                            Odds(q_i, q_c),
                            positive,
                            loop,
                            oracle_rng,
                        )
                        < thresholds[0]
                    ):
                        oracle_stop = paid
            if oracle:
                screened[oracle_name].trials.append(
                    Trial(
                        kind,
                        kept and oracle_stop is None,
                        calls if oracle_stop is None else oracle_stop,
                        run=run,
                    )
                )
            for t in thresholds:
                first_stop = next((paid for p, paid in stop_at if p < t), None)
                screened[f"on, T = {t:g}"].trials.append(
                    Trial(
                        kind,
                        kept and first_stop is None,
                        calls if first_stop is None else first_stop,
                        run=run,
                    )
                )
            if kept:
                inc_fixed, inc_first, inc_extra = cand_fixed, cand_first, cand_extra
    return base, screened


def futility_table(base: PolicyResult, screened: dict[str, PolicyResult], n_items: int) -> list[str]:
    """Calls per no-op candidate (in full passes) and kept shares, without and with futility."""
    head = (
        f"{'futility':<28} {'no-op calls/162':>15} {'no-op kept':>10} "
        + " ".join(f"{f'fix {d} kept':>11}" for d in FIX_SIZES)
        + f" {'fix calls/162':>13}"
    )
    lines = [head, "-" * len(head)]
    for name, res in [("off", base), *screened.items()]:
        cells = []
        for kind in KINDS:
            k, total = keep_rate(res.trials, kind)
            cells.append(f"{k / total:>10.1%}" if total else f"{'—':>10}")
        fixes = [t for t in res.trials if t.kind != "noop"]
        lines.append(
            f"{name:<28} {calls_per_pass(res.trials, n_items, 'noop'):>15.2f} {cells[0]} "
            + " ".join(f"{c:>11}" for c in cells[1:])
            + f" {calls_per_pass(fixes, n_items):>13.2f}"
        )
    return lines
