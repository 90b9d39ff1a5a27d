"""Pure helpers shared by the strategies: disagreement sampling and formatting, history text,
allowed-path checks and Markdown section splicing."""

from __future__ import annotations

import random
import re
from collections import Counter
from collections.abc import Sequence

from optimizer import fmt
from optimizer.loop.strategies import Direction, Disagreement, PastExperiment
from optimizer.workspace.config import experiment_seed
from optimizer.workspace.paths import allowed_name

REASONING_CHARS = 600
DIFF_CHARS = 1500

# What each direction means for the judge, in the optimiser's words.
DIRECTION_TEXT: dict[str, str] = {
    "missed_failure": "missed failure (label: failed, judge said success) — the judge is too lenient here",
    "rejected_success": "rejected success (label: succeeded, judge said failure) — the judge is too strict here",
}


def rng_for(seed: int, experiment_seq: int) -> random.Random:
    """A generator fixed by the run's seed and the experiment number (same inputs → same proposal)."""
    return random.Random(experiment_seed(seed, experiment_seq, wrap=False))


def counts_by_direction(disagreements: Sequence[Disagreement]) -> Counter[str]:
    return Counter(d.direction for d in disagreements)


def dominant_direction(disagreements: Sequence[Disagreement]) -> Direction | None:
    """The direction with more disagreements (stable ones count double: they are not chance); None if tied."""
    weight: Counter[str] = Counter()
    for d in disagreements:
        weight[d.direction] += 1 if d.unstable else 2
    missed, rejected = weight["missed_failure"], weight["rejected_success"]
    if missed == rejected:
        return None
    return "missed_failure" if missed > rejected else "rejected_success"


