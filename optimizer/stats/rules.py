from __future__ import annotations

from fractions import Fraction
from typing import Literal, NamedTuple

from pydantic import BaseModel, ConfigDict

from optimizer import fmt
from optimizer.stats.evidence import AdaptiveTest
from optimizer.stats.metrics import (
    FlipTable,
    Metrics,
    kappa_fraction,
    mcnemar_exact_one_sided,
)
from optimizer.stats.policies import FirstPass, policy_for
from optimizer.vocab import PolicyName
from optimizer.workspace.config import LoopSection

# The decision rules by name (`optimizer.vocab`).
Policy = PolicyName


class Counts(NamedTuple):
    """Confusion counts of one verdict set."""

    tp: int
    fn: int
    tn: int
    fp: int

    @classmethod
    def of(cls, m: Metrics) -> Counts:
        return cls(m.tp, m.fn, m.tn, m.fp)


# The rule whose outcome a decision's reason states: a policy's own rule, an early-stopping bound
# (``fpr_bound``, ``kappa_bound``: the first pass's; ``adaptive_bound``), the futility screen, a wave's Holm
# step-down, the cheaper-not-worse test, or the ``max_cost_ratio`` cap.
ReasonRule = Literal[
    "literal",
    "paired",
    "adaptive",
    "fpr_bound",
    "kappa_bound",
    "adaptive_bound",
    "futility",
    "wave",
    "cheaper",
    "cost_cap",
]


class Reason(BaseModel):
    """A decision's reason as data, set where the reason is built: the rule that decided, its outcome,
    the conditions it found unmet, the figures it read (``evidence``) and what follows the outcome
    (``after``: another rule's note, or the reason it rewrites). `text` is the reason as it is stored and
    shown; `advice` words it for the person who decides (``--propose-only``). ``bound``: worded as an
    early-stopping bound ("… it could not be kept (…)") instead of "…: kept" / "…: rolled back (…)"."""

    model_config = ConfigDict(frozen=True)

    rule: ReasonRule
    kept: bool
    evidence: str
    unmet: tuple[str, ...] = ()
    after: str = ""
    bound: bool = False
    # The word of a keep (cheaper: "kept as cheaper, not worse") and of a roll back (cheaper: "not kept").
    kept_word: str = "kept"
    rolled_back_word: str = "rolled back"
    # The reason this one rewrites (a wave's Holm step-down, the cost rules), whose text its own quotes.
    earlier: Reason | None = None

    def rules(self) -> tuple[ReasonRule, ...]:
        """Every rule that spoke, the earliest first (``earlier``'s, then this one's)."""
        return (*(self.earlier.rules() if self.earlier else ()), self.rule)

    def outcome(self) -> str:
        """The outcome as the reason states it: "kept", "rolled back (why; why)"."""
        if self.bound:
            return f"it could not be kept ({'; '.join(self.unmet)})"
        if self.kept:
            return self.kept_word
        return self.rolled_back_word + (f" ({'; '.join(self.unmet)})" if self.unmet else "")

    def text(self) -> str:
        """The reason as stored in the ledger and shown (`Decision.reason`)."""
        if self.bound:
            return f"{self.evidence} {self.outcome()}{self.after}"
        return f"{self.evidence}: {self.outcome()}{self.after}"

    def advice(self) -> str:
        """The reason worded as advice: "would keep it…" / "would roll it back (why)…", then the figures
        (cheaper: "would keep it as cheaper, not worse…")."""
        would = "would keep it" + self.kept_word.removeprefix("kept") if self.kept else "would roll it back"
        unmet = f" ({'; '.join(self.unmet)})" if self.unmet else ""
        return f"{would}{unmet}{self.after}: {self.evidence}"


class Decision(BaseModel):
    """The outcome for one candidate under both policies, and the one that decided."""

    model_config = ConfigDict(frozen=True)

    keep: bool
    reason: str
    # The reason as data (`Reason.text()` is ``reason``); None only for a decision built without one.
    why: Reason | None = None
    literal_keep: bool
    paired_keep: bool
    p_value: float
    policy: Policy
    # True when the candidate was stopped by an early-stopping bound; its metrics are partial.
    early_stopped: bool = False
    # The adaptive rule's outcome (None when it was not evaluated, e.g. an early stop under paired).
    adaptive_keep: bool | None = None
    # The level the deciding test was run at (loop.alpha, or the online-FDR level of this candidate).
    alpha: float | None = None
    test: AdaptiveTest | None = None
    # "cheaper" when kept as cheaper-not-worse ([loop] cheaper_margin_items), not as an improvement.
    keep_kind: str | None = None
    # The literal rule on per-item majorities over every judgement (the adaptive test's; None when it was not
    # evaluated): what `optimizer.stats.pooling.points_right_way` reads as "kappa up, FPR not up".
    majority_literal_keep: bool | None = None
    # Set when the adaptive bound stopped the candidate (`adaptive_stop`): True when only significance was out
    # of reach (kappa could rise, FPR need not) and it had fixed more items than it broke so far.
    short_of_significance: bool | None = None


def exact_fraction(value: float) -> Fraction:
    """A config threshold as the decimal the user wrote (0.1 means 1/10, not its binary neighbour)."""
    return Fraction(repr(float(value)))


def kappa_clears(candidate: Counts, incumbent: Counts, min_kappa_delta: float) -> bool:
    k_c, k_i = kappa_fraction(*candidate), kappa_fraction(*incumbent)
    if k_c is None or k_i is None:
        return False
    return k_c > k_i + exact_fraction(min_kappa_delta)


