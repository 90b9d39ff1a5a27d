"""AgentRewardBench (McGill-NLP/agent-reward-bench): web-agent trajectories with expert labels.

The layout read, as the official repository's code reads it (checked against McGill-NLP/agent-reward-bench:
``apps/demo.py``, ``scripts/score_judgments.py``, ``scripts/clean_processed_trajectories.py``,
``agent_reward_bench/judge/utils.py``, ``agent_reward_bench/eval/metrics.py`` and
``agent_reward_bench/trajectories.py``):

- ``annotations.csv`` (at SRC's top or in ``data/``), one expert annotation a row, with the columns
  ``benchmark``, ``model_name``, ``task_id`` and ``trajectory_success`` (``Successful`` |
  ``Unsuccessful`` | ``Unsure``, read as ``eval/metrics.py`` reads it: any case, quotes dropped, also
  success / yes and failure / no; empty is refused, as the official scoring refuses a None label) used here; ``annotator_name``, ``trajectory_side_effect``,
  ``trajectory_optimality`` and ``trajectory_looping`` are kept in the label row. As the official
  scoring does, the first row of a (benchmark, model_name, task_id) is the primary annotation and later
  ones are secondary (left out), and an ``Unsure`` success is no label (left out, warned).
- ``cleaned/<benchmark>/<model_name>/<experiment>/<task_id>.json`` (SRC may also hold it as
  ``trajectories/cleaned/``): ``goal`` (the instruction) and ``steps``, each with ``action`` (BrowserGym
  code, e.g. ``click('a51')``, or null), ``reasoning`` (the agent's thought, or null) and
  ``screenshot_path`` (``trajectories/screenshots/<benchmark>/<agent>/<stem>/<file>``, relative to the
  folder holding ``trajectories/``: read inside SRC with or without that first component).

Nothing else of a trajectory file reaches the judge: not ``summary_info`` (it holds the benchmark's own
reward, ``cum_reward``), not the accessibility trees, chat messages or URLs.
"""

from __future__ import annotations

import csv
import io
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
    item_id,
    one_line,
    read_json_object,
    source_file,
    steps_list,
    text_field,
)
from optimizer.devset.ids import OutsideError, check_id, inside
from optimizer.errors import UserError

FORMAT = "agentrewardbench"
KEY_COLUMNS = ("benchmark", "model_name", "task_id")
LABEL_COLUMN = "trajectory_success"
KEPT_COLUMNS = ("annotator_name", "trajectory_side_effect", "trajectory_optimality", "trajectory_looping")
# As the official ``eval/metrics.py`` reads a success value (``clean_label`` then ``numerize``): lower-cased,
# quotes removed; "Unsure" (``is_unsure``) is no label.
LABELS = {
    "successful": "positive",
    "success": "positive",
    "yes": "positive",
    "unsuccessful": "negative",
    "unsuccesful": "negative",
    "failure": "negative",
    "no": "negative",
}
UNSURE = "Unsure"
MAX_ANNOTATIONS_BYTES = 64 << 20
# Cleaned files keep every step's accessibility tree: 100-400 MB files occur in the release.
MAX_TRAJECTORY_BYTES = 1 << 30


def _cleaned(value: str) -> str:
    return value.strip().lower().replace("'", "").replace('"', "")


def _layout(root: Path) -> tuple[Path, Path]:
    """(the cleaned trajectories' folder, annotations.csv) of SRC."""
    cleaned = next((d for d in (root / "cleaned", root / "trajectories" / "cleaned") if d.is_dir()), None)
    annotations = next(
        (f for f in (root / "annotations.csv", root / "data" / "annotations.csv") if f.is_file()), None
    )
    if cleaned is None or annotations is None:
        missing = "cleaned/" if cleaned is None else "annotations.csv"
        raise UserError(
            f"{root} is not in the AgentRewardBench layout (no {missing}: expected cleaned/<benchmark>/<agent>/"
            "<experiment>/<task_id>.json and annotations.csv); point SRC at the downloaded dataset folder"
        )
    return cleaned, annotations


def _annotation_rows(path: Path) -> list[tuple[int, dict[str, str]]]:
    size = path.stat().st_size
    if size > MAX_ANNOTATIONS_BYTES:
        raise UserError(
            f"{path}: {size:,} bytes, over the {MAX_ANNOTATIONS_BYTES:,} an annotation file may hold"
        )
    try:
        text = path.read_text(encoding="utf-8-sig")
        reader = csv.DictReader(io.StringIO(text, newline=""))
        header = reader.fieldnames or []
        missing = [c for c in (*KEY_COLUMNS, LABEL_COLUMN) if c not in header]
        if missing:
            raise UserError(
                f"{path}: no column {', '.join(missing)} (the header has {', '.join(header) or 'nothing'}); "
                "expected AgentRewardBench's annotations.csv"
            )
        return [(reader.line_num, row) for row in reader]
    except UnicodeDecodeError as exc:
        raise UserError(f"{path}: not UTF-8 text ({exc.reason}); expected a CSV file") from None
    except csv.Error as exc:
        raise UserError(f"{path}: not a readable CSV file ({exc}); fix the file") from None


