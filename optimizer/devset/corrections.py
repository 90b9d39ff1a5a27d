"""Label corrections: ``devset/<split>/corrections.jsonl``, a person's re-adjudication of labels, and
the label set a run decides with (``[loop] labels = "given" | "corrected"``).

One correction a line: ``{"id": "<trajectory id>", "label": "success" | "failure", "reason": "...",
"by": "<who>" (optional), "at": "<ISO 8601 time>"}``. ``success`` makes the item a positive,
``failure`` a negative (with no mistake type: the person named none). Every line must parse, name an
item of the split's manifest once, change its label and give a reason; any problem is one
`UserError` line naming the file and line. Only a person writes the file (`record_correction`, the
CLI's ``label-fix`` and the TUI's suspects queue); the optimiser's files, tools and guards never
reach it (`optimizer.loop.guards`: only ``prompts/`` files may change). Label side: like
`optimizer.devset.labels`, the judge-input side never imports this module.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal, Protocol

from optimizer.devset.labels import fingerprint, load_labels
from optimizer.devset.split import Split
from optimizer.errors import UserError
from optimizer.models import Label

CORRECTIONS_FILE = "corrections.jsonl"
# A correction is one short line; anything longer is not one (and is not read into memory whole).
MAX_LINE_BYTES = 16_384
MAX_FILE_BYTES = 64 * 1024 * 1024  # a 10 MB line is refused as a line, naming it
CORRECTED_LABELS = ("success", "failure")
LabelSetName = Literal["given", "corrected"]
_KEYS = {"id", "label", "reason", "by", "at"}


@dataclass(frozen=True)
class Correction:
    """One line of ``corrections.jsonl``."""

    id: str
    label: Literal["success", "failure"]
    reason: str
    at: str
    by: str | None = None

    @property
    def positive(self) -> bool:
        return self.label == "success"

    def as_json(self) -> str:
        obj: dict[str, str] = {"id": self.id, "label": self.label, "reason": self.reason}
        if self.by:
            obj["by"] = self.by
        obj["at"] = self.at
        return json.dumps(obj, ensure_ascii=False)


def corrections_path(split: Split) -> Path:
    return split.root / CORRECTIONS_FILE


def _problem(path: Path, line: int, what: str) -> UserError:
    return UserError(f"{path}:{line}: {what}; fix or delete that line (a person's file: `judgeloop label-fix` "
                     "writes it)")


def _parse_line(path: Path, lineno: int, raw: bytes) -> Correction:
    if len(raw) > MAX_LINE_BYTES:
        raise _problem(path, lineno, f"a line of {len(raw):,} bytes, over the {MAX_LINE_BYTES:,} a correction may take")
    try:
        obj = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise _problem(path, lineno, "not UTF-8 text") from None
    except json.JSONDecodeError as exc:
        raise _problem(path, lineno, f"not valid JSON ({exc.msg})") from None
    if not isinstance(obj, dict):
        raise _problem(path, lineno, "not a JSON object")
    unknown = sorted(set(obj) - _KEYS)
    if unknown:
        raise _problem(path, lineno, f"unknown key {unknown[0]!r} (keys: id, label, reason, by, at)")
    for key in ("id", "label", "reason", "at"):
        if not isinstance(obj.get(key), str) or not obj[key].strip():
            raise _problem(path, lineno, f"{key!r} must be a non-empty string")
    if obj["label"] not in CORRECTED_LABELS:
        raise _problem(path, lineno, f"label {obj['label']!r} is not success or failure")
    by = obj.get("by")
    if by is not None and not isinstance(by, str):
        raise _problem(path, lineno, "'by' must be a string")
    try:
        datetime.fromisoformat(obj["at"])
    except ValueError:
        raise _problem(path, lineno, f"'at' {obj['at']!r} is not an ISO 8601 time") from None
    return Correction(id=obj["id"], label=obj["label"], reason=obj["reason"].strip(), at=obj["at"], by=by or None)


def read_corrections(split: Split, labels: Mapping[str, Label] | None = None) -> dict[str, Correction]:
    """The split's corrections keyed by id, in file order ({} when there is no file). Every problem —
    a broken line, an id outside the manifest, an id twice, a label equal to the given one — is a
    `UserError` naming the file and line."""
    path = corrections_path(split)
    if not path.is_file():
        return {}
    try:
        size = path.stat().st_size
        if size > MAX_FILE_BYTES:
            raise UserError(f"{path} is {size:,} bytes, over the {MAX_FILE_BYTES:,} a corrections file may take; "
                            "it holds one short line per corrected item")
        data = path.read_bytes()
    except OSError as exc:
        raise UserError(f"cannot read {path} ({exc.strerror})") from None
    given = load_labels(split) if labels is None else labels
    found: dict[str, Correction] = {}
    where: dict[str, int] = {}
    for lineno, raw in enumerate(data.split(b"\n"), start=1):
        if not raw.strip():
            continue
        corr = _parse_line(path, lineno, raw.strip())
        if corr.id not in given:
            raise _problem(path, lineno, f"id {corr.id!r} is not an item of split {split.name!r}")
        if corr.id in found:
            raise _problem(path, lineno, f"id {corr.id} is corrected twice (first on line {where[corr.id]})")
        if corr.positive == given[corr.id].is_positive:
            raise _problem(path, lineno, f"id {corr.id} is already labelled {corr.label}; a correction changes a label")
        found[corr.id] = corr
        where[corr.id] = lineno
    return found


def apply_corrections(labels: Mapping[str, Label], corrections: Mapping[str, Correction]) -> dict[str, Label]:
    """The labels with each correction applied (a corrected negative loses its mistake type), in the
    same order."""
    out: dict[str, Label] = {}
    for tid, lab in labels.items():
        corr = corrections.get(tid)
        if corr is None:
            out[tid] = lab
        else:
            out[tid] = lab.model_copy(update={"label": "positive" if corr.positive else "negative",
                                              "mistake_type": None})
    return out


@dataclass(frozen=True)
class LabelSet:
    """The labels a run decides with: which set, the labels, their fingerprint (`labels.fingerprint`
    of the labels as applied) and the corrections in them."""

    name: LabelSetName
    labels: dict[str, Label]
    fingerprint: str
    corrections: dict[str, Correction]


def label_set(split: Split, name: LabelSetName) -> LabelSet:
    """The split's labels as given or as corrected by its ``corrections.jsonl`` (read and checked now)."""
    given = load_labels(split)
    corrections = read_corrections(split, given) if name == "corrected" else {}
    labels = apply_corrections(given, corrections)
    return LabelSet(name, labels, fingerprint(labels.values()), corrections)


