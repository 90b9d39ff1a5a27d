"""Label triage: the "label suspects" queue and the metrics under the labels as given and as corrected.

The queue reads every judgement the ledger holds for a split — every replicate of every experiment
of every run on it — and, per item of the split's manifest, counts them against the item's *given*
label (``labels.jsonl``). A judgement is one verdict of one prompt version; a version is the prompts
judged (their hash), so the same prompts judged by two runs (a baseline each, answered from the judge
cache) count once per replicate index: the key is (version, replicate), its first verdict wins.
Invalid verdicts (no ``success``) are not judgements.

The structural judges count with their own evidence (`judgements`):

- **A panel** (judge.toml ``[panel]``): each valid member verdict of a replicate is a judgement (its
  own confidence), not the panel's vote, which is derived from them — a panel of k is k judges, so
  a split panel weighs for the label as well as against it. A replicate whose members are *all*
  valid and *unanimously* against the label is the strongest evidence a panel gives: each of its
  member judgements weighs 1 whatever the members' own confidence, and counts as ``structural``.
- **A review** (``review = "success"``) that turned a success into a failure citing steps, on an item
  labelled success, is a judgement against the label that cites its evidence: weight 1, structural.
- **Criteria** (``structure = "criteria"``): a failure verdict against a success label with an unmet
  required criterion that cites steps, or a success verdict against a failure label whose every
  required criterion is met with steps cited: weight 1, structural.

Every other judgement against the label weighs by its confidence. For an item with ``judged``
judgements, ``against`` of them answering the opposite of its label:

    score = Σ over the judgements against the label of w / judged,
    w = 1 when structural (above), else w(high) = 1, w(medium) = 0.5, w(low) = 0, w(none given) = 0.5

so an item every version and replicate judges against its label with high confidence scores 1, a
low-confidence disagreement adds nothing, and a judge that reports no confidence (a harness CLI)
ranks by the share of judgements alone. An item is a suspect when ``judged >= MIN_JUDGEMENTS``,
``against`` is a strict majority of ``judged`` and ``score > 0``; suspects are ranked by score, then
``against``, then ``judged`` (more evidence first), then id. ``versions_against`` counts the versions
whose majority over their judgements is against the label. Corrections (`optimizer.devset.corrections`)
do not change the score (it is against the given label); a corrected suspect is shown with its
correction. Label side: reads labels, never imported by the judge.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass

from optimizer.devset.corrections import Correction, apply_corrections, read_corrections
from optimizer.devset.labels import load_labels
from optimizer.devset.split import Split
from optimizer.ledger import Ledger, ReplicateVerdict, Run
from optimizer.models import Label
from optimizer.stats.metrics import Metrics, score

MIN_JUDGEMENTS = 3
CONFIDENCE_WEIGHT: Mapping[str | None, float] = {"high": 1.0, "medium": 0.5, "low": 0.0, None: 0.5}


def _weight(confidence: str | None) -> float:
    return CONFIDENCE_WEIGHT.get(confidence, CONFIDENCE_WEIGHT[None])


@dataclass(frozen=True)
class Judgement:
    """One judgement of an item against (or for) its label: ``weight`` counts only when ``against``."""

    against: bool
    weight: float
    high: bool
    structural: bool


def _cites_against(rep: ReplicateVerdict, positive: bool) -> bool:
    """Whether a criteria/review verdict against the label cites the steps that decide it (module docstring)."""
    if positive and rep.review is not None and rep.review.applied and rep.review.steps:
        return True
    required = [c for c in rep.criteria if c.required]
    if not required:
        return False
    if rep.success:
        return not positive and all(c.met and c.steps for c in required)
    return positive and any(not c.met and c.steps for c in required)


def judgements(rep: ReplicateVerdict, positive: bool) -> list[Judgement]:
    """The judgements one replicate verdict gives against or for a label (``positive``): one per valid
    panel member, else one (none when invalid); see the module docstring for the weights."""
    if rep.members:
        valid = [m for m in rep.members if m.success is not None]
        unanimous = len(valid) == len(rep.members) >= 2 and all(m.success != positive for m in valid)
        return [
            Judgement(
                m.success != positive,
                1.0 if unanimous else _weight(m.confidence),
                m.confidence == "high",
                unanimous,
            )
            for m in valid
        ]
    if rep.success is None:
        return []
    against = rep.success != positive
    structural = against and _cites_against(rep, positive)
    return [
        Judgement(
            against, 1.0 if structural else _weight(rep.confidence), rep.confidence == "high", structural
        )
    ]


@dataclass(frozen=True)
class Suspect:
    """One item of the queue (see the module docstring for every figure)."""

    trajectory_id: str
    given: Label
    score: float
    judged: int
    against: int
    high_against: int
    structural_against: int  # judgements against the label a structural judge backs (module docstring)
    versions: int
    versions_against: int
    last_experiment: int  # the latest experiment that judged it (where the TUI opens it)
    correction: Correction | None

    @property
    def given_word(self) -> str:
        return "success" if self.given.is_positive else "failure"

    def line(self) -> str:
        fixed = f"  corrected → {self.correction.label}: {self.correction.reason}" if self.correction else ""
        structural = f", {self.structural_against} structural" if self.structural_against else ""
        return (
            f"{self.trajectory_id}  label {self.given_word}  score {self.score:.2f}  against "
            f"{self.against}/{self.judged} judgements ({self.high_against} high confidence{structural}), "
            f"{self.versions_against}/{self.versions} versions{fixed}"
        )

    def as_json(self) -> dict[str, object]:
        return {
            "id": self.trajectory_id,
            "label": self.given_word,
            "score": round(self.score, 6),
            "judged": self.judged,
            "against": self.against,
            "high_against": self.high_against,
            "structural_against": self.structural_against,
            "versions": self.versions,
            "versions_against": self.versions_against,
            "last_experiment": self.last_experiment,
            "correction": None
            if self.correction is None
            else {
                "label": self.correction.label,
                "reason": self.correction.reason,
                "by": self.correction.by,
                "at": self.correction.at,
            },
        }


def label_suspects(
    ledger: Ledger,
    split: Split,
    *,
    min_judgements: int = MIN_JUDGEMENTS,
    labels: Mapping[str, Label] | None = None,
    corrections: Mapping[str, Correction] | None = None,
) -> list[Suspect]:
    """The ranked queue for ``split`` over every run on it in the ledger (see the module docstring).
    ``labels``/``corrections``: already read (else read from the split now)."""
    given = load_labels(split) if labels is None else labels
    fixes = read_corrections(split, given) if corrections is None else corrections
    seen: set[tuple[str, str, int]] = set()
    judged: dict[str, int] = defaultdict(int)
    against: dict[str, int] = defaultdict(int)
    high: dict[str, int] = defaultdict(int)
    structural: dict[str, int] = defaultdict(int)
    weight: dict[str, float] = defaultdict(float)
    last: dict[str, int] = {}
    per_version: dict[tuple[str, str], list[bool]] = defaultdict(list)
    for experiment_id, version, tid, rep in ledger.split_evidence(split.name):
        label = given.get(tid)
        if label is None or (version, tid, rep.replicate) in seen:
            continue
        found = judgements(rep, label.is_positive)
        if not found:
            continue
        seen.add((version, tid, rep.replicate))
        last[tid] = max(last.get(tid, experiment_id), experiment_id)
        for j in found:
            judged[tid] += 1
            per_version[(tid, version)].append(j.against)
            if j.against:
                against[tid] += 1
                weight[tid] += j.weight
                high[tid] += j.high
                structural[tid] += j.structural
    versions: dict[str, int] = defaultdict(int)
    versions_against: dict[str, int] = defaultdict(int)
    for (tid, _version), wrongs in per_version.items():
        versions[tid] += 1
        versions_against[tid] += 2 * sum(wrongs) > len(wrongs)
    out = [
        Suspect(
            tid,
            given[tid],
            weight[tid] / judged[tid],
            judged[tid],
            against[tid],
            high[tid],
            structural[tid],
            versions[tid],
            versions_against[tid],
            last[tid],
            fixes.get(tid),
        )
        for tid in judged
        if judged[tid] >= min_judgements and 2 * against[tid] > judged[tid] and weight[tid] > 0
    ]
    out.sort(key=lambda s: (-s.score, -s.against, -s.judged, s.trajectory_id))
    return out


@dataclass(frozen=True)
class GivenCorrected:
    """One experiment's majority answers scored under both label sets."""

    experiment_id: int
    given: Metrics
    corrected: Metrics


def metrics_given_corrected(
    ledger: Ledger, run: Run, split: Split
) -> tuple[dict[str, Correction], list[GivenCorrected]]:
    """The split's corrections and, when there are any, every fully evaluated experiment of ``run``
    scored under the labels as given and as corrected (an early-stopped one is left out: its answers
    are partial)."""
    given = load_labels(split)
    fixes = read_corrections(split, given)
    if not fixes:
        return fixes, []
    corrected = apply_corrections(given, fixes)
    rows = []
    for exp in ledger.experiments(run.id):
        if exp.early_stopped or not exp.metrics:
            continue
        answers = ledger.item_answers(exp.id)
        if not answers:
            continue
        ids = [tid for tid in given if tid in answers]
        rows.append(
            GivenCorrected(
                exp.id,
                score({t: given[t] for t in ids}, answers),
                score({t: corrected[t] for t in ids}, answers),
            )
        )
    return fixes, rows
