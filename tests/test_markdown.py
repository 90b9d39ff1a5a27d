"""The Markdown renderer is byte-identical with the official AgentHorizon renderer.

Every expected string here is written by hand from the rules of the official
``scripts/render_trajectories.py`` (ServiceNow/agenthorizon), never produced by judgeloop's renderer.
At the end, `check_report` reads a rendering back by those rules (an independent formulation: it
parses instead of generating) and is run over random combinations of the hand-written cases and over
every Markdown file of the bundled sample.
"""

from __future__ import annotations

import json
import random
import re
from decimal import ROUND_HALF_EVEN, Decimal
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from optimizer.devset.markdown import action_string, render_markdown, timestamp_ms_text
from optimizer.models import Action, Step, Trajectory
from tests.support.paths import SAMPLE_DIR


def act(kind: str, **params: Any) -> dict[str, Any]:
    return {"type": kind, "parameters": params}


# (raw action as stored in the JSON, the action string written by hand from the script's rules)
ACTION_CASES: list[tuple[dict[str, Any], str]] = [
    (act("click", x=812, y=440, button="left"), "left-click (812, 440)"),
    (act("click", x=812, y=440), "left-click (812, 440)"),  # no button: left
    (act("click", x=1, y=2, button="middle"), "left-click (1, 2)"),  # anything but right: left
    (act("click", x=3, y=4, button="right"), "right-click (3, 4)"),
    (act("click", x=5, y=6, button="left", num_clicks=2), "left-click (5, 6) x2"),
    (act("click", x=5, y=6, button="right", num_clicks=3), "right-click (5, 6) x3"),
    (act("click", x=5, y=6, num_clicks=1), "left-click (5, 6)"),  # x1 is never written
    (act("click", x=5, y=6, num_clicks=0), "left-click (5, 6)"),
    (act("click", x=5, y=6, num_clicks=None), "left-click (5, 6)"),
    (act("click", x=5, y=6, num_clicks=2.0), "left-click (5, 6) x2.0"),  # printed as stored
    (act("click", x=10.5, y=3), "left-click (10.5, 3)"),
    (act("click"), "left-click (?, ?)"),  # missing coordinates: '?'
    (act("click", y=7, button="right"), "right-click (?, 7)"),
    (act("click", x=None, y=5), "left-click (None, 5)"),  # present but null: Python's None
    (act("type", text="hello world"), 'type "hello world"'),
    (act("type", text=""), 'type ""'),
    (act("type"), 'type ""'),  # missing text: empty
    (act("type", text='say "hi"'), 'type "say "hi""'),  # quotes are not escaped
    (act("press", keys=["enter"]), "press enter"),
    (act("press", keys=["Tab", "Tab", "enter"]), "press Tab Tab enter"),
    (act("press", keys=[]), "press "),  # no keys: the trailing space stays
    (act("press"), "press "),
    (act("press", keys="enter"), "press e n t e r"),  # a bare string is joined letter by letter
    (act("hotkey", keys=["Ctrl", "c"]), "hotkey Ctrl+c"),
    (act("hotkey", keys=["ctrl", "shift", "t"]), "hotkey ctrl+shift+t"),  # verbatim, no re-casing
    (act("hotkey", keys=[]), "hotkey "),
    (act("hotkey"), "hotkey "),
    (act("scroll", x=640, y=400, direction="down", amount=120), "scroll down 120px at (640, 400)"),
    (act("scroll", x=1, y=2, direction="up", amount=3), "scroll up 3px at (1, 2)"),
    (act("scroll", x=1, y=2), "scroll ? ?px at (1, 2)"),
    (act("scroll"), "scroll ? ?px at (?, ?)"),
    (act("drag", start_x=1, start_y=2, end_x=30, end_y=40), "drag (1, 2) -> (30, 40)"),
    (act("drag", end_x=30, end_y=40), "drag (?, ?) -> (30, 40)"),
    (act("drag"), "drag (?, ?) -> (?, ?)"),
    (act("move", x=9, y=9), "move"),
    (act("move"), "move"),
    (act("wait", duration_s=2.5), "wait"),
    (act("key_down", key="shift"), "keydown shift"),
    (act("key_up", key="shift"), "keyup shift"),
    (act("key_down"), "keydown ?"),
    (act("key_up"), "keyup ?"),
    (act("teleport", x=1), "teleport"),  # an unknown type: its name
    ({"parameters": {"x": 1}}, "unknown"),  # no type at all
    ({"type": "click"}, "left-click (?, ?)"),  # no parameters object
]


@pytest.mark.parametrize(("raw", "expected"), ACTION_CASES, ids=[e for _, e in ACTION_CASES])
def test_action_string_follows_the_official_rules(raw: dict[str, Any], expected: str) -> None:
    assert action_string(Action.model_validate(raw)) == expected


