"""OSReward (OS-Copilot/OSReward): GUI-agent traces (desktop, mobile, web) with a human success label.

The trace format read, as the official judge reads it (checked against OS-Copilot/OSReward:
``eval_pipeline/README.md`` "Trace format", ``eval_pipeline/run_judge.py`` — ``is_binary_trace``,
``discover_json_traces``, ``trace_record``, ``resolve_screenshots``, ``build_history_text`` — and
``eval_pipeline/example/example_trace.json``):

- one JSON object per trace, found in SRC's folders recursively (``*.json``, names starting with ``.``
  skipped); a JSON without ``trace_id`` and ``task_id`` is not a trace and is passed over;
- ``trace_id`` (the item's id here: it must be a safe id, and two traces may not share it, as the
  official judge refuses duplicates), ``task_id``, ``platform`` (Desktop | Mobile | Web), ``agent``,
  ``instruction``, ``trajectory``: steps with ``step_index``, ``screenshot_path`` (relative to the
  trace's own folder; null for a frame not recorded), ``thought`` and ``action`` (e.g.
  ``click(coordinate=[150, 608])``);
- the gold label ``human_label`` (``SUCCESS`` | ``FAIL``) and the optional ``human_alignment`` and
  ``human_efficiency``: they go to labels.jsonl only, never into the trajectory the judge reads.

The release's Parquet shards (``parquet/<subset>/*.parquet``, screenshots embedded) are not read: export
them as JSON traces first.
"""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path, PurePosixPath
from typing import Any

from optimizer.devset.formats.common import (
    MAX_ACTION_CHARS,
    MAX_INSTRUCTION_CHARS,
    MAX_THOUGHT_CHARS,
    Converted,
    ConvertedItem,
    ConvertedStep,
    one_line,
    read_json_object,
    source_file,
    steps_list,
    text_field,
)
from optimizer.devset.ids import check_id, shown
from optimizer.errors import UserError

FORMAT = "osreward"
LABELS = {"SUCCESS": "positive", "FAIL": "negative"}
KEPT_FIELDS = ("task_id", "platform", "agent", "human_alignment", "human_efficiency")
MAX_TRACE_BYTES = 64 << 20  # screenshots are files beside a trace, never inside it


def _trace_files(root: Path) -> list[Path]:
    """The ``*.json`` files below ``root`` (dot-names skipped), each resolving inside it: a symlink out of
    SRC is never followed."""
    return sorted(
        p
        for p in root.rglob("*.json")
        if not p.name.startswith(".") and p.is_file() and p.resolve().is_relative_to(root)
    )


def _item(root: Path, path: Path, trace: dict[str, Any], warnings: list[str]) -> ConvertedItem:
    at = str(path)
    tid = check_id(trace.get("trace_id"), "trace_id", at, "fix the trace (the id names the item's files)")
    value = trace.get("human_label")
    if value not in LABELS:
        what = "no human_label" if value is None else f"human_label {shown(value, 40)}"
        raise UserError(
            f"{at}: trace {tid} has {what}, not SUCCESS or FAIL; label it or leave it out with --manifest"
        )
    instruction = (
        text_field(trace.get("instruction"), "instruction", at, MAX_INSTRUCTION_CHARS, required=True) or ""
    )
    base = PurePosixPath(path.parent.relative_to(root).as_posix())
    steps = []
    for index, step in enumerate(steps_list(trace.get("trajectory"), "trajectory", at)):
        here = f"{at}: step {index}"
        link = step.get("screenshot_path")
        shot = None
        if link is not None and link != "":
            shot = source_file(root, link, here, base)
            if not shot.is_file():
                warnings.append(f"{here}: screenshot {link} is missing; the step is judged without it")
                shot = None
        steps.append(
            ConvertedStep(
                action=one_line(text_field(step.get("action"), "action", here, MAX_ACTION_CHARS)),
                thought=text_field(step.get("thought"), "thought", here, MAX_THOUGHT_CHARS),
                screenshot=shot,
            )
        )
    label: dict[str, Any] = {
        "trajectory_id": tid,
        "label": LABELS[value],
        "original_id": "",
        "source_format": FORMAT,
    }
    label.update({k: trace[k] for k in KEPT_FIELDS if isinstance(trace.get(k), str | int | float)})
    return ConvertedItem(tid, instruction.strip(), steps, label, at)


def convert(src: Path, wanted: Collection[str] | None = None) -> Converted:
    """The traces of an OSReward folder (only those whose ``trace_id`` is in ``wanted``, when given).
    UserError, one line, for no trace at all, a trace that is not valid JSON or over its size bound, an
    unsafe or repeated ``trace_id``, a missing or unknown ``human_label``, a screenshot path leading
    outside SRC, a field over its bound."""
    root = src.expanduser().resolve()
    if not root.is_dir():
        raise UserError(f"{src} is not a folder; pass the folder holding the OSReward trace JSON files")
    converted = Converted(FORMAT, root, [])
    first: dict[str, Path] = {}
    for path in _trace_files(root):
        trace = read_json_object(path, MAX_TRACE_BYTES, "trace")
        if not trace.get("trace_id") or not trace.get("task_id"):
            continue  # not a trace (the official judge passes such files over too)
        raw_id = trace["trace_id"]
        key = raw_id if isinstance(raw_id, str) else repr(raw_id)
        if key in first:
            raise UserError(
                f"{path}: trace_id {shown(raw_id, 80)} again (first in {first[key]}); "
                "two traces may not share an id — remove one"
            )
        first[key] = path
        if wanted is not None and key not in wanted:
            continue
        converted.items.append(_item(root, path, trace, converted.warnings))
    if not first:
        parquet = next(iter(root.rglob("*.parquet")), None)
        hint = (
            f" (found Parquet shards such as {parquet}: export them as JSON traces first)" if parquet else ""
        )
        raise UserError(f"{root} holds no OSReward trace (a JSON with trace_id and task_id){hint}")
    return converted
