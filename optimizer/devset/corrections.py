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

Every write holds an ``flock`` on ``corrections.jsonl.lock`` beside the file (two ``label-fix`` and the
TUI at once lose nothing), re-reads and checks the file under it, checks the new text line by line with
the reader's own rules (a line over `MAX_LINE_BYTES`, the reader's limit, is refused before anything is
written), writes a temporary file with fsync and renames it over the file, and records the bytes written
in git (`optimizer.devset.record`: a commit under ``refs/judgeloop/corrections/<split>``). Every read
(`read_corrections`: a run's start with ``labels = "corrected"``, `eval`, `report`, `devset verify`, the
TUI, and each write) compares the file with that record: a file changed, created or deleted by anything
else is refused in one line naming the file, how to put it back and how a person accepts it
(`adopt_corrections`, ``judgeloop label-adopt``). A held-out split — by name or holding a held-out item
(`optimizer.devset.heldout.heldout_reason`) — is never corrected, and the refusal says the same whatever
the item's label.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal, Protocol

from optimizer.devset.heldout import heldout_reason
from optimizer.devset.labels import fingerprint, load_labels
from optimizer.devset.record import exclusive_lock, record_file, record_ref, recorded_file
from optimizer.devset.split import Split
from optimizer.errors import UserError
from optimizer.models import Label
from optimizer.workspace.paths import (
    CORRECTIONS_FILE as CORRECTIONS_FILE,  # spelled in optimizer.workspace.paths
)
from optimizer.workspace.workspace import Workspace

LOCK_SUFFIX = ".lock"  # corrections.jsonl.lock, beside the file, while a writer holds it
# A correction is one short line; anything longer is not one (and is not read into memory whole). The
# reader refuses a longer line and the writer refuses to write one: one constant for both.
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


def _workspace_root(split: Split) -> Path:
    # `open_split` opens ``<workspace>/devset/<name>``: the repository the record lives in.
    return split.root.parent.parent


def _display(split: Split) -> str:
    return f"devset/{split.name}/{CORRECTIONS_FILE}"


def check_recorded(split: Split, data: bytes | None) -> None:
    """UserError unless ``data`` (the file's bytes; None: no file) is what `label-fix`, the TUI or
    `label-adopt` last recorded for the split (no record: no file, or one without a correction)."""
    recorded = recorded_file(_workspace_root(split), record_ref(split.name), CORRECTIONS_FILE)
    if data == recorded or (recorded is None and not (data or b"").strip()):
        return
    ref = record_ref(split.name)
    if recorded is None:
        what = "holds corrections no `judgeloop label-fix` or TUI correction recorded"
        back = "delete it"
    else:
        what = (
            "was deleted" if data is None else "was changed"
        ) + " outside `judgeloop label-fix` and the TUI"
        back = f"put it back with `git show {ref}:{CORRECTIONS_FILE} > {_display(split)}`"
    raise UserError(
        f"{_display(split)} {what}, so its labels are not trusted; {back}, or, if the change is "
        f"yours, accept it with `judgeloop label-adopt --split {split.name}`"
    )


def _problem(path: Path, line: int, what: str) -> UserError:
    return UserError(
        f"{path}:{line}: {what}; fix or delete that line (a person's file: `judgeloop label-fix` writes it)"
    )


def _parse_line(path: Path, lineno: int, raw: bytes) -> Correction:
    if len(raw) > MAX_LINE_BYTES:
        raise _problem(
            path, lineno, f"a line of {len(raw):,} bytes, over the {MAX_LINE_BYTES:,} a correction may take"
        )
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
    return Correction(
        id=obj["id"], label=obj["label"], reason=obj["reason"].strip(), at=obj["at"], by=by or None
    )


