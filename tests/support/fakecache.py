"""Prompt caching as the providers document it, for the fake LLM server (`tests.support.fakeserver`).

`PromptCache` turns a request body into the usage a real provider would bill, remembering what
earlier requests cached. Token counts are the fake's own (text: characters / 4; an image: width x
height / 750, at least 85, read from the JPEG/PNG header of the base64 data; tool definitions and tool
blocks: their JSON's characters / 4), the same everywhere, so figures compare across layouts and
wires. They are written here, not imported from the engine's estimator (`optimizer.judge.estimate`):
the fake stands for the provider, and tests/test_fake_billing.py checks it against the providers'
documented usage, so a test that the engine's reservation covers the fake's bill compares two things.

Anthropic (Messages API):
- The prompt is a sequence of blocks in the API's cache order: tools, then system blocks, then each
  message's content blocks. A block marked ``cache_control`` is a breakpoint; at most 4 per request
  (more is a 400 error), and a ``ttl: "1h"`` breakpoint may not follow a ``5m`` one (400 error).
- Read: the longest prefix ending at a breakpoint, or at one of the 20 blocks before a breakpoint
  (the API's lookback), that an earlier request wrote and that has not expired.
  ``cache_read_input_tokens`` = its tokens; a read refreshes its lifetime.
- Write: every breakpoint after the hit whose prefix reaches the model's minimum cacheable length
  (1024 tokens; 2048 for Haiku models) is written with its TTL (5m default, or 1h);
  ``cache_creation_input_tokens`` = tokens from the hit to the last written breakpoint, split by the
  TTL of the breakpoint that ends each stretch into ``cache_creation.ephemeral_5m/1h_input_tokens``.
- ``input_tokens`` = the rest (after the last breakpoint, or below the minimum).
- Entries are per model; an entry lives until ``now > expiry`` on the injectable ``clock``.

Both wires: an entry is readable only once the writing response has begun. A request is priced when
it arrives (`begin_anthropic` / `begin_openai`: what it reads is what was visible then); the entries
it writes stay pending until its response begins (`CacheTicket.commit`, which the fake server calls
just before it sends the response), so requests for one prefix that overlap each pay the write. The
fake records each paid write per prefix (`writes`), the count tests assert on. `anthropic` /
`openai` price and commit at once (a request answered before the next one arrives).

OpenAI (Chat Completions):
- The prompt is the token stream tools, response schema, then the messages in order (each prefixed
  by its role). Prompts of 1024 tokens or more are cached, in 128-token increments: every
  128-token boundary of the stream is a cacheable prefix.
- Requests are routed to one of ``openai_machines`` cache machines by a hash of the first 256
  tokens and the ``prompt_cache_key``; a route getting more than ``openai_overflow_per_minute``
  requests within 60 s spills the excess to other machines (OpenAI's documented behaviour, about 15
  requests per minute per prefix and key), whose caches do not have the prefix.
- ``cached_tokens`` = the longest 128-token boundary (≥ 1024) the machine holds; every boundary ≥
  1024 of the request is then stored for ``openai_retention_s`` (24 hours: extended retention, the
  default for organisations without zero data retention).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import io
import json
import math
import threading
import time
from collections import defaultdict, deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from PIL import Image

ANTHROPIC_LOOKBACK_BLOCKS = 20
ANTHROPIC_MAX_BREAKPOINTS = 4
OPENAI_MIN_TOKENS = 1024
OPENAI_INCREMENT = 128
OPENAI_ROUTE_TOKENS = 256
TTL_SECONDS = {"5m": 300.0, "1h": 3600.0}


class CacheRequestError(Exception):
    """The request's cache_control markers break the provider's rules (answered with HTTP 400)."""


class ManualClock:
    """An injectable clock: seconds that move only when `advance` is called."""

    def __init__(self, start: float = 0.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@dataclass(frozen=True)
class CachedUsage:
    """What a request is billed for, in the providers' split (input excludes cache reads and writes)."""

    input_tokens: int
    cache_read_tokens: int = 0
    cache_write_5m_tokens: int = 0
    cache_write_1h_tokens: int = 0

    @property
    def cache_write_tokens(self) -> int:
        return self.cache_write_5m_tokens + self.cache_write_1h_tokens

    @property
    def prompt_tokens(self) -> int:
        return self.input_tokens + self.cache_read_tokens + self.cache_write_tokens


