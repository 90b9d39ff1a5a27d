"""A tiny dev split and a `ProposalContext` over it, for the strategy tests."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from optimizer.devset.importer import import_split
from optimizer.devset.split import Split
from optimizer.loop.strategies import Disagreement, PastExperiment, ProposalContext
from optimizer.scaffold import init_workspace
from optimizer.workspace.workspace import Workspace
from tests.support.data import FakeItem, make_items, pair_items, write_release

ALLOWED = ["prompts/judge.md", "prompts/rubric.md"]


@dataclass
class DevFixture:
    ws: Workspace
    split: Split
    items: list[FakeItem]
    heldout: list[FakeItem]  # items that exist in no split of the workspace


def make_dev(tmp_path: Path, *, n_pairs: int = 2, n_steps: int = 4) -> DevFixture:
    """A fresh workspace with split ``dev`` of ``4 * n_pairs`` items, screenshots 8×6 PNGs."""
    ws = init_workspace(tmp_path / "ws")
    items = make_items(n_pairs, n_steps=n_steps)
    release = write_release(tmp_path / "release", items)
    split = import_split(ws, release.root, "dev", all_items=True, warn=lambda _m: None)
    heldout = pair_items(99, tag="heldout")
    return DevFixture(ws, split, items, heldout)


def disagreements_for(items: list[FakeItem], *, missed: int, rejected: int) -> list[Disagreement]:
    """``missed`` negatives judged successful and ``rejected`` positives judged failed, from ``items``."""
    negatives = [i for i in items if i.label == "negative"][:missed]
    positives = [i for i in items if i.label == "positive"][:rejected]
    out = [
        Disagreement(
            i.trajectory_id,
            i.instruction,
            False,
            i.mistake_type,
            True,
            "The agent saved the report, so the task looks complete.",
            "high",
            False,
        )
        for i in negatives
    ]
    out += [
        Disagreement(
            i.trajectory_id,
            i.instruction,
            True,
            None,
            False,
            "I cannot see the file being saved.",
            "low",
            k % 2 == 1,
        )
        for k, i in enumerate(positives)
    ]
    return out


def make_context(
    dev: DevFixture,
    disagreements: list[Disagreement],
    *,
    history: list[PastExperiment] | None = None,
    seq: int = 1,
    seed: int = 0,
    allowed: list[str] | None = None,
    guidance: str = "Prefer short rules.",
) -> ProposalContext:
    allowed = list(ALLOWED if allowed is None else allowed)
    files = {p: (dev.ws.root / p).read_text(encoding="utf-8") for p in allowed}
    return ProposalContext(
        workspace_root=dev.ws.root,
        allowed_files=allowed,
        current_files=files,
        disagreements=disagreements,
        history=list(history or []),
        guidance=guidance,
        split=dev.split,
        rng_seed=seed,
        experiment_seq=seq,
    )