def read_corrections(split: Split, labels: Mapping[str, Label] | None = None) -> dict[str, Correction]:
    """The split's corrections keyed by id, in file order ({} when there is no file). Every problem —
    a broken line, an id outside the manifest, an id twice, a label equal to the given one — is a
    `UserError` naming the file and line; so is a file that is not what its writers recorded
    (`check_recorded`)."""
    data = _read_file(split)
    given = load_labels(split) if labels is None else labels
    found = parse_corrections(split, data or b"", given)  # first: a broken line is named, whoever wrote it
    try:
        check_recorded(split, data)
    except UserError:
        # A writer may be between recording and renaming: look again under its lock before refusing.
        with exclusive_lock(_lock_path(split)):
            _data, found = _locked_read(split, given)
    return found


def _lock_path(split: Split) -> Path:
    path = corrections_path(split)
    return path.with_name(path.name + LOCK_SUFFIX)


def _read_file(split: Split) -> bytes | None:
    """The corrections file's bytes, or None when there is none."""
    path = corrections_path(split)
    if not path.is_file():
        return None
    try:
        size = path.stat().st_size
        if size > MAX_FILE_BYTES:
            raise UserError(
                f"{path} is {size:,} bytes, over the {MAX_FILE_BYTES:,} a corrections file may take; "
                "it holds one short line per corrected item"
            )
        return path.read_bytes()
    except OSError as exc:
        raise UserError(f"cannot read {path} ({exc.strerror})") from None


def parse_corrections(split: Split, data: bytes, given: Mapping[str, Label]) -> dict[str, Correction]:
    """The corrections in ``data`` (the file's bytes) keyed by id, every line checked against the given
    labels (`read_corrections`' rules), without comparing the file with its record."""
    path = corrections_path(split)
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
            raise _problem(
                path, lineno, f"id {corr.id} is already labelled {corr.label}; a correction changes a label"
            )
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
            out[tid] = lab.model_copy(
                update={"label": "positive" if corr.positive else "negative", "mistake_type": None}
            )
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
        out[tid] = (
            lab
            if row is None
            else lab.model_copy(
                update={"label": "positive" if row.positive else "negative", "mistake_type": row.mistake_type}
            )
        )
    return out


def refuse_heldout_split(ws: Workspace, split: Split) -> None:
    """UserError when ``split`` is held out, by name or by item (`heldout_reason`): its labels are never
    read to answer a person, so the refusal is the same whatever an item's label (no label oracle)."""
    found = heldout_reason(ws, split.name)
    if found is not None:
        raise UserError(
            f"{found[0]}: its labels are not corrected here and `judgeloop label-fix` says nothing "
            "of them; correct items of the dev split only"
        )


def _correction_line(corr: Correction, what: str = "--reason") -> bytes:
    """One line of the file (with its newline), refused over `MAX_LINE_BYTES` — the reader's limit, so
    everything written reads back — or when the text is not UTF-8 (a reason of undecodable bytes)."""
    try:
        line = corr.as_json().encode("utf-8")
    except UnicodeEncodeError:
        raise UserError("--reason or --by is not UTF-8 text; type it again") from None
    if len(line) > MAX_LINE_BYTES:
        raise UserError(
            f"{what} makes a correction line of {len(line):,} bytes, over the {MAX_LINE_BYTES:,} "
            "a correction may take; say why in fewer words (the longer account belongs elsewhere)"
        )
    return line + b"\n"


def _locked_read(split: Split, given: Mapping[str, Label]) -> tuple[bytes | None, dict[str, Correction]]:
    """The file's bytes and corrections, checked against its record; call under the lock."""
    data = _read_file(split)
    found = parse_corrections(split, data or b"", given)
    check_recorded(split, data)
    return data, found


def _write(split: Split, given: Mapping[str, Label], text: bytes, message: str, by: str | None) -> None:
    """Write ``text`` as the corrections file: a temporary file beside it (fsync), the bytes recorded in
    git, then a rename over the file; call under the lock."""
    path = corrections_path(split)
    parse_corrections(split, text, given)  # everything written reads back (the reader's rules)
    try:
        fd, tmp_name = tempfile.mkstemp(dir=split.root, prefix=f".{CORRECTIONS_FILE}.", suffix=".tmp")
    except OSError as exc:
        raise UserError(
            f"cannot write in {split.root} ({exc.strerror}); check the folder is writable"
        ) from None
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, 0o644)
        record_file(_workspace_root(split), record_ref(split.name), CORRECTIONS_FILE, text, message, by)
        os.replace(tmp, path)
    except OSError as exc:
        raise UserError(f"cannot write {path} ({exc.strerror}); check the folder is writable") from None
    finally:
        tmp.unlink(missing_ok=True)
    _fsync_dir(split.root)


