"""What every benchmark format converts into, the checks they share, and the one import path.

A format module reads its benchmark's files and returns a `Converted`: items (an id, the instruction,
steps holding an action text, a thought and a screenshot file) and their labels, kept apart. Only the
fields listed here reach the trajectory a judge reads; everything else in a source file (a benchmark's
own reward, annotations, observation dumps) stays behind. `import_converted` writes the items in the
AgentHorizon release layout into a staging folder and imports it with
`optimizer.devset.importer.import_split`: the same id rule, path rule (`optimizer.devset.ids.inside`),
verification, held-out check and atomic write as an AgentHorizon import.

A converted item is its own recording: its label's ``original_id`` is empty, so the screenshot links
written here (``./data/media/images/<id>/step_<k+1>.png``, whatever the image's own format) are kept as
they are, and a step without a screenshot keeps none.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from optimizer.devset.ids import MAX_ID_LENGTH, OutsideError, inside, is_safe_id, relative_link, shown
from optimizer.devset.importer import MAX_WARNINGS_SHOWN, import_split, release_json_bytes
from optimizer.devset.split import SPLIT_NAME, Split, canonical_screenshot_link, open_split
from optimizer.errors import UserError
from optimizer.workspace.paths import LABELS_FILE
from optimizer.workspace.workspace import Workspace

# Bounds on what one source field may hold: a judge benchmark's instruction is a paragraph, an action
# one call, a thought a few paragraphs. A file past them is damaged or hostile; refused, never cut.
MAX_INSTRUCTION_CHARS = 20_000
MAX_ACTION_CHARS = 2_000
MAX_THOUGHT_CHARS = 50_000
MAX_STEPS = 2_000

AGENTHORIZON = "agenthorizon"

# AgentHorizon's own action types: a bare action text with one of these names would render as that type
# with its parameters missing (``left-click (?, ?)``), so it is written as a call (``click()``).
AGENTHORIZON_ACTION_TYPES = frozenset(
    {"click", "type", "press", "hotkey", "scroll", "drag", "key_down", "key_up"}
)

Warn = Callable[[str], None]


def _drop(message: str) -> None:
    """The default `Warn`: the CLI passes its own."""


@dataclass(frozen=True)
class ImportRequest:
    """How `devset import` chooses and writes items: the format, exactly one of ``manifest``,
    ``all_items`` and ``rebuild_ahd`` (the last for AgentHorizon only), ``link`` (AgentHorizon only:
    symlink screenshots) and where warnings go."""

    format: str = AGENTHORIZON
    manifest: Path | None = None
    all_items: bool = False
    rebuild_ahd: bool = False
    link: bool = False
    warn: Warn | None = None


@dataclass(frozen=True)
class ConvertedStep:
    """One step as the judge will read it: the action as the benchmark wrote it (one line), the agent's
    thought, and the screenshot taken before the action (a file inside the source folder, or None)."""

    action: str | None
    thought: str | None
    screenshot: Path | None


@dataclass(frozen=True)
class ConvertedItem:
    tid: str
    instruction: str
    steps: list[ConvertedStep]
    label: dict[str, Any]  # a labels.jsonl row: trajectory_id, label, original_id "", then the source's own
    where: str  # the source file, for messages


@dataclass
class Converted:
    format: str
    root: Path
    items: list[ConvertedItem]
    warnings: list[str] = field(default_factory=list)


def item_id(readable: str) -> str:
    """``readable`` when it is a safe id; else its safe characters cut to fit, then ``-`` and 12 hex
    digits of its sha256, so two different sources never share an id."""
    if is_safe_id(readable):
        return readable
    digest = hashlib.sha256(readable.encode("utf-8")).hexdigest()[:12]
    safe = re.sub(r"[^A-Za-z0-9._-]+", "-", readable).lstrip(".-")[: MAX_ID_LENGTH - 13]
    return f"{safe}-{digest}" if safe else f"item-{digest}"


def text_field(value: object, what: str, where: str, limit: int, *, required: bool = False) -> str | None:
    """A source's text field: None when absent (UserError when ``required``); UserError when it is not
    text or longer than ``limit`` characters."""
    if value is None:
        if required:
            raise UserError(f"{where}: no {what}; every item needs one — fix the file or leave the item out")
        return None
    if not isinstance(value, str):
        raise UserError(
            f"{where}: {what} is {shown(value, 60)}, not text; fix the file or leave the item out"
        )
    if len(value) > limit:
        raise UserError(
            f"{where}: {what} is {len(value):,} characters, over the limit of {limit:,}; "
            "the file is damaged — fix it or leave the item out"
        )
    return value


def one_line(action: str | None) -> str | None:
    """An action text on one line (runs of white space as one space), None when empty."""
    if action is None:
        return None
    flat = " ".join(action.split())
    return flat or None


def action_type(action: str | None) -> str:
    """The action text as the staged step's action type (rendered verbatim): "unknown" when absent, a
    bare AgentHorizon type name written as a call."""
    if action is None:
        return "unknown"
    return f"{action}()" if action in AGENTHORIZON_ACTION_TYPES else action


def steps_list(value: object, what: str, where: str) -> list[dict[str, Any]]:
    """A source's list of steps: UserError unless a list of objects, at most `MAX_STEPS` long."""
    if not isinstance(value, list):
        raise UserError(f"{where}: {what} is {shown(value, 60)}, not a list of steps; fix the file")
    if len(value) > MAX_STEPS:
        raise UserError(
            f"{where}: {len(value):,} steps, over the limit of {MAX_STEPS:,}; the file is damaged"
        )
    for index, step in enumerate(value):
        if not isinstance(step, dict):
            raise UserError(f"{where}: step {index} is {shown(step, 60)}, not an object; fix the file")
    return value


