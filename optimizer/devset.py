"""AgentHorizon data: reading release folders, importing splits, verifying and reading them.

A source folder (``SRC``) is in one of the two release layouts of ``shared/agenthorizon-format.md``:

- the public release: label files at the top, ``sandbox/data/{markdowns,jsons,media/images}``;
- the authors' tooling: ``agenthorizon_md/``, ``agenthorizon_json/`` and ``data/media/images/`` side
  by side (the folder holding ``data/`` is the sandbox root).

Label files are the ``*.jsonl`` files at the top of SRC whose rows are labels (``AgentHorizon.jsonl``,
``AgentHorizon-Simple.jsonl``, ``labels.jsonl``); a top-level ``*.jsonl`` whose rows are whole
trajectories (the authors' full form) is also read, for items that have no per-item JSON file.

An imported split (``devset/NAME/``) always holds the blind projection: JSON with only
``trajectory_id``, ``task``, ``environment`` and ``steps``, Markdown next to it (rendered from the JSON
when the source has none) and the screenshots it links; its labels sit apart in ``labels.jsonl``.

A `Split` never reads labels. `load_labels` is the only reader of a split's labels; the code that
builds judge input (render, judge, providers) must never import it.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import re
import shutil
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath
from typing import Any, NamedTuple

from pydantic import ValidationError

from optimizer.errors import UserError
from optimizer.markdown import action_string, format_timestamp_ms, render_markdown
from optimizer.models import MISTAKE_TYPES, Label, Step, Trajectory
from optimizer.workspace import Workspace

LABEL_FILE_NAMES = ("AgentHorizon.jsonl", "AgentHorizon-Simple.jsonl", "labels.jsonl")
PROJECTION_KEYS = ("trajectory_id", "task", "environment", "steps")
UNTYPED = "untyped"
MAX_WARNINGS_SHOWN = 20  # an import of a damaged release must not flood the terminal

# The paper's AH-D: a reconstruction that does not give exactly these counts is not AH-D.
AHD_COMPONENTS = 50
AHD_SEED = 42
AHD_COUNTS: dict[str, Any] = {
    "items": 162,
    "positives": 62,
    "negatives": 100,
    "mistake_types": {
        "Critical Mistake": 32,
        "Bad Side Effect": 26,
        "Misunderstanding of the Instruction": 41,
        UNTYPED: 1,
    },
}

_SPLIT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
_MD_IMAGE = re.compile(r"!\[[^\]]*\]\(([^)\s]+)\)")

Warn = Callable[[str], None]


def _warn_stderr(message: str) -> None:
    print(f"judgeloop: warning: {message}", file=sys.stderr)


# --------------------------------------------------------------------------------------------
# Labels


class LabelRow(NamedTuple):
    """One valid line of a label file: where it was, the parsed label, the line as written."""

    path: Path
    line: int
    label: Label
    raw: str


def _first_error(exc: ValidationError) -> str:
    errors = exc.errors()
    first = errors[0]
    loc = ".".join(str(part) for part in first["loc"]) or "row"
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return f"{loc}: {first['msg']}{more}"


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
            problems.append(f"{shown}:{lineno}: {_first_error(exc)}")
            continue
        rows.append(LabelRow(path, lineno, label, raw))
    return rows, problems


def fingerprint(labels: Iterable[Label]) -> str:
    """sha256 (hex) over ``"<id>\\t<label>\\t<mistake_type or ''>\\n"`` lines sorted by id."""
    lines = sorted(f"{lab.trajectory_id}\t{lab.label}\t{lab.mistake_type or ''}\n" for lab in labels)
    return hashlib.sha256("".join(lines).encode("utf-8")).hexdigest()


def count_labels(labels: Iterable[Label]) -> dict[str, Any]:
    """``{"items", "positives", "negatives", "mistake_types": {<type>: n, ..., "untyped": n}}``."""
    counts: dict[str, Any] = {"items": 0, "positives": 0, "negatives": 0}
    types = dict.fromkeys((*MISTAKE_TYPES, UNTYPED), 0)
    for lab in labels:
        counts["items"] += 1
        if lab.is_positive:
            counts["positives"] += 1
        else:
            counts["negatives"] += 1
            types[lab.mistake_type or UNTYPED] += 1
    counts["mistake_types"] = types
    return counts


def describe_counts(counts: dict[str, Any]) -> str:
    """``items=N positives=P negatives=M (Critical Mistake 32, ..., untyped 1)``."""
    types = ", ".join(f"{name} {n}" for name, n in counts["mistake_types"].items())
    return (
        f"items={counts['items']} positives={counts['positives']} negatives={counts['negatives']} ({types})"
    )


# --------------------------------------------------------------------------------------------
# Manifests


def read_manifest(path: Path) -> list[str]:
    """Trajectory ids, one per line, in file order; ``#`` starts a comment; blank lines are skipped."""
    if not path.is_file():
        raise UserError(f"manifest {path} does not exist; pass a file with one trajectory id per line")
    ids: list[str] = []
    first_line: dict[str, int] = {}
    for lineno, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), start=1):
        tid = line.split("#", 1)[0].strip()
        if not tid:
            continue
        if any(ch.isspace() for ch in tid):
            raise UserError(
                f"{path}:{lineno}: more than one word on the line; write one trajectory id per line"
            )
        if tid in first_line:
            raise UserError(
                f"{path}:{lineno}: id {tid} is listed twice (first at line {first_line[tid]}); remove one of the lines"
            )
        first_line[tid] = lineno
        ids.append(tid)
    if not ids:
        raise UserError(f"manifest {path} lists no trajectory ids; write one id per line")
    return ids