def anthropic_min_tokens(model: str) -> int:
    """The minimum cacheable prompt length of a Claude model (tokens)."""
    return 2048 if "haiku" in model.lower() else 1024


def text_tokens(text: str) -> int:
    return math.ceil(len(text) / 4)


_image_cache: dict[str, int] = {}
_image_lock = threading.Lock()


def image_tokens(b64: str) -> int:
    """Tokens of a base64 image: width x height / 750 from its header (85 when it cannot be read)."""
    key = hashlib.sha256(b64[:4096].encode() + str(len(b64)).encode()).hexdigest()
    with _image_lock:
        if key in _image_cache:
            return _image_cache[key]
    try:
        with Image.open(io.BytesIO(base64.b64decode(b64))) as img:
            width, height = img.size
        tokens = max(85, math.ceil(width * height / 750))
    except (OSError, ValueError, binascii.Error):
        tokens = 85
    with _image_lock:
        _image_cache[key] = tokens
    return tokens


@dataclass
class _Entry:
    expiry: float
    ttl_s: float


@dataclass
class CacheTicket:
    """One priced request whose cache writes become readable when its response begins (`commit`)."""

    usage: CachedUsage
    _cache: PromptCache
    _anthropic: list[tuple[tuple[str, bytes], _Entry]] = field(default_factory=list)
    _openai: list[tuple[int, bytes, float]] = field(default_factory=list)
    committed: bool = False

    def commit(self) -> CachedUsage:
        """The response begins: the entries this request wrote become readable (idempotent)."""
        if not self.committed:
            self.committed = True
            self._cache._commit(self)
        return self.usage


