"""The data layer's full-form import, byte-identical with the official renderer: the authors' full-form
JSONL and a release rendered by the official script become the same files the official renderer writes;
a source Markdown that is not its JSON's rendering is replaced (moved from tests/test_devset.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from optimizer.cli import main
from optimizer.devset.importer import import_split
from optimizer.devset.verify import verify_split
from optimizer.errors import UserError
from optimizer.scaffold import init_workspace
from optimizer.workspace.workspace import Workspace


@pytest.fixture
def ws(tmp_path: Path) -> Workspace:
    return init_workspace(tmp_path / "ws")


def run(*argv: str) -> int:
    return main(list(argv))


# ---------------------------------------------------------------------------------------------
# Byte-identical with the official renderer (scripts/render_trajectories.py, run with the labels).
# The expected files below are written by hand from its rules, not produced by judgeloop.

TID = "11111111-2222-4333-8444-555555555555"
REC = "rec-0001"


def full_form_row(**changes: Any) -> dict[str, Any]:
    """An authors' full-form trajectory: extra top-level keys, URL/null/converter links, odd timestamps."""
    row: dict[str, Any] = {
        "version": "1.1",
        "trajectory_id": TID,
        "source": {"name": "human", "original_file": "data/new/delivery.json"},
        "task": {"instruction": "Öffne die Datei café.txt ✓", "category": None, "applications": ["Files"]},
        "environment": {"os": "linux", "screen_resolution": None},
        "steps": [
            {
                "step_id": 0,
                "screenshot": f"https://storage.example.com/{REC}/1.png",
                "action": {
                    "type": "click",
                    "parameters": {"x": 10, "y": 20, "button": "left", "num_clicks": 1},
                },
                "thought": None,
                "action_description": None,
                "timestamp_us": 1000.6,
            },
            {
                "step_id": 1,
                "screenshot": None,
                "action": {"type": "type", "parameters": {"text": "naïve"}},
                "thought": None,
                "action_description": None,
                "timestamp_us": "n/a",
            },
            {
                "step_id": 2,
                "screenshot": f"data/media/images/{REC}/step_3.png",
                "action": {"type": "key_down", "parameters": {}},
                "thought": None,
                "action_description": None,
                "timestamp_us": 2500,
            },
            {
                "step_id": 3,
                "action": {"type": "wait", "parameters": {"duration_s": 1.0}},
                "timestamp_us": None,
            },
        ],
        "milestones": [{"step_id": "zero", "description": 5}],  # not projected, so never validated
    }
    row.update(changes)
    return row


OFFICIAL_JSON = """\
{
  "trajectory_id": "11111111-2222-4333-8444-555555555555",
  "task": {
    "instruction": "\\u00d6ffne die Datei caf\\u00e9.txt \\u2713",
    "category": null,
    "applications": [
      "Files"
    ]
  },
  "environment": {
    "os": "linux",
    "screen_resolution": null
  },
  "steps": [
    {
      "step_id": 0,
      "screenshot": "./data/media/images/rec-0001/step_1.png",
      "action": {
        "type": "click",
        "parameters": {
          "x": 10,
          "y": 20,
          "button": "left",
          "num_clicks": 1
        }
      },
      "thought": null,
      "action_description": null,
      "timestamp_us": 1000.6
    },
    {
      "step_id": 1,
      "screenshot": "./data/media/images/rec-0001/step_2.png",
      "action": {
        "type": "type",
        "parameters": {
          "text": "na\\u00efve"
        }
      },
      "thought": null,
      "action_description": null,
      "timestamp_us": "n/a"
    },
    {
      "step_id": 2,
      "screenshot": "./data/media/images/rec-0001/step_3.png",
      "action": {
        "type": "key_down",
        "parameters": {}
      },
      "thought": null,
      "action_description": null,
      "timestamp_us": 2500
    },
    {
      "step_id": 3,
      "action": {
        "type": "wait",
        "parameters": {
          "duration_s": 1.0
        }
      },
      "timestamp_us": null,
      "screenshot": "./data/media/images/rec-0001/step_4.png"
    }
  ]
}
"""

OFFICIAL_MD = """\
# Trajectory Report

## Goal

Öffne die Datei café.txt ✓

## Steps

Total steps: **4**

---

### Step 0

![Step 0 screenshot](./data/media/images/rec-0001/step_1.png)

**Action:** `left-click (10, 20)`

**Timestamp:** 1 ms

---

### Step 1

![Step 1 screenshot](./data/media/images/rec-0001/step_2.png)

**Action:** `type "naïve"`


---

### Step 2

![Step 2 screenshot](./data/media/images/rec-0001/step_3.png)

**Action:** `keydown ?`

**Timestamp:** 2 ms

---

### Step 3

![Step 3 screenshot](./data/media/images/rec-0001/step_4.png)

**Action:** `wait`
"""