def test_null_parameters_read_as_none_given() -> None:
    # The official renderer fails on "parameters": null; judgeloop reads it as no parameters.
    assert action_string(Action.model_validate({"type": "click", "parameters": None})) == "left-click (?, ?)"


def test_type_text_of_exactly_80_characters_is_kept_whole() -> None:
    text = "a" * 80
    assert action_string(Action.model_validate(act("type", text=text))) == f'type "{text}"'


def test_type_text_beyond_80_characters_is_cut_to_77_plus_ellipsis() -> None:
    text = "0123456789" * 8 + "X"  # 81 characters
    expected = 'type "' + "0123456789" * 7 + "0123456" + '..."'
    assert action_string(Action.model_validate(act("type", text=text))) == expected


def test_type_text_is_cut_by_characters_not_bytes() -> None:
    text = "é" * 81
    assert action_string(Action.model_validate(act("type", text=text))) == 'type "' + "é" * 77 + '..."'


# (timestamp_us as stored, the milliseconds text; None = no timestamp line)
TIMESTAMP_CASES: list[tuple[Any, str | None]] = [
    (1532000, "1532"),
    (0, "0"),
    (499, "0"),
    (500, "0"),  # 0.5 -> 0 (half to even)
    (1500, "2"),  # 1.5 -> 2
    (2500, "2"),  # 2.5 -> 2
    (3500, "4"),
    (999_500, "1000"),
    (1532000.7, "1532"),  # int() first: fractions are truncated
    (2500.9, "2"),  # truncated to 2500 -> 2.5 -> 2 (not 2.5009 -> 3)
    (-1500.5, "-2"),  # truncated toward zero to -1500 -> -1.5 -> -2
    ("1532000", "1532"),  # a numeric string is read by int()
    (True, "0"),  # int(True) == 1 -> 0.001 ms
    ("12.5", None),  # int() cannot read it: no line
    ("soon", None),
    ([1], None),
    ({"us": 1}, None),
    (None, None),
]


@pytest.mark.parametrize(("stored", "expected"), TIMESTAMP_CASES, ids=[repr(s) for s, _ in TIMESTAMP_CASES])
def test_timestamp_text_follows_the_official_rules(stored: Any, expected: str | None) -> None:
    assert timestamp_ms_text(stored) == expected


def test_step_model_keeps_any_timestamp_and_refuses_a_non_integer_step_id() -> None:
    step = {"step_id": 0, "action": act("wait")}
    for stored, _ in TIMESTAMP_CASES:
        assert Step.model_validate({**step, "timestamp_us": stored}).timestamp_us == stored
    assert Step.model_validate({"step_id": 2}).action.type == "unknown"  # no action: "unknown"
    for bad in (1.0, "1", True):
        with pytest.raises(ValidationError):
            Step.model_validate({**step, "step_id": bad})


def traj(steps: list[dict[str, Any]], instruction: str = "Open the file.") -> Trajectory:
    return Trajectory.model_validate(
        {"trajectory_id": "t-1", "task": {"instruction": instruction}, "steps": steps}
    )


def test_render_matches_the_format_doc_example_byte_for_byte() -> None:
    t = traj(
        [
            {
                "step_id": 0,
                "screenshot": "./data/media/images/rec-1/step_1.png",
                "action": {"type": "click", "parameters": {"x": 812, "y": 440, "button": "left"}},
                "timestamp_us": 1532000,
            }
        ],
        instruction="  Rename the file to report.pdf.\n",
    )
    expected = (
        "# Trajectory Report\n"
        "\n"
        "## Goal\n"
        "\n"
        "Rename the file to report.pdf.\n"
        "\n"
        "## Steps\n"
        "\n"
        "Total steps: **1**\n"
        "\n"
        "---\n"
        "\n"
        "### Step 0\n"
        "\n"
        "![Step 0 screenshot](./data/media/images/rec-1/step_1.png)\n"
        "\n"
        "**Action:** `left-click (812, 440)`\n"
        "\n"
        "**Timestamp:** 1532 ms\n"
    )
    assert render_markdown(t) == expected