@dataclass
class PromptCache:
    """The caches of both wires, shared by every request the fake server answers."""

    clock: Callable[[], float] = time.monotonic
    openai_machines: int = 4
    openai_overflow_per_minute: int = 15
    openai_retention_s: float = 24 * 3600.0
    _anthropic: dict[tuple[str, bytes], _Entry] = field(default_factory=dict)
    _openai: list[dict[bytes, float]] = field(default_factory=list)
    _routes: dict[bytes, deque[float]] = field(default_factory=lambda: defaultdict(deque))
    _lock: threading.Lock = field(default_factory=threading.Lock)
    # Paid cache writes per written prefix (the digest of its longest written breakpoint / boundary).
    writes: dict[bytes, int] = field(default_factory=lambda: defaultdict(int))

    def __post_init__(self) -> None:
        self._openai = [{} for _ in range(self.openai_machines)]

    def clear(self) -> None:
        with self._lock:
            self._anthropic.clear()
            for machine in self._openai:
                machine.clear()
            self._routes.clear()
            self.writes.clear()

    def _commit(self, ticket: CacheTicket) -> None:
        with self._lock:
            for key, entry in ticket._anthropic:
                self._anthropic[key] = entry
            for machine, digest, expiry in ticket._openai:
                self._openai[machine][digest] = expiry

    def write_counts(self) -> list[int]:
        """The paid writes of each prefix written so far (one per prefix when no two requests for it overlapped)."""
        with self._lock:
            return sorted(self.writes.values())

    # -- Anthropic --------------------------------------------------------------------------------

    def anthropic(self, body: dict[str, Any]) -> CachedUsage:
        """The usage of one Messages request answered at once; raises `CacheRequestError` for invalid markers."""
        return self.begin_anthropic(body).commit()

    def begin_anthropic(self, body: dict[str, Any]) -> CacheTicket:
        """Price one Messages request as it arrives; its writes are readable after ``commit()``."""
        model = str(body.get("model", ""))
        blocks = list(_anthropic_blocks(body))
        breakpoints = [i for i, (_, _, ttl) in enumerate(blocks) if ttl is not None]
        if len(breakpoints) > ANTHROPIC_MAX_BREAKPOINTS:
            raise CacheRequestError(
                f"A maximum of {ANTHROPIC_MAX_BREAKPOINTS} blocks with cache_control may be provided. "
                f"Found {len(breakpoints)}."
            )
        seen_5m = False
        for i in breakpoints:
            ttl = blocks[i][2]
            if ttl == "1h" and seen_5m:
                raise CacheRequestError("a ttl='1h' cache_control block must not come after a ttl='5m' one")
            seen_5m = seen_5m or ttl == "5m"
        digests: list[bytes] = []
        cumulative: list[int] = []
        h = hashlib.sha256(model.encode())
        total = 0
        for key, tokens, _ in blocks:
            h.update(hashlib.sha256(key).digest())
            digests.append(h.digest())
            total += tokens
            cumulative.append(total)
        minimum = anthropic_min_tokens(model)
        with self._lock:
            now = self.clock()
            hit = -1
            for b in breakpoints:
                for j in range(b, max(-1, b - ANTHROPIC_LOOKBACK_BLOCKS), -1):
                    if j <= hit:
                        break
                    entry = self._anthropic.get((model, digests[j]))
                    if entry is not None and entry.expiry >= now:
                        hit = j
                        break
            if hit >= 0:
                entry = self._anthropic[(model, digests[hit])]
                entry.expiry = now + entry.ttl_s  # a read refreshes the entry
            read = cumulative[hit] if hit >= 0 else 0
            written = {"5m": 0, "1h": 0}
            position = read
            pending: list[tuple[tuple[str, bytes], _Entry]] = []
            for b in breakpoints:
                if b <= hit or cumulative[b] < minimum:
                    continue
                ttl = blocks[b][2] or "5m"
                written[ttl] += cumulative[b] - position
                position = cumulative[b]
                pending.append(((model, digests[b]), _Entry(now + TTL_SECONDS[ttl], TTL_SECONDS[ttl])))
            if pending:
                self.writes[pending[-1][0][1]] += 1
        usage = CachedUsage(
            input_tokens=total - position,
            cache_read_tokens=read,
            cache_write_5m_tokens=written["5m"],
            cache_write_1h_tokens=written["1h"],
        )
        return CacheTicket(usage, self, _anthropic=pending)

    # -- OpenAI -----------------------------------------------------------------------------------

    def openai(self, body: dict[str, Any]) -> CachedUsage:
        """The usage of one Chat Completions request answered at once (``cache_read_tokens`` = ``cached_tokens``)."""
        return self.begin_openai(body).commit()

    def begin_openai(self, body: dict[str, Any]) -> CacheTicket:
        """Price one Chat Completions request as it arrives; its writes are readable after ``commit()``."""
        model = str(body.get("model", ""))
        boundaries, total, route_digest = _openai_boundaries(body)
        route = hashlib.sha256(route_digest + str(body.get("prompt_cache_key") or "").encode()).digest()
        with self._lock:
            now = self.clock()
            recent = self._routes[route]
            while recent and recent[0] <= now - 60.0:
                recent.popleft()
            recent.append(now)
            home = int.from_bytes(route[:4], "big") % self.openai_machines
            over = len(recent) - self.openai_overflow_per_minute
            index = home if over <= 0 else (home + over) % self.openai_machines
            machine = self._openai[index]
            cached = 0
            pending: list[tuple[int, bytes, float]] = []
            if total >= OPENAI_MIN_TOKENS:
                for tokens, digest in reversed(boundaries):
                    key = model.encode() + digest
                    expiry = machine.get(key)
                    if tokens >= OPENAI_MIN_TOKENS and expiry is not None and expiry >= now:
                        cached = tokens
                        break
                for tokens, digest in boundaries:
                    if tokens > cached and tokens >= OPENAI_MIN_TOKENS:
                        pending.append((index, model.encode() + digest, now + self.openai_retention_s))
                    elif tokens >= OPENAI_MIN_TOKENS:
                        machine[model.encode() + digest] = now + self.openai_retention_s  # a read refreshes
            if pending:
                self.writes[pending[-1][1]] += 1
        return CacheTicket(
            CachedUsage(input_tokens=total - cached, cache_read_tokens=cached), self, _openai=pending
        )


# -- prompt decomposition ----------------------------------------------------------------------------


def _ttl(block: Any) -> str | None:
    if not isinstance(block, dict) or not isinstance(block.get("cache_control"), dict):
        return None
    return str(block["cache_control"].get("ttl") or "5m")


