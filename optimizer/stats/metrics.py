"""Protocol metrics over verdicts and labels: pure functions, no I/O.

Definitions (positive class = "success", the judge's ``success=true``):

- Denominators are fixed by the labels passed in (the split's manifest). An item with no usable
  answer — absent, ``status`` other than ``"ok"``, or ``success`` not a bool — is a **wrong answer**:
  it is scored as the opposite of its label, so a silent or broken judge can never shrink a
  denominator or dodge a rate.
- TPR = tp/P, TNR = tn/N, FPR = fp/N = 1 − TNR, FNR = fn/P = 1 − TPR,
  balanced accuracy = (TPR + TNR)/2, Cohen's kappa between verdicts and labels.
- Mistake-type recall, per type: among negatives labelled with that type, the share the judge
  rejected (``success=false``) *and* gave the same type. "overall" pools every typed negative.
  Untyped negatives count in FPR but in no recall.

Degenerate splits: a rate whose denominator is empty (no positives ⇒ TPR, FNR; no negatives ⇒ TNR,
FPR; a recall type with no labelled item) is ``None``, not 0, and balanced accuracy is ``None`` when
either class is empty. Kappa is ``None`` only when it is 0/0 (chance agreement pe = 1: labels and
verdicts all in the same single class); scikit-learn returns NaN there. On a one-class split any
imperfect judge has kappa exactly 0.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Protocol, TypedDict

import numpy as np
from pydantic import BaseModel, ConfigDict, computed_field

from optimizer.models import MISTAKE_TYPES, Label, fold_mistake_type
from optimizer.vocab import UNTYPED as UNTYPED
from optimizer.vocab import AnswerStatus as AnswerStatus


class ScoreJson(TypedDict):
    """The object ``judgeloop score --json`` prints (the scoring protocol): rates in [0, 1] or None
    where undefined, counts in items, keys in this order."""

    n: int
    balanced_accuracy: float | None
    tpr: float | None
    tnr: float | None
    fpr: float | None
    fnr: float | None
    kappa: float | None
    invalid: int
    missing: int
    mistake_type_recall: dict[str, float | None]


PROTOCOL_KEYS: tuple[str, ...] = tuple(ScoreJson.__annotations__)


@dataclass(frozen=True)
class Answer:
    """One judge answer for one item. ``success=None`` or any status but "ok" is a wrong answer.

    ``missing``: no answer at all (no file). ``invalid``: an answer that is not a usable verdict
    (bad JSON, ``success`` not a JSON boolean). ``infra_error``: the call never produced a reply
    (transport failure after retries); counted with ``missing`` in the protocol numbers.
    """

    success: bool | None
    mistake_type: str | None = None
    status: AnswerStatus = "ok"

    @property
    def usable(self) -> bool:
        """True when this is a real boolean verdict."""
        return self.status == "ok" and isinstance(self.success, bool)


MISSING = Answer(success=None, status="missing")


class LabelLike(Protocol):
    """What scoring reads of a label: `models.Label`, or a label as the ledger stores it."""

    @property
    def is_positive(self) -> bool: ...

    @property
    def mistake_type(self) -> str | None: ...


def majority_answer(answers: Sequence[Answer]) -> Answer:
    """One item's answer from several judgements, by the rule `optimizer.judge.verdicts.majority`
    applies to replicate verdicts: unusable judgements outnumbering usable ones give an invalid
    answer; otherwise the majority of the usable ones, a tie being ``False`` (which can never raise
    the false-positive rate); a failure carries the most common mistake type among the winners."""
    if not answers:
        raise ValueError("majority_answer() needs at least one judgement")
    usable = [a for a in answers if a.usable]
    if len(answers) - len(usable) > len(usable):
        return Answer(success=None, status="invalid")
    yes = sum(1 for a in usable if a.success)
    winner = yes > len(usable) - yes
    if winner:
        return Answer(success=True)
    types = [a.mistake_type for a in usable if not a.success]
    best = max(types.count(t) for t in types)
    return Answer(success=False, mistake_type=next(t for t in types if types.count(t) == best))


def outcome(answer: Answer) -> bool | None:
    """What a judgement says, label-free: True, False, or None for no usable verdict."""
    return answer.success if answer.usable else None


def is_correct(label: LabelLike, answer: Answer | None) -> bool:
    """Whether ``answer`` agrees with ``label``; an absent or unusable answer is never correct."""
    return answer is not None and answer.usable and answer.success is label.is_positive


def predicted_success(label: LabelLike, answer: Answer | None) -> bool:
    """The verdict as scored: the answer's ``success``, or the opposite of the label when unusable."""
    if answer is not None and answer.usable:
        return bool(answer.success)
    return not label.is_positive


