"""Labels: reading label files, counting and fingerprinting them, and `load_labels` — the only
reader of an imported split's labels. Only scoring, the loop's decisions, the report and the
optimiser's disagreement view use it; the judge-input side never imports this module."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from pydantic import ValidationError

from optimizer.devset.split import Split
from optimizer.errors import UserError, first_error
from optimizer.models import MISTAKE_TYPES, Label
from optimizer.stats.metrics import UNTYPED as UNTYPED  # the importer and verify take it from here
from optimizer.workspace.paths import LABELS_FILE

LABEL_FILE_NAMES = ("AgentHorizon.jsonl", "AgentHorizon-Simple.jsonl", LABELS_FILE)


class LabelRow(NamedTuple):
    """One valid line of a label file: where it was, the parsed label, the line as written."""

    path: Path
    line: int
    label: Label
    raw: str


def read_label_file(path: Path, display: str | None = None) -> tuple[list[LabelRow], list[str]]:
    """Parse a labels JSONL file; broken lines become ``"<display>:<line>: what is wrong"`` problems.

    Never raises for bad content: a broken line is reported and skipped. Duplicate ids are left to
    the caller (an importer refuses them, `verify_split` reports them).
    """
    shown = display or str(path)
    rows: list[LabelRow] = []
    problems: list[str] = []
    for lineno, raw_bytes in enumerate(path.read_bytes().split(b"\n"), start=1):
        try:
            raw = raw_bytes.decode("utf-8").strip()
        except UnicodeDecodeError:
            problems.append(f"{shown}:{lineno}: not UTF-8 text")
            continue
        if not raw:
            continue
        try:
            obj = json.loads(raw)
        except json.JSONDecodeError as exc:
            problems.append(f"{shown}:{lineno}: not valid JSON ({exc.msg})")
            continue
        if not isinstance(obj, dict):
            problems.append(f"{shown}:{lineno}: not a JSON object")
            continue
        try:
            label = Label.model_validate(obj)
        except ValidationError as exc:
            problems.append(f"{shown}:{lineno}: {first_error(exc).line()}")
            continue
        rows.append(LabelRow(path, lineno, label, raw))
    return rows, problems


def fingerprint(labels: Iterable[Label]) -> str:
    """sha256 (hex) over ``"<id>\\t<label>\\t<mistake_type or ''>\\n"`` lines sorted by id."""
    lines = sorted(f"{lab.trajectory_id}\t{lab.label}\t{lab.mistake_type or ''}\n" for lab in labels)
    return hashlib.sha256("".join(lines).encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class LabelCounts:
    """Items, positives and negatives, and the negatives per mistake type (every type of
    `optimizer.vocab.MISTAKE_TYPES`, then ``untyped``: a negative with none given)."""

    items: int
    positives: int
    negatives: int
    mistake_types: dict[str, int]

    def as_json(self) -> dict[str, Any]:
        """``{"items", "positives", "negatives", "mistake_types": {<type>: n, ..., "untyped": n}}``: the
        ``counts`` of a split's ``split.json``."""
        return {
            "items": self.items,
            "positives": self.positives,
            "negatives": self.negatives,
            "mistake_types": dict(self.mistake_types),
        }

    @classmethod
    def from_json(cls, data: object) -> LabelCounts | None:
        """The counts an `as_json` wrote, or None when ``data`` is not such a record (a split imported
        before the counts were recorded, or a hand-edited file)."""
        if not isinstance(data, dict):
            return None
        items, positives, negatives = data.get("items"), data.get("positives"), data.get("negatives")
        types = data.get("mistake_types")
        if not (isinstance(items, int) and isinstance(positives, int) and isinstance(negatives, int)):
            return None
        if not isinstance(types, dict):
            return None
        return cls(items, positives, negatives, {str(k): v for k, v in types.items() if isinstance(v, int)})


def count_labels(labels: Iterable[Label]) -> LabelCounts:
    """The `LabelCounts` of ``labels``."""
    items = positives = negatives = 0
    types = dict.fromkeys((*MISTAKE_TYPES, UNTYPED), 0)
    for lab in labels:
        items += 1
        if lab.is_positive:
            positives += 1
        else:
            negatives += 1
            types[lab.mistake_type or UNTYPED] += 1
    return LabelCounts(items, positives, negatives, types)


def describe_counts(counts: LabelCounts) -> str:
    """``items=N positives=P negatives=M (Critical Mistake 32, ..., untyped 1)``."""
    types = ", ".join(f"{name} {n}" for name, n in counts.mistake_types.items())
    return f"items={counts.items} positives={counts.positives} negatives={counts.negatives} ({types})"


def load_labels(split: Split) -> dict[str, Label]:
    """The split's labels keyed by id, in manifest order — the only reader of a split's labels.

    Scoring needs every label, so any broken line, duplicate or unlabelled item is a UserError
    (run `judgeloop devset verify NAME` to see them all).
    """
    path = split.root / LABELS_FILE
    if not path.is_file():
        raise UserError(f"{path} is missing; re-import split {split.name!r}")
    rows, problems = read_label_file(path)
    by_id: dict[str, Label] = {}
    for row in rows:
        if row.label.trajectory_id in by_id:
            problems.append(f"{path}:{row.line}: id {row.label.trajectory_id} is labelled twice")
        by_id[row.label.trajectory_id] = row.label
    missing = [tid for tid in split.ids if tid not in by_id]
    if missing:
        problems.append(f"{path}: no label for {len(missing)} manifest item(s), first {missing[0]}")
    if problems:
        more = f" (and {len(problems) - 1} more problems)" if len(problems) > 1 else ""
        raise UserError(f"{problems[0]}{more}; run `judgeloop devset verify {split.name}`")
    return {tid: by_id[tid] for tid in split.ids}