def _without_marker(block: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in block.items() if k != "cache_control"}


def _anthropic_block_tokens(block: dict[str, Any]) -> int:
    kind = block.get("type")
    if kind == "text":
        return text_tokens(str(block.get("text", "")))
    if kind == "image":
        return image_tokens(str(block.get("source", {}).get("data", "")))
    if kind == "tool_result" and isinstance(block.get("content"), list):
        return sum(_anthropic_block_tokens(b) for b in block["content"] if isinstance(b, dict)) + 8
    return text_tokens(json.dumps(block, sort_keys=True))


def _anthropic_blocks(body: dict[str, Any]) -> Iterator[tuple[bytes, int, str | None]]:
    """(identity, tokens, ttl of its breakpoint or None) per block, in the cache's prefix order."""
    for tool in body.get("tools") or []:
        yield (
            b"tool" + json.dumps(_without_marker(tool), sort_keys=True).encode(),
            text_tokens(json.dumps(tool)),
            _ttl(tool),
        )
    system = body.get("system")
    if isinstance(system, str):
        yield b"system" + system.encode(), text_tokens(system), None
    elif isinstance(system, list):
        for block in system:
            yield (
                b"system" + json.dumps(_without_marker(block), sort_keys=True).encode(),
                _anthropic_block_tokens(block),
                _ttl(block),
            )
    for n, message in enumerate(body.get("messages") or []):
        role = str(message.get("role"))
        content = message.get("content")
        if isinstance(content, str):
            yield f"{n}:{role}:".encode() + content.encode(), text_tokens(content), None
            continue
        for block in content or []:
            ident = f"{n}:{role}:".encode() + json.dumps(_without_marker(block), sort_keys=True).encode()
            yield ident, _anthropic_block_tokens(block), _ttl(block)


def _openai_atoms(body: dict[str, Any]) -> Iterator[str | tuple[bytes, int]]:
    """The prompt as a stream: text pieces, and (identity, tokens) for images."""
    if body.get("tools"):
        yield "tools:" + json.dumps(body["tools"], sort_keys=True)
    if body.get("response_format"):
        yield "schema:" + json.dumps(body["response_format"], sort_keys=True)
    for message in body.get("messages") or []:
        yield f"<|{message.get('role')}|>"
        content = message.get("content")
        if isinstance(content, str):
            yield content
        elif isinstance(content, list):
            for part in content:
                if part.get("type") == "text":
                    yield str(part.get("text", ""))
                elif part.get("type") == "image_url":
                    url = str(part.get("image_url", {}).get("url", ""))
                    data = url.split(",", 1)[1] if "," in url else url
                    yield hashlib.sha256(url.encode()).digest(), image_tokens(data)
        for call in message.get("tool_calls") or []:
            yield json.dumps(call, sort_keys=True)
        if message.get("tool_call_id"):
            yield f"<|call {message['tool_call_id']}|>"


def _openai_boundaries(body: dict[str, Any]) -> tuple[list[tuple[int, bytes]], int, bytes]:
    """(every 128-token boundary as (tokens, digest of the stream up to it), total tokens, the digest of
    the first 256 tokens, which routes the request)."""
    h = hashlib.sha256(b"openai")
    chars = 0.0  # tokens = chars / 4 for text; images add whole tokens
    tokens = 0.0
    boundaries: list[tuple[int, bytes]] = []
    next_boundary = OPENAI_INCREMENT
    route: bytes | None = None

    def passed() -> None:
        nonlocal next_boundary, route
        while tokens >= next_boundary:
            digest = h.digest()
            boundaries.append((next_boundary, digest))
            if next_boundary == OPENAI_ROUTE_TOKENS:
                route = digest
            next_boundary += OPENAI_INCREMENT

    for atom in _openai_atoms(body):
        if isinstance(atom, str):
            rest = atom
            while rest:
                take = max(1, math.ceil((next_boundary - tokens) * 4))
                piece, rest = rest[:take], rest[take:]
                h.update(piece.encode())
                chars += len(piece)
                tokens += len(piece) / 4
                passed()
        else:
            identity, n = atom
            h.update(identity)
            tokens += n
            passed()
    return boundaries, math.ceil(tokens), route if route is not None else h.digest()