# --------------------------------------------------------------------------------------------
# Screenshot links


def _is_remote(link: str) -> bool:
    return "://" in link or link.startswith("data:")


def _local_relpath(link: str) -> PurePosixPath | None:
    """The link as a clean path relative to the sandbox root, or None (URL, absolute, escaping)."""
    if _is_remote(link):
        return None
    path = PurePosixPath(link.replace("\\", "/"))
    if path.is_absolute():
        return None
    parts = [part for part in path.parts if part != "."]
    if not parts or ".." in parts or parts[0].endswith(":"):
        return None
    return PurePosixPath(*parts)


def canonical_screenshot_link(recording_id: str, step_id: int) -> str:
    """The blind projection's link: ``./data/media/images/<recording_id>/step_<step_id+1>.png``."""
    return f"./data/media/images/{recording_id}/step_{step_id + 1}.png"


def _resolve_link(sandbox_root: Path, link: str) -> Path | None:
    if _is_remote(link):
        return None
    path = Path(link)
    if path.is_absolute():
        return path
    return Path(os.path.normpath(sandbox_root / link))


# --------------------------------------------------------------------------------------------
# Splits


class Split:
    """An imported split: manifest order, judge input files and screenshots. Never reads labels."""

    def __init__(self, name: str, root: Path, ids: list[str], fingerprint: str) -> None:
        self.name = name
        self.root = root
        self.ids = ids
        self.fingerprint = fingerprint
        self._members = frozenset(ids)

    def __repr__(self) -> str:
        return f"Split(name={self.name!r}, items={len(self.ids)}, fingerprint={self.fingerprint[:12]!r})"

    @property
    def sandbox_root(self) -> Path:
        """The folder holding ``data/``; screenshot links are relative to it."""
        return self.root / "sandbox"

    def markdown_path(self, tid: str) -> Path:
        return self.sandbox_root / "data" / "markdowns" / f"{tid}.md"

    def json_path(self, tid: str) -> Path:
        return self.sandbox_root / "data" / "jsons" / f"{tid}.json"

    def _member(self, tid: str) -> None:
        if tid not in self._members:
            raise UserError(
                f"{tid} is not an item of split {self.name!r}; see its manifest {self.root / 'manifest.txt'}"
            )

    def trajectory(self, tid: str) -> Trajectory:
        """The item's trajectory, validated (UserError naming the file when missing or invalid)."""
        self._member(tid)
        path = self.json_path(tid)
        if not path.is_file():
            raise UserError(
                f"{path} is missing; run `judgeloop devset verify {self.name}` and re-import the split"
            )
        try:
            return Trajectory.model_validate_json(path.read_bytes())
        except ValidationError as exc:
            raise UserError(f"{path}: {_first_error(exc)}; re-import the split from its source") from None

    def markdown_text(self, tid: str) -> str:
        """The item's Markdown as stored (the release text, or rendered from JSON at import)."""
        self._member(tid)
        path = self.markdown_path(tid)
        if not path.is_file():
            raise UserError(
                f"{path} is missing; run `judgeloop devset verify {self.name}` and re-import the split"
            )
        return path.read_text(encoding="utf-8")

    def screenshot_file(self, step: Step) -> Path | None:
        """The step's screenshot resolved against the sandbox root; None when null or a URL."""
        if step.screenshot is None:
            return None
        return _resolve_link(self.sandbox_root, step.screenshot)


