"""`judgeloop score`: read a folder of AgentHorizon verdict files and print the protocol numbers.

A results folder holds one ``<trajectory_id>.json`` per judged item, written by judgeloop or by any
other harness (e.g. the official Codex or Claude Code runners). Files whose name starts with ``_``
(``_summary.json``) and files not ending in ``.json`` are not verdicts and are ignored.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from optimizer import fmt
from optimizer.devset.heldout import refuse_heldout
from optimizer.devset.labels import load_labels
from optimizer.devset.split import open_split
from optimizer.errors import UserError
from optimizer.models import MISTAKE_TYPES, fold_mistake_type
from optimizer.stats.metrics import MISSING, Answer, Metrics, bootstrap_intervals, score
from optimizer.workspace.workspace import Workspace

INVALID = Answer(success=None, status="invalid")


def parse_result_file(raw: bytes) -> Answer:
    """One verdict file's bytes → an Answer; anything but a JSON object with a boolean ``success`` is invalid.

    The string "false", ``null``, 0/1 and a missing key are all invalid: the protocol never coerces.
    ``mistake_type`` is kept when it is a string (the release's plural spelling folded); a name
    that is not a known type simply matches no label.
    """
    try:
        data: Any = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        return INVALID
    if not isinstance(data, dict) or not isinstance(data.get("success"), bool):
        return INVALID
    mistake = data.get("mistake_type")
    mistake = fold_mistake_type(mistake.strip()) if isinstance(mistake, str) else None
    return Answer(success=data["success"], mistake_type=mistake)


def looks_like_trajectory_id(name: str) -> bool:
    """AgentHorizon trajectory ids are UUIDs; the official tools skip every other file name."""
    try:
        uuid.UUID(name)
    except ValueError:
        return False
    return True


def read_results_dir(path: Path, ids: Sequence[str], skipped: list[str] | None = None) -> dict[str, Answer]:
    """Read ``path/<trajectory_id>.json`` for every id in ``ids`` (manifest order).

    Returns an Answer for every id: a missing file is ``status="missing"``; an unreadable or
    malformed file is ``status="invalid"``. A verdict file named like a trajectory id (a UUID) that
    is not in ``ids`` is a UserError (scoring against the wrong split would silently drop it); other
    ``.json`` files (``analysis.json`` from the official analysis step, ``summary.json``, ...) are
    not verdicts and are skipped, their names appended to ``skipped``.
    """
    if not path.is_dir():
        raise UserError(
            f"{path} is not a folder; pass the folder holding the <trajectory_id>.json verdict files"
        )
    wanted = set(ids)
    found: dict[str, Answer] = {}
    for file in sorted(path.iterdir()):
        if not file.name.endswith(".json") or file.name.startswith("_") or not file.is_file():
            continue
        tid = file.name[: -len(".json")]
        if tid not in wanted and not looks_like_trajectory_id(tid):
            if skipped is not None:
                skipped.append(file.name)
            continue
        if tid not in wanted:
            raise UserError(
                f"{file} names trajectory {tid!r}, which is not in the split's manifest; "
                "remove the file or score against the split it belongs to"
            )
        try:
            raw = file.read_bytes()
        except OSError:
            found[tid] = INVALID
            continue
        found[tid] = parse_result_file(raw)
    return {tid: found.get(tid, MISSING) for tid in ids}


# The score table shows a missing rate as "n/a".
_num = partial(fmt.num, missing=fmt.NA)


def format_table(split_name: str, metrics: Metrics, intervals: dict[str, tuple[float, float]]) -> str:
    """The human-readable score table (rates with 95% bootstrap intervals and their counts)."""

    def row(name: str, key: str, value: float | None, counts: str = "") -> str:
        ci = intervals.get(key)
        ci_text = f"[{ci[0]:.3f}, {ci[1]:.3f}]" if ci and value is not None else ""
        return f"  {name:<19}{_num(value):>7}  {ci_text:<16}  {counts}".rstrip()

    m = metrics
    lines = [
        f"split {split_name}: n={m.n} (positives {m.positives}, negatives {m.negatives}); "
        f"invalid {m.invalid}, missing {m.missing} (both scored as wrong)",
        f"  {'metric':<19}{'value':>7}  {'95% interval':<16}  counts",
        row("balanced accuracy", "balanced_accuracy", m.balanced_accuracy),
        row("TPR", "tpr", m.tpr, f"{m.tp}/{m.positives}"),
        row("TNR", "tnr", m.tnr, f"{m.tn}/{m.negatives}"),
        row("FPR", "fpr", m.fpr, f"{m.fp}/{m.negatives}"),
        row("FNR", "fnr", m.fnr, f"{m.fn}/{m.positives}"),
        row("Cohen's kappa", "kappa", m.kappa),
        "  mistake-type recall (rejected and same type named):",
    ]
    for key in (*MISTAKE_TYPES, "overall"):
        lines.append(f"    {key:<36}{_num(m.mistake_type_recall.get(key)):>7}")
    return "\n".join(lines)


@dataclass(frozen=True)
class FolderScore:
    """A results folder scored against a split's labels."""

    split: str
    metrics: Metrics
    intervals: dict[str, tuple[float, float]]
    skipped: list[str]  # .json files that are not verdicts (not named by a trajectory id)


def score_folder(ws: Workspace, results_dir: Path, split_name: str) -> FolderScore:
    """Score the verdict files in ``results_dir`` against split ``split_name`` by the published
    protocol (a missing or invalid verdict counts as wrong), with 95% bootstrap intervals."""
    refuse_heldout(ws, split_name, "score")  # its figures only through confirm, counted and capped
    split = open_split(ws, split_name)
    labels = load_labels(split)
    skipped: list[str] = []
    answers = read_results_dir(results_dir, split.ids, skipped)
    return FolderScore(split.name, score(labels, answers), bootstrap_intervals(labels, answers), skipped)
