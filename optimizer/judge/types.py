"""Plain data passed between render, providers, judge and evaluate (no I/O here)."""

from __future__ import annotations

import ast
import hashlib
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeGuard

if TYPE_CHECKING:
    from optimizer.judge.call_ceiling import CallCeiling

from optimizer.vocab import MISTAKE_TYPES


@dataclass(frozen=True)
class TextPart:
    text: str


@dataclass(frozen=True)
class ImagePart:
    """One encoded image (a screenshot, or a 2×2 tile of four consecutive screenshots)."""

    data: bytes
    media_type: str = "image/jpeg"
    step_ids: tuple[int, ...] = ()


Part = TextPart | ImagePart


@dataclass(frozen=True)
class SandboxFile:
    """One file of a harness judge's sandbox: its path relative to the sandbox folder, its content
    (``data``) or the file to copy it from (``source``), and the sha256 of that content."""

    path: str
    digest: str
    data: bytes | None = None
    source: str | None = None


@dataclass(frozen=True)
class Sandbox:
    """What a harness judge's sandbox folder holds for one item (`optimizer.judge.harness`).
    ``runner`` identifies the command that runs there (the cache keys it with the files)."""

    trajectory_id: str
    runner: str
    files: tuple[SandboxFile, ...]


CacheTTL = Literal["5m", "1h"]


def _text_parts_before(parts: tuple[Part, ...], end: int) -> int:
    return sum(1 for p in parts[:end] if isinstance(p, TextPart))


@dataclass(frozen=True)
class JudgeRequest:
    """What a provider sends: a system prompt and the user content in order.

    ``cache_prefix``: None for the rubric-first layout (the system prompt is judge.md + rubric);
    under trajectory-first, the number of leading ``parts`` that are the same for every candidate
    (goal, steps, screenshots): providers put a cache breakpoint after them (Anthropic, with
    ``cache_ttl``) or route by a key derived from them (OpenAI ``prompt_cache_key``). Neither changes
    what the model reads, so neither is part of `fingerprint`.
    """

    system: str
    parts: tuple[Part, ...]
    # Preprocessing notes for the run record: images dropped, text compressed, budget applied...
    notes: tuple[str, ...] = ()
    cache_prefix: int | None = None
    cache_ttl: CacheTTL | None = None
    # A harness judge's request: the folder its command runs in (None for API providers).
    sandbox: Sandbox | None = None
    # The trajectory judged: routes the call among several endpoints (optimizer.judge.endpoints);
    # not content, so not part of `fingerprint`.
    item_id: str | None = None

    def prefix_key(self) -> str | None:
        """A stable id of the cached prefix (system prompt + the first ``cache_prefix`` parts): the same
        for every candidate judging this item, different between items; None without a prefix. Built from
        the rendered content only, never from labels or keys."""
        if self.cache_prefix is None:
            return None
        h = hashlib.sha256(b"system\0" + self.system.encode())
        for part in self.parts[: self.cache_prefix]:
            if isinstance(part, TextPart):
                h.update(b"\0text\0" + part.text.encode())
            else:
                h.update(b"\0image\0" + hashlib.sha256(part.data).digest())
        return "judgeloop-" + h.hexdigest()[:40]

    def fingerprint(self) -> str:
        """sha256 over everything that determines the request content (not the notes)."""
        h = hashlib.sha256()
        h.update(b"system\0" + self.system.encode())
        for part in self.parts:
            if isinstance(part, TextPart):
                h.update(b"\0text\0" + part.text.encode())
            else:
                h.update(b"\0image\0" + part.media_type.encode() + b"\0" + hashlib.sha256(part.data).digest())
        if self.sandbox is not None:
            h.update(
                b"\0sandbox\0" + self.sandbox.trajectory_id.encode() + b"\0" + self.sandbox.runner.encode()
            )
            for f in self.sandbox.files:
                h.update(b"\0file\0" + f.path.encode() + b"\0" + f.digest.encode())
        return h.hexdigest()

    def without_images(self, note: str) -> JudgeRequest:
        prefix = None if self.cache_prefix is None else _text_parts_before(self.parts, self.cache_prefix)
        return JudgeRequest(
            system=self.system,
            parts=tuple(p for p in self.parts if isinstance(p, TextPart)),
            notes=(*self.notes, note),
            cache_prefix=prefix,
            cache_ttl=self.cache_ttl,
            sandbox=self.sandbox,
            item_id=self.item_id,
        )


@dataclass(frozen=True)
class Sampling:
    """Sampling the user set explicitly; None means "do not send, use the provider's default"."""

    max_tokens: int = 1024
    temperature: float | None = None
    top_p: float | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"max_tokens": self.max_tokens, "temperature": self.temperature, "top_p": self.top_p}