def list_splits(ws: Workspace) -> list[str]:
    """Names of the workspace's splits (folders of ``devset/`` holding ``split.json``), sorted."""
    if not ws.devset_dir.is_dir():
        return []
    return sorted(
        p.name
        for p in ws.devset_dir.iterdir()
        if p.is_dir() and not p.name.startswith(".") and (p / "split.json").is_file()
    )


def _split_meta(root: Path) -> dict[str, Any]:
    path = root / "split.json"
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise UserError(f"{path} is unreadable ({exc}); re-import the split") from None
    if not isinstance(meta, dict) or not isinstance(meta.get("fingerprint"), str):
        raise UserError(f"{path} has no fingerprint; re-import the split")
    return meta


def open_split(ws: Workspace, name: str) -> Split:
    """Open ``devset/NAME``; an unknown name is refused with the list of known splits."""
    root = ws.split_dir(name)
    if not _SPLIT_NAME.match(name) or not (root / "split.json").is_file():
        known = ", ".join(list_splits(ws)) or "none"
        raise UserError(
            f"no split named {name!r} in {ws.devset_dir} (known: {known}); "
            f"import one with `judgeloop devset import SRC --name {name} --manifest FILE`"
        )
    meta = _split_meta(root)
    ids = read_manifest(root / "manifest.txt")
    return Split(name=name, root=root, ids=ids, fingerprint=meta["fingerprint"])


def load_labels(split: Split) -> dict[str, Label]:
    """The split's labels keyed by id, in manifest order — the only reader of a split's labels.

    Scoring needs every label, so any broken line, duplicate or unlabelled item is a UserError
    (run `judgeloop devset verify NAME` to see them all).
    """
    path = split.root / "labels.jsonl"
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


# --------------------------------------------------------------------------------------------
# Reading a source folder


@dataclass
class _Source:
    root: Path
    sandbox_root: Path
    markdown_dir: Path
    json_dir: Path
    label_files: list[Path]
    trajectory_files: list[Path]
    warnings: list[str] = field(default_factory=list)
    missing: set[Path] = field(default_factory=set)
    _rows: dict[str, tuple[str, dict[str, Any]]] | None = None

    def trajectory_rows(self) -> dict[str, tuple[str, dict[str, Any]]]:
        """Full-form trajectories from top-level JSONL files, by id (read once, lazily)."""
        if self._rows is None:
            self._rows = {}
            for path in self.trajectory_files:
                for lineno, line in enumerate(
                    path.read_text(encoding="utf-8", errors="replace").splitlines(), 1
                ):
                    if not line.strip():
                        continue
                    try:
                        obj = json.loads(line)
                    except json.JSONDecodeError as exc:
                        self.warnings.append(f"{path}:{lineno}: not valid JSON ({exc.msg})")
                        continue
                    tid = obj.get("trajectory_id") if isinstance(obj, dict) else None
                    if not isinstance(tid, str):
                        self.warnings.append(f"{path}:{lineno}: no trajectory_id")
                        continue
                    self._rows.setdefault(tid, (f"{path}:{lineno}", obj))
        return self._rows


def _peek_jsonl(path: Path) -> dict[str, Any] | None:
    with path.open(encoding="utf-8", errors="replace") as fh:
        for line in fh:
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError:
                continue
            return obj if isinstance(obj, dict) else None
    return None