def kappa_fraction(tp: int, fn: int, tn: int, fp: int) -> Fraction | None:
    """Cohen's kappa as an exact fraction from the confusion counts, or None when it is 0/0.

    Uses the identity kappa = (po − pe)/(1 − pe) = 2(tp·tn − fn·fp) / ((tp+fp)(fp+tn) + (tp+fn)(fn+tn)).
    """
    den = (tp + fp) * (fp + tn) + (tp + fn) * (fn + tn)
    if den == 0:
        return None
    return Fraction(2 * (tp * tn - fn * fp), den)


def cohen_kappa(tp: int, fn: int, tn: int, fp: int) -> float | None:
    """Cohen's kappa as a float (see `kappa_fraction`)."""
    k = kappa_fraction(tp, fn, tn, fp)
    return None if k is None else float(k)


def _ratio(num: int, den: int) -> float | None:
    return None if den == 0 else num / den


class Metrics(BaseModel):
    """The protocol numbers of one verdict set on one split, plus the confusion counts behind them."""

    model_config = ConfigDict(frozen=True)

    n: int
    balanced_accuracy: float | None
    tpr: float | None
    tnr: float | None
    fpr: float | None
    fnr: float | None
    kappa: float | None
    invalid: int
    missing: int
    mistake_type_recall: dict[str, float | None]
    tp: int
    fn: int
    tn: int
    fp: int
    infra_errors: int = 0  # already included in `missing`; kept apart for run records

    @property
    def positives(self) -> int:
        return self.tp + self.fn

    @property
    def negatives(self) -> int:
        return self.tn + self.fp

    def protocol_dict(self) -> ScoreJson:
        """Exactly the keys of ``judgeloop score --json``, in protocol order."""
        return ScoreJson(
            n=self.n,
            balanced_accuracy=self.balanced_accuracy,
            tpr=self.tpr,
            tnr=self.tnr,
            fpr=self.fpr,
            fnr=self.fnr,
            kappa=self.kappa,
            invalid=self.invalid,
            missing=self.missing,
            mistake_type_recall=self.mistake_type_recall,
        )

    @classmethod
    def from_counts(
        cls,
        tp: int,
        fn: int,
        tn: int,
        fp: int,
        *,
        invalid: int = 0,
        missing: int = 0,
        infra_errors: int = 0,
        mistake_type_recall: Mapping[str, float | None] | None = None,
    ) -> Metrics:
        """Build the rates from confusion counts (for simulations and stored ledger rows)."""
        positives, negatives = tp + fn, tn + fp
        tpr, tnr = _ratio(tp, positives), _ratio(tn, negatives)
        recall = dict(mistake_type_recall) if mistake_type_recall is not None else {}
        for key in (*MISTAKE_TYPES, "overall"):
            recall.setdefault(key, None)
        return cls(
            n=positives + negatives,
            balanced_accuracy=None if tpr is None or tnr is None else (tpr + tnr) / 2,
            tpr=tpr,
            tnr=tnr,
            fpr=_ratio(fp, negatives),
            fnr=_ratio(fn, positives),
            kappa=cohen_kappa(tp, fn, tn, fp),
            invalid=invalid,
            missing=missing,
            infra_errors=infra_errors,
            mistake_type_recall=recall,
            tp=tp,
            fn=fn,
            tn=tn,
            fp=fp,
        )