@dataclass(frozen=True)
class ProviderReply:
    """One model reply and its usage, split the way providers bill it: ``input_tokens`` uncached
    input; ``cache_read_tokens`` input read from the prompt cache; ``cache_write_tokens`` input
    written to it (all TTLs), of which ``cache_write_1h_tokens`` with the 1-hour TTL (Anthropic);
    ``output_tokens``. Their sum is the whole prompt + reply."""

    text: str
    model: str
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    raw: dict[str, Any] = field(default_factory=dict)
    cache_write_1h_tokens: int = 0
    # What the call cost as the provider itself reported it (a harness CLI), in US dollars; None:
    # priced from the tokens (`optimizer.judge.providers.pricing`).
    cost_usd: float | None = None


# -- tool-using conversations (the agentic judge) --------------------------------------------------


@dataclass(frozen=True)
class ToolSpec:
    """One tool offered to the model: its name, what it does, and a JSON schema of its arguments."""

    name: str
    description: str
    parameters: dict[str, Any]


@dataclass(frozen=True)
class ToolCall:
    """One tool call the model made. ``arguments`` is the JSON text as the model gave it (it may be
    invalid; the caller answers such a call with an error result)."""

    id: str
    name: str
    arguments: str


# The agentic judge's tools, by name (`optimizer.judge.agentic` implements them).
READ_STEPS = "read_steps"
VIEW_SCREENSHOTS = "view_screenshots"
SUBMIT_VERDICT = "submit_verdict"

CallOutcome = Literal["ok", "refused", "invalid"]


@dataclass(frozen=True)
class JudgeToolCall:
    """One entry of an agentic judge's trace, as data: a tool call and how it was answered.

    ``name`` is the tool's name, or None for an answer given as plain text instead of a tool call.
    ``arguments`` are the call's JSON arguments as the model sent them; None when they were not a
    JSON object, and always None for ``submit_verdict`` (its arguments are the verdict, stored as
    the verdict). ``outcome``: "refused" when the tool answered with an error, "invalid" for a
    verdict that did not parse. Read-only: treat ``arguments`` as frozen too.

    ``str()`` is the trace line that verdict files (``tool_calls``), the optimiser
    (``judge_tool_calls``) and the TUI show: ``read_steps(0-24)``, ``view_screenshots(3, 7)``,
    ``submit_verdict``, ``submit_verdict (invalid)``, ``text answer``, ``foo(…) (refused)``.
    """

    name: str | None
    arguments: dict[str, Any] | None = field(default=None, hash=False)
    outcome: CallOutcome = "ok"

    def __str__(self) -> str:
        if self.name is None:
            return "text answer"
        if self.name == SUBMIT_VERDICT and self.outcome != "refused":
            return SUBMIT_VERDICT + (" (invalid)" if self.outcome == "invalid" else "")
        args = self.arguments
        if isinstance(args, dict) and self.name == READ_STEPS:
            text = f"{READ_STEPS}({args.get('first')}-{args.get('last')})"
        elif isinstance(args, dict) and self.name == VIEW_SCREENSHOTS and isinstance(args.get("steps"), list):
            text = f"{VIEW_SCREENSHOTS}({', '.join(str(s) for s in args['steps'])})"
        else:
            text = f"{self.name}(…)"
        return text + (" (refused)" if self.outcome == "refused" else "")

    def to_json(self) -> dict[str, Any]:
        """A JSON object (the ledger's form): ``name``, plus ``arguments``/``outcome`` when set."""
        out: dict[str, Any] = {"name": self.name}
        if self.arguments is not None:
            out["arguments"] = self.arguments
        if self.outcome != "ok":
            out["outcome"] = self.outcome
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> JudgeToolCall:
        return cls(name=data["name"], arguments=data.get("arguments"), outcome=data.get("outcome", "ok"))

    @classmethod
    def from_text(cls, line: str) -> JudgeToolCall:
        """Parse a trace line as ``str()`` writes it (how ledgers stored traces before they were data).

        ``str(JudgeToolCall.from_text(line)) == line`` for every line ``str()`` produces. Argument values
        come back as the JSON values they print as (``"7"`` → 7); a value that does not print back as
        written stays text."""
        if line == "text answer":
            return cls(name=None)
        if line in (SUBMIT_VERDICT, f"{SUBMIT_VERDICT} (invalid)"):
            return cls(name=SUBMIT_VERDICT, outcome="invalid" if line.endswith("(invalid)") else "ok")
        outcome: CallOutcome = "ok"
        if line.endswith(" (refused)"):
            line, outcome = line[: -len(" (refused)")], "refused"
        if line.endswith("(…)"):
            return cls(name=line[: -len("(…)")], outcome=outcome)
        if line.startswith(f"{VIEW_SCREENSHOTS}(") and line.endswith(")"):
            inner = line[len(VIEW_SCREENSHOTS) + 1 : -1]
            steps = [_printed_value(s) for s in inner.split(", ")] if inner else []
            return cls(name=VIEW_SCREENSHOTS, arguments={"steps": steps}, outcome=outcome)
        if line.startswith(f"{READ_STEPS}(") and line.endswith(")"):
            inner = line[len(READ_STEPS) + 1 : -1]
            m = re.fullmatch(r"(-?\d+|None)-(-?\d+|None)", inner)
            first, _, last = (m.group(1), "-", m.group(2)) if m else inner.partition("-")
            return cls(
                name=READ_STEPS,
                arguments={"first": _printed_value(first), "last": _printed_value(last)},
                outcome=outcome,
            )
        return cls(name=line, outcome=outcome)  # not a line str() writes: keep what there is as the name