def write_source(
    root: Path,
    *,
    rows: list[dict[str, Any]] | None = None,
    files: dict[str, str] | None = None,
    original_id: str = REC,
    images: range = range(1, 5),
) -> Path:
    """A source folder in the authors' layout: labels, optional full-form JSONL and per-item files."""
    root.mkdir(parents=True)
    label = {"trajectory_id": TID, "label": "positive", "original_id": original_id}
    (root / "AgentHorizon.jsonl").write_text(json.dumps(label) + "\n", encoding="utf-8")
    if rows is not None:
        (root / "agenthorizon.jsonl").write_text(
            "".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8"
        )
    for rel, text in (files or {}).items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text, encoding="utf-8")
    folder = root / "data" / "media" / "images" / REC
    folder.mkdir(parents=True)
    for n in images:
        Image.new("RGB", (4, 3), (n, 0, 0)).save(folder / f"step_{n}.png")
    return root


def test_full_form_import_writes_the_official_json_and_markdown_byte_for_byte(
    ws: Workspace, tmp_path: Path
) -> None:
    source = write_source(tmp_path / "src", rows=[full_form_row()])
    seen: list[str] = []
    split = import_split(ws, source, "full", all_items=True, warn=seen.append)  # --all: nothing refused
    assert split.json_path(TID).read_bytes() == OFFICIAL_JSON.encode("ascii")
    assert split.markdown_path(TID).read_bytes() == OFFICIAL_MD.encode("utf-8")
    assert verify_split(split).ok
    assert seen == []


def test_full_form_import_links_the_screenshot_of_a_null_step_even_when_it_is_missing(
    ws: Workspace, tmp_path: Path
) -> None:
    source = write_source(tmp_path / "src", rows=[full_form_row()], images=range(1, 4))  # no step_4.png
    seen: list[str] = []
    split = import_split(ws, source, "full", all_items=True, warn=seen.append)
    assert split.json_path(TID).read_bytes() == OFFICIAL_JSON.encode("ascii")
    assert seen == [
        f"{source / 'data/media/images' / REC / 'step_4.png'}: missing (screenshot of step 3 of {TID})"
    ]
    assert verify_split(split).problems == [
        f"devset/full/sandbox/data/media/images/{REC}/step_4.png: missing screenshot (linked by {TID})"
    ]


def test_without_a_recording_id_the_stored_links_are_kept_as_the_official_renderer_does(
    ws: Workspace, tmp_path: Path
) -> None:
    row = full_form_row(
        task={"instruction": "Go."},
        environment=None,
        steps=[
            {
                "step_id": 0,
                "screenshot": None,
                "action": {"type": "press", "parameters": {"keys": ["enter"]}},
            },
            {"step_id": 1, "screenshot": f"data/media/images/{REC}/step_2.png", "action": {"type": "move"}},
        ],
    )
    source = write_source(tmp_path / "src", rows=[row], original_id="")
    split = import_split(ws, source, "raw", all_items=True)
    expected_json = (
        "{\n"
        f'  "trajectory_id": "{TID}",\n'
        '  "task": {\n'
        '    "instruction": "Go."\n'
        "  },\n"
        '  "steps": [\n'  # a null environment is left out
        "    {\n"
        '      "step_id": 0,\n'
        '      "screenshot": null,\n'
        '      "action": {\n'
        '        "type": "press",\n'
        '        "parameters": {\n'
        '          "keys": [\n'
        '            "enter"\n'
        "          ]\n"
        "        }\n"
        "      }\n"
        "    },\n"
        "    {\n"
        '      "step_id": 1,\n'
        f'      "screenshot": "data/media/images/{REC}/step_2.png",\n'
        '      "action": {\n'
        '        "type": "move"\n'
        "      }\n"
        "    }\n"
        "  ]\n"
        "}\n"
    )
    expected_md = (
        "# Trajectory Report\n\n## Goal\n\nGo.\n\n## Steps\n\nTotal steps: **2**\n\n"
        "---\n\n### Step 0\n\n**Action:** `press enter`\n\n"
        f"---\n\n### Step 1\n\n![Step 1 screenshot](data/media/images/{REC}/step_2.png)\n\n**Action:** `move`\n"
    )
    assert split.json_path(TID).read_text(encoding="ascii") == expected_json
    assert split.markdown_path(TID).read_text(encoding="utf-8") == expected_md
    assert (split.sandbox_root / "data/media/images" / REC / "step_2.png").is_file()
    assert verify_split(split).ok


