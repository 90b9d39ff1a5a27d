"""The batch store contract (`optimizer.evaluation.batchstore.BatchStore`), run against both stores:
the judge cache (``eval``/``confirm --batch``) and the ledger (``run --batch``, `LedgerBatches`).
Driven through the same calls, both must give back the same records: what was stored, not what an
adapter derives."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path

import pytest

from optimizer.evaluation.batchstore import BatchRecord, BatchStore
from optimizer.evaluation.cache import JudgeCache
from optimizer.ledger import Ledger, RunSpec
from optimizer.loop.evaluate import LedgerBatches

WHERE = {"provider": "openai", "endpoint": "https://api.openai.com/v1", "model": "gpt-5"}


@contextmanager
def _cache_store(tmp_path: Path) -> Iterator[BatchStore]:
    with JudgeCache(tmp_path / "cache.sqlite") as cache:
        yield cache


@contextmanager
def _ledger_store(tmp_path: Path) -> Iterator[BatchStore]:
    with Ledger(tmp_path / "ledger.sqlite") as ledger:
        run = ledger.create_run(
            RunSpec(
                strategy="library",
                policy="paired",
                split="sample",
                split_fingerprint="fp",
                start_rev="abc123",
            )
        )
        yield LedgerBatches(ledger, run.id, None)


@pytest.mark.parametrize("store_of", [_cache_store, _ledger_store], ids=["judge-cache", "ledger"])
def test_both_batch_stores_keep_a_batchs_life_the_same_way(
    store_of: Callable[[Path], AbstractContextManager[BatchStore]], tmp_path: Path
) -> None:
    with store_of(tmp_path) as store:
        killed = store.record_batch(**WHERE, custom_ids=["k1"], estimate_usd=0.25)  # id never recorded
        sent = store.record_batch(**WHERE, custom_ids=["k2", "k3"], estimate_usd=0.5)
        store.update_batch(sent, status="submitted", batch_id="batch_2")
        done = store.record_batch(**WHERE, custom_ids=["k4"], estimate_usd=0.1)
        store.update_batch(done, status="submitted", batch_id="batch_3")
        store.update_batch(done, status="collected")
        other_model = store.record_batch(**{**WHERE, "model": "gpt-4o"}, custom_ids=["k5"], estimate_usd=0.1)
        records = store.open_batches(**WHERE)
        store.update_batch(killed, status="abandoned")
        after = store.open_batches(**WHERE)
    assert other_model not in [r.record_id for r in records]
    assert records == [
        BatchRecord(
            record_id=killed,
            **WHERE,
            batch_id=None,
            status="submitting",
            custom_ids=("k1",),
            estimate_usd=0.25,
        ),
        BatchRecord(
            record_id=sent,
            **WHERE,
            batch_id="batch_2",
            status="submitted",
            custom_ids=("k2", "k3"),
            estimate_usd=0.5,
        ),
    ]
    assert [r.record_id for r in after] == [sent]
