"""What the parts of `benchmarks/cache_cost.py` share: the wires' models, the layouts and modes, the
fake's paced clock, and the long-item split with its baseline and candidate prompt sets."""

from __future__ import annotations

import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from optimizer.devset.importer import import_split
from optimizer.devset.split import Split
from optimizer.evaluation.batch import BatchOptions
from optimizer.judge.prompts import JUDGE_TOML, RUBRIC_MD, PromptSet
from optimizer.scaffold import init_workspace
from optimizer.workspace.workspace import Workspace
from tests.support.config import with_layout
from tests.support.data import make_items, write_release

MODELS = {"anthropic": "claude-sonnet-4-5", "openai": "gpt-5"}
LAYOUTS = ("rubric-first", "trajectory-first")
MINUTES_PER_CANDIDATE = 20.0
# How the calls are sent: one request per call, or each pass as one batch through the batch API.
MODES = ("direct", "batch")
TODAY = ("rubric-first", "direct")  # what every cell's ratio is to
# Batches on the fake end at the first status poll; poll fast so the benchmark times the judge work.
FAST_POLLS = BatchOptions(poll_s=0.01, poll_max_s=0.05)


class PacedClock:
    """The fake's clock: ``step_s`` simulated seconds pass with every request it bills."""

    def __init__(self, step_s: float) -> None:
        self.now = 0.0
        self.step_s = step_s

    def __call__(self) -> float:
        self.now += self.step_s
        return self.now


def build(root: Path, n: int, steps: int) -> tuple[Workspace, Split]:
    ws = init_workspace(root / "ws")
    items = make_items(math.ceil(n / 4), n_steps=steps)[:n]
    for i, item in enumerate(items):
        item.instruction = f"{item.instruction} (benchmark task {i})"
    release = write_release(root / "release", items, markdown=False)
    split = import_split(ws, release.root, "long", all_items=True, warn=lambda _m: None)
    return ws, split


def prompt_sets(ws: Workspace, layout: str, candidates: int) -> list[PromptSet]:
    """The baseline and ``candidates`` rubric edits (one more rule each), all with ``layout``."""
    files = dict(PromptSet.from_dir(ws.prompts_dir).files)
    files[JUDGE_TOML] = with_layout(files[JUDGE_TOML], layout)
    out = [PromptSet.from_files(files)]
    for k in range(1, candidates + 1):
        edited = dict(files)
        edited[RUBRIC_MD] = (
            files[RUBRIC_MD] + f"\n- Candidate rule {k}: re-check requirement {k} in the final state.\n"
        )
        out.append(PromptSet.from_files(edited))
    return out