def _check_ids(labels: Mapping[str, LabelLike], answers: Mapping[str, Answer], what: str) -> None:
    extra = [tid for tid in answers if tid not in labels]
    if extra:
        raise ValueError(f"{what} has answers for {len(extra)} id(s) outside the labels, e.g. {extra[0]!r}")


def score(labels: Mapping[str, Label], answers: Mapping[str, Answer]) -> Metrics:
    """Score ``answers`` against ``labels`` with fixed denominators (every labelled id counts).

    An id absent from ``answers`` is missing (a wrong answer). Answers for ids outside ``labels``
    are a caller bug and raise ValueError.
    """
    _check_ids(labels, answers, "score()")
    tp = fn = tn = fp = invalid = missing = infra = 0
    typed_total = dict.fromkeys(MISTAKE_TYPES, 0)
    typed_hit = dict.fromkeys(MISTAKE_TYPES, 0)
    for tid, label in labels.items():
        answer = answers.get(tid)
        if answer is None or answer.status == "missing":
            missing += 1
        elif answer.status == "infra_error":
            missing += 1
            infra += 1
        elif not answer.usable:
            invalid += 1
        said_success = predicted_success(label, answer)
        if label.is_positive:
            tp, fn = (tp + 1, fn) if said_success else (tp, fn + 1)
            continue
        tn, fp = (tn, fp + 1) if said_success else (tn + 1, fp)
        if label.mistake_type in typed_total:
            typed_total[label.mistake_type] += 1
            named = fold_mistake_type(answer.mistake_type) if answer is not None else None
            if is_correct(label, answer) and named == label.mistake_type:
                typed_hit[label.mistake_type] += 1
    recall: dict[str, float | None] = {t: _ratio(typed_hit[t], typed_total[t]) for t in MISTAKE_TYPES}
    recall["overall"] = _ratio(sum(typed_hit.values()), sum(typed_total.values()))
    return Metrics.from_counts(
        tp, fn, tn, fp, invalid=invalid, missing=missing, infra_errors=infra, mistake_type_recall=recall
    )


def false_positives_by_type(labels: Mapping[str, LabelLike], answers: Mapping[str, Answer]) -> dict[str, int]:
    """False positives per mistake type of the negatives in ``labels`` (the three types, then
    ``"untyped"``), scored as `score` scores them: a wrong or unusable answer on a negative is a false
    positive. Pass the labels of the items both sides were judged on to compare two experiments."""
    counts = dict.fromkeys((*MISTAKE_TYPES, UNTYPED), 0)
    for tid, label in labels.items():
        if not label.is_positive and predicted_success(label, answers.get(tid)):
            kind = label.mistake_type if label.mistake_type in counts else UNTYPED
            counts[kind or UNTYPED] += 1
    return counts


def bootstrap_intervals(
    labels: Mapping[str, Label],
    answers: Mapping[str, Answer],
    *,
    n_boot: int = 2000,
    seed: int = 0,
    level: float = 0.95,
) -> dict[str, tuple[float, float]]:
    """Percentile bootstrap intervals for balanced_accuracy, tpr, tnr, fpr, fnr and kappa.

    Stratified by label: positives and negatives are resampled separately, each with its own
    size, because the split's composition (e.g. 62/100) is fixed by design, not sampled — a plain
    resample would vary the class sizes and could even draw a resample with no positives. Within a
    class the number of correct answers in a resample with replacement is exactly
    Binomial(class size, observed rate), which is how it is drawn. A metric whose class is empty is
    left out of the result. Seeded: the same inputs and seed give the same intervals.
    """
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level}")
    m = score(labels, answers)
    rng = np.random.default_rng(seed)
    P, N = m.positives, m.negatives
    tp = rng.binomial(P, m.tp / P, n_boot).astype(float) if P else None
    tn = rng.binomial(N, m.tn / N, n_boot).astype(float) if N else None
    lo_q, hi_q = (1 - level) / 2, 1 - (1 - level) / 2

    def interval(values: np.ndarray) -> tuple[float, float]:
        lo, hi = np.quantile(values, [lo_q, hi_q])
        return float(lo), float(hi)

    out: dict[str, tuple[float, float]] = {}
    if tp is not None:
        out["tpr"] = interval(tp / P)
        out["fnr"] = interval(1 - tp / P)
    if tn is not None:
        out["tnr"] = interval(tn / N)
        out["fpr"] = interval(1 - tn / N)
    if tp is not None and tn is not None:
        out["balanced_accuracy"] = interval((tp / P + tn / N) / 2)
        fn, fp = P - tp, N - tn
        den = (tp + fp) * (fp + tn) + (tp + fn) * (fn + tn)  # > 0 whenever both classes are present
        out["kappa"] = interval(2 * (tp * tn - fn * fp) / den)
    return out


