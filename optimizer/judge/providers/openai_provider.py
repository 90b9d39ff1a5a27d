"""The OpenAI Chat Completions provider, through the official ``openai`` SDK — also for any
OpenAI-compatible server (vLLM, llama.cpp server, Ollama) via ``base_url``, and for ``local``.

- The key comes only from ``OPENAI_API_KEY``. Against the OpenAI API (no ``base_url``) a missing
  key is a UserError at construction. Against a user-given ``base_url`` a missing key is allowed
  and a placeholder is sent, because local servers ignore it; if that server does want a key, its
  401 becomes a UserError saying the variable is not set.
- Structured output: ``response_format={"type": "json_schema", "json_schema": {..., "strict": true}}``.
- Images are ``image_url`` parts with ``data:`` URLs, in order with the text parts. A request with
  no image is sent as one plain string (the lowest common denominator of compatible servers).
- The length limit is ``max_completion_tokens`` for the OpenAI API (reasoning models reject
  ``max_tokens``) and ``max_tokens`` for compatible servers (which do not all know the new name).
- ``temperature``/``top_p`` are sent only when the user set them.
- Tool-using conversations (`converse`: the agentic judge, and the optimiser's own model) send
  ``tools`` (functions; none: no ``tools`` key) and the conversation so far: the model's turns as
  assistant messages with ``tool_calls``, each answer as a ``tool`` message (text only on this
  wire); screenshots a tool returned follow as one user message after the ``tool`` messages of that
  turn, each image introduced by its text. No ``response_format`` in that mode. The prompt cache is
  automatic on this wire, so ``cache_conversation`` changes nothing here.
- ``role`` (`_common.Role`): whose model this is — the judge's or the optimiser's; it words the
  errors a user reads, nothing else.
- Token convention: ``input_tokens = prompt_tokens - cached_tokens``, ``cache_read_tokens = cached_tokens``
  (``prompt_tokens`` includes the cached tokens; this wire reports no cache writes).
- Under ``layout = "trajectory-first"`` (`JudgeRequest.cache_prefix`) the body carries
  ``prompt_cache_key``: a hash of the item's rendered prefix (`JudgeRequest.prefix_key`), the same for
  every candidate, so the item's requests are routed to where its trajectory is cached. Compatible
  servers ignore the field.
- The call goes through the client's own ``post`` (the SDK's transport, auth, retries honouring
  ``retry-after``, error classes and response parsing into ``ChatCompletion``) rather than
  ``chat.completions.create``: ``create`` first runs the SDK's type-directed parameter transform,
  which walks every message part and the whole JSON schema on each call (7-9 ms of CPU per call,
  the largest cost of the harness at concurrency 16). The body built here is already wire-shaped —
  plain dicts, no aliased keys, no files — so that transform is the identity on it, and it is sent
  as pre-encoded bytes with the base64 images spliced in (`encode_json_body`); tests check both.
- ``[judge] base_urls`` (several OpenAI-compatible replicas): one client per endpoint, and each
  call goes to its item's endpoint by consistent hashing on ``JudgeRequest.item_id`` (a
  conversation: on its ``prompt_cache_key``, else its opening), so every replica keeps its own
  items' prefixes (`optimizer.judge.endpoints`). A call whose endpoint fails after the SDK's retries
  (connection failed or timed out, HTTP 5xx) drains that endpoint and goes to the item's next one;
  only when every endpoint is drained does the call fail (and the next call tries them all again).
  `run_notes` reports per endpoint the calls and cached prompt tokens since the last report, and each
  drained endpoint. Batches go to the first endpoint. The cache keys (`optimizer.evaluation.cache.provider_endpoint`) name the first one.
- ``[judge] affinity_header`` (one base URL in front of a router: LiteLLM, llm-d, SGLang's router): every
  call carries that header with its item's affinity key (`optimizer.judge.endpoints.affinity_key`, a hash
  of what the ring above routes by), so the router keeps an item's calls on the replica holding its
  prefix. ``prompt_cache_key`` stays the prefix's own key (rubric-first sends none: there the shared
  prefix is the system prompt, which per-item keys would scatter), and ``user`` is not used (it names an
  end user to the OpenAI API).
- Batches (`submit_batch`, `batch_state`, `batch_results`): the Batch API through the SDK — a JSONL
  input file (one ``{"custom_id", "method": "POST", "url": "/v1/chat/completions", "body"}`` line per
  call, ``body`` exactly what `complete` would post) uploaded with ``files.create(purpose="batch")``,
  ``batches.create(endpoint="/v1/chat/completions", completion_window="24h")``, ``batches.retrieve``,
  and the output and error files read with ``files.content``.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Any, Literal

import openai
from openai._types import RequestOptions
from openai.types import Batch
from openai.types.chat import ChatCompletion, ChatCompletionMessageFunctionToolCall

from optimizer.errors import UserError
from optimizer.judge.endpoints import EndpointFigures, EndpointPool, affinity_key, report_lines, shown_url
from optimizer.judge.providers._common import (
    JUDGE,
    ImageString,
    Role,
    Secret,
    WireProvider,
    encode_json_body,
    http_client_options,
    key_from_env,
    quote_server_message,
)
from optimizer.judge.types import (
    AssistantTurn,
    BatchEntry,
    BatchLimits,
    BatchState,
    ConversationMessage,
    ImagePart,
    InfrastructureError,
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
)
from optimizer.workspace.config import JudgeSection

KEY_ENV = "OPENAI_API_KEY"
DEFAULT_BASE_URL = "https://api.openai.com/v1"
# Sent to a user-given OpenAI-compatible server when OPENAI_API_KEY is unset; such servers ignore it.
PLACEHOLDER_KEY = "judgeloop-no-key"
# What ``chat.completions.create`` passes as request options: the bearer key and nothing else.
_CHAT_OPTIONS: RequestOptions = {"security": {"bearer_auth": True}}
BATCH_ENDPOINT: Literal["/v1/chat/completions"] = "/v1/chat/completions"
# Batch statuses after which nothing more happens (the output and error files are final).
_ENDED = ("completed", "failed", "expired", "cancelled")


class OpenAIProvider(WireProvider):
    """`optimizer.judge_types.Provider` for OpenAI models and OpenAI-compatible servers."""

    name = "openai"
    # Batch API limits (requests per batch, size of the JSONL input file): a larger pass is split.
    traits = ProviderTraits(
        batch=BatchLimits(max_requests=50_000, max_bytes=200 * 1024 * 1024), tool_use=True, prompt_cache=True
    )
    default_base_url = DEFAULT_BASE_URL
    key_env = KEY_ENV

    def __init__(
        self,
        judge: JudgeSection,
        *,
        use_env_key: bool = True,
        display_name: str | None = None,
        role: Role = JUDGE,
    ) -> None:
        """``use_env_key=False`` (the local server) never reads or sends ``OPENAI_API_KEY``."""
        if display_name:
            self.name = display_name
        self.model = judge.model
        # With base_urls the first one stands for the pool where one address is shown (errors); the
        # judge-call cache keys the whole set (`optimizer.evaluation.cache.provider_endpoint`).
        self.base_url = judge.base_urls[0] if judge.base_urls else judge.base_url
        self.base_urls: tuple[str, ...] = tuple(judge.base_urls or ())
        self.role = role
        self._max_retries = judge.max_retries
        self._ever_succeeded = False
        self._secret: Secret | None = self.read_key(judge, role) if use_env_key else None
        self._key_missing = use_env_key and self._secret is None
        urls = judge.base_urls or [judge.base_url or DEFAULT_BASE_URL]
        clients = {
            url: openai.AsyncOpenAI(
                api_key=self._secret.reveal() if self._secret else PLACEHOLDER_KEY,
                base_url=url,
                timeout=judge.timeout_s,
                max_retries=judge.max_retries,
                http_client=openai.DefaultAsyncHttpxClient(**http_client_options(judge.max_concurrency)),
            )
            for url in urls
        }
        self._client = clients[urls[0]]
        self._pool: EndpointPool[openai.AsyncOpenAI] | None = (
            EndpointPool(clients) if judge.base_urls else None
        )
        self._affinity_header = judge.affinity_header

    @classmethod
    def read_key(cls, judge: JudgeSection, role: Role = JUDGE) -> Secret | None:
        """The key this provider sends: required for the OpenAI API, optional for a ``base_url``
        server (None: a placeholder is sent); a missing required one is a `UserError` worded for ``role``."""
        keyless = judge.base_url is not None or judge.base_urls is not None
        return key_from_env(
            KEY_ENV, required=not keyless, role=role, provider=cls.name, base_url_would_do=True
        )

    def _body(
        self, request: JudgeRequest, sampling: Sampling, schema: dict[str, Any], image: ImageString
    ) -> dict[str, Any]:
        params: dict[str, Any] = {
            "model": self.model,
            "messages": [
                {"role": "system", "content": request.system},
                {"role": "user", "content": _content(request.parts, image)},
            ],
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "verdict", "schema": schema, "strict": True},
            },
        }
        cache_key = request.prefix_key()
        if cache_key is not None:
            params["prompt_cache_key"] = cache_key
        return self._with_sampling(params, sampling)

    def _with_sampling(self, params: dict[str, Any], sampling: Sampling) -> dict[str, Any]:
        params["max_tokens" if self.base_url else "max_completion_tokens"] = sampling.max_tokens
        if sampling.temperature is not None:
            params["temperature"] = sampling.temperature
        if sampling.top_p is not None:
            params["top_p"] = sampling.top_p
        return params

    def _conversation_body(
        self,
        system: str,
        messages: list[ConversationMessage],
        tools: list[ToolSpec],
        sampling: Sampling,
        image: ImageString,
        cache_conversation: bool = True,  # noqa: ARG002 - OpenAI caches prompt prefixes by itself
    ) -> dict[str, Any]:
        wire: list[dict[str, Any]] = [{"role": "system", "content": system}]
        for message in messages:
            if isinstance(message, UserMessage):
                wire.append({"role": "user", "content": _content(message.parts, image)})
            elif isinstance(message, AssistantTurn):
                turn: dict[str, Any] = {"role": "assistant", "content": message.text or None}
                if message.tool_calls:
                    turn["tool_calls"] = [
                        {
                            "id": c.id,
                            "type": "function",
                            "function": {"name": c.name, "arguments": c.arguments},
                        }
                        for c in message.tool_calls
                    ]
                wire.append(turn)
            elif isinstance(message, ToolResults):
                shown: list[Part] = []
                for r in message.results:
                    text = "\n".join(p.text for p in r.parts if isinstance(p, TextPart))
                    images = [p for p in r.parts if isinstance(p, ImagePart)]
                    if images:
                        text += f"\n({len(images)} image(s) follow in the next user message)"
                        shown += [p for p in r.parts if isinstance(p, ImagePart) or p.text]
                    wire.append({"role": "tool", "tool_call_id": r.call_id, "content": text})
                if shown:
                    wire.append({"role": "user", "content": _content(tuple(shown), image, force_parts=True)})
        params: dict[str, Any] = {"model": self.model, "messages": wire}
        opening = next((m for m in messages if isinstance(m, UserMessage)), None)
        if opening is not None and opening.cache_prefix is not None:
            params["prompt_cache_key"] = JudgeRequest(
                system=system, parts=opening.parts, cache_prefix=opening.cache_prefix
            ).prefix_key()
        if tools:  # an empty ``tools`` array is rejected by the OpenAI API
            params["tools"] = [
                {
                    "type": "function",
                    "function": {"name": t.name, "description": t.description, "parameters": t.parameters},
                }
                for t in tools
            ]
        return self._with_sampling(params, sampling)

    def _options(self, route_key: str) -> RequestOptions:
        """The call's request options: with ``[judge] affinity_header``, the item's affinity key in it."""
        if self._affinity_header is None:
            return _CHAT_OPTIONS
        return {**_CHAT_OPTIONS, "headers": {self._affinity_header: affinity_key(route_key)}}

    async def _post(self, body: bytes, route_key: str) -> ChatCompletion:
        options = self._options(route_key)
        if self._pool is None:
            return await self._post_to(self._client, body, options)
        failure: Exception | None = None
        while (picked := self._pool.route(route_key)) is not None:
            url, client = picked
            try:
                completion = await client.post(
                    "/chat/completions", cast_to=ChatCompletion, content=body, options=options
                )
            except (openai.APIConnectionError, openai.InternalServerError) as exc:
                # The server is gone or broken (after the SDK's retries): its items go to the others.
                failure = exc
                self._pool.fail(url, _why(exc))
                continue
            except (openai.APIError, ValueError) as exc:
                raise self._mapped(exc) from None
            usage = completion.usage
            cached = 0
            if usage is not None and usage.prompt_tokens_details is not None:
                cached = usage.prompt_tokens_details.cached_tokens or 0
            self._pool.record(url, usage.prompt_tokens if usage else 0, cached)
            return completion
        self._pool.revive_all()  # a later call (the evaluator's retry rounds) tries them all again
        if failure is not None and not self._ever_succeeded:
            raise self._mapped(failure) from None
        raise InfrastructureError(
            "every endpoint of [judge] base_urls has failed and was drained "
            "after the SDK's retries; restart them and re-run"
        )

    async def _post_to(
        self, client: openai.AsyncOpenAI, body: bytes, options: RequestOptions = _CHAT_OPTIONS
    ) -> ChatCompletion:
        try:
            return await client.post(
                "/chat/completions", cast_to=ChatCompletion, content=body, options=options
            )
        except (openai.APIError, ValueError) as exc:
            raise self._mapped(exc) from None

    def _mapped(self, exc: Exception) -> Exception:
        if self._key_missing and isinstance(exc, openai.AuthenticationError):
            return UserError(self.role.key_needed.format(env=KEY_ENV, where=self.where))
        return self._sdk_error(exc, openai)

    def run_notes(self) -> tuple[str, ...]:
        """With base_urls: per endpoint, the calls and cached prompt tokens since the last call of
        this method, and every endpoint drained since."""
        if self._pool is None:
            return ()
        since, drains = self._pool.take_report()
        return tuple(
            report_lines(
                {shown_url(u): s for u, s in since.items()}, [(shown_url(u), why) for u, why in drains]
            )
        )

    def take_endpoint_pass(self) -> EndpointFigures:
        """With base_urls: per endpoint, calls, prompt and cached tokens, failed calls and whether it
        was drained (1/0), since the last call of this method (`EndpointReporting`); else empty."""
        if self._pool is None:
            return {}
        return {
            shown_url(u): {
                "calls": s.calls,
                "prompt_tokens": s.prompt_tokens,
                "cached_tokens": s.cached_tokens,
                "failures": s.failures,
                "drained": int(drained),
            }
            for u, (s, drained) in self._pool.take_pass().items()
        }

    def endpoint_totals(self) -> dict[str, dict[str, int]]:
        """With base_urls: per endpoint (address without credentials), calls, prompt and cached
        tokens over the provider's life, and whether it was drained (1) or not (0); else empty."""
        if self._pool is None:
            return {}
        return {
            shown_url(u): {
                "calls": s.calls,
                "prompt_tokens": s.prompt_tokens,
                "cached_tokens": s.cached_tokens,
                "drained": int(self._pool.ever_drained(u)),
            }
            for u, s in self._pool.totals.items()
        }

    async def complete(
        self, request: JudgeRequest, sampling: Sampling, schema: dict[str, Any]
    ) -> ProviderReply:
        """One judge call. Raises `InfrastructureError` after the SDK's retries, `UserError` for setup problems."""
        route = request.item_id or request.prefix_key() or request.fingerprint()
        completion = await self._post(self.encode_body(request, sampling, schema), route)
        self._ever_succeeded = True
        choice = completion.choices[0] if completion.choices else None
        text = (choice.message.content or "") if choice is not None else ""
        return self._reply(completion, text)

    async def converse(
        self,
        system: str,
        messages: list[ConversationMessage],
        tools: list[ToolSpec],
        sampling: Sampling,
        *,
        cache_conversation: bool = True,  # noqa: ARG002 - as in encode_conversation
    ) -> tuple[AssistantTurn, ProviderReply]:
        """One model turn of a conversation (the agentic judge's, or the optimiser's): its text and
        tool calls, and the usage. ``tools`` may be empty. Errors as in `complete`."""
        completion = await self._post(
            self.encode_conversation(system, messages, tools, sampling), _conversation_route(system, messages)
        )
        self._ever_succeeded = True
        choice = completion.choices[0] if completion.choices else None
        text = (choice.message.content or "") if choice is not None else ""
        calls: tuple[ToolCall, ...] = ()
        if choice is not None and choice.message.tool_calls:
            calls = tuple(
                ToolCall(id=c.id, name=c.function.name, arguments=c.function.arguments or "")
                for c in choice.message.tool_calls
                if isinstance(c, ChatCompletionMessageFunctionToolCall)
            )
        return AssistantTurn(text=text, tool_calls=calls), self._reply(completion, text)

    def _reply(self, completion: ChatCompletion, text: str) -> ProviderReply:
        choice = completion.choices[0] if completion.choices else None
        usage = completion.usage
        prompt_tokens = usage.prompt_tokens if usage else 0
        cached = 0
        if usage is not None and usage.prompt_tokens_details is not None:
            cached = usage.prompt_tokens_details.cached_tokens or 0
        return ProviderReply(
            text=text,
            model=completion.model or self.model,
            input_tokens=max(0, prompt_tokens - cached),
            output_tokens=usage.completion_tokens if usage else 0,
            cache_read_tokens=cached,
            raw={"id": completion.id, "finish_reason": choice.finish_reason if choice else None},
        )

    # -- the Batch API --------------------------------------------------------------------------

    def batch_input(
        self, requests: Sequence[tuple[str, JudgeRequest]], sampling: Sampling, schema: dict[str, Any]
    ) -> bytes:
        """The JSONL input file of a batch: one line per ``(custom_id, request)``, images spliced in as bytes."""
        lines = []
        for custom_id, request in requests:
            head = encode_json_body({"custom_id": custom_id, "method": "POST", "url": BATCH_ENDPOINT})
            lines.append(head[:-1] + b',"body":' + self.encode_body(request, sampling, schema) + b"}")
        return b"\n".join(lines) + b"\n"

    async def submit_batch(
        self, requests: Sequence[tuple[str, JudgeRequest]], sampling: Sampling, schema: dict[str, Any]
    ) -> BatchState:
        """Upload the JSONL input file and create a batch over it; its state as created."""
        data = self.batch_input(requests, sampling, schema)
        try:
            uploaded = await self._client.files.create(
                file=("judgeloop-batch.jsonl", data, "application/jsonl"), purpose="batch"
            )
            batch = await self._client.batches.create(
                input_file_id=uploaded.id, endpoint=BATCH_ENDPOINT, completion_window="24h"
            )
        except (openai.APIError, ValueError) as exc:
            raise self._sdk_error(exc, openai) from None
        self._ever_succeeded = True
        return _batch_state(batch)

    async def batch_state(self, batch_id: str) -> BatchState:
        """The batch's ``status`` and request counts."""
        try:
            batch = await self._client.batches.retrieve(batch_id)
        except (openai.APIError, ValueError) as exc:
            raise self._sdk_error(exc, openai) from None
        self._ever_succeeded = True
        return _batch_state(batch)

    async def batch_results(self, batch_id: str) -> list[BatchEntry]:
        """Every entry of the ended batch: the output file's answers and the error file's failures
        (``batch_expired`` lines are ``expired``). A batch that failed validation has neither file;
        then no entry is returned and the caller counts every request as not answered."""
        try:
            batch = await self._client.batches.retrieve(batch_id)
            files = [f for f in (batch.output_file_id, batch.error_file_id) if f]
            texts = [(await self._client.files.content(f)).text for f in files]
        except (openai.APIError, ValueError) as exc:
            raise self._sdk_error(exc, openai) from None
        entries: list[BatchEntry] = []
        for text in texts:
            for raw in text.splitlines():
                if raw.strip():
                    entries.append(self.batch_entry(json.loads(raw)))
        return entries

    def batch_entry(self, line: dict[str, Any]) -> BatchEntry:
        """One line of a batch output or error file as a `BatchEntry` — the OpenAI Batch API's lines and
        `vllm run-batch`'s alike (its ``error`` may be a plain string, or an error response object). A
        line whose answer is not a chat completion is ``errored``, saying so."""
        custom_id = str(line.get("custom_id"))
        raw_response = line.get("response")
        response: dict[str, Any] = raw_response if isinstance(raw_response, dict) else {}
        raw_error = line.get("error")
        error: dict[str, Any] = raw_error if isinstance(raw_error, dict) else {}
        if isinstance(error.get("error"), dict):  # vLLM: an ErrorResponse, the details one level down
            error = error["error"]
        body = response.get("body")
        if response.get("status_code") == 200 and isinstance(body, dict):
            try:
                completion = ChatCompletion.model_validate(body)
            except ValueError as exc:  # pydantic's ValidationError is a ValueError
                why = str(exc).splitlines()[0]
                return BatchEntry(custom_id, "errored", error=f"the answer is not a chat completion ({why})")
            choice = completion.choices[0] if completion.choices else None
            text = (choice.message.content or "") if choice is not None else ""
            return BatchEntry(custom_id, "succeeded", reply=self._reply(completion, text))
        if error.get("code") == "batch_expired":
            return BatchEntry(custom_id, "expired", error="the request expired before the batch ran it")
        body_error = (body.get("error") if isinstance(body, dict) else None) or {}
        said = (
            raw_error
            if isinstance(raw_error, str) and raw_error
            else error.get("message") or (body_error.get("message") if isinstance(body_error, dict) else None)
        )
        status = response.get("status_code")
        where = f"HTTP {status}: " if status else ""
        return BatchEntry(
            custom_id, "errored", error=where + quote_server_message(str(said or "no message"), self._secret)
        )

    async def aclose(self) -> None:
        """Close the SDK's HTTP connection pools."""
        if self._pool is None:
            await self._client.close()
            return
        for client in self._pool.clients.values():
            await client.close()