def test_a_release_rendered_by_the_official_script_is_copied_and_verifies_clean(
    ws: Workspace, tmp_path: Path
) -> None:
    source = write_source(
        tmp_path / "src",
        files={f"agenthorizon_json/{TID}.json": OFFICIAL_JSON, f"agenthorizon_md/{TID}.md": OFFICIAL_MD},
    )
    seen: list[str] = []
    split = import_split(ws, source, "official", all_items=True, warn=seen.append)
    assert split.json_path(TID).read_bytes() == OFFICIAL_JSON.encode()
    assert split.markdown_path(TID).read_bytes() == OFFICIAL_MD.encode()
    assert seen == [] and verify_split(split).ok


def test_a_release_file_in_other_formatting_is_kept_as_it_is(ws: Workspace, tmp_path: Path) -> None:
    compact = json.dumps(json.loads(OFFICIAL_JSON), ensure_ascii=False)  # same content, one line, UTF-8
    source = write_source(tmp_path / "src", files={f"agenthorizon_json/{TID}.json": compact})
    split = import_split(ws, source, "compact", all_items=True)
    assert split.json_path(TID).read_text(encoding="utf-8") == compact
    assert split.markdown_path(TID).read_bytes() == OFFICIAL_MD.encode()
    assert verify_split(split).ok


def test_a_source_markdown_that_is_not_the_rendering_of_its_json_is_warned_and_replaced(
    ws: Workspace, tmp_path: Path
) -> None:
    old_layout = OFFICIAL_MD.replace("---\n\n### Step 1", "### Step 1")  # judgeloop's old single-rule layout
    source = write_source(
        tmp_path / "src",
        files={f"agenthorizon_json/{TID}.json": OFFICIAL_JSON, f"agenthorizon_md/{TID}.md": old_layout},
    )
    seen: list[str] = []
    split = import_split(ws, source, "fixed", all_items=True, warn=seen.append)
    md_src = source / "agenthorizon_md" / f"{TID}.md"
    assert seen == [
        f"{md_src}: differs from the rendering of its JSON at line 21; the rendering was imported"
    ]
    assert split.markdown_path(TID).read_bytes() == OFFICIAL_MD.encode()


@pytest.mark.parametrize(
    ("edit", "line"),
    [
        (lambda md: md.replace("---\n\n### Step 1", "### Step 1"), 21),  # a step without its rule
        (lambda md: md[:-1], 46),  # no final newline: the last line differs
        (lambda md: md + "\n", 47),  # one blank line too many at the end
        (lambda md: md.replace("![Step 2 screenshot](./data/media/images/rec-0001/step_3.png)\n\n", ""), 34),
    ],
)
@pytest.mark.slow
def test_verify_names_a_markdown_that_differs_from_the_rendering_of_its_json(
    ws: Workspace, tmp_path: Path, edit: Any, line: int
) -> None:
    source = write_source(tmp_path / "src", rows=[full_form_row()])
    split = import_split(ws, source, "dev", all_items=True)
    md = split.markdown_path(TID)
    assert OFFICIAL_MD.count("\n") == 46
    md.write_bytes(edit(OFFICIAL_MD).encode())
    assert verify_split(split).problems == [
        f"devset/dev/sandbox/data/markdowns/{TID}.md: differs from the rendering of its JSON at line {line}; "
        "re-import the split"
    ]


def test_a_trajectory_id_repeated_in_the_full_form_jsonl_takes_its_last_line(
    ws: Workspace, tmp_path: Path
) -> None:
    first = full_form_row(task={"instruction": "First."})
    source = write_source(tmp_path / "src", rows=[first, full_form_row()])
    seen: list[str] = []
    split = import_split(ws, source, "dup", all_items=True, warn=seen.append)
    assert split.json_path(TID).read_bytes() == OFFICIAL_JSON.encode("ascii")  # the later row, as officially
    jsonl = source / "agenthorizon.jsonl"
    assert seen == [
        f"{jsonl}:2: trajectory_id {TID} again (first at {jsonl}:1); the later line is used, "
        "as the official renderer does"
    ]


def test_a_float_step_id_is_refused_naming_the_file(ws: Workspace, tmp_path: Path) -> None:
    row = full_form_row(steps=[{"step_id": 0.0, "action": {"type": "move"}}])
    source = write_source(tmp_path / "src", rows=[row])
    with pytest.raises(
        UserError, match=r"agenthorizon\.jsonl:1: steps\.0\.step_id: Input should be a valid integer"
    ):
        import_split(ws, source, "bad", all_items=True)
