"""The one batch store interface: where a batch pass (`optimizer.evaluation.batch`) records the
batches it submits, durably, so a killed process's batch is collected, never submitted twice.

Two stores implement it, because two kinds of command send batches:
- `JudgeCache` (its ``batches`` table) for ``eval --batch`` and ``confirm --batch``, which have no
  run: the workspace's judge-call cache is the only durable place they write;
- `optimizer.loop.evaluate.LedgerBatches` (the ledger's ``batches`` table) for ``run --batch``: the
  run's record, each batch under its run and experiment, which ``run --resume`` reports and collects.

Both return the same `BatchRecord`, holding only what both tables store.
Judge-input side: never reads labels.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol, cast, get_args

# A batch's life in a batch store: recorded just before submission, submitted (the provider gave
# its id), collected (every answer is in the cache), or abandoned (never accepted, or unknown).
BatchStatus = Literal["submitting", "submitted", "collected", "abandoned"]
OPEN_BATCH_STATUSES: tuple[BatchStatus, ...] = ("submitting", "submitted")


def batch_status(text: str) -> BatchStatus:
    """``text`` (a stored status) as a `BatchStatus`; a ValueError for anything else."""
    if text not in get_args(BatchStatus):
        raise ValueError(f"unknown batch status {text!r}")
    return cast(BatchStatus, text)


@dataclass(frozen=True)
class BatchRecord:
    """A batch of judge calls as a batch store keeps it.

    ``endpoint`` is where the batch lives (a batch id means something only there; never a key);
    ``batch_id`` is None until the provider accepted it; ``custom_ids`` are the judge-call cache keys
    of its calls; ``estimate_usd`` what was reserved for it (US dollars, at the batch price)."""

    record_id: int
    provider: str
    endpoint: str
    model: str
    batch_id: str | None
    status: BatchStatus
    custom_ids: tuple[str, ...]
    estimate_usd: float


class BatchStore(Protocol):
    """Where submitted batches are recorded durably (see the module docstring for the two stores)."""

    def record_batch(
        self, *, provider: str, endpoint: str, model: str, custom_ids: list[str], estimate_usd: float
    ) -> int:
        """Record a batch about to be submitted (status ``submitting``); its record id."""
        ...

    def update_batch(self, record_id: int, *, status: BatchStatus, batch_id: str | None = None) -> None:
        """Set a recorded batch's status (and its provider id, once known)."""
        ...

    def open_batches(self, *, provider: str, endpoint: str, model: str) -> list[BatchRecord]:
        """Batches recorded for this provider, endpoint and model and not yet collected, oldest first."""
        ...