def fpr_within(candidate_fp: int, incumbent_fp: int, negatives: int, fpr_tolerance: float) -> bool:
    if negatives == 0:
        return True
    return Fraction(candidate_fp, negatives) <= Fraction(incumbent_fp, negatives) + exact_fraction(
        fpr_tolerance
    )


def p_text(p: float) -> str:
    """A p-value as a decision's reason writes it (3 decimals, `optimizer.fmt.p_value`)."""
    return fmt.p_value(p, 3)


def rate_text(x: Fraction | None, digits: int) -> str:
    """A kappa (or other rate) as a reason writes it, "undefined" for None (0/0 on a one-class split)."""
    return fmt.num(None if x is None else float(x), digits, missing="undefined")


def decide_counts(
    incumbent: Counts,
    candidate: Counts,
    improved: int,
    worsened: int,
    loop: LoopSection,
    *,
    alpha: float | None = None,
) -> Decision:
    """Apply the literal and paired policies to confusion counts and the flip counts (see module
    docstring); ``alpha`` overrides ``loop.alpha`` (online FDR). Under ``adaptive`` the paired
    outcome is the one reported as ``keep`` here; `decide_adaptive` decides."""
    level = loop.alpha if alpha is None else alpha
    P, N = incumbent.tp + incumbent.fn, incumbent.tn + incumbent.fp
    if (candidate.tp + candidate.fn, candidate.tn + candidate.fp) != (P, N):
        raise ValueError(
            f"incumbent and candidate were scored on different items: {incumbent} vs {candidate}"
        )
    kappa_ok = kappa_clears(candidate, incumbent, loop.min_kappa_delta)
    fpr_ok = fpr_within(candidate.fp, incumbent.fp, N, loop.fpr_tolerance)
    p_value = mcnemar_exact_one_sided(improved, worsened)
    significant = p_value < level
    literal_keep = kappa_ok and fpr_ok
    paired_keep = literal_keep and significant
    policy = policy_for(loop)
    flags = FirstPass(literal_keep, paired_keep)
    keep = policy.keeps(flags)

    k_i, k_c = kappa_fraction(*incumbent), kappa_fraction(*candidate)
    if k_i is None or k_c is None:
        kappa_part = f"kappa {rate_text(k_i, 3)} → {rate_text(k_c, 3)}"
    else:
        kappa_part = f"kappa {float(k_i):.3f} → {float(k_c):.3f} ({float(k_c - k_i):+.3f})"
    fpr_part = f"FPR {incumbent.fp / N:.3f} → {candidate.fp / N:.3f}" if N else "FPR undefined (no negatives)"
    p_part = f"p={p_text(p_value)} {'<' if significant else '≥'} {level:.3g}"
    unmet: list[str] = []
    if not kappa_ok:
        if k_i is None or k_c is None:
            unmet.append("kappa is undefined on this split")
        elif loop.min_kappa_delta:
            unmet.append(f"kappa did not rise by more than {loop.min_kappa_delta:g}")
        else:
            unmet.append("kappa did not rise")
    if not fpr_ok:
        unmet.append(
            "FPR rose" if not loop.fpr_tolerance else f"FPR rose by more than {loop.fpr_tolerance:g}"
        )
    if policy.tests_at_alpha and literal_keep and not significant:
        unmet.append("the gain is not significant")
    why = Reason(
        rule="paired" if policy.tests_at_alpha else "literal",
        kept=keep,
        evidence=f"{kappa_part}, {fpr_part}, flips +{improved}/−{worsened}, {p_part}",
        unmet=() if keep else tuple(unmet),
        after=policy.other_policy_note(flags),
    )
    return Decision(
        keep=keep,
        reason=why.text(),
        why=why,
        literal_keep=literal_keep,
        paired_keep=paired_keep,
        p_value=p_value,
        policy=loop.policy,
        alpha=level,
    )


def min_fixes_to_keep(broken: int, alpha: float) -> int:
    """The fewest items a candidate must newly get right, while newly getting ``broken`` wrong, for
    the paired policy's exact McNemar p-value to fall below ``alpha`` (the literal rule aside)."""
    if not 0 < alpha <= 1:
        raise ValueError(f"alpha must be in (0, 1], got {alpha}")
    fixed = 0
    while mcnemar_exact_one_sided(fixed, broken) >= alpha:
        fixed += 1
    return fixed


def detectable_gain_line(n_items: int, alpha: float, policy: Policy = "paired") -> str:
    """One line on what gain the paired (or adaptive) policy can see on ``n_items`` items (said when
    nothing is kept). Under ``adaptive`` an item counts in full only when every one of its judgements
    went the candidate's way (d = 1); the sign-flip tail of such items is the McNemar tail."""
    clean, one, two = (min_fixes_to_keep(w, alpha) for w in (0, 1, 2))
    items = policy_for(policy).items_right
    return (
        f"on {n_items} items the {policy} policy (alpha {alpha:g}) keeps a candidate only if it newly gets "
        f"at least {clean} {items} while breaking none ({one} if it breaks one, {two} if two): "
        f"{clean / n_items:.0%} of the split at the least; a smaller real gain cannot be told from the "
        "judge's own noise here"
    )


def decide(
    incumbent: Metrics, candidate: Metrics, flips: FlipTable, loop: LoopSection, *, alpha: float | None = None
) -> Decision:
    """Keep or roll back ``candidate`` against ``incumbent`` (same items) under the literal and
    paired policies (both computed)."""
    return decide_counts(
        Counts.of(incumbent), Counts.of(candidate), flips.improved, flips.worsened, loop, alpha=alpha
    )
