"""The Markdown renderer reproduces the release format byte for byte (shared/agenthorizon-format.md)."""

from __future__ import annotations

from typing import Any

import pytest

from optimizer.devset.markdown import action_string, render_markdown
from optimizer.models import Action, Trajectory


def act(kind: str, **params: Any) -> Action:
    return Action(type=kind, parameters=params)


@pytest.mark.parametrize(
    ("action", "expected"),
    [
        (act("click", x=812, y=440, button="left"), "left-click (812, 440)"),
        (act("click", x=812, y=440), "left-click (812, 440)"),  # no button: left
        (act("click", x=1, y=2, button="middle"), "left-click (1, 2)"),  # not right: left
        (act("click", x=3, y=4, button="right"), "right-click (3, 4)"),
        (act("click", x=5, y=6, button="left", num_clicks=2), "left-click (5, 6) x2"),
        (act("click", x=5, y=6, button="right", num_clicks=3), "right-click (5, 6) x3"),
        (act("click", x=5, y=6, num_clicks=1), "left-click (5, 6)"),  # x1 is never written
        (act("click", x=5, y=6, num_clicks=None), "left-click (5, 6)"),
        (act("type", text="hello world"), 'type "hello world"'),
        (act("type", text=""), 'type ""'),
        (act("press", keys=["enter"]), "press enter"),
        (act("press", keys=["Tab", "Tab", "enter"]), "press Tab Tab enter"),
        (act("hotkey", keys=["Ctrl", "c"]), "hotkey Ctrl+c"),
        (act("hotkey", keys=["ctrl", "shift", "t"]), "hotkey ctrl+shift+t"),  # verbatim, no re-casing
        (act("scroll", x=640, y=400, direction="down", amount=120), "scroll down 120px at (640, 400)"),
        (act("scroll", x=1, y=2, direction="up", amount=3), "scroll up 3px at (1, 2)"),
        (act("drag", start_x=1, start_y=2, end_x=30, end_y=40), "drag (1, 2) -> (30, 40)"),
        (act("move", x=9, y=9), "move"),
        (act("wait", duration_s=2.5), "wait"),
        (act("key_down", key="shift"), "keydown shift"),
        (act("key_up", key="shift"), "keyup shift"),
        # Missing required parameters: the bare type name, never invented values.
        (act("click"), "click"),
        (act("hotkey", keys=[]), "hotkey"),
        (act("scroll", x=1, y=2), "scroll"),
        (act("teleport", x=1), "teleport"),  # an unknown type: its name
    ],
)
def test_action_string_for_every_action_type(action: Action, expected: str) -> None:
    assert action_string(action) == expected


def test_type_text_of_exactly_80_characters_is_kept_whole() -> None:
    text = "a" * 80
    assert action_string(act("type", text=text)) == f'type "{text}"'


def test_type_text_beyond_80_characters_is_cut_to_77_plus_ellipsis() -> None:
    text = "0123456789" * 8 + "X"  # 81 characters
    assert action_string(act("type", text=text)) == 'type "' + ("0123456789" * 8)[:77] + '..."'
    assert len(action_string(act("type", text=text))) == len('type ""') + 80


def traj(steps: list[dict[str, Any]], instruction: str = "Open the file.") -> Trajectory:
    return Trajectory.model_validate({"trajectory_id": "t-1", "task": {"instruction": instruction}, "steps": steps})


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


def test_render_several_steps_null_screenshot_unknown_timestamp_and_half_even_rounding() -> None:
    t = traj(
        [
            {
                "step_id": 0,
                "screenshot": "./data/media/images/r/step_1.png",
                "action": {"type": "hotkey", "parameters": {"keys": ["Ctrl", "c"]}},
                "timestamp_us": 2500,  # 2.5 ms -> "2" (half to even)
                "thought": "copy it",  # thoughts are not part of the Markdown
            },
            {
                "step_id": 1,
                "screenshot": None,  # null screenshot: no image line at all
                "action": {"type": "type", "parameters": {"text": "hi"}},
                "timestamp_us": 3500,  # 3.5 ms -> "4"
            },
            {
                "step_id": 2,
                "screenshot": "./data/media/images/r/step_3.png",
                "action": {"type": "wait", "parameters": {"duration_s": 1}},
                "timestamp_us": None,  # unknown: no timestamp line
            },
        ]
    )
    expected = (
        "# Trajectory Report\n\n"
        "## Goal\n\n"
        "Open the file.\n\n"
        "## Steps\n\n"
        "Total steps: **3**\n\n"
        "---\n\n"
        "### Step 0\n\n"
        "![Step 0 screenshot](./data/media/images/r/step_1.png)\n\n"
        "**Action:** `hotkey Ctrl+c`\n\n"
        "**Timestamp:** 2 ms\n\n"
        "### Step 1\n\n"
        '**Action:** `type "hi"`\n\n'
        "**Timestamp:** 4 ms\n\n"
        "### Step 2\n\n"
        "![Step 2 screenshot](./data/media/images/r/step_3.png)\n\n"
        "**Action:** `wait`\n"
    )
    assert render_markdown(t) == expected


def test_render_ends_with_exactly_one_newline_after_an_action_line() -> None:
    t = traj([{"step_id": 0, "action": {"type": "move", "parameters": {"x": 1, "y": 1}}}])
    text = render_markdown(t)
    assert text.endswith("**Action:** `move`\n")
    assert not text.endswith("\n\n")


def test_render_of_a_trajectory_without_steps() -> None:
    expected = "# Trajectory Report\n\n## Goal\n\nDo nothing.\n\n## Steps\n\nTotal steps: **0**\n\n---\n"
    assert render_markdown(traj([], instruction="Do nothing.")) == expected


def test_render_tolerates_unknown_fields_and_keeps_multiline_instruction_inside() -> None:
    t = Trajectory.model_validate(
        {
            "trajectory_id": "t",
            "task": {"instruction": "\nLine one.\nLine two.\n\n", "extra": 1},
            "steps": [
                {
                    "step_id": 0,
                    "screenshot": "./data/media/images/r/step_1.png",
                    "action": {"type": "press", "parameters": {"keys": ["enter"], "new_field": True}},
                    "timestamp_us": 999_500,  # 999.5 ms -> "1000" (half to even)
                    "future": "ignored",
                }
            ],
        }
    )
    expected = (
        "# Trajectory Report\n\n## Goal\n\nLine one.\nLine two.\n\n## Steps\n\nTotal steps: **1**\n\n---\n\n"
        "### Step 0\n\n![Step 0 screenshot](./data/media/images/r/step_1.png)\n\n"
        "**Action:** `press enter`\n\n**Timestamp:** 1000 ms\n"
    )
    assert render_markdown(t) == expected