def test_every_step_starts_with_its_own_rule_and_screenshots_show_only_when_non_empty() -> None:
    t = traj(
        [
            {
                "step_id": 0,
                "screenshot": "./data/media/images/r/step_1.png",
                "action": act("hotkey", keys=["Ctrl", "c"]),
                "timestamp_us": 2500,
                "thought": "copy it",  # thoughts are not part of the Markdown
            },
            {"step_id": 1, "screenshot": None, "action": act("type", text="hi"), "timestamp_us": 3500},
            {"step_id": 2, "screenshot": "", "action": act("press", keys=["enter"]), "timestamp_us": 4000},
            {
                "step_id": 3,
                "screenshot": "https://storage.example.com/shots/a%20b.png?x=1",
                "action": act("wait", duration_s=1),
                "timestamp_us": None,
            },
            {"step_id": 4, "action": act("key_up", key="shift")},  # no screenshot key, no timestamp key
        ]
    )
    expected = (
        "# Trajectory Report\n\n"
        "## Goal\n\n"
        "Open the file.\n\n"
        "## Steps\n\n"
        "Total steps: **5**\n\n"
        "---\n\n"
        "### Step 0\n\n"
        "![Step 0 screenshot](./data/media/images/r/step_1.png)\n\n"
        "**Action:** `hotkey Ctrl+c`\n\n"
        "**Timestamp:** 2 ms\n\n"
        "---\n\n"
        "### Step 1\n\n"
        '**Action:** `type "hi"`\n\n'
        "**Timestamp:** 4 ms\n\n"
        "---\n\n"
        "### Step 2\n\n"
        "**Action:** `press enter`\n\n"
        "**Timestamp:** 4 ms\n\n"
        "---\n\n"
        "### Step 3\n\n"
        "![Step 3 screenshot](https://storage.example.com/shots/a%20b.png?x=1)\n\n"
        "**Action:** `wait`\n\n"
        "---\n\n"
        "### Step 4\n\n"
        "**Action:** `keyup shift`\n"
    )
    assert render_markdown(t) == expected


def test_headings_are_the_stored_step_ids_not_positions() -> None:
    t = traj([{"step_id": 7, "screenshot": "s.png", "action": act("move")}])
    assert render_markdown(t).endswith(
        "---\n\n### Step 7\n\n![Step 7 screenshot](s.png)\n\n**Action:** `move`\n"
    )


def test_unreadable_timestamp_drops_its_line_but_keeps_its_blank_line() -> None:
    t = traj(
        [
            {"step_id": 0, "action": act("click", x=1, y=2), "timestamp_us": "soon"},
            {"step_id": 1, "action": act("click", x=3, y=4), "timestamp_us": 1532000.7},
            {"step_id": 2, "action": act("move"), "timestamp_us": [5]},
        ]
    )
    expected = (
        "# Trajectory Report\n\n## Goal\n\nOpen the file.\n\n## Steps\n\nTotal steps: **3**\n\n"
        "---\n\n### Step 0\n\n**Action:** `left-click (1, 2)`\n\n\n"  # one extra blank line
        "---\n\n### Step 1\n\n**Action:** `left-click (3, 4)`\n\n**Timestamp:** 1532 ms\n\n"
        "---\n\n### Step 2\n\n**Action:** `move`\n\n"  # the file ends with a blank line
    )
    assert render_markdown(t) == expected


def test_render_of_a_trajectory_without_steps_has_no_rule() -> None:
    expected = "# Trajectory Report\n\n## Goal\n\nDo nothing.\n\n## Steps\n\nTotal steps: **0**\n"
    assert render_markdown(traj([], instruction="Do nothing.")) == expected


def test_missing_parameters_render_with_question_marks_in_the_report() -> None:
    t = traj(
        [
            {"step_id": 0, "action": {"type": "click"}, "timestamp_us": 10_000},
            {"step_id": 1, "action": {"type": "type", "parameters": {}}},
            {"step_id": 2, "action": {"type": "press", "parameters": {}}},
            {"step_id": 3, "action": {"type": "key_down", "parameters": {}}},
        ]
    )
    expected = (
        "# Trajectory Report\n\n## Goal\n\nOpen the file.\n\n## Steps\n\nTotal steps: **4**\n\n"
        "---\n\n### Step 0\n\n**Action:** `left-click (?, ?)`\n\n**Timestamp:** 10 ms\n\n"
        '---\n\n### Step 1\n\n**Action:** `type ""`\n\n'
        "---\n\n### Step 2\n\n**Action:** `press `\n\n"
        "---\n\n### Step 3\n\n**Action:** `keydown ?`\n"
    )
    assert render_markdown(t) == expected


def test_render_tolerates_unknown_fields_and_keeps_multiline_instruction_inside() -> None:
    t = Trajectory.model_validate(
        {
            "trajectory_id": "t",
            "task": {"instruction": "\nLine one.\n  Line two.\n\n", "extra": 1},
            "steps": [
                {
                    "step_id": 0,
                    "screenshot": "./data/media/images/r/step_1.png",
                    "action": {"type": "press", "parameters": {"keys": ["enter"], "new_field": True}},
                    "timestamp_us": 999_500,
                    "future": "ignored",
                }
            ],
        }
    )
    expected = (
        "# Trajectory Report\n\n## Goal\n\nLine one.\n  Line two.\n\n## Steps\n\nTotal steps: **1**\n\n---\n\n"
        "### Step 0\n\n![Step 0 screenshot](./data/media/images/r/step_1.png)\n\n"
        "**Action:** `press enter`\n\n**Timestamp:** 1000 ms\n"
    )
    assert render_markdown(t) == expected