def _printed_value(text: str) -> Any:
    """The JSON value that Python prints as ``text`` (``"7"`` → 7, ``"None"`` → None), else ``text``."""
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return text
    return value if str(value) == text else text


@dataclass(frozen=True)
class AssistantTurn:
    """One model reply in a tool-using conversation: its text and its tool calls, in order."""

    text: str
    tool_calls: tuple[ToolCall, ...] = ()

    def to_json(self) -> str:
        return stable_json(
            {"text": self.text, "tool_calls": [[c.id, c.name, c.arguments] for c in self.tool_calls]}
        )

    @classmethod
    def from_json(cls, text: str) -> AssistantTurn:
        data = json.loads(text)
        return cls(text=data["text"], tool_calls=tuple(ToolCall(*c) for c in data["tool_calls"]))


@dataclass(frozen=True)
class ToolResult:
    """The answer to one `ToolCall`: text and images in order; ``is_error`` for a refused call."""

    call_id: str
    parts: tuple[Part, ...]
    is_error: bool = False


@dataclass(frozen=True)
class UserMessage:
    """A user turn. ``cache_prefix``/``cache_ttl`` as in `JudgeRequest` (the agentic judge's opening
    message under trajectory-first: a breakpoint after the trajectory index)."""

    parts: tuple[Part, ...]
    cache_prefix: int | None = None
    cache_ttl: CacheTTL | None = None


@dataclass(frozen=True)
class ToolResults:
    """The answers to every tool call of the preceding `AssistantTurn`, in call order."""

    results: tuple[ToolResult, ...]


ConversationMessage = UserMessage | AssistantTurn | ToolResults


class InfrastructureError(Exception):
    """A transport failure that survived every retry (timeout, 429, 5xx, connection). Never cached."""


Layout = Literal["rubric-first", "trajectory-first"]


@dataclass(frozen=True)
class BatchLimits:
    """What one batch of a provider's batch API may hold: a pass larger than either is sent as
    several batches."""

    max_requests: int
    max_bytes: int


@dataclass(frozen=True)
class ProviderTraits:
    """What a provider can do, declared by the provider (callers read these, never probe for methods).

    ``text_only``: it cannot read images (callers drop screenshots up front). ``layout``: the request
    layout it works best with, overriding judge.toml's; None to follow judge.toml. ``batch``: its batch
    API's limits (it is then a `BatchingProvider`); None without one. ``tool_use``: it holds tool-using
    conversations (it is then a `ConversingProvider`, so the agentic mode can run on it).
    ``max_parallel_calls``: the calls it runs at once (callers give it no more call slots); None for no
    limit of its own. ``demo_label``: for a demonstration-quality judge, what its results say it is,
    wherever they go; None for a real judge. ``sandbox``: for a harness judge (a CLI run in a folder
    per item), the identity of its command: callers build requests with
    `optimizer.judge.harness.sandbox_request` (the trajectory as files, not as parts); None otherwise.
    ``priced_per_call``: its cost cannot be estimated from tokens before a call, so a budget reserves
    ``call_price_usd`` per call and cannot run without one.
    ``prompt_cache``: it caches request prefixes (a cached trajectory is billed at the read price once
    written; calls for one cold prefix go one first, `optimizer.evaluation.warmup`).
    ``call_ceiling``: for a harness judge, the most one call may cost as a budget reserves it (it rises
    with what calls report; `optimizer.judge.call_ceiling`); None: ``call_price_usd`` or the estimate.
    ``confinement``: for a harness judge, how its CLI runs ("bwrap", or "none": unconfined, said in
    every result); None for other providers. ``batch_offline``: its batches run on an engine the user runs
    (`vllm run-batch`), not the provider's batch API: billed as direct calls (no ``[prices] batch``
    multiplier), and no cold item is warmed by a direct call first (that would warm the server's cache)."""

    text_only: bool = False
    layout: Layout | None = None
    batch: BatchLimits | None = None
    tool_use: bool = False
    max_parallel_calls: int | None = None
    demo_label: str | None = None
    sandbox: str | None = None
    priced_per_call: bool = False
    call_price_usd: float | None = None
    prompt_cache: bool = False
    call_ceiling: CallCeiling | None = None
    confinement: str | None = None
    batch_offline: bool = False


