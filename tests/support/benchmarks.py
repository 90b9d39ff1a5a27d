"""Small folders written in other benchmarks' published schemas (the data cannot be downloaded here).

`write_arb` writes an AgentRewardBench download (``annotations.csv``, ``cleaned/<benchmark>/<agent>/
<experiment>/<task_id>.json``, ``screenshots/...``) and `write_osreward` an OSReward trace folder (one
JSON per trace, screenshots beside it), each with the fields `optimizer.devset.formats` reads and some it
must leave behind (a benchmark's own reward, accessibility trees).
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from PIL import Image

ARB_AGENT = "GenericAgent-gpt-4o-2024-11-20"
ARB_OTHER_AGENT = "GenericAgent-anthropic_claude-3.7-sonnet"
ARB_COLUMNS = [
    "annotator_name",
    "benchmark",
    "task_id",
    "model_name",
    "trajectory_success",
    "trajectory_side_effect",
    "trajectory_optimality",
    "trajectory_looping",
]


def png(path: Path, shade: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (8, 6), (shade % 256, 90, 150)).save(path)


@dataclass
class ArbItem:
    task_id: str
    success: str  # Successful | Unsuccessful | Unsure
    agent: str = ARB_AGENT
    benchmark: str = "webarena"
    goal: str = ""
    steps: int = 3
    trajectory: dict[str, Any] = field(default_factory=dict)  # overrides of the trajectory file's keys

    @property
    def item_id(self) -> str:
        return f"{self.task_id}.{self.agent}"


def arb_items() -> list[ArbItem]:
    return [
        ArbItem("webarena.177", "Successful", goal='Change my reddit bio to "Pro Python Developer"'),
        ArbItem("webarena.155", "Unsuccessful", goal="Open the most upvoted post in r/books"),
        ArbItem(
            "webarena.155",
            "Successful",
            agent=ARB_OTHER_AGENT,
            goal="Open the most upvoted post in r/books",
            steps=4,
        ),
        ArbItem("webarena.400", "Unsuccessful", agent=ARB_OTHER_AGENT, goal="Star the judgeloop repository"),
        ArbItem(
            "workarena.servicenow.order-apple-watch-l2",
            "Successful",
            benchmark="workarena",
            goal="Order an Apple Watch",
        ),
        ArbItem("webarena.12", "Unsure", goal="Find the cheapest lamp"),
    ]


def write_arb(root: Path, items: list[ArbItem], *, extra_rows: list[dict[str, str]] | None = None) -> Path:
    """An AgentRewardBench download at ``root``: the annotations (a secondary annotation of the first item
    too, with the opposite label) and one cleaned trajectory with screenshots per item."""
    root.mkdir(parents=True, exist_ok=True)
    rows = []
    for item in items:
        rows.append(
            {
                "annotator_name": "A",
                "benchmark": item.benchmark,
                "task_id": item.task_id,
                "model_name": item.agent,
                "trajectory_success": item.success,
                "trajectory_side_effect": "No",
                "trajectory_optimality": "2. Suboptimal",
                "trajectory_looping": "No",
            }
        )
        exp = f"{item.agent}_on_{item.benchmark}"
        stem = item.task_id
        steps = []
        for k in range(item.steps):
            shot = f"trajectories/screenshots/{item.benchmark}/{item.agent}/{stem}/screenshot_step_{k}.png"
            png(root / shot.removeprefix("trajectories/"), 40 * k + len(item.task_id))
            steps.append(
                {
                    "num": k,
                    "reasoning": f"Step {k} of {item.task_id}: I look at the page first.",
                    "action": f"click('a{k + 50}')" if k < item.steps - 1 else "send_msg_to_user('done')",
                    "screenshot_path": shot,
                    "url": f"https://wa-forum.example.org/{k}",
                    "axtree_pruned": "[24] navigation ''",
                    "last_action_error": "",
                }
            )
        traj: dict[str, Any] = {
            "benchmark": item.benchmark,
            "agent": item.agent,
            "model": item.agent.removeprefix("GenericAgent-"),
            "goal": item.goal + "\n",
            "seed": 23,
            "summary_info": {
                "n_steps": item.steps,
                "cum_reward": 1.0 if item.success == "Successful" else 0.0,
            },
            "steps": steps,
        }
        traj.update(item.trajectory)
        path = root / "cleaned" / item.benchmark / item.agent / exp / f"{item.task_id}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(traj), encoding="utf-8")
    if items:
        second = dict(rows[0], annotator_name="F")
        second["trajectory_success"] = "Unsuccessful" if items[0].success == "Successful" else "Successful"
        rows.append(second)
    rows.extend(extra_rows or [])
    with (root / "annotations.csv").open("w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=ARB_COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
    return root


def arb_trajectory_file(root: Path, item: ArbItem) -> Path:
    return (
        root
        / "cleaned"
        / item.benchmark
        / item.agent
        / f"{item.agent}_on_{item.benchmark}"
        / f"{item.task_id}.json"
    )


@dataclass
class OsrTrace:
    trace_id: str
    human_label: Any  # SUCCESS | FAIL (anything else: a malformed trace)
    instruction: str = "Turn on Dark Mode in the Settings app."
    steps: int = 3
    folder: str = "desktop"
    extra: dict[str, Any] = field(default_factory=dict)


def osreward_traces() -> list[OsrTrace]:
    return [
        OsrTrace("dark_mode_0", "SUCCESS"),
        OsrTrace("dark_mode_1", "FAIL", instruction="Turn on Dark Mode and set the accent colour to green."),
        OsrTrace("calendar_0", "SUCCESS", instruction="Add an event on 3 May.", folder="mobile/aw"),
        OsrTrace("calendar_1", "FAIL", instruction="Delete every event on 3 May.", folder="mobile/aw"),
    ]


def write_osreward(root: Path, traces: list[OsrTrace]) -> Path:
    """One ``<trace_id>.json`` per trace under ``root/<folder>/``, screenshots in ``screenshots/<trace_id>/``
    beside it (the last step's screenshot null: a frame not recorded), plus a JSON that is not a trace."""
    for trace in traces:
        folder = root / trace.folder
        stem = trace.trace_id.replace("/", "_").replace(".", "_")  # a hostile id still gets a file inside
        steps = []
        for k in range(trace.steps):
            shot = None
            if k < trace.steps - 1:
                shot = f"screenshots/{stem}/step_{k:04d}.png"
                png(folder / shot, 30 * k + len(trace.trace_id))
            steps.append(
                {
                    "step_index": k,
                    "screenshot_path": shot,
                    "raw_response": None,
                    "thought": f"{trace.trace_id} step {k}: the Settings app is open.",
                    "action": f"click(coordinate=[{100 + k}, 608])"
                    if k < trace.steps - 1
                    else "terminate(status='success')",
                    "coordinate": [100 + k, 608],
                    "meta_action": "click",
                }
            )
        body: dict[str, Any] = {
            "trace_id": trace.trace_id,
            "task_id": f"task_{trace.trace_id}",
            "platform": "Desktop",
            "agent": "example-agent",
            "instruction": trace.instruction,
            "trajectory": steps,
            "trajectory_length": trace.steps,
            "human_label": trace.human_label,
            "human_alignment": 1.0,
            "human_efficiency": 0.5,
        }
        body.update(trace.extra)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{stem}.json").write_text(json.dumps(body), encoding="utf-8")
    root.mkdir(parents=True, exist_ok=True)
    (root / "results.json").write_text(json.dumps({"model": "gpt-4o", "accuracy": 0.5}), encoding="utf-8")
    return root
