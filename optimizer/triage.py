"""Label triage: the "label suspects" queue and the metrics under the labels as given and as corrected.

The queue reads every judgement the ledger holds for a split — every replicate of every experiment
of every run on it — and, per item of the split's manifest, counts them against the item's *given*
label (``labels.jsonl``). A judgement is one replicate verdict of one prompt version; a version is
the prompts judged (their hash), so the same prompts judged by two runs (a baseline each, answered
from the judge cache) count once per replicate index: the key is (version, replicate), its first
verdict wins. Invalid verdicts (no ``success``) are not judgements.

For an item with ``judged`` judgements, ``against`` of them answering the opposite of its label:

    score = Σ over the judgements against the label of w(confidence) / judged,
    w(high) = 1, w(medium) = 0.5, w(low) = 0, w(none given) = 0.5

so an item every version and replicate judges against its label with high confidence scores 1, a
low-confidence disagreement adds nothing, and a judge that reports no confidence (a harness CLI)
ranks by the share of judgements alone. An item is a suspect when ``judged >= MIN_JUDGEMENTS``,
``against`` is a strict majority of ``judged`` and ``score > 0``; suspects are ranked by score, then
``against``, then ``judged`` (more evidence first), then id. ``versions_against`` counts the versions
whose majority over their replicates is against the label. Corrections (`optimizer.devset.corrections`)
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
from optimizer.ledger import Ledger, Run
from optimizer.metrics import Metrics, score
from optimizer.models import Label

MIN_JUDGEMENTS = 3
CONFIDENCE_WEIGHT: Mapping[str | None, float] = {"high": 1.0, "medium": 0.5, "low": 0.0, None: 0.5}


def _weight(confidence: str | None) -> float:
    return CONFIDENCE_WEIGHT.get(confidence, CONFIDENCE_WEIGHT[None])


@dataclass(frozen=True)
class Suspect:
    """One item of the queue (see the module docstring for every figure)."""

    trajectory_id: str
    given: Label
    score: float
    judged: int
    against: int
    high_against: int
    versions: int
    versions_against: int
    last_experiment: int  # the latest experiment that judged it (where the TUI opens it)
    correction: Correction | None

    @property
    def given_word(self) -> str:
        return "success" if self.given.is_positive else "failure"

    def line(self) -> str:
        fixed = (f"  corrected → {self.correction.label}: {self.correction.reason}" if self.correction else "")
        return (f"{self.trajectory_id}  label {self.given_word}  score {self.score:.2f}  against "
                f"{self.against}/{self.judged} judgements ({self.high_against} high confidence), "
                f"{self.versions_against}/{self.versions} versions{fixed}")

    def as_json(self) -> dict[str, object]:
        return {
            "id": self.trajectory_id, "label": self.given_word, "score": round(self.score, 6),
            "judged": self.judged, "against": self.against, "high_against": self.high_against,
            "versions": self.versions, "versions_against": self.versions_against,
            "last_experiment": self.last_experiment,
            "correction": None if self.correction is None else {
                "label": self.correction.label, "reason": self.correction.reason, "by": self.correction.by,
                "at": self.correction.at},
        }


def label_suspects(ledger: Ledger, split: Split, *, min_judgements: int = MIN_JUDGEMENTS,
                   labels: Mapping[str, Label] | None = None,
                   corrections: Mapping[str, Correction] | None = None) -> list[Suspect]:
    """The ranked queue for ``split`` over every run on it in the ledger (see the module docstring).
    ``labels``/``corrections``: already read (else read from the split now)."""
    given = load_labels(split) if labels is None else labels
    fixes = read_corrections(split, given) if corrections is None else corrections
    seen: set[tuple[str, str, int]] = set()
    judged: dict[str, int] = defaultdict(int)
    against: dict[str, int] = defaultdict(int)
    high: dict[str, int] = defaultdict(int)
    weight: dict[str, float] = defaultdict(float)
    last: dict[str, int] = {}
    per_version: dict[tuple[str, str], list[bool]] = defaultdict(list)
    for experiment_id, version, tid, replicate, success, confidence in ledger.split_judgements(split.name):
        label = given.get(tid)
        if label is None or success is None or (version, tid, replicate) in seen:
            continue
        seen.add((version, tid, replicate))
        wrong = success != label.is_positive
        judged[tid] += 1
        last[tid] = max(last.get(tid, experiment_id), experiment_id)
        per_version[(tid, version)].append(wrong)
        if wrong:
            against[tid] += 1
            weight[tid] += _weight(confidence)
            high[tid] += confidence == "high"
    versions: dict[str, int] = defaultdict(int)
    versions_against: dict[str, int] = defaultdict(int)
    for (tid, _version), wrongs in per_version.items():
        versions[tid] += 1
        versions_against[tid] += 2 * sum(wrongs) > len(wrongs)
    out = [
        Suspect(tid, given[tid], weight[tid] / judged[tid], judged[tid], against[tid], high[tid], versions[tid],
                versions_against[tid], last[tid], fixes.get(tid))
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


def metrics_given_corrected(ledger: Ledger, run: Run, split: Split) -> tuple[dict[str, Correction],
                                                                              list[GivenCorrected]]:
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
        rows.append(GivenCorrected(exp.id, score({t: given[t] for t in ids}, answers),
                                   score({t: corrected[t] for t in ids}, answers)))
    return fixes, rows