class Provider(Protocol):
    name: str
    model: str

    @property
    def traits(self) -> ProviderTraits:
        """What this provider can do (`ProviderTraits`)."""
        ...

    async def complete(
        self, request: JudgeRequest, sampling: Sampling, schema: dict[str, Any]
    ) -> ProviderReply:
        """One judge call. Raises InfrastructureError after retries, UserError for fatal setup problems."""
        ...

    async def aclose(self) -> None: ...

    def run_notes(self) -> tuple[str, ...]:
        """What an evaluation's notes should say about how this provider ran (usually nothing)."""
        ...


class ConversingProvider(Provider, Protocol):
    """A provider that can also hold a tool-using conversation: the agentic judge mode, and the
    optimiser's own model (`optimizer.judge.providers.make_optimizer_provider`)."""

    async def converse(
        self,
        system: str,
        messages: list[ConversationMessage],
        tools: list[ToolSpec],
        sampling: Sampling,
        *,
        cache_conversation: bool = True,
    ) -> tuple[AssistantTurn, ProviderReply]:
        """One model turn of a conversation: its text and tool calls, and the usage (``tools`` may be
        empty). ``cache_conversation=False`` when no turn will follow. Same errors as ``complete``."""
        ...


# -- batch APIs (Anthropic Message Batches, OpenAI Batch) --------------------------------------------


@dataclass(frozen=True)
class BatchState:
    """A submitted batch as the provider reports it: its own status word (``in_progress``,
    ``ended``, ``validating``, ``completed``, ...), whether processing has ended (results can be
    fetched), and the provider's request counts by outcome."""

    batch_id: str
    status: str
    ended: bool
    counts: dict[str, int] = field(default_factory=dict)

    def line(self) -> str:
        counts = ", ".join(f"{k} {v}" for k, v in self.counts.items() if v)
        return f"batch {self.batch_id}: {self.status}" + (f" ({counts})" if counts else "")


@dataclass(frozen=True)
class BatchEntry:
    """One request's outcome in an ended batch, matched by ``custom_id``: a reply (``outcome``
    ``"succeeded"``), or ``"errored"``/``"expired"``/``"canceled"`` with ``error`` saying why."""

    custom_id: str
    outcome: Literal["succeeded", "errored", "expired", "canceled"]
    reply: ProviderReply | None = None
    error: str | None = None


class BatchingProvider(Provider, Protocol):
    """A provider with a batch API: many judge calls submitted at once, answered within 24 hours at
    half price. ``where`` names the endpoint (a batch id means something only there)."""

    where: str

    async def submit_batch(
        self, requests: Sequence[tuple[str, JudgeRequest]], sampling: Sampling, schema: dict[str, Any]
    ) -> BatchState:
        """Submit ``(custom_id, request)`` pairs as one batch. Errors as in ``complete``."""
        ...

    async def batch_state(self, batch_id: str) -> BatchState:
        """The batch's current state (one status request)."""
        ...

    async def batch_results(self, batch_id: str) -> list[BatchEntry]:
        """Every entry of an ended batch (the order is the provider's, not the submission's)."""
        ...


def converses(provider: Provider) -> TypeGuard[ConversingProvider]:
    """Whether ``provider`` declares tool use (``traits.tool_use``): then it is a `ConversingProvider`."""
    return provider.traits.tool_use


def batches(provider: Provider) -> TypeGuard[BatchingProvider]:
    """Whether ``provider`` declares a batch API (``traits.batch``): then it is a `BatchingProvider`."""
    return provider.traits.batch is not None


VERDICT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "success": {"type": "boolean"},
        "reasoning": {"type": "string"},
        "confidence": {"type": "string", "enum": ["low", "medium", "high"]},
        "mistake_type": {
            "anyOf": [
                {"type": "null"},
                {"type": "string", "enum": list(MISTAKE_TYPES)},
            ]
        },
    },
    "required": ["success", "reasoning", "confidence", "mistake_type"],
    "additionalProperties": False,
}


def stable_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
