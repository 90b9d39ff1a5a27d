"""Render a trajectory as the release's Markdown (the judge's text input), byte for byte.

The reference is the official AgentHorizon renderer (``scripts/render_trajectories.py`` in
ServiceNow/agenthorizon); where ``shared/agenthorizon-format.md`` and that script differ, the script
wins. Its rules, as implemented here:

- The text is a list of lines joined by ``\\n``. Every element is followed by one blank line, so the
  text normally ends with exactly one newline: a title, ``## Goal``, the instruction stripped of
  surrounding white space, ``## Steps``, ``Total steps: **n**``.
- Every step then starts with its own ``---`` rule, then ``### Step <step_id>``; a trajectory without
  steps has no rule at all.
- The image line ``![Step k screenshot](<screenshot>)`` comes before the action line, and only when
  the step's screenshot is non-empty (null and ``""`` give no line). The link is the stored value
  verbatim: in a release's blind projection it is already
  ``./data/media/images/<recording_id>/step_<k+1>.png``.
- ``**Action:** `<action_string>` `` always follows.
- A timestamp that is present (not null) yields ``**Timestamp:** <int(us) / 1000, .0f> ms`` (Python's
  ``int()`` first, so a fractional value is truncated toward zero before the round-half-to-even
  formatting); when ``int()`` cannot read it the timestamp line is left out but its blank line is
  still written, so the step (or the file) ends with one extra blank line.

Action strings: missing parameters render as ``?`` (click, scroll, drag, key_down/key_up), as an
empty text (``type ""``) or as no keys (``press `` with its trailing space); a parameter present with
value null renders as Python's ``None``; values are printed with Python's ``str``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from optimizer.models import Action, Step, Trajectory

TYPE_TEXT_LIMIT = 80  # longer typed text is cut ...
TYPE_TEXT_KEEP = 77  # ... to this many characters followed by "..."
MISSING = "?"  # what a missing coordinate, amount, direction or key renders as


def _joined(keys: Any, sep: str) -> str:
    """Keys joined by ``sep`` the way ``str.join`` does (a bare string is joined letter by letter)."""
    if keys is None:
        return ""
    if isinstance(keys, Iterable) and all(isinstance(k, str) for k in keys):
        return sep.join(keys)
    # The official renderer fails on keys that are not strings; show them rather than fail.
    if isinstance(keys, list | tuple):
        return sep.join(str(k) for k in keys)
    return str(keys)


def _click_suffix(clicks: Any) -> str:
    # Only a number above one is written; the official renderer fails comparing anything else.
    if isinstance(clicks, int | float) and clicks and clicks > 1:
        return f" x{clicks}"
    return ""


def action_string(action: Action) -> str:
    """The one-line action text used after ``**Action:**`` (e.g. ``left-click (812, 440) x2``)."""
    p = action.parameters
    kind = action.type
    if kind == "click":
        side = "right" if p.get("button", "left") == "right" else "left"
        suffix = _click_suffix(p.get("num_clicks", 1))
        return f"{side}-click ({p.get('x', MISSING)}, {p.get('y', MISSING)}){suffix}"
    if kind == "type":
        typed = p.get("text", "")
        if isinstance(typed, str) and len(typed) > TYPE_TEXT_LIMIT:
            typed = typed[:TYPE_TEXT_KEEP] + "..."
        return f'type "{typed}"'
    if kind == "press":
        return f"press {_joined(p.get('keys', []), ' ')}"
    if kind == "hotkey":
        return f"hotkey {_joined(p.get('keys', []), '+')}"
    if kind == "scroll":
        where = f"({p.get('x', MISSING)}, {p.get('y', MISSING)})"
        return f"scroll {p.get('direction', MISSING)} {p.get('amount', MISSING)}px at {where}"
    if kind == "drag":
        start = f"({p.get('start_x', MISSING)}, {p.get('start_y', MISSING)})"
        end = f"({p.get('end_x', MISSING)}, {p.get('end_y', MISSING)})"
        return f"drag {start} -> {end}"
    if kind in ("key_down", "key_up"):
        return f"{kind.replace('_', '')} {p.get('key', MISSING)}"
    # move, wait and any type the format does not know: the bare type name.
    return kind


def timestamp_ms_text(timestamp_us: Any) -> str | None:
    """Microseconds → the milliseconds text of the Markdown, or None when the value is unreadable.

    ``int()`` of the stored value (a float is truncated, a numeric string is read), divided by 1000
    and printed with no decimals (Python's round half to even).
    """
    if timestamp_us is None:
        return None
    try:
        ms = int(timestamp_us) / 1000
    except (ValueError, TypeError, OverflowError):  # OverflowError: infinite, or too large for a float
        return None
    return f"{ms:.0f}"


def _step_lines(step: Step) -> list[str]:
    lines = ["---", "", f"### Step {step.step_id}", ""]
    if step.screenshot:
        lines += [f"![Step {step.step_id} screenshot]({step.screenshot})", ""]
    lines += [f"**Action:** `{action_string(step.action)}`", ""]
    if step.timestamp_us is not None:
        ms = timestamp_ms_text(step.timestamp_us)
        if ms is not None:
            lines.append(f"**Timestamp:** {ms} ms")
        lines.append("")  # written even when the value could not be read (an extra blank line)
    return lines


def render_markdown(traj: Trajectory) -> str:
    """The trajectory as the release's Markdown text (normally ending with exactly one newline)."""
    lines = [
        "# Trajectory Report",
        "",
        "## Goal",
        "",
        traj.task.instruction.strip(),
        "",
        "## Steps",
        "",
        f"Total steps: **{len(traj.steps)}**",
        "",
    ]
    for step in traj.steps:
        lines += _step_lines(step)
    return "\n".join(lines)


def first_differing_line(stored: str, rendered: str) -> int | None:
    """The 1-based number of the first line where ``stored`` differs from ``rendered``; None if equal."""
    if stored == rendered:
        return None
    a, b = stored.split("\n"), rendered.split("\n")
    for number, (x, y) in enumerate(zip(a, b, strict=False), start=1):
        if x != y:
            return number
    return min(len(a), len(b))  # one is the other plus more lines (or a missing final newline)
