"""The Anthropic Messages provider, through the official ``anthropic`` SDK (2.x).

- The key comes only from ``ANTHROPIC_API_KEY`` and is passed to the client explicitly (so the SDK
  consults no profile or other credential source); a missing key is a UserError at construction.
- The system prompt is one text block marked ``cache_control: ephemeral``: every item of a split
  shares it, so the judge prompt + rubric is billed at the cache-read price after the first call.
- Under ``layout = "trajectory-first"`` (`JudgeRequest.cache_prefix`) the last block of the
  trajectory carries a second breakpoint, and both carry ``ttl`` = ``cache_ttl`` ("1h" by default):
  the next candidate re-reads the trajectory at the cache-read price. Usage is split as billed:
  ``input_tokens`` (uncached), ``cache_read_input_tokens``, ``cache_creation_input_tokens`` and its
  ``cache_creation.ephemeral_1h_input_tokens`` part (the 1-hour writes, priced apart).
- Images are base64 image blocks, in order with the text blocks.
- Structured output: ``output_config={"format": {"type": "json_schema", "schema": ...}}``.
- SDK 2.x has no ``temperature``/``top_p`` arguments; they go in the request body, and only when
  the user set them.
- The call is the client's own ``post("/v1/messages", cast_to=Message)`` with the body pre-encoded
  as bytes (base64 images spliced in, never scanned by the JSON encoder), which is what
  ``messages.create`` sends for these arguments minus its per-call JSON encoding of ~300 KB of
  base64 per 12-screenshot request; the SDK's transport, auth headers, retries and error classes
  are unchanged.
- Tool-using conversations (`converse`: the agentic judge, and the optimiser's own model) send
  ``tools`` (none: no ``tools`` key) and the conversation so far: the model's turns as ``text`` +
  ``tool_use`` blocks, tool answers as ``tool_result`` blocks (screenshots as image blocks inside
  them). Besides the system block, the last block of the conversation is marked ``cache_control``
  (unless the caller says no turn will follow), so each turn re-reads the previous turns at the
  cache-read price.
- ``role`` (`_common.Role`): whose model this is — the judge's or the optimiser's; it words the
  errors a user reads, nothing else.
- Retries (429 honouring ``retry-after``, 5xx, timeouts, connection errors) are the SDK's own,
  ``max_retries`` times; what survives becomes `InfrastructureError` or `UserError`.
- Batches (`submit_batch`, `batch_state`, `batch_results`): the Message Batches API through the
  SDK's ``messages.batches`` (create, retrieve, results: the JSONL at ``results_url``); each request's
  ``params`` is exactly the body `complete` would post, its ``custom_id`` the caller's (a judge-call
  cache key: 64 hex characters, within the API's ``[A-Za-z0-9_-]{1,64}``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import anthropic
from anthropic.types import Message
from anthropic.types.messages import MessageBatch

from optimizer.judge.providers._common import (
    JUDGE,
    ImageString,
    Role,
    Secret,
    WireProvider,
    http_client_options,
    key_from_env,
    quote_server_message,
)
from optimizer.judge.types import (
    AssistantTurn,
    BatchEntry,
    BatchLimits,
    BatchState,
    CacheTTL,
    ConversationMessage,
    ImagePart,
    JudgeRequest,
    Part,
    ProviderReply,
    ProviderTraits,
    Sampling,
    TextPart,
    ToolCall,
    ToolResults,
    ToolSpec,
    UserMessage,
    stable_json,
)
from optimizer.workspace.config import JudgeSection

KEY_ENV = "ANTHROPIC_API_KEY"
DEFAULT_BASE_URL = "https://api.anthropic.com"


class AnthropicProvider(WireProvider):
    """`optimizer.judge_types.Provider` for Claude models."""

    name = "anthropic"
    # Message Batches limits: a pass larger than this is sent as several batches.
    traits = ProviderTraits(
        batch=BatchLimits(max_requests=100_000, max_bytes=256 * 1024 * 1024), tool_use=True, prompt_cache=True
    )
    default_base_url = DEFAULT_BASE_URL
    key_env = KEY_ENV

    def __init__(self, judge: JudgeSection, *, role: Role = JUDGE) -> None:
        self.model = judge.model
        self.base_url = judge.base_url
        self.role = role
        self._secret = self.read_key(judge, role)
        self._max_retries = judge.max_retries
        self._ever_succeeded = False
        assert self._secret is not None
        self._client = anthropic.AsyncAnthropic(
            api_key=self._secret.reveal(),
            base_url=judge.base_url,
            timeout=judge.timeout_s,
            max_retries=judge.max_retries,
            http_client=anthropic.DefaultAsyncHttpxClient(**http_client_options(judge.max_concurrency)),
        )

    @classmethod
    # judge: the signature every provider shares (OpenAI's reads it).
    def read_key(cls, judge: JudgeSection, role: Role = JUDGE) -> Secret | None:  # noqa: ARG003
        """The key this provider sends; a missing one is a `UserError` worded for ``role``."""
        return key_from_env(KEY_ENV, required=True, role=role, provider=cls.name)

    def _body(
        self, request: JudgeRequest, sampling: Sampling, schema: dict[str, Any], image: ImageString
    ) -> dict[str, Any]:
        params: dict[str, Any] = {
            "model": self.model,
            "max_tokens": sampling.max_tokens,
            "system": [
                {"type": "text", "text": request.system, "cache_control": _cache_control(request.cache_ttl)}
            ],
            "messages": [
                {
                    "role": "user",
                    "content": _prefixed_blocks(
                        request.parts, request.cache_prefix, request.cache_ttl, image
                    ),
                }
            ],
            "output_config": {"format": {"type": "json_schema", "schema": schema}},
        }
        return _with_sampling(params, sampling)

    def _conversation_body(
        self,
        system: str,
        messages: list[ConversationMessage],
        tools: list[ToolSpec],
        sampling: Sampling,
        image: ImageString,
        cache_conversation: bool = True,
    ) -> dict[str, Any]:
        wire: list[dict[str, Any]] = []
        # The system block's TTL may not be shorter than a later breakpoint's (the API rejects a 1h
        # breakpoint after a 5m one): it takes the opening message's.
        ttl = next(
            (m.cache_ttl for m in messages if isinstance(m, UserMessage) and m.cache_prefix is not None), None
        )
        for message in messages:
            if isinstance(message, UserMessage):
                wire.append(
                    {
                        "role": "user",
                        "content": _prefixed_blocks(
                            message.parts, message.cache_prefix, message.cache_ttl, image
                        ),
                    }
                )
            elif isinstance(message, AssistantTurn):
                blocks: list[dict[str, Any]] = (
                    [{"type": "text", "text": message.text}] if message.text else []
                )
                blocks += [
                    {"type": "tool_use", "id": c.id, "name": c.name, "input": _input_object(c.arguments)}
                    for c in message.tool_calls
                ]
                wire.append({"role": "assistant", "content": blocks})
            elif isinstance(message, ToolResults):
                results = []
                for r in message.results:
                    block: dict[str, Any] = {
                        "type": "tool_result",
                        "tool_use_id": r.call_id,
                        "content": _blocks(r.parts, image),
                    }
                    if r.is_error:
                        block["is_error"] = True
                    results.append(block)
                wire.append({"role": "user", "content": results})
        if cache_conversation and wire and wire[-1]["content"]:
            last = wire[-1]["content"][-1]
            # Turns follow each other within seconds: the 5-minute TTL (the cheaper write) is enough.
            wire[-1]["content"][-1] = {**last, "cache_control": {"type": "ephemeral"}}
        params: dict[str, Any] = {
            "model": self.model,
            "max_tokens": sampling.max_tokens,
            "system": [{"type": "text", "text": system, "cache_control": _cache_control(ttl)}],
            "messages": wire,
        }
        if tools:
            params["tools"] = [
                {"name": t.name, "description": t.description, "input_schema": t.parameters} for t in tools
            ]
        return _with_sampling(params, sampling)

    async def _post(self, body: bytes) -> Message:
        try:
            return await self._client.post("/v1/messages", cast_to=Message, content=body)
        except (anthropic.APIError, ValueError) as exc:
            raise self._sdk_error(exc, anthropic) from None

    async def complete(
        self, request: JudgeRequest, sampling: Sampling, schema: dict[str, Any]
    ) -> ProviderReply:
        """One judge call. Raises `InfrastructureError` after the SDK's retries, `UserError` for setup problems."""
        message = await self._post(self.encode_body(request, sampling, schema))
        self._ever_succeeded = True
        text = "".join(block.text for block in message.content if block.type == "text")
        return self._reply(message, text)

    async def converse(
        self,
        system: str,
        messages: list[ConversationMessage],
        tools: list[ToolSpec],
        sampling: Sampling,
        *,
        cache_conversation: bool = True,
    ) -> tuple[AssistantTurn, ProviderReply]:
        """One model turn of a conversation (the agentic judge's, or the optimiser's): its text and
        tool calls, and the usage. ``tools`` may be empty. ``cache_conversation=False`` when no turn
        will follow (a one-off call would pay the cache-write price for nothing). Errors as in `complete`."""
        body = self.encode_conversation(
            system, messages, tools, sampling, cache_conversation=cache_conversation
        )
        message = await self._post(body)
        self._ever_succeeded = True
        text = "".join(block.text for block in message.content if block.type == "text")
        calls = tuple(
            ToolCall(id=block.id, name=block.name, arguments=stable_json(block.input))
            for block in message.content
            if block.type == "tool_use"
        )
        return AssistantTurn(text=text, tool_calls=calls), self._reply(message, text)

    def _reply(self, message: Message, text: str) -> ProviderReply:
        usage = message.usage
        written = usage.cache_creation_input_tokens or 0
        # The per-TTL breakdown, when the API sends it; without it every write is priced as a 5m write
        # unless the request asked only for 1h breakpoints, which the caller's pricing cannot know:
        # the breakdown is what Anthropic bills by.
        written_1h = usage.cache_creation.ephemeral_1h_input_tokens if usage.cache_creation is not None else 0
        return ProviderReply(
            text=text,
            model=message.model or self.model,
            input_tokens=usage.input_tokens or 0,
            output_tokens=usage.output_tokens or 0,
            cache_read_tokens=usage.cache_read_input_tokens or 0,
            cache_write_tokens=written,
            cache_write_1h_tokens=min(written, written_1h or 0),
            raw={"id": message.id, "stop_reason": message.stop_reason},
        )

    # -- the Message Batches API ----------------------------------------------------------------

    async def submit_batch(
        self, requests: Sequence[tuple[str, JudgeRequest]], sampling: Sampling, schema: dict[str, Any]
    ) -> BatchState:
        """Submit ``(custom_id, request)`` pairs as one Message Batch; its state as created."""
        entries: list[Any] = [
            {"custom_id": custom_id, "params": self.build_params(request, sampling, schema)}
            for custom_id, request in requests
        ]
        try:
            batch = await self._client.messages.batches.create(requests=entries)
        except (anthropic.APIError, ValueError) as exc:
            raise self._sdk_error(exc, anthropic) from None
        self._ever_succeeded = True
        return _batch_state(batch)

    async def batch_state(self, batch_id: str) -> BatchState:
        """The Message Batch's ``processing_status`` and request counts."""
        try:
            batch = await self._client.messages.batches.retrieve(batch_id)
        except (anthropic.APIError, ValueError) as exc:
            raise self._sdk_error(exc, anthropic) from None
        self._ever_succeeded = True
        return _batch_state(batch)

    async def batch_results(self, batch_id: str) -> list[BatchEntry]:
        """Every entry of the ended batch, from the JSONL at its ``results_url``."""
        entries: list[BatchEntry] = []
        try:
            decoder = await self._client.messages.batches.results(batch_id)
            async for line in decoder:
                result = line.result
                if result.type == "succeeded":
                    message = result.message
                    text = "".join(block.text for block in message.content if block.type == "text")
                    entries.append(BatchEntry(line.custom_id, "succeeded", reply=self._reply(message, text)))
                elif result.type == "errored":
                    error = result.error.error
                    said = quote_server_message(f"{error.type}: {error.message}", self._secret)
                    entries.append(BatchEntry(line.custom_id, "errored", error=said))
                else:
                    entries.append(
                        BatchEntry(line.custom_id, result.type, error=f"the request was {result.type}")
                    )
        except (anthropic.APIError, ValueError) as exc:
            raise self._sdk_error(exc, anthropic) from None
        return entries

    async def aclose(self) -> None:
        """Close the SDK's HTTP connection pool."""
        await self._client.close()


