"""Several replicas of one judge model (``[judge] base_urls``): which endpoint serves which item.

A self-hosted server (vLLM, SGLang) keeps in its prefix cache only the items it has seen, so
spreading one item's calls over replicas loses most cache hits. Each item therefore goes to one
endpoint, chosen by consistent hashing of its trajectory id on a ring with `VNODES` virtual nodes
per endpoint: every candidate's calls for an item reach the replica that already holds its prefix,
and taking one endpoint out (`EndpointPool.drain`) moves only the items it owned, spread over the
rest, while every other item stays where its prefix is cached.

An endpoint is drained (until every endpoint has been: then all are tried again) when a call to it fails
in a way that says the server is gone or broken (connection refused or timed out, HTTP 5xx after
the SDK's retries); the caller re-sends that call to the item's next endpoint on the ring.
"""

from __future__ import annotations

import hashlib
import threading
from bisect import bisect_right
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar, runtime_checkable

# How every line of `report_lines` begins (the loop shows these lines after each evaluation).
ENDPOINT_NOTE = "endpoint "
# Virtual nodes per endpoint: enough that items spread within a few percent of evenly.
VNODES = 160

C = TypeVar("C")


def _point(text: str) -> int:
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big")


class HashRing:
    """A consistent-hash ring over endpoint names, `VNODES` points per name."""

    def __init__(self, names: Sequence[str], vnodes: int = VNODES) -> None:
        if not names:
            raise ValueError("a hash ring needs at least one endpoint")
        points = sorted((_point(f"{name}#{v}"), name) for name in names for v in range(vnodes))
        self._hashes = [h for h, _ in points]
        self._names = [n for _, n in points]

    def owner(self, key: str, excluded: frozenset[str] | set[str] = frozenset()) -> str | None:
        """The first endpoint clockwise from ``key``'s point that is not ``excluded`` (None: all are)."""
        start = bisect_right(self._hashes, _point(key))
        n = len(self._names)
        for step in range(n):
            name = self._names[(start + step) % n]
            if name not in excluded:
                return name
        return None


@dataclass
class EndpointStats:
    """What one endpoint served since the last report: calls answered, their prompt tokens, of them
    cached, and the calls that failed there (after the SDK's retries; each one drained it)."""

    calls: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    failures: int = 0

    @property
    def hit_rate(self) -> float | None:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else None


# One pass's figures per endpoint (its address without credentials): calls, prompt_tokens,
# cached_tokens, failures, and drained (1 when the endpoint was drained during the pass, else 0).
EndpointFigures = dict[str, dict[str, int]]
FIGURE_KEYS = ("calls", "prompt_tokens", "cached_tokens", "failures", "drained")


@runtime_checkable
class EndpointReporting(Protocol):
    """A provider that spreads calls over several endpoints and counts what each served."""

    def take_endpoint_pass(self) -> EndpointFigures:
        """The figures since the last call of this method (one evaluation pass), then from zero."""
        ...


class EndpointPool(Generic[C]):
    """Endpoints by name (their base URL) with a client each; routes items, drains failed endpoints
    and counts what each served. Thread- and task-safe (calls finish concurrently)."""

    def __init__(self, clients: Mapping[str, C], vnodes: int = VNODES) -> None:
        self.clients = dict(clients)
        self.ring = HashRing(list(self.clients), vnodes)
        self.drained: dict[str, str] = {}  # name -> why, in draining order
        self.totals = {name: EndpointStats() for name in self.clients}
        self._since = {name: EndpointStats() for name in self.clients}
        self._pass = {name: EndpointStats() for name in self.clients}  # `take_pass`'s own counters
        self._pass_drained: set[str] = set()
        self._reported_drains = 0
        self._revived: dict[str, str] = {}  # drained, then put back when every endpoint had failed
        self._lock = threading.Lock()

    def route(self, key: str) -> tuple[str, C] | None:
        """The endpoint serving ``key`` (an item's id) and its client; None when every one is drained."""
        with self._lock:
            name = self.ring.owner(key, set(self.drained))
        return None if name is None else (name, self.clients[name])

    def drain(self, name: str, reason: str) -> bool:
        """Take ``name`` out of the ring (its items rehash to the rest); False if it already was."""
        with self._lock:
            if name in self.drained:
                return False
            self.drained[name] = reason
            return True

    def fail(self, name: str, reason: str) -> bool:
        """Count one failed call of ``name`` and drain it (`drain`)."""
        with self._lock:
            for stats in (self.totals[name], self._since[name], self._pass[name]):
                stats.failures += 1
            self._pass_drained.add(name)
        return self.drain(name, reason)

    def revive_all(self) -> None:
        """Put every drained endpoint back in the ring (they have all failed: the next call tries
        again rather than failing at once for the rest of the run); the drains stay reported."""
        with self._lock:
            self._revived.update(self.drained)
            self.drained = {}

    def ever_drained(self, name: str) -> bool:
        with self._lock:
            return name in self.drained or name in self._revived

    def record(self, name: str, prompt_tokens: int, cached_tokens: int) -> None:
        """Count one answered call of ``name``."""
        with self._lock:
            for stats in (self.totals[name], self._since[name], self._pass[name]):
                stats.calls += 1
                stats.prompt_tokens += prompt_tokens
                stats.cached_tokens += cached_tokens

    def take_report(self) -> tuple[dict[str, EndpointStats], list[tuple[str, str]]]:
        """Per endpoint, what it served since the last report, and the endpoints drained since;
        both start again from zero."""
        with self._lock:
            since, self._since = self._since, {name: EndpointStats() for name in self.clients}
            every = list({**self._revived, **self.drained}.items())
            drains = every[self._reported_drains :]
            self._reported_drains = len(every)
        return since, drains

    def take_pass(self) -> dict[str, tuple[EndpointStats, bool]]:
        """Per endpoint, what it served since the last call of this method and whether it was
        drained meanwhile; both start again from zero (independent of `take_report`)."""
        with self._lock:
            taken, self._pass = self._pass, {name: EndpointStats() for name in self.clients}
            drained, self._pass_drained = self._pass_drained, set()
        return {name: (stats, name in drained) for name, stats in taken.items()}


def report_lines(since: Mapping[str, EndpointStats], drains: Sequence[tuple[str, str]]) -> list[str]:
    """One line per endpoint (calls, cached share of prompt tokens) and one per drained endpoint."""
    lines = []
    for name, stats in since.items():
        rate = stats.hit_rate
        share = "" if rate is None else f" ({rate:.0%})"
        lines.append(
            f"{ENDPOINT_NOTE}{name}: {stats.calls} calls, {stats.cached_tokens:,} of "
            f"{stats.prompt_tokens:,} prompt tokens cached{share}"
        )
    for name, why in drains:
        lines.append(f"{ENDPOINT_NOTE}{name} drained ({why}); its items were rehashed to the other endpoints")
    return lines


def shown_url(url: str) -> str:
    """``url`` without any user:password part (reports and files never carry credentials)."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    host, slash, path = rest.partition("/")
    return f"{scheme}://{host.rpartition('@')[2]}{slash}{path}"


def affinity_key(route: str) -> str:
    """The per-item affinity key a router in front of several servers routes by (``[judge]
    affinity_header``): a hash of what judgeloop's own ring routes by, ``route`` (a direct call's
    trajectory id; a conversation's prefix key), so every candidate's and replicate's calls for one item
    carry the same key and different items different keys. Only a hash leaves: never a label, a key or
    the id itself."""
    return "judgeloop-" + hashlib.sha256(b"judgeloop-affinity\0" + route.encode()).hexdigest()[:32]