def _open_source(src: Path) -> _Source:
    root = src.expanduser().resolve()
    if not root.is_dir():
        raise UserError(f"{src} is not a folder; pass the folder you downloaded AgentHorizon into")
    if (root / "sandbox" / "data").is_dir():
        sandbox = root / "sandbox"
        md_dir, json_dir = sandbox / "data" / "markdowns", sandbox / "data" / "jsons"
    elif any((root / d).is_dir() for d in ("agenthorizon_json", "agenthorizon_md", "data")):
        sandbox = root
        md_dir, json_dir = root / "agenthorizon_md", root / "agenthorizon_json"
    else:
        raise UserError(
            f"{root} is in neither AgentHorizon layout (expected sandbox/data/ or agenthorizon_md/, "
            "agenthorizon_json/ and data/media/images/); point SRC at the downloaded release folder"
        )
    label_files: list[Path] = []
    trajectory_files: list[Path] = []
    for path in sorted(root.glob("*.jsonl")):
        head = _peek_jsonl(path)
        if path.name in LABEL_FILE_NAMES or (
            head is not None and "label" in head and "trajectory_id" in head
        ):
            label_files.append(path)
        elif head is not None and "steps" in head and "task" in head:
            trajectory_files.append(path)
    if not label_files:
        raise UserError(
            f"{root} has no labels (no AgentHorizon.jsonl, AgentHorizon-Simple.jsonl or labels.jsonl at its top); "
            "add the label file next to the data"
        )
    return _Source(root, sandbox, md_dir, json_dir, label_files, trajectory_files)


def _read_source_labels(source: _Source) -> dict[str, LabelRow]:
    rows_by_id: dict[str, LabelRow] = {}
    for path in source.label_files:
        rows, problems = read_label_file(path)
        source.warnings.extend(f"{p} (line skipped)" for p in problems)
        for row in rows:
            tid = row.label.trajectory_id
            if tid in rows_by_id:
                first = rows_by_id[tid]
                raise UserError(
                    f"label id {tid} appears twice ({first.path.name}:{first.line} and {path.name}:{row.line}); "
                    "remove one of the lines"
                )
            rows_by_id[tid] = row
    if not rows_by_id:
        names = ", ".join(p.name for p in source.label_files)
        raise UserError(f"no valid label line in {names} in {source.root}; fix the label file")
    return rows_by_id


class _ItemError(Exception):
    """One requested item cannot be imported (collected, then reported as one UserError)."""


def _source_trajectory(source: _Source, tid: str) -> tuple[str, dict[str, Any], bytes | None]:
    """(where, raw object, file bytes or None) for one item: per-item JSON first, then JSONL rows."""
    path = source.json_dir / f"{tid}.json"
    if path.is_file():
        data = path.read_bytes()
        try:
            obj = json.loads(data)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise _ItemError(f"{path}: not valid JSON ({exc})") from None
        if not isinstance(obj, dict):
            raise _ItemError(f"{path}: not a JSON object")
        return str(path), obj, data
    rows = source.trajectory_rows()
    if tid in rows:
        where, obj = rows[tid]
        return where, obj, None
    raise _ItemError(f"{tid} has no trajectory JSON in {source.root} (looked for {path})")


@dataclass
class _Planned:
    """What importing one item will write."""

    tid: str
    json_bytes: bytes
    markdown: str | bytes
    screenshots: dict[str, Path]  # clean relative link -> source file


def _plan_item(source: _Source, row: LabelRow, warnings: list[str]) -> _Planned:
    tid = row.label.trajectory_id
    where, raw, data = _source_trajectory(source, tid)
    try:
        traj = Trajectory.model_validate(raw)
    except ValidationError as exc:
        raise _ItemError(f"{where}: {_first_error(exc)}") from None
    if traj.trajectory_id != tid:
        raise _ItemError(f"{where}: holds trajectory_id {traj.trajectory_id}, not {tid}")

    projected = {
        k: raw[k] for k in PROJECTION_KEYS if k in raw and not (k == "environment" and raw[k] is None)
    }
    projected["steps"] = [dict(s) for s in raw["steps"]]
    changed = set(raw) != set(projected)
    relinked = False
    screenshots: dict[str, Path] = {}
    for step_raw, step in zip(projected["steps"], traj.steps, strict=True):
        link = step.screenshot
        if link is None:
            continue
        rel = _local_relpath(link)
        if rel is None:
            # Full-form files may link absolute paths or URLs; the release links the canonical file.
            canonical = canonical_screenshot_link(row.label.original_id, step.step_id)
            if (source.sandbox_root / canonical).is_file():
                step_raw["screenshot"] = canonical
                rel = _local_relpath(canonical)
                changed = relinked = True
            elif not _is_remote(link) and Path(link).is_file():
                step_raw["screenshot"] = canonical
                screenshots[str(_local_relpath(canonical))] = Path(link)
                changed = relinked = True
                continue
            else:
                warnings.append(f"{where}: step {step.step_id} links {link}, which is not in {source.root}")
                continue
        assert rel is not None
        src_file = source.sandbox_root / rel
        if not src_file.is_file():
            if src_file not in source.missing:  # warn once per file, not once per item sharing it
                source.missing.add(src_file)
                warnings.append(f"{src_file}: missing (screenshot of step {step.step_id} of {tid})")
            continue
        screenshots[str(rel)] = src_file

    if changed:
        json_bytes = (json.dumps(projected, ensure_ascii=False, indent=2) + "\n").encode("utf-8")
    else:
        json_bytes = (
            data if data is not None else (json.dumps(raw, ensure_ascii=False, indent=2) + "\n").encode()
        )
    md_path = source.markdown_dir / f"{tid}.md"
    markdown: str | bytes
    if md_path.is_file() and not relinked:
        markdown = md_path.read_bytes()
    else:
        markdown = render_markdown(Trajectory.model_validate(projected))
    return _Planned(tid, json_bytes, markdown, screenshots)