def read_json_object(path: Path, limit: int, what: str) -> dict[str, Any]:
    """A JSON object from ``path`` of at most ``limit`` bytes (UserError naming the file otherwise)."""
    size = path.stat().st_size
    if size > limit:
        raise UserError(
            f"{path}: {size:,} bytes, over the {limit:,} a {what} may hold; the file is damaged or not a {what}"
        )
    try:
        obj = json.loads(path.read_bytes())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise UserError(f"{path}: not valid JSON ({exc}); fix or remove the file") from None
    except RecursionError:
        raise UserError(f"{path}: nested too deeply to be a {what}; fix or remove the file") from None
    if not isinstance(obj, dict):
        raise UserError(f"{path}: not a JSON object, so not a {what}; fix or remove the file")
    return obj


def source_file(root: Path, link: object, where: str, base: PurePosixPath | None = None) -> Path:
    """The file a source's screenshot link names, resolved inside ``root`` (relative to ``base``, a folder
    of ``root``, when given). UserError when the link is not text, absolute, has a ``..`` step or leads
    outside ``root`` through a symlink: a data file never reaches a file outside the folder it came in."""
    if not isinstance(link, str) or not link:
        raise UserError(f"{where}: screenshot path {shown(link, 60)} is not a path; fix the file")
    try:
        rel = relative_link(link)
        return inside(root, base / rel if base is not None else rel)
    except OutsideError as exc:
        raise UserError(
            f"{where}: the screenshot {exc}; screenshots must lie inside {root} — fix the file"
        ) from None


def check_unique(items: Sequence[ConvertedItem]) -> None:
    seen: dict[str, str] = {}
    for item in items:
        if item.tid in seen:
            raise UserError(
                f"{item.where}: id {item.tid} again (first in {seen[item.tid]}); "
                "two items may not share an id — remove one"
            )
        seen[item.tid] = item.where


def check_request(ws: Workspace, name: str, request: ImportRequest) -> None:
    """What can be refused before a source is read: a bad or taken name, the AgentHorizon-only options."""
    if request.rebuild_ahd:
        raise UserError(
            f"--rebuild-ahd reconstructs AgentHorizon's AH-D; a --format {request.format} import takes "
            "--all or --manifest FILE"
        )
    if request.link:
        raise UserError(
            f"--link is for AgentHorizon releases only; a --format {request.format} import copies "
            "its screenshots — drop --link"
        )
    if not SPLIT_NAME.match(name):
        raise UserError(
            f"{name!r} is not a valid split name; use letters, digits, '.', '_' or '-' (at most 64)"
        )
    if ws.split_dir(name).exists():
        raise UserError(
            f"a split named {name!r} already exists at {ws.split_dir(name)}; pick another --name or delete that folder"
        )


def import_converted(ws: Workspace, converted: Converted, name: str, request: ImportRequest) -> Split:
    """Stage ``converted`` in the AgentHorizon layout and import it as ``devset/NAME`` with
    `import_split` (``--all`` or ``--manifest``); record the format and the real source in split.json."""
    warn = request.warn or _drop
    check_unique(converted.items)
    if not converted.items:
        raise UserError(f"{converted.root}: no labelled {converted.format} item to import; check SRC")
    for message in converted.warnings[:MAX_WARNINGS_SHOWN]:
        warn(message)
    if len(converted.warnings) > MAX_WARNINGS_SHOWN:
        warn(f"... and {len(converted.warnings) - MAX_WARNINGS_SHOWN} more warnings")
    ws.devset_dir.mkdir(parents=True, exist_ok=True)
    staging = ws.devset_dir / f".{name}.converting-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    try:
        _stage(staging, converted.items)
        split = import_split(
            ws,
            staging,
            name,
            manifest=request.manifest,
            all_items=request.all_items,
            warn=warn,
        )
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    meta_path = split.root / "split.json"
    meta = json.loads(meta_path.read_text(encoding="utf-8"))
    meta.update(source=str(converted.root), format=converted.format)
    tmp = meta_path.with_name(".split.json.tmp")
    tmp.write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, meta_path)
    return open_split(ws, name)


def _stage(root: Path, items: Sequence[ConvertedItem]) -> None:
    data = root / "sandbox" / "data"
    for sub in ("markdowns", "jsons", "media/images"):
        (data / sub).mkdir(parents=True)
    lines = []
    for item in items:
        steps = []
        for k, step in enumerate(item.steps):
            link = None
            if step.screenshot is not None:
                link = canonical_screenshot_link(item.tid, k)
                target = root / "sandbox" / relative_link(link)
                target.parent.mkdir(parents=True, exist_ok=True)
                try:
                    os.link(step.screenshot, target)  # the importer copies it again: no third copy
                except OSError:
                    shutil.copyfile(step.screenshot, target)
            entry: dict[str, Any] = {
                "step_id": k,
                "screenshot": link,
                "action": {"type": action_type(step.action), "parameters": {}},
            }
            if step.thought:
                entry["thought"] = step.thought
            steps.append(entry)
        payload = {"trajectory_id": item.tid, "task": {"instruction": item.instruction}, "steps": steps}
        (data / "jsons" / f"{item.tid}.json").write_bytes(release_json_bytes(payload))
        lines.append(json.dumps(item.label, ensure_ascii=False))
    (root / LABELS_FILE).write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")
