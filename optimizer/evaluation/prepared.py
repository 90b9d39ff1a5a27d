"""The records an `optimizer.evaluation.judging.ItemJudge` is given and hands back: `JudgeSetup` (how it
judges: sampling, replicates, concurrency, prices, budget) and `PreparedItem` (an item ready to be judged:
its cache lookups and the calls still to make). Plain data; judge-input side: never reads labels."""

from __future__ import annotations

from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from optimizer.evaluation.budget import Budget
from optimizer.evaluation.results import ReplicateResult
from optimizer.evaluation.warmup import PrefixWarmth
from optimizer.judge.memory import Retriever
from optimizer.judge.types import JudgeRequest, Sampling


@dataclass(frozen=True)
class PreparedItem:
    """An item ready to be judged: its notes, each replicate's cache key and cached result (None:
    a call is needed), and the calls to make, each to be started holding one `ItemJudge.slots` slot."""

    trajectory_id: str
    notes: tuple[str, ...]
    looked_up: list[tuple[str, ReplicateResult | None]]
    calls: Sequence[Callable[[], Coroutine[Any, Any, ReplicateResult]]]
    # Direct mode: the rendered request (None when every replicate is cached) and its fingerprint,
    # for a batch that sends the missing replicates instead of `calls`.
    request: JudgeRequest | None = None
    fingerprint: str = ""
    # A panel: each member's label; ``looked_up`` is then member-major (every replicate of the
    # first member, then of the second...), and ``request`` None (a batch cannot send a panel).
    members: tuple[str, ...] = ()


@dataclass(frozen=True)
class JudgeSetup:
    """How an `ItemJudge` judges: the ``sampling``, ``replicates`` calls per item (replicate indices
    from ``first_replicate``), ``concurrency`` calls in flight at most, the ``prices`` table
    (US dollars per million tokens, `optimizer.judge.providers.pricing`), the ``budget`` (None: no
    limit), where encoded screenshots are shared (``image_cache_dir``), the cached-prefix warmth
    (None: the process's own, `optimizer.evaluation.warmup.WARM_PREFIXES`) and the memory retriever
    (None: memory off)."""

    sampling: Sampling
    replicates: int
    concurrency: int
    prices: dict[str, Any]
    budget: Budget | None
    image_cache_dir: Path | None
    first_replicate: int = 0
    warmth: PrefixWarmth | None = None
    memory: Retriever | None = None