# --------------------------------------------------------------------------------------------
# AH-D reconstruction


def select_ahd(labels: Iterable[Label]) -> list[str]:
    """The pair-aware AH-D selection of the format doc, without checking the counts.

    Link each negative's ``original_id`` and ``paired_id`` into components of recordings; keep the
    components holding exactly two recordings and two negatives; sort them by their sorted
    recording ids joined with ``::``; shuffle with ``random.Random(42)``; take the first 50; return
    the ids of their items (component by component, each in release order).
    """
    items = list(labels)
    parent: dict[str, str] = {}

    def find(x: str) -> str:
        parent.setdefault(x, x)
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for lab in items:
        find(lab.original_id)
        if lab.label == "negative" and lab.paired_id:
            a, b = find(lab.original_id), find(lab.paired_id)
            if a != b:
                parent[a] = b
    recordings: dict[str, set[str]] = {}
    for node in list(parent):
        recordings.setdefault(find(node), set()).add(node)
    negatives: dict[str, int] = {}
    for lab in items:
        if lab.label == "negative":
            root = find(lab.original_id)
            negatives[root] = negatives.get(root, 0) + 1
    kept = [
        (root, "::".join(sorted(recs)))
        for root, recs in recordings.items()
        if len(recs) == 2 and negatives.get(root, 0) == 2
    ]
    kept.sort(key=lambda pair: pair[1])
    random.Random(AHD_SEED).shuffle(kept)
    chosen = [root for root, _ in kept[:AHD_COMPONENTS]]
    members: dict[str, list[str]] = {root: [] for root in chosen}
    for lab in items:
        root = find(lab.original_id)
        if root in members:
            members[root].append(lab.trajectory_id)
    return [tid for root in chosen for tid in members[root]]


def rebuild_ahd(labels: Iterable[Label]) -> list[str]:
    """The reconstructed AH-D ids; UserError with the counts got unless they are 62/100, 32/26/41/1."""
    items = list(labels)
    ids = select_ahd(items)
    by_id = {lab.trajectory_id: lab for lab in items}
    counts = count_labels(by_id[tid] for tid in ids)
    if counts != AHD_COUNTS:
        raise UserError(
            f"the AH-D reconstruction gave {describe_counts(counts)}, not 62 positives/100 negatives with types "
            "32/26/41/1 untyped; import from the complete AgentHorizon release (both label files) or use --manifest"
        )
    return ids


# --------------------------------------------------------------------------------------------
# Import


