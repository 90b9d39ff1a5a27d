"""Render a trajectory as the release's Markdown (the judge's text input), byte for byte.

The format is fixed by ``shared/agenthorizon-format.md``:

- a title, the goal (instruction stripped of surrounding white space), ``Total steps: **n**`` and
  one ``---`` rule, then one ``### Step k`` section per step with 0-based headings;
- in a step, the screenshot line comes before the action line, the timestamp line comes last and
  only when the timestamp is known (milliseconds, ``f"{us / 1000:.0f}"``, i.e. round half to even);
- every element is followed by one blank line, so the text ends with exactly one newline.

Decisions the format doc leaves open (kept here so they are made once):

- The screenshot line links the step's ``screenshot`` field verbatim: in the blind projection that
  is already ``./data/media/images/<recording_id>/step_<k+1>.png`` (1-based file names). A step
  whose screenshot is null has **no image line** at all: inventing a link to a file that was never
  recorded would send the judge (and ``devset verify``) looking for it.
- Hotkey and press keys are joined verbatim (``["Ctrl", "c"]`` → ``Ctrl+c``); key names are never
  re-capitalised, so the text shows exactly what the recorder stored.
- Coordinates and amounts are printed with Python's ``str`` of the stored value.
- An action whose required parameters are missing renders as its bare type name, as ``move`` and
  ``wait`` always do: the renderer never invents values and never fails on a partial step.
"""

from __future__ import annotations

from typing import Any

from optimizer.models import Action, Step, Trajectory

TYPE_TEXT_LIMIT = 80  # longer typed text is cut ...
TYPE_TEXT_KEEP = 77  # ... to this many characters followed by "..."


def _has(params: dict[str, Any], *names: str) -> bool:
    return all(params.get(n) is not None for n in names)


def _keys(params: dict[str, Any], name: str) -> list[str] | None:
    keys = params.get(name)
    if isinstance(keys, str):
        return [keys]
    if isinstance(keys, list | tuple) and keys:
        return [str(k) for k in keys]
    return None


def action_string(action: Action) -> str:
    """The one-line action text used after ``**Action:**`` (e.g. ``left-click (812, 440) x2``)."""
    p = action.parameters
    kind = action.type
    if kind == "click":
        if not _has(p, "x", "y"):
            return kind
        side = "right" if p.get("button") == "right" else "left"
        text = f"{side}-click ({p['x']}, {p['y']})"
        clicks = p.get("num_clicks")
        if isinstance(clicks, int) and not isinstance(clicks, bool) and clicks > 1:
            text += f" x{clicks}"
        return text
    if kind == "type":
        if p.get("text") is None:
            return kind
        typed = str(p["text"])
        if len(typed) > TYPE_TEXT_LIMIT:
            typed = typed[:TYPE_TEXT_KEEP] + "..."
        return f'type "{typed}"'
    if kind == "press":
        keys = _keys(p, "keys")
        return f"press {' '.join(keys)}" if keys else kind
    if kind == "hotkey":
        keys = _keys(p, "keys")
        return f"hotkey {'+'.join(keys)}" if keys else kind
    if kind == "scroll":
        if not _has(p, "x", "y", "direction", "amount"):
            return kind
        return f"scroll {p['direction']} {p['amount']}px at ({p['x']}, {p['y']})"
    if kind == "drag":
        if not _has(p, "start_x", "start_y", "end_x", "end_y"):
            return kind
        return f"drag ({p['start_x']}, {p['start_y']}) -> ({p['end_x']}, {p['end_y']})"
    if kind in ("key_down", "key_up"):
        if p.get("key") is None:
            return kind
        return f"{kind.replace('_', '')} {p['key']}"
    # move, wait and any type the format does not know: the bare type name.
    return kind


def format_timestamp_ms(timestamp_us: int) -> str:
    """Microseconds → the milliseconds text of the Markdown (Python's round half to even)."""
    return f"{timestamp_us / 1000:.0f}"


def _step_elements(step: Step, index: int) -> list[str]:
    elements = [f"### Step {index}"]
    if step.screenshot is not None:
        elements.append(f"![Step {index} screenshot]({step.screenshot})")
    elements.append(f"**Action:** `{action_string(step.action)}`")
    if step.timestamp_us is not None:
        elements.append(f"**Timestamp:** {format_timestamp_ms(step.timestamp_us)} ms")
    return elements


def render_markdown(traj: Trajectory) -> str:
    """The trajectory as the release's Markdown text, ending with exactly one newline."""
    elements = [
        "# Trajectory Report",
        "## Goal",
        traj.task.instruction.strip(),
        "## Steps",
        f"Total steps: **{len(traj.steps)}**",
        "---",
    ]
    # Headings use step_id (0-based), the same number the 1-based image file name is derived from.
    for step in traj.steps:
        elements.extend(_step_elements(step, step.step_id))
    return "\n\n".join(elements) + "\n"
