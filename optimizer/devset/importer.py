"""Importing AgentHorizon items from a release folder into ``devset/NAME/`` (and rebuilding AH-D).

A source folder (``SRC``) is in one of the two release layouts of ``shared/agenthorizon-format.md``:

- the public release: label files at the top, ``sandbox/data/{markdowns,jsons,media/images}``;
- the authors' tooling: ``agenthorizon_md/``, ``agenthorizon_json/`` and ``data/media/images/`` side
  by side (the folder holding ``data/`` is the sandbox root).

Label files are the ``*.jsonl`` files at the top of SRC whose rows are labels (``AgentHorizon.jsonl``,
``AgentHorizon-Simple.jsonl``, ``labels.jsonl``); a top-level ``*.jsonl`` whose rows are whole
trajectories (the authors' full form) is also read, for items that have no per-item JSON file.

An imported split always holds the blind projection, written as the official renderer
(``scripts/render_trajectories.py`` in ServiceNow/agenthorizon, run with the labels) writes it:
JSON with only ``trajectory_id``, ``task``, ``environment`` and ``steps``, every screenshot linked
as ``./data/media/images/<original_id>/step_<step_id+1>.png`` (see `release_json`); a source file
that already is that projection is copied byte for byte. The Markdown is always the rendering of
the JSON written (``optimizer.devset.markdown``), so ``devset verify`` can check it; a source
Markdown that differs from it is reported as a warning. The screenshots it links are copied
(or linked); the labels sit apart in ``labels.jsonl``.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from optimizer.devset.heldout import check_apart
from optimizer.devset.ids import OutsideError, check_id, inside, is_remote, relative_link
from optimizer.devset.labels import (
    LABEL_FILE_NAMES,
    UNTYPED,
    LabelCounts,
    LabelRow,
    count_labels,
    describe_counts,
    fingerprint,
    read_label_file,
)
from optimizer.devset.markdown import first_differing_line, render_markdown
from optimizer.devset.split import (
    SPLIT_NAME,
    Split,
    canonical_screenshot_link,
    open_split,
    read_manifest,
)
from optimizer.errors import UserError, first_error
from optimizer.models import Label, Trajectory
from optimizer.workspace.paths import LABELS_FILE
from optimizer.workspace.workspace import Workspace

MAX_WARNINGS_SHOWN = 20  # an import of a damaged release must not flood the terminal


# The paper's AH-D: a reconstruction that does not give exactly these counts is not AH-D.
AHD_COMPONENTS = 50


AHD_SEED = 42


Warn = Callable[[str], None]


def _drop(message: str) -> None:
    """The default `Warn`: callers that want the warnings pass their own (the CLI prints them)."""


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
                    if tid in self._rows:
                        self.warnings.append(
                            f"{path}:{lineno}: trajectory_id {tid} again (first at {self._rows[tid][0]}); "
                            "the later line is used, as the official renderer does"
                        )
                    self._rows[tid] = (f"{path}:{lineno}", obj)
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
    markdown: str
    screenshots: dict[str, Path]  # clean relative link -> source file


def release_json(raw: dict[str, Any], local_image_id: str | None) -> dict[str, Any]:
    """The blind projection the official renderer writes for a trajectory, as a dict in key order.

    ``trajectory_id``, ``task``, ``environment`` and ``steps`` in that order, keys whose value is
    missing or null left out, each step kept whole. Given a recording id (the label's
    ``original_id``), every step's ``screenshot`` — null ones too — becomes
    ``./data/media/images/<id>/step_<step_id+1>.png`` (an added key goes last in the step).
    ``raw`` must already be a valid trajectory (integer step ids).
    """
    steps = raw.get("steps", [])
    if local_image_id is not None:
        # Null screenshots too: arguably a bug (a link to a file never recorded), matched on purpose.
        steps = [
            {**step, "screenshot": canonical_screenshot_link(local_image_id, step["step_id"])}
            for step in steps
        ]
    payload = {
        "trajectory_id": raw.get("trajectory_id"),
        "task": raw.get("task", {}),
        "environment": raw.get("environment"),
        "steps": steps,
    }
    return {key: value for key, value in payload.items() if value is not None}


def release_json_bytes(payload: dict[str, Any]) -> bytes:
    """The file the official renderer writes: ``json.dumps(payload, indent=2)`` (ASCII-escaped) + newline."""
    return (json.dumps(payload, indent=2) + "\n").encode("ascii")


def _same_json(a: Any, b: Any) -> bool:
    """Equal as JSON, key order included (formatting aside)."""
    return json.dumps(a) == json.dumps(b)


def _plan_item(source: _Source, row: LabelRow, warnings: list[str]) -> _Planned:
    tid = row.label.trajectory_id
    where, raw, data = _source_trajectory(source, tid)
    plain = release_json(raw, None)
    try:
        traj = Trajectory.model_validate(plain)  # only what is written is checked: no version, milestones
    except ValidationError as exc:
        raise _ItemError(f"{where}: {first_error(exc).line()}") from None
    if traj.trajectory_id != tid:
        raise _ItemError(f"{where}: holds trajectory_id {traj.trajectory_id}, not {tid}")

    # Arguably a bug, matched on purpose (byte-identical): with no original_id, links stay as stored.
    recording = row.label.original_id or None
    payload = release_json(raw, recording)
    # The release's own file is kept as it is when it says the same.
    json_bytes = data if data is not None and _same_json(payload, raw) else release_json_bytes(payload)

    screenshots: dict[str, Path] = {}
    for step, stored in zip(payload["steps"], traj.steps, strict=True):
        link = step.get("screenshot")
        if not isinstance(link, str) or not link:
            continue
        if is_remote(link):
            warnings.append(f"{where}: step {stored.step_id} links {link}, which is not in {source.root}")
            continue
        try:
            rel = relative_link(link)  # the link is kept in the split: it must stay inside it
            src_file = inside(source.sandbox_root, rel)
        except OutsideError as exc:
            raise _ItemError(f"{where}: step {stored.step_id}: the screenshot {exc}") from None
        shown_file = source.sandbox_root / rel
        if not src_file.is_file() and stored.screenshot and link != stored.screenshot:
            # Relinked: the file may still be where the full form pointed (an absolute path, say).
            old = _stored_file(source, stored.screenshot)
            if old is None and not is_remote(stored.screenshot):
                warnings.append(
                    f"{where}: step {stored.step_id} stores the screenshot {stored.screenshot}, outside "
                    f"{source.sandbox_root}; not read"
                )
            if old is not None and old.is_file():
                src_file = old
        if not src_file.is_file():
            if shown_file not in source.missing:  # warn once per file, not once per item sharing it
                source.missing.add(shown_file)
                warnings.append(f"{shown_file}: missing (screenshot of step {stored.step_id} of {tid})")
            continue
        screenshots[str(rel)] = src_file

    markdown = render_markdown(Trajectory.model_validate(payload))
    md_path = source.markdown_dir / f"{tid}.md"
    if md_path.is_file():
        line = first_differing_line(md_path.read_bytes().decode("utf-8", errors="replace"), markdown)
        if line is not None:
            warnings.append(
                f"{md_path}: differs from the rendering of its JSON at line {line}; the rendering was imported"
            )
    return _Planned(tid, json_bytes, markdown, screenshots)


def _stored_file(source: _Source, link: str) -> Path | None:
    """Where a full form's own link points, resolved, when that lies inside the release's sandbox."""
    if is_remote(link):
        return None
    path = Path(link)
    try:
        rel = (
            path.resolve().relative_to(source.sandbox_root.resolve()).as_posix()
            if path.is_absolute()
            else link
        )
        return inside(source.sandbox_root, rel)
    except (OutsideError, ValueError):
        return None


def _check_row_ids(row: LabelRow) -> None:
    """The ids of an item to import: each names files or folders of the split, so each must be safe."""
    where = f"{row.path}:{row.line}"
    fix = "fix the label file (ids name the split's files and folders)"
    check_id(row.label.trajectory_id, "trajectory_id", where, fix)
    for field_name, value in (("original_id", row.label.original_id), ("paired_id", row.label.paired_id)):
        if value:  # an empty recording id is allowed: the stored links are then kept as they are
            check_id(value, field_name, where, fix)


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
    warn = warn or _drop
    if sum((manifest is not None, all_items, rebuild_ahd)) != 1:
        raise UserError("choose the items with exactly one of --manifest FILE, --all or --rebuild-ahd")
    if not SPLIT_NAME.match(name):
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

    for tid in ids:
        _check_row_ids(label_rows[tid])
    side = ws.config.workspace
    if name == side.dev_split or name in side.heldout_splits:
        # Before anything is written: a dev and a held-out split share no item and no recording.
        check_apart(ws, name, {tid: label_rows[tid].label for tid in ids})

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
        "counts": count_labels(labels).as_json(),
        "method": method,
        "screenshots": "linked" if link else "copied",
        "format": "agenthorizon",  # another benchmark's import (optimizer.devset.formats) says its own
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
    (root / LABELS_FILE).write_text("".join(f"{label_rows[tid].raw}\n" for tid in ids), encoding="utf-8")
    written: set[str] = set()
    for item in planned:
        (data / "jsons" / f"{item.tid}.json").write_bytes(item.json_bytes)
        (data / "markdowns" / f"{item.tid}.md").write_bytes(item.markdown.encode("utf-8"))
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


AHD_COUNTS = LabelCounts(
    items=162,
    positives=62,
    negatives=100,
    mistake_types={
        "Critical Mistake": 32,
        "Bad Side Effect": 26,
        "Misunderstanding of the Instruction": 41,
        UNTYPED: 1,
    },
)