# ---------------------------------------------------------------------------------------------
# An independent checker: read a report back by the official rules


UNREADABLE = "unreadable"


def expected_ms(stored: Any) -> str | None:
    """The timestamp text by exact decimal arithmetic (the renderer uses float formatting)."""
    if stored is None:
        return None
    if isinstance(stored, bool | int | float) or (
        isinstance(stored, str) and re.fullmatch(r"\s*[+-]?\d+\s*", stored)
    ):
        us = int(stored)
    else:
        return UNREADABLE
    ms = (Decimal(us) / 1000).quantize(Decimal(1), rounding=ROUND_HALF_EVEN)
    return str(ms)  # a negative value rounding to zero stays "-0", as in Python's float format


def check_report(md: str, doc: dict[str, Any], actions: list[str] | None = None) -> None:
    """Assert that ``md`` is the official report of the trajectory ``doc``.

    The text is cut at the rule lines; each step part must hold exactly the heading, the image line
    when the screenshot is non-empty, the action line and the timestamp line, each element followed
    by one blank line. ``actions`` gives the expected action texts (else only their shape is checked).
    """
    steps = doc["steps"]
    parts = md.split("\n---\n")
    assert len(parts) == len(steps) + 1, "one rule per step"
    goal = doc["task"]["instruction"].strip()
    assert (
        parts[0] == f"# Trajectory Report\n\n## Goal\n\n{goal}\n\n## Steps\n\nTotal steps: **{len(steps)}**\n"
    )
    for k, (step, part) in enumerate(zip(steps, parts[1:], strict=True)):
        elements = [f"### Step {step['step_id']}"]
        if step.get("screenshot"):
            elements.append(f"![Step {step['step_id']} screenshot]({step['screenshot']})")
        action = re.search(r"^\*\*Action:\*\* `(.*)`$", part, re.MULTILINE)
        assert action is not None, part
        if actions is not None:
            assert action.group(1) == actions[k]
        elements.append(action.group(0))
        tail = ""
        ms = expected_ms(step.get("timestamp_us"))
        if ms == UNREADABLE:
            tail = "\n"
        elif ms is not None:
            elements.append(f"**Timestamp:** {ms} ms")
        assert part == "".join(f"\n{e}\n" for e in elements) + tail, (k, part)


def test_checker_agrees_with_the_renderer_on_random_combinations_of_the_hand_written_cases() -> None:
    rng = random.Random(2026)
    shots = [
        None,
        "",
        "./data/media/images/r/step_1.png",
        "https://example.com/s.png",
        "data/media/images/r/x.png",
    ]
    stamps = [s for s, _ in TIMESTAMP_CASES]
    for trial in range(200):
        n = rng.choice([0, 1, 2, 5, 12])
        chosen = [rng.choice(ACTION_CASES) for _ in range(n)]
        steps: list[dict[str, Any]] = []
        for k, (raw, _) in enumerate(chosen):
            step: dict[str, Any] = {"step_id": k, "action": raw}
            if rng.random() < 0.8:
                step["screenshot"] = rng.choice(shots)
            if rng.random() < 0.8:
                step["timestamp_us"] = rng.choice(stamps)
            steps.append(step)
        doc = {"trajectory_id": f"t{trial}", "task": {"instruction": f"  Task {trial}.\n"}, "steps": steps}
        check_report(render_markdown(Trajectory.model_validate(doc)), doc, [text for _, text in chosen])


def test_checker_rejects_the_old_single_rule_layout() -> None:
    doc = {
        "trajectory_id": "t",
        "task": {"instruction": "Go."},
        "steps": [{"step_id": 0, "action": act("move")}, {"step_id": 1, "action": act("move")}],
    }
    old = (
        "# Trajectory Report\n\n## Goal\n\nGo.\n\n## Steps\n\nTotal steps: **2**\n\n---\n\n"
        "### Step 0\n\n**Action:** `move`\n\n### Step 1\n\n**Action:** `move`\n"
    )
    with pytest.raises(AssertionError):
        check_report(old, doc)


def test_every_bundled_sample_markdown_is_the_official_report_of_its_json() -> None:
    data = Path(SAMPLE_DIR) / "sandbox" / "data"
    md_files = sorted((data / "markdowns").glob("*.md"))
    assert len(md_files) == 88
    for md_path in md_files:
        doc = json.loads((data / "jsons" / f"{md_path.stem}.json").read_text(encoding="utf-8"))
        check_report(md_path.read_bytes().decode("utf-8"), doc)