def import_split(
    ws: Workspace,
    src: Path,
    name: str,
    *,
    manifest: Path | None = None,
    all_items: bool = False,
    rebuild_ahd: bool = False,
    link: bool = False,
    warn: Warn | None = None,
) -> Split:
    """Copy (or, with ``link``, symlink screenshots of) the chosen items of SRC into ``devset/NAME``.

    Exactly one of ``manifest``, ``all_items`` and ``rebuild_ahd`` chooses the items. Refused with a
    UserError: a bad or taken name, a source in neither layout, no labels, a duplicate label id, a
    manifest naming an id with no label, an item whose trajectory is missing or invalid. Problems that
    do not stop the import (a broken label line, a missing source screenshot) go to ``warn``.
    Nothing is left behind on refusal: the split is written to a temporary folder, then renamed.
    """
    warn = warn or _warn_stderr
    if sum((manifest is not None, all_items, rebuild_ahd)) != 1:
        raise UserError("choose the items with exactly one of --manifest FILE, --all or --rebuild-ahd")
    if not _SPLIT_NAME.match(name):
        raise UserError(
            f"{name!r} is not a valid split name; use letters, digits, '.', '_' or '-' (at most 64)"
        )
    dest = ws.split_dir(name)
    if dest.exists():
        raise UserError(
            f"a split named {name!r} already exists at {dest}; pick another --name or delete that folder"
        )

    source = _open_source(Path(src))
    label_rows = _read_source_labels(source)
    if manifest is not None:
        ids = read_manifest(manifest)
        unknown = [tid for tid in ids if tid not in label_rows]
        if unknown:
            skipped = " (some label lines were broken and skipped)" if source.warnings else ""
            raise UserError(
                f"manifest {manifest} names {len(unknown)} id(s) with no label in {source.root}{skipped}, "
                f"first {unknown[0]}; fix the manifest or the source folder"
            )
        method = "manifest"
    elif all_items:
        ids = list(label_rows)
        method = "all"
    else:
        ids = _rebuild(label_rows)
        method = "rebuild-ahd"

    warnings = source.warnings
    planned: list[_Planned] = []
    errors: list[str] = []
    for tid in ids:
        try:
            planned.append(_plan_item(source, label_rows[tid], warnings))
        except _ItemError as exc:
            errors.append(str(exc))
    if errors:
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        raise UserError(
            f"{len(errors)} of the {len(ids)} items cannot be imported: {errors[0]}{more}; "
            "fix the source folder or leave those ids out of the manifest"
        )

    labels = [label_rows[tid].label for tid in ids]
    meta = {
        "name": name,
        "fingerprint": fingerprint(labels),
        "source": str(source.root),
        "created": datetime.now(UTC).replace(microsecond=0).isoformat(),
        "counts": count_labels(labels),
        "method": method,
        "screenshots": "linked" if link else "copied",
    }
    ws.devset_dir.mkdir(parents=True, exist_ok=True)
    tmp = ws.devset_dir / f".{name}.importing-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    try:
        _write_split(tmp, ids, label_rows, planned, meta, link)
        tmp.rename(dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    for message in warnings[:MAX_WARNINGS_SHOWN]:
        warn(message)
    if len(warnings) > MAX_WARNINGS_SHOWN:
        warn(
            f"... and {len(warnings) - MAX_WARNINGS_SHOWN} more; run `judgeloop devset verify {name}` for the split's state"
        )
    return open_split(ws, name)


def _rebuild(label_rows: dict[str, LabelRow]) -> list[str]:
    return rebuild_ahd(row.label for row in label_rows.values())


def _write_split(
    root: Path,
    ids: Sequence[str],
    label_rows: dict[str, LabelRow],
    planned: Sequence[_Planned],
    meta: dict[str, Any],
    link: bool,
) -> None:
    data = root / "sandbox" / "data"
    (data / "markdowns").mkdir(parents=True)
    (data / "jsons").mkdir()
    (data / "media" / "images").mkdir(parents=True)
    (root / "manifest.txt").write_text("".join(f"{tid}\n" for tid in ids), encoding="utf-8")
    (root / "labels.jsonl").write_text("".join(f"{label_rows[tid].raw}\n" for tid in ids), encoding="utf-8")
    written: set[str] = set()
    for item in planned:
        (data / "jsons" / f"{item.tid}.json").write_bytes(item.json_bytes)
        md = item.markdown.encode("utf-8") if isinstance(item.markdown, str) else item.markdown
        (data / "markdowns" / f"{item.tid}.md").write_bytes(md)
        for rel, src_file in item.screenshots.items():
            if rel in written:  # a positive and its negative share one recording's screenshots
                continue
            written.add(rel)
            target = root / "sandbox" / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            if link:
                os.symlink(src_file.resolve(), target)
            else:
                shutil.copyfile(src_file, target)
    (root / "split.json").write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")


# --------------------------------------------------------------------------------------------
# Verify


@dataclass
class VerifyReport:
    """What `verify_split` found: counts over the manifest's labels and every problem, one line each."""

    name: str
    fingerprint: str
    counts: dict[str, Any]
    problems: list[str]

    @property
    def ok(self) -> bool:
        return not self.problems


def verify_split(split: Split) -> VerifyReport:
    """Check every manifest item has a label, Markdown, JSON and every screenshot it links.

    Problems name the file (relative to the workspace), e.g. ``devset/x/labels.jsonl:3: not valid
    JSON``; the fingerprint in ``split.json`` is also checked against the labels.
    """
    base = split.root.parent.parent

    def show(path: Path) -> str:
        try:
            return str(path.relative_to(base))
        except ValueError:
            return str(path)

    problems: list[str] = []
    labels_path = split.root / "labels.jsonl"
    by_id: dict[str, Label] = {}
    if labels_path.is_file():
        rows, label_problems = read_label_file(labels_path, display=show(labels_path))
        problems.extend(label_problems)
        first_line: dict[str, int] = {}
        for row in rows:
            tid = row.label.trajectory_id
            if tid in first_line:
                problems.append(
                    f"{show(labels_path)}:{row.line}: id {tid} is already labelled at line {first_line[tid]}"
                )
                continue
            first_line[tid] = row.line
            by_id[tid] = row.label
    else:
        problems.append(f"{show(labels_path)}: missing")

    missing_files: dict[Path, list[str]] = {}
    for tid in split.ids:
        if labels_path.is_file() and tid not in by_id:
            problems.append(f"{show(labels_path)}: no label for manifest item {tid}")
        md_path = split.markdown_path(tid)
        links: list[str] = []
        if md_path.is_file():
            links.extend(_MD_IMAGE.findall(md_path.read_text(encoding="utf-8", errors="replace")))
        else:
            problems.append(f"{show(md_path)}: missing")
        json_path = split.json_path(tid)
        if not json_path.is_file():
            problems.append(f"{show(json_path)}: missing")
        else:
            try:
                traj = Trajectory.model_validate_json(json_path.read_bytes())
            except ValidationError as exc:
                problems.append(f"{show(json_path)}: {_first_error(exc)}")
            else:
                if traj.trajectory_id != tid:
                    problems.append(f"{show(json_path)}: holds trajectory_id {traj.trajectory_id}, not {tid}")
                links.extend(step.screenshot for step in traj.steps if step.screenshot is not None)
        for link in dict.fromkeys(links):
            target = _resolve_link(split.sandbox_root, link)
            if target is None:
                problems.append(
                    f"{show(json_path)}: links the remote screenshot {link}; judgeloop needs local files"
                )
            elif not target.is_file():
                missing_files.setdefault(target, []).append(tid)
    for target, tids in missing_files.items():
        others = f" and {len(tids) - 1} more" if len(tids) > 1 else ""
        problems.append(f"{show(target)}: missing screenshot (linked by {tids[0]}{others})")

    present = [by_id[tid] for tid in split.ids if tid in by_id]
    if len(present) == len(split.ids) and fingerprint(present) != split.fingerprint:
        problems.append(
            f"{show(split.root / 'split.json')}: fingerprint {split.fingerprint[:12]} does not match the labels "
            f"({fingerprint(present)[:12]}); labels.jsonl changed since import — re-import the split"
        )
    return VerifyReport(split.name, split.fingerprint, count_labels(present), problems)


# --------------------------------------------------------------------------------------------
# Command handlers


def cmd_import(args: argparse.Namespace) -> int:
    """`judgeloop devset import SRC --name NAME (--manifest FILE | --all | --rebuild-ahd) [--link]`."""
    ws = Workspace.open(args.workspace)
    split = import_split(
        ws,
        Path(args.src),
        args.name,
        manifest=Path(args.manifest) if args.manifest else None,
        all_items=bool(args.all),
        rebuild_ahd=bool(args.rebuild_ahd),
        link=bool(args.link),
    )
    meta = _split_meta(split.root)
    print(f"imported {len(split.ids)} items into {split.root.relative_to(ws.root)}")
    print(describe_counts(meta["counts"]))
    print(f"fingerprint {split.fingerprint}")
    print(
        f"next: judgeloop devset verify {split.name}  (committing devset/{split.name} is optional: "
        "splits are pinned by their fingerprint)"
    )
    return 0


def _print_report(report: VerifyReport) -> None:
    print(f"split {report.name}  fingerprint {report.fingerprint[:12]}")
    counts = report.counts
    print(f"items={counts['items']} positives={counts['positives']} negatives={counts['negatives']}")
    for type_name, n in counts["mistake_types"].items():
        print(f"  {type_name}: {n}")
    if report.ok:
        print("ok")
        return
    for problem in report.problems:
        print(f"problem: {problem}", file=sys.stderr)
    print(f"split {report.name}: {len(report.problems)} problem(s)", file=sys.stderr)


def cmd_verify(args: argparse.Namespace) -> int:
    """`judgeloop devset verify [NAME]`: exit 0 when every checked split is complete, 1 otherwise."""
    ws = Workspace.open(args.workspace)
    names = [args.name] if args.name else list_splits(ws)
    if not names:
        raise UserError(
            "this workspace has no splits; import one with `judgeloop devset import SRC --name NAME --manifest FILE`"
        )
    failed = 0
    for name in names:
        report = verify_split(open_split(ws, name))
        _print_report(report)
        failed += not report.ok
    return 1 if failed else 0


def _resolve_item(split: Split, wanted: str) -> str:
    if wanted in split.ids:
        return wanted
    matches = [tid for tid in split.ids if tid.startswith(wanted)]
    if len(matches) == 1:
        return matches[0]
    if matches:
        raise UserError(
            f"{wanted!r} matches {len(matches)} items of split {split.name!r}; give more of the id"
        )
    raise UserError(f"no item {wanted!r} in split {split.name!r}; see {split.root / 'manifest.txt'}")


def format_trajectory(split: Split, tid: str) -> str:
    """One trajectory as a person reads it: goal, then each step's action, thought and screenshot.

    Shows no label (this text is safe to put in front of a reviewer or a judge).
    """
    traj = split.trajectory(tid)
    lines = [f"trajectory {traj.trajectory_id}  (split {split.name}, {len(traj.steps)} steps)", ""]
    lines.append("Goal:")
    lines.extend(f"  {line}" for line in traj.task.instruction.strip().splitlines())
    if traj.task.applications:
        lines.append(f"Applications: {', '.join(traj.task.applications)}")
    env = traj.environment
    if env is not None and (env.os or env.screen_resolution):
        res = "x".join(str(v) for v in env.screen_resolution) if env.screen_resolution else "unknown size"
        lines.append(f"Environment: {env.os or 'unknown os'}, {res}")
    for step in traj.steps:
        lines.append("")
        when = f"  at {format_timestamp_ms(step.timestamp_us)} ms" if step.timestamp_us is not None else ""
        lines.append(f"Step {step.step_id}{when}")
        lines.append(f"  action: {action_string(step.action)}")
        if step.thought:
            lines.append(f"  thought: {step.thought.strip()}")
        if step.action_description:
            lines.append(f"  description: {step.action_description.strip()}")
        shot = split.screenshot_file(step)
        if step.screenshot is None:
            lines.append("  screenshot: none recorded")
        elif shot is None:
            lines.append(f"  screenshot: {step.screenshot} (remote)")
        else:
            lines.append(f"  screenshot: {shot}{'' if shot.is_file() else '  [missing]'}")
    return "\n".join(lines) + "\n"


def cmd_show(args: argparse.Namespace) -> int:
    """`judgeloop devset show NAME ID` (ID may be a unique prefix)."""
    ws = Workspace.open(args.workspace)
    split = open_split(ws, args.name)
    sys.stdout.write(format_trajectory(split, _resolve_item(split, args.id)))
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    """`judgeloop devset list`: each split with its counts and fingerprint."""
    ws = Workspace.open(args.workspace)
    names = list_splits(ws)
    if not names:
        print("no splits; import one with `judgeloop devset import SRC --name NAME --manifest FILE`")
        return 0
    rows = [("NAME", "ITEMS", "POS", "NEG", "FINGERPRINT", "SOURCE")]
    for name in names:
        meta = _split_meta(ws.split_dir(name))
        counts = meta.get("counts") or {}
        rows.append(
            (
                name,
                str(counts.get("items", "?")),
                str(counts.get("positives", "?")),
                str(counts.get("negatives", "?")),
                meta["fingerprint"][:12],
                str(meta.get("source", "")),
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=False)) + "  " + row[-1])
    return 0