def _why(exc: Exception) -> str:
    if isinstance(exc, openai.APITimeoutError):
        return "timed out after the SDK's retries"
    if isinstance(exc, openai.APIStatusError):
        return f"HTTP {exc.status_code} after the SDK's retries"
    return "connection failed after the SDK's retries"


def _conversation_route(system: str, messages: list[ConversationMessage]) -> str:
    """What a conversation is routed by: its opening's prefix key, else a hash of its opening."""
    opening = next((m for m in messages if isinstance(m, UserMessage)), None)
    if opening is None:
        return hashlib.sha256(system.encode()).hexdigest()
    request = JudgeRequest(system=system, parts=opening.parts, cache_prefix=opening.cache_prefix)
    return request.prefix_key() or request.fingerprint()


def _batch_state(batch: Batch) -> BatchState:
    counts = batch.request_counts
    return BatchState(
        batch_id=batch.id,
        status=batch.status,
        ended=batch.status in _ENDED,
        counts={}
        if counts is None
        else {"total": counts.total, "completed": counts.completed, "failed": counts.failed},
    )


def _content(
    parts: tuple[Part, ...], image: ImageString, *, force_parts: bool = False
) -> str | list[dict[str, Any]]:
    """User content: one plain string when there is no image (the lowest common denominator of
    compatible servers), else text and ``image_url`` parts in order."""
    if not force_parts and not any(isinstance(p, ImagePart) for p in parts):
        return "\n".join(p.text for p in parts if isinstance(p, TextPart))
    content: list[dict[str, Any]] = []
    for part in parts:
        if isinstance(part, TextPart):
            if part.text:
                content.append({"type": "text", "text": part.text})
        else:
            url = image(f"data:{part.media_type};base64,", part.data)
            content.append({"type": "image_url", "image_url": {"url": url}})
    return content