class FlipTable(BaseModel):
    """Items whose correctness changed between the incumbent and the candidate, by direction."""

    model_config = ConfigDict(frozen=True)

    tp_to_fn: list[str]
    fn_to_tp: list[str]
    tn_to_fp: list[str]
    fp_to_tn: list[str]

    @computed_field  # type: ignore[prop-decorator]
    @property
    def improved(self) -> int:
        """Items the incumbent got wrong and the candidate right."""
        return len(self.fn_to_tp) + len(self.fp_to_tn)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def worsened(self) -> int:
        """Items the incumbent got right and the candidate wrong."""
        return len(self.tp_to_fn) + len(self.tn_to_fp)


# How a person reads the flip table (the TUI and `judgeloop report` alike): a row is what happened to
# the judge's answer, newly wrong or newly right; within a row, positives then negatives. Each row's
# words are true of both of its cells (TN→FP is a newly wrong *success* verdict, so rows are not named
# by verdict).
FLIP_ARROWS: dict[str, str] = {
    "tp_to_fn": "TP→FN",
    "fn_to_tp": "FN→TP",
    "tn_to_fp": "TN→FP",
    "fp_to_tn": "FP→TN",
}
FLIP_ROWS: tuple[tuple[str, tuple[str, str]], ...] = (
    ("newly wrong", ("tp_to_fn", "tn_to_fp")),
    ("newly right", ("fn_to_tp", "fp_to_tn")),
)


def flip_table(
    labels: Mapping[str, LabelLike], incumbent: Mapping[str, Answer], candidate: Mapping[str, Answer]
) -> FlipTable:
    """The paired flip table over every labelled id (absent answers are wrong), in label order."""
    _check_ids(labels, incumbent, "flip_table() incumbent")
    _check_ids(labels, candidate, "flip_table() candidate")
    cells: dict[str, list[str]] = {"tp_to_fn": [], "fn_to_tp": [], "tn_to_fp": [], "fp_to_tn": []}
    for tid, label in labels.items():
        before, after = is_correct(label, incumbent.get(tid)), is_correct(label, candidate.get(tid))
        if before == after:
            continue
        if label.is_positive:
            cells["tp_to_fn" if before else "fn_to_tp"].append(tid)
        else:
            cells["tn_to_fp" if before else "fp_to_tn"].append(tid)
    return FlipTable(**cells)


def mcnemar_exact_one_sided(improved: int, worsened: int) -> float:
    """Exact one-sided McNemar p-value: P(X ≥ improved) for X ~ Binomial(improved + worsened, ½).

    Only discordant items enter. With no discordant items the p-value is 1 (no evidence). Computed
    with exact integer arithmetic, then rounded once to float.
    """
    if improved < 0 or worsened < 0:
        raise ValueError(f"counts must be non-negative, got improved={improved}, worsened={worsened}")
    n = improved + worsened
    tail = sum(math.comb(n, k) for k in range(improved, n + 1))
    return float(Fraction(tail, 2**n))