def _batch_state(batch: MessageBatch) -> BatchState:
    counts = batch.request_counts
    return BatchState(
        batch_id=batch.id,
        status=batch.processing_status,
        ended=batch.processing_status == "ended",
        counts={
            "processing": counts.processing,
            "succeeded": counts.succeeded,
            "errored": counts.errored,
            "expired": counts.expired,
            "canceled": counts.canceled,
        },
    )


def _blocks(parts: tuple[Part, ...], image: ImageString) -> list[dict[str, Any]]:
    """Text and base64 image content blocks, in order (empty text is left out: the API rejects it)."""
    content: list[dict[str, Any]] = []
    for part in parts:
        if isinstance(part, TextPart):
            if part.text:
                content.append({"type": "text", "text": part.text})
        elif isinstance(part, ImagePart):
            content.append(
                {
                    "type": "image",
                    "source": {"type": "base64", "media_type": part.media_type, "data": image("", part.data)},
                }
            )
    return content


def _cache_control(ttl: CacheTTL | None) -> dict[str, Any]:
    """A ``cache_control`` marker: the API's default TTL (5 minutes) when ``ttl`` is None."""
    return {"type": "ephemeral"} if ttl is None else {"type": "ephemeral", "ttl": ttl}


def _prefixed_blocks(
    parts: tuple[Part, ...], prefix: int | None, ttl: CacheTTL | None, image: ImageString
) -> list[dict[str, Any]]:
    """Content blocks of ``parts``; with a ``prefix``, the last block of the first ``prefix`` parts
    carries a cache breakpoint (the end of the trajectory, under the trajectory-first layout)."""
    if prefix is None:
        return _blocks(parts, image)
    head = _blocks(parts[:prefix], image)
    if head:
        head[-1] = {**head[-1], "cache_control": _cache_control(ttl)}
    return head + _blocks(parts[prefix:], image)


def _with_sampling(params: dict[str, Any], sampling: Sampling) -> dict[str, Any]:
    # SDK 2.x has no temperature/top_p arguments: they are plain body fields, sent only when set.
    if sampling.temperature is not None:
        params["temperature"] = sampling.temperature
    if sampling.top_p is not None:
        params["top_p"] = sampling.top_p
    return params


def _input_object(arguments: str) -> dict[str, Any]:
    """A tool call's arguments as the object a ``tool_use`` block needs ({} when they were not one)."""
    try:
        value = json.loads(arguments)
    except json.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}