def _fsync_dir(folder: Path) -> None:
    # The rename is durable only once the folder is synced.
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def record_correction(
    ws: Workspace, split: Split, tid: str, label: str, reason: str, by: str | None = None
) -> str:
    """Write (or replace) the correction of item ``tid``: one line of ``corrections.jsonl``, the file
    rewritten whole under its lock (module docstring). ``label`` equal to the item's given label removes
    its correction instead. Returns what was done, one line. Refuses a held-out split (before reading any
    label), an unknown id, a bad label, an empty or over-long reason and a corrections file that is
    broken or not as recorded."""
    refuse_heldout_split(ws, split)
    given = load_labels(split)
    if tid not in given:
        raise UserError(
            f"{tid!r} is not an item of split {split.name!r}; see `judgeloop devset list` and the "
            "label suspects in `judgeloop report`"
        )
    if label not in CORRECTED_LABELS:
        raise UserError(f"--label {label!r} is not success or failure")
    if not reason.strip():
        raise UserError("--reason is empty; say why the label is wrong (it is kept with the correction)")
    positive = label == "success"
    fix = Correction(
        id=tid,
        label="success" if positive else "failure",
        reason=reason.strip(),
        at=datetime.now(UTC).isoformat(timespec="seconds"),
        by=by or None,
    )
    line = _correction_line(fix)  # before the lock: an over-long reason changes nothing
    path = corrections_path(split)
    with exclusive_lock(_lock_path(split)):
        _data, existing = _locked_read(split, given)
        if positive == given[tid].is_positive:
            if tid not in existing:
                raise UserError(
                    f"{tid} is already labelled {label} in split {split.name!r}; nothing to correct"
                )
            del existing[tid]
            done = f"removed the correction of {tid}: its label is back to the given {label}"
        else:
            existing[tid] = fix
            done = f"corrected {tid} to {label} in {path.name} of split {split.name!r}"
        text = b"".join(
            line if c is fix else _correction_line(c, f"the correction of {c.id}") for c in existing.values()
        )
        _write(split, given, text, done, by)
    return done


def adopt_corrections(ws: Workspace, split: Split, by: str | None = None) -> str:
    """Accept the split's ``corrections.jsonl`` as it is now — a person's hand edit, or a file from before
    writes were recorded — after checking every line: record it as `label-fix` would. Returns one line
    saying what changed against the last record (ids added, removed, changed)."""
    refuse_heldout_split(ws, split)
    given = load_labels(split)
    with exclusive_lock(_lock_path(split)):
        data = _read_file(split)
        found = parse_corrections(split, data or b"", given)
        recorded = recorded_file(_workspace_root(split), record_ref(split.name), CORRECTIONS_FILE)
        if data == recorded:
            return f"{_display(split)} is already as recorded ({len(found)} correction(s)); nothing to adopt"
        try:
            before = parse_corrections(split, recorded or b"", given)
        except UserError:  # recorded for labels or a manifest since changed: every correction counts as new
            before = {}
        added = [t for t in found if t not in before]
        removed = [t for t in before if t not in found]
        changed = [t for t in found if t in before and found[t] != before[t]]
        done = (
            f"adopted {_display(split)}: {len(found)} correction(s); {len(added)} added, {len(removed)} removed, "
            f"{len(changed)} changed since the last record"
        )
        listed = "; ".join(
            f"{what} {', '.join(ids)}"
            for what, ids in (("added", added), ("removed", removed), ("changed", changed))
            if ids
        )
        _write(split, given, data or b"", done + (f" ({listed})" if listed else ""), by)
    return done + (f" ({listed})" if listed else "")
