"""Cheaper, not worse: the non-inferiority test of a cheaper candidate (`decide_cheaper`) and the FPR bound
alone that may stop one early (`FprStopper`). Pure."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from fractions import Fraction

from pydantic import BaseModel, ConfigDict

from optimizer.models import Label
from optimizer.stats.adaptive import (
    Judgements,
    counts_from_correct,
)
from optimizer.stats.bounds import (
    fpr_stop,
)
from optimizer.stats.metrics import (
    Answer,
    is_correct,
    majority_answer,
)
from optimizer.stats.rules import (
    Decision,
    Reason,
    exact_fraction,
    fpr_within,
    p_text,
)
from optimizer.stats.signflip import (
    SignFlipResult,
    sign_flip_test,
)
from optimizer.workspace.config import LoopSection

# --- cheaper, not worse ---------------------------------------------------------------------------
#
# ``[loop] cheaper_margin_items = M`` (0: off). A candidate that is not kept as an improvement but
# costs at least ``cheaper_min_saving`` less per verdict is kept when it is shown *not worse* than the
# incumbent by more than M items: H0 "the candidate's gain Σ d_i is ≤ −M" against H1 "> −M", tested
# with the same exact one-sided sign-flip test on the per-item differences shifted by the margin,
# d_i + M/n over all n items (the items both prompts judged alike too: each carries its share of the
# margin). Statistic: the plain sum (the shift makes every item non-zero, so a d·|d| weighting would
# weigh the margin by itself). The FPR veto is unchanged: the candidate's FPR (majority over all
# judgements) may not exceed the incumbent's + fpr_tolerance. Such a keep is a test at the
# candidate's level like any other, so it counts in the run's expected false keeps.


# In a decision's reason when the non-inferiority test ran (the report counts such tests, `accounting`).
CHEAPER_TEST_MARK = "non-inferiority (margin"


class CheaperTest(BaseModel):
    """The outcome of the non-inferiority test of one cheaper candidate."""

    model_config = ConfigDict(frozen=True)

    keep: bool
    reason: str
    why: Reason  # the reason as data (`Reason.text()` is ``reason``)
    p_value: float
    gain: float  # Σ d_i, in items (negative: worse)
    margin_items: int
    saving: float  # 1 − candidate cost per verdict / incumbent's


def noninferiority_test(
    differences: Sequence[Fraction], n_items: int, margin_items: int, *, seed: int = 0
) -> SignFlipResult:
    """One-sided p-value for "the candidate is worse than the incumbent by less than ``margin_items``":
    the sign-flip test (`optimizer.stats.signflip`) on each of the ``n_items`` differences (``differences``
    lists the non-zero ones and may omit zeros) plus ``margin_items / n_items``."""
    if n_items < len(differences) or n_items < 1:
        raise ValueError(f"n_items ({n_items}) must cover the {len(differences)} differences given")
    shift = Fraction(margin_items, n_items)
    shifted = [Fraction(d) + shift for d in differences] + [shift] * (n_items - len(differences))
    return sign_flip_test(shifted, seed=seed)


def decide_cheaper(
    labels: Mapping[str, Label],
    incumbent: Judgements,
    candidate: Judgements,
    loop: LoopSection,
    *,
    saving: float,
    alpha: float | None = None,
    seed: int = 0,
) -> CheaperTest:
    """Keep ``candidate`` as cheaper-not-worse? ``saving``: its billed saving per verdict (1 − ratio),
    checked against ``cheaper_min_saving`` here too. ``incumbent``/``candidate``: every labelled id →
    its judgements (all of them: first pass and re-judging)."""
    level = loop.alpha if alpha is None else alpha
    margin = loop.cheaper_margin_items
    missing = [t for t in labels if not incumbent.get(t) or not candidate.get(t)]
    if missing:
        raise ValueError(f"decide_cheaper: {len(missing)} item(s) without judgements, e.g. {missing[0]!r}")
    all_i = {t: is_correct(labels[t], majority_answer(incumbent[t])) for t in labels}
    all_c = {t: is_correct(labels[t], majority_answer(candidate[t])) for t in labels}
    counts_i, counts_c = counts_from_correct(labels, all_i), counts_from_correct(labels, all_c)
    n_neg = counts_i.tn + counts_i.fp
    fpr_ok = fpr_within(counts_c.fp, counts_i.fp, n_neg, loop.fpr_tolerance)
    diffs = [
        d
        for t in sorted(labels)
        if (
            d := Fraction(sum(1 for a in candidate[t] if is_correct(labels[t], a)), len(candidate[t]))
            - Fraction(sum(1 for a in incumbent[t] if is_correct(labels[t], a)), len(incumbent[t]))
        )
    ]
    gain = float(sum(diffs, Fraction(0)))
    enough = Fraction(repr(saving)) >= exact_fraction(loop.cheaper_min_saving)
    result = noninferiority_test(diffs, len(labels), margin, seed=seed) if margin > 0 else None
    p = 1.0 if result is None else result.p_value
    within = result is not None and result.below(exact_fraction(level))
    keep = margin > 0 and enough and fpr_ok and within
    why: list[str] = []
    if not enough:
        why.append(f"saves {saving:.0%} per verdict, under cheaper_min_saving {loop.cheaper_min_saving:.0%}")
    if not fpr_ok:
        why.append("FPR rose")
    if not within:
        why.append(f"not shown within {margin} item(s) of the incumbent")
    reason = Reason(
        rule="cheaper",
        kept=keep,
        evidence=(
            f"cheaper: {saving:.0%} less per verdict, gain {gain:+.2f} items, {CHEAPER_TEST_MARK} {margin} "
            f"item(s)) p={p_text(p)} {'<' if within else '≥'} {level:.3g}"
        ),
        unmet=() if keep else tuple(why),
        kept_word="kept as cheaper, not worse",
        rolled_back_word="not kept",
    )
    return CheaperTest(
        keep=keep, reason=reason.text(), why=reason, p_value=p, gain=gain, margin_items=margin, saving=saving
    )


class FprStopper:
    """The FPR early-stopping bound alone, one item at a time: a cheaper-not-worse candidate may be kept
    without a kappa gain, so only the bound that no keep of either kind survives may stop it."""

    def __init__(
        self,
        labels: Mapping[str, Label],
        incumbent: Mapping[str, Answer],
        loop: LoopSection,
        alpha: float | None = None,
    ) -> None:
        self.labels, self.loop = labels, loop
        self.level = loop.alpha if alpha is None else alpha
        negatives = [t for t, lab in labels.items() if not lab.is_positive]
        self.n_neg = len(negatives)
        self.fp_inc = sum(1 for t in negatives if not is_correct(labels[t], incumbent.get(t)))
        self.wrong: dict[str, bool] = {}
        self.fp = 0

    def add(self, trajectory_id: str, answer: Answer) -> Decision | None:
        label = self.labels[trajectory_id]
        if label.is_positive or not self.n_neg:
            return None
        wrong = not is_correct(label, answer)
        self.fp += wrong - self.wrong.get(trajectory_id, False)
        self.wrong[trajectory_id] = wrong
        fp = self.fp
        if fpr_within(fp, self.fp_inc, self.n_neg, self.loop.fpr_tolerance):
            return None
        judged_neg = len(self.wrong)
        return fpr_stop(
            fp,
            self.fp_inc,
            self.n_neg,
            self.n_neg - judged_neg,
            judged_neg,
            len(self.labels),
            self.loop,
            self.level,
        )