class StoredLabel(Protocol):
    """A label as a run stored it (`optimizer.ledger.LabelRow`)."""

    @property
    def positive(self) -> bool: ...

    @property
    def mistake_type(self) -> str | None: ...


def labels_as_stored(split: Split, stored: Mapping[str, StoredLabel]) -> dict[str, Label]:
    """The split's labels with each item's label and mistake type as a run stored them at its start —
    the label set it decides with, rebuilt on resume whatever ``corrections.jsonl`` says now."""
    out: dict[str, Label] = {}
    for tid, lab in load_labels(split).items():
        row = stored.get(tid)
        out[tid] = lab if row is None else lab.model_copy(update={
            "label": "positive" if row.positive else "negative", "mistake_type": row.mistake_type})
    return out


def record_correction(split: Split, tid: str, label: str, reason: str, by: str | None = None) -> str:
    """Write (or replace) the correction of item ``tid``: one line of ``corrections.jsonl``, the file
    rewritten whole (temporary file, then rename). ``label`` equal to the item's given label removes its
    correction instead. Returns what was done, one line. Refuses an unknown id, a bad label, an empty
    reason and a corrections file that is already broken."""
    given = load_labels(split)
    if tid not in given:
        raise UserError(f"{tid!r} is not an item of split {split.name!r}; see `judgeloop devset list` and the "
                        "label suspects in `judgeloop report`")
    if label not in CORRECTED_LABELS:
        raise UserError(f"--label {label!r} is not success or failure")
    if not reason.strip():
        raise UserError("--reason is empty; say why the label is wrong (it is kept with the correction)")
    existing = read_corrections(split, given)
    path = corrections_path(split)
    positive = label == "success"
    if positive == given[tid].is_positive:
        if tid not in existing:
            raise UserError(f"{tid} is already labelled {label} in split {split.name!r}; nothing to correct")
        del existing[tid]
        done = f"removed the correction of {tid}: its label is back to the given {label}"
    else:
        existing[tid] = Correction(id=tid, label="success" if positive else "failure", reason=reason.strip(),
                                   at=datetime.now(UTC).isoformat(timespec="seconds"), by=by or None)
        done = f"corrected {tid} to {label} in {path.name} of split {split.name!r}"
    text = "".join(c.as_json() + "\n" for c in existing.values())
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise UserError(f"cannot write {path} ({exc.strerror}); check the folder is writable") from None
    return done