def _screenshot(root: Path, link: object, where: str, warnings: list[str]) -> Path | None:
    if link is None or link == "":
        return None
    path = source_file(root, link, where)
    if not path.is_file() and isinstance(link, str):
        rel = PurePosixPath(link.replace("\\", "/"))
        if rel.parts and rel.parts[0] == "trajectories":  # the path is from the repository's root
            try:
                path = inside(root, PurePosixPath(*rel.parts[1:]))
            except OutsideError as exc:
                raise UserError(f"{where}: the screenshot {exc}; fix the file") from None
    if not path.is_file():
        warnings.append(f"{where}: screenshot {link} is missing; the step is judged without it")
        return None
    return path


def _item(root: Path, cleaned: Path, row: dict[str, str], where: str, warnings: list[str]) -> ConvertedItem:
    fix = "fix annotations.csv (these values name folders and files)"
    benchmark, model, task = (check_id(row.get(c), c, where, fix) for c in KEY_COLUMNS)
    found = sorted((cleaned / benchmark / model).glob(f"*/{task}.json"))
    if not found:
        raise UserError(
            f"{where}: no trajectory {cleaned}/{benchmark}/{model}/*/{task}.json; download it or leave the "
            "item out with --manifest"
        )
    if len(found) > 1:
        raise UserError(f"{where}: {len(found)} trajectories match ({found[0]}, {found[1]}); keep one")
    try:
        path = inside(root, found[0].relative_to(root).as_posix())
    except OutsideError as exc:
        raise UserError(f"{where}: the trajectory {exc}; fix the dataset folder") from None
    traj = read_json_object(path, MAX_TRAJECTORY_BYTES, "AgentRewardBench trajectory")
    at = str(path)
    instruction = text_field(traj.get("goal"), "goal", at, MAX_INSTRUCTION_CHARS, required=True) or ""
    steps = []
    for index, step in enumerate(steps_list(traj.get("steps"), "steps", at)):
        here = f"{at}: step {index}"
        steps.append(
            ConvertedStep(
                action=one_line(text_field(step.get("action"), "action", here, MAX_ACTION_CHARS)),
                thought=text_field(step.get("reasoning"), "reasoning", here, MAX_THOUGHT_CHARS),
                screenshot=_screenshot(root, step.get("screenshot_path"), here, warnings),
            )
        )
    tid = item_id(f"{task}.{model}")
    label: dict[str, Any] = {
        "trajectory_id": tid,
        "label": LABELS[_cleaned(row[LABEL_COLUMN])],
        "original_id": "",
        "source_format": FORMAT,
        "benchmark": benchmark,
        "model_name": model,
        "task_id": task,
    }
    label.update({c: row[c] for c in KEPT_COLUMNS if row.get(c) is not None})
    return ConvertedItem(tid, instruction.strip(), steps, label, at)


def convert(src: Path, wanted: Collection[str] | None = None) -> Converted:
    """The primary, sure annotations of an AgentRewardBench download and their trajectories (only the
    items whose id is in ``wanted``, when given). UserError, one line, for a folder in another layout, an
    annotation file without the columns read, a success value other than Successful / Unsuccessful /
    Unsure, an unsafe benchmark, model or task name, a trajectory missing or malformed, a screenshot
    path leading outside SRC, a field over its bound."""
    root = src.expanduser().resolve()
    if not root.is_dir():
        raise UserError(f"{src} is not a folder; pass the folder you downloaded AgentRewardBench into")
    cleaned, annotations = _layout(root)
    converted = Converted(FORMAT, root, [])
    seen: set[tuple[str, ...]] = set()
    secondary = unsure = 0
    for line, row in _annotation_rows(annotations):
        where = f"{annotations}:{line}"
        key = tuple(row.get(c) or "" for c in KEY_COLUMNS)
        if key in seen:
            secondary += 1  # the official scoring's secondary annotator
            continue
        seen.add(key)
        value = row.get(LABEL_COLUMN) or ""
        if value == UNSURE:
            unsure += 1
            continue
        if not value.strip():
            raise UserError(
                f"{where}: no trajectory_success; label the trajectory (Successful, Unsuccessful or Unsure)"
            )
        if _cleaned(value) not in LABELS:
            raise UserError(
                f"{where}: trajectory_success is {value[:40]!r}, not Successful, Unsuccessful or Unsure; fix the file"
            )
        fix = "fix annotations.csv (these values name folders and files)"
        tid = item_id(
            f"{check_id(key[2], 'task_id', where, fix)}.{check_id(key[1], 'model_name', where, fix)}"
        )
        if wanted is not None and tid not in wanted:
            continue
        converted.items.append(_item(root, cleaned, row, where, converted.warnings))
    if secondary:
        converted.warnings.append(
            f"{annotations}: {secondary} secondary annotation(s) left out (the first row of a trajectory is its label)"
        )
    if unsure:
        converted.warnings.append(
            f"{annotations}: {unsure} trajectory(ies) annotated Unsure left out (no label)"
        )
    return converted