def balanced_sample(
    disagreements: Sequence[Disagreement], cap: int, rng: random.Random
) -> list[Disagreement]:
    """Up to ``cap`` disagreements, half from each direction when both have enough (the other fills).

    Within a direction stable items come before unstable ones (an unstable item may be noise) and
    missed failures are interleaved by mistake type so one type does not crowd out the others.
    """
    by_dir: dict[str, list[Disagreement]] = {"missed_failure": [], "rejected_success": []}
    for d in disagreements:
        by_dir[d.direction].append(d)
    ordered: dict[str, list[Disagreement]] = {}
    for direction, items in by_dir.items():
        items = sorted(items, key=lambda d: d.trajectory_id)
        rng.shuffle(items)
        stable = [d for d in items if not d.unstable]
        unstable = [d for d in items if d.unstable]
        ordered[direction] = _interleave_by_type(stable) + _interleave_by_type(unstable)
    missed, rejected = ordered["missed_failure"], ordered["rejected_success"]
    take_missed = min(len(missed), max(cap // 2, cap - len(rejected)))
    take_rejected = min(len(rejected), cap - take_missed)
    return missed[:take_missed] + rejected[:take_rejected]


def _interleave_by_type(items: list[Disagreement]) -> list[Disagreement]:
    groups: dict[str, list[Disagreement]] = {}
    for d in items:
        groups.setdefault(d.mistake_type or "", []).append(d)
    out: list[Disagreement] = []
    queues = list(groups.values())
    while any(queues):
        for q in queues:
            if q:
                out.append(q.pop(0))
    return out


def _clip(text: str, limit: int) -> str:
    text = text.strip()
    return text if len(text) <= limit else text[: limit - 3] + "..."


def disagreement_dict(d: Disagreement) -> dict[str, object]:
    """One disagreement as JSON-able data for the optimiser (reasoning clipped)."""
    return {
        "trajectory_id": d.trajectory_id,
        "direction": d.direction,
        "instruction": d.instruction,
        "label": "positive" if d.label_positive else "negative",
        "mistake_type": d.mistake_type,
        "judge_success": d.judge_success,
        "judge_confidence": d.confidence,
        "judge_reasoning": _clip(d.reasoning, REASONING_CHARS),
        "unstable": d.unstable,
        **({"judge_tool_calls": [str(c) for c in d.judge_tools]} if d.judge_tools else {}),
    }


def format_disagreement(d: Disagreement) -> str:
    """One disagreement as a short Markdown block."""
    verdict = "no valid answer" if d.judge_success is None else ("success" if d.judge_success else "failure")
    lines = [
        f"- [{DIRECTION_TEXT[d.direction]}]" + (" (unstable across replicates)" if d.unstable else ""),
        f"  instruction: {d.instruction.strip()}",
    ]
    if d.mistake_type:
        lines.append(f"  labelled mistake type: {d.mistake_type}")
    lines.append(f"  judge verdict: {verdict}, confidence {d.confidence or 'unknown'}")
    if d.reasoning.strip():
        lines.append(f"  judge reasoning: {_clip(d.reasoning, REASONING_CHARS)}")
    return "\n".join(lines)


def format_history(
    history: Sequence[PastExperiment], *, limit: int = 20, diff_chars: int = DIFF_CHARS
) -> str:
    """The most recent ``limit`` experiments with decisions, metrics, rationale and clipped diffs."""
    if not history:
        return "No experiments yet."
    blocks = []
    for e in list(history)[-limit:]:
        kappa, fpr = fmt.num(e.kappa, missing=fmt.NA), fmt.num(e.fpr, missing=fmt.NA)
        blocks.append(
            f"## Experiment {e.id}: {e.decision} ({e.reason})\n"
            f"kappa {kappa}, FPR {fpr}\n"
            f"rationale: {e.rationale.strip()}\n"
            f"diff:\n{_clip(e.diff, diff_chars) if e.diff.strip() else '(none)'}"
        )
    skipped = len(history) - limit
    head = f"({skipped} older experiments not shown)\n\n" if skipped > 0 else ""
    return head + "\n\n".join(blocks)


def allowed_path(path: str, allowed: Sequence[str]) -> str | None:
    """The allowed file ``path`` names (canonical, `optimizer.workspace.paths.prompt_file`), or None if it names none."""
    return allowed_name(path, list(allowed))


_MARKER_PREFIX = "<!-- judgeloop:"
_HEADING = re.compile(r"^(#{1,6})[ \t]+(.+?)[ \t#]*$")


def _heading_key(text: str) -> str:
    return " ".join(text.strip().lstrip("#").strip().rstrip("#").split()).casefold()


def headings(text: str) -> list[str]:
    """The Markdown ATX headings of ``text`` as written (outside fenced code blocks)."""
    out, in_fence = [], False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            in_fence = not in_fence
            continue
        if not in_fence and _HEADING.match(line):
            out.append(line.strip())
    return out


def splice_section(text: str, heading: str, new_section: str) -> str | None:
    """Replace the section under ``heading`` (up to the next heading of the same or a higher level,
    or the first judgeloop marker line, so protected and library regions are never swallowed).

    ``heading`` is matched ignoring ``#`` marks, case and spacing. ``new_section`` may start with the
    heading line (then it replaces it) or hold only the body (the heading is kept). Returns None when
    no such heading exists.
    """
    lines = text.splitlines(keepends=True)
    key = _heading_key(heading)
    start = level = None
    in_fence = False
    for i, line in enumerate(lines):
        if line.lstrip().startswith("```"):
            in_fence = not in_fence
            continue
        if start is not None and line.strip().startswith(_MARKER_PREFIX):
            end = i  # a protected or library region is never part of a rewritable section
            break
        m = None if in_fence else _HEADING.match(line.rstrip("\n"))
        if m is None:
            continue
        if start is None and _heading_key(m.group(2)) == key:
            start, level = i, len(m.group(1))
        elif start is not None and level is not None and len(m.group(1)) <= level:
            end = i
            break
    else:
        end = len(lines)
    if start is None:
        return None
    body = new_section.strip("\n")
    first = body.splitlines()[0] if body else ""
    if _HEADING.match(first) and _heading_key(first) == key:
        replacement = body + "\n"
    else:
        replacement = lines[start].rstrip("\n") + "\n\n" + body + "\n"
    if end < len(lines):
        replacement += "\n"
    return "".join(lines[:start]) + replacement + "".join(lines[end:])
