"""Write small fake AgentHorizon releases in either layout, for the data-layer tests.

Items come in instruction pairs like the real release: recordings A and B, positives (A with its
own instruction, B with its own) and swapped negatives (A's recording with B's instruction and the
reverse), each negative carrying ``paired_id`` and a mistake type.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from PIL import Image

from optimizer.devset.markdown import render_markdown
from optimizer.models import Trajectory

TYPES = ("Critical Mistake", "Bad Side Effect", "Misunderstanding of the Instruction")


def fake_id(*parts: object) -> str:
    """A deterministic UUID v4-shaped id derived from ``parts``."""
    digest = hashlib.sha256("/".join(map(str, parts)).encode()).digest()[:16]
    return str(uuid.UUID(bytes=digest, version=4))


@dataclass
class FakeItem:
    trajectory_id: str
    label: Literal["positive", "negative"]
    original_id: str
    instruction: str
    paired_id: str | None = None
    mistake_type: str | None = None
    n_steps: int = 3

    def label_row(self) -> dict[str, Any]:
        row: dict[str, Any] = {
            "trajectory_id": self.trajectory_id,
            "label": self.label,
            "original_id": self.original_id,
            "trajectory_scenario": "fake",
        }
        if self.label == "negative":
            row["paired_id"] = self.paired_id
            row["negative_source"] = "parent_instruction_child_trajectory"
            row["mistake_type"] = self.mistake_type
        return row


def pair_items(
    pair: int,
    *,
    positives: tuple[bool, bool] = (True, True),
    types: tuple[str | None, str | None] = ("Critical Mistake", "Bad Side Effect"),
    n_steps: int = 3,
    tag: str = "p",
) -> list[FakeItem]:
    """One instruction pair: up to two positives and the two swapped negatives."""
    rec_a, rec_b = fake_id(tag, pair, "rec", "A"), fake_id(tag, pair, "rec", "B")
    instr_a = f"Save the report of pair {pair} as PDF."
    instr_b = f"Save the report of pair {pair} as DOCX."
    items: list[FakeItem] = []
    if positives[0]:
        items.append(FakeItem(fake_id(tag, pair, "pos", "A"), "positive", rec_a, instr_a, n_steps=n_steps))
    if positives[1]:
        items.append(FakeItem(fake_id(tag, pair, "pos", "B"), "positive", rec_b, instr_b, n_steps=n_steps))
    items.append(
        FakeItem(fake_id(tag, pair, "neg", "A"), "negative", rec_a, instr_b, rec_b, types[0], n_steps)
    )
    items.append(
        FakeItem(fake_id(tag, pair, "neg", "B"), "negative", rec_b, instr_a, rec_a, types[1], n_steps)
    )
    return items


def make_items(n_pairs: int, *, n_steps: int = 3) -> list[FakeItem]:
    """``4 * n_pairs`` items (2 positives, 2 negatives per pair), mistake types cycling."""
    items: list[FakeItem] = []
    for pair in range(n_pairs):
        types = (TYPES[(2 * pair) % 3], TYPES[(2 * pair + 1) % 3])
        items.extend(pair_items(pair, types=types, n_steps=n_steps))
    return items


def step_actions(k: int) -> dict[str, Any]:
    """A varied action for step ``k`` (click, type, hotkey, scroll)."""
    cycle = [
        {"type": "click", "parameters": {"x": 10 + k, "y": 20 + k, "button": "left"}},
        {"type": "type", "parameters": {"text": f"report-{k}.pdf"}},
        {"type": "hotkey", "parameters": {"keys": ["Ctrl", "s"]}},
        {"type": "scroll", "parameters": {"x": 5, "y": 6, "direction": "down", "amount": 120}},
    ]
    return cycle[k % len(cycle)]


@dataclass
class WrittenRelease:
    root: Path
    sandbox_root: Path
    items: list[FakeItem]
    label_files: list[Path] = field(default_factory=list)

    def screenshot(self, item: FakeItem, step_id: int) -> Path:
        return self.sandbox_root / "data" / "media" / "images" / item.original_id / f"step_{step_id + 1}.png"


def trajectory_dict(
    item: FakeItem, *, full_form: bool = False, sandbox_root: Path | None = None
) -> dict[str, Any]:
    """The blind projection of ``item`` (or the full form: version, milestones, absolute links)."""
    steps = []
    for k in range(item.n_steps):
        link = f"./data/media/images/{item.original_id}/step_{k + 1}.png"
        if full_form and sandbox_root is not None:
            link = str(sandbox_root / link)
        steps.append(
            {
                "step_id": k,
                "screenshot": link,
                "action": step_actions(k),
                "thought": f"thinking about step {k}",
                "timestamp_us": 1000 * k + 500,
            }
        )
    traj: dict[str, Any] = {
        "trajectory_id": item.trajectory_id,
        "task": {"instruction": item.instruction, "applications": ["Files"]},
        "environment": {"os": "linux", "screen_resolution": [1280, 800]},
        "steps": steps,
    }
    if full_form:
        traj = {"version": "1.1", **traj, "milestones": [{"step_id": 0, "description": "opened"}]}
    return traj


def write_release(
    root: Path,
    items: list[FakeItem],
    *,
    layout: Literal["release", "authors"] = "release",
    markdown: bool = True,
    full_form: bool = False,
    label_files: dict[str, list[FakeItem]] | None = None,
) -> WrittenRelease:
    """Write ``items`` as a release folder at ``root`` and return where things are.

    ``layout="release"``: labels at the top and ``sandbox/data/{markdowns,jsons,media/images}``;
    ``layout="authors"``: ``agenthorizon_md/``, ``agenthorizon_json/`` and ``data/media/images/``.
    ``label_files`` maps file names to the items they hold (default: all in AgentHorizon.jsonl).
    """
    root.mkdir(parents=True, exist_ok=True)
    if layout == "release":
        sandbox = root / "sandbox"
        md_dir, json_dir = sandbox / "data" / "markdowns", sandbox / "data" / "jsons"
    else:
        sandbox = root
        md_dir, json_dir = root / "agenthorizon_md", root / "agenthorizon_json"
    md_dir.mkdir(parents=True, exist_ok=True)
    json_dir.mkdir(parents=True, exist_ok=True)
    release = WrittenRelease(root, sandbox, items)

    for item in items:
        for k in range(item.n_steps):
            png = release.screenshot(item, k)
            if not png.exists():
                png.parent.mkdir(parents=True, exist_ok=True)
                Image.new("RGB", (8, 6), ((37 * k) % 256, 80, 160)).save(png)
        traj = trajectory_dict(item, full_form=full_form, sandbox_root=sandbox)
        (json_dir / f"{item.trajectory_id}.json").write_text(json.dumps(traj, indent=2), encoding="utf-8")
        if markdown:
            text = render_markdown(Trajectory.model_validate(trajectory_dict(item)))
            (md_dir / f"{item.trajectory_id}.md").write_text(text, encoding="utf-8")

    for name, members in (label_files or {"AgentHorizon.jsonl": items}).items():
        path = root / name
        path.write_text("".join(json.dumps(it.label_row()) + "\n" for it in members), encoding="utf-8")
        release.label_files.append(path)
    return release


def write_manifest(path: Path, ids: list[str], *, comment: str = "# fake manifest") -> Path:
    path.write_text(comment + "\n" + "".join(f"{tid}  # item\n" for tid in ids) + "\n", encoding="utf-8")
    return path
