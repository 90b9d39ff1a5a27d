"""Ledger rows for the ledger's tests: a run with the defaults they share and an item's verdicts."""

from __future__ import annotations

from typing import Any

from optimizer.ledger import ItemVerdict, Ledger, ReplicateVerdict, Run, RunSpec


def make_run(ledger: Ledger, *, run_id: str | None = None, **kw: Any) -> Run:
    """A run of the library strategy on the sample split; ``kw`` overrides any of its RunSpec fields."""
    args: dict[str, Any] = dict(
        strategy="library", policy="paired", split="sample", split_fingerprint="fp", start_rev="abc123"
    )
    args.update(kw)
    return ledger.create_run(RunSpec(**args), run_id=run_id)


def make_item(tid: str, success: bool | None, reps: int = 3) -> ItemVerdict:
    """An item judged ``reps`` times alike (replicate 0 cached); an id ending in ``u`` is unstable."""
    return ItemVerdict(
        trajectory_id=tid,
        success=success,
        status="ok" if success is not None else "invalid",
        unstable=reps > 1 and tid.endswith("u"),
        replicates=[
            ReplicateVerdict(
                replicate=r, success=success, reasoning=f"why {tid} {r}", confidence="high", cached=r == 0
            )
            for r in range(reps)
        ],
    )
