"""The Anthropic Messages provider, through the official ``anthropic`` SDK (2.x).

- The key comes only from ``ANTHROPIC_API_KEY`` and is passed to the client explicitly (so the SDK
  consults no profile or other credential source); a missing key is a UserError at construction.
- The system prompt is one text block marked ``cache_control: ephemeral``: every item of a split
  shares it, so the judge prompt + rubric is billed at the cache-read price after the first call.
- Images are base64 image blocks, in order with the text blocks.
- Structured output: ``output_config={"format": {"type": "json_schema", "schema": ...}}``.
- SDK 2.x has no ``temperature``/``top_p`` arguments; they go in the request body, and only when
  the user set them.
- The call is the client's own ``post("/v1/messages", cast_to=Message)`` with the body pre-encoded
  as bytes (base64 images spliced in, never scanned by the JSON encoder), which is what
  ``messages.create`` sends for these arguments minus its per-call JSON encoding of ~300 KB of
  base64 per 12-screenshot request; the SDK's transport, auth headers, retries and error classes
  are unchanged.
- Retries (429 honouring ``retry-after``, 5xx, timeouts, connection errors) are the SDK's own,
  ``max_retries`` times; what survives becomes `InfrastructureError` or `UserError`.
"""

from __future__ import annotations

from typing import Any

import anthropic
from anthropic.types import Message

from optimizer.config import JudgeSection
from optimizer.judge_types import ImagePart, JudgeRequest, ProviderReply, Sampling, TextPart
from optimizer.providers._common import (
    BodyBlobs,
    ImageString,
    encode_json_body,
    http_client_options,
    inline_image,
    key_from_env,
    map_sdk_error,
)

KEY_ENV = "ANTHROPIC_API_KEY"
DEFAULT_BASE_URL = "https://api.anthropic.com"


class AnthropicProvider:
    """`optimizer.judge_types.Provider` for Claude models."""

    name = "anthropic"
    text_only = False

    def __init__(self, judge: JudgeSection) -> None:
        self.model = judge.model
        self.base_url = judge.base_url
        self._secret = key_from_env(KEY_ENV, required=True)
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

    def __repr__(self) -> str:
        return f"AnthropicProvider(model={self.model!r}, base_url={self.base_url!r})"

    @property
    def where(self) -> str:
        return self.base_url or DEFAULT_BASE_URL

    def build_params(
        self, request: JudgeRequest, sampling: Sampling, schema: dict[str, Any]
    ) -> dict[str, Any]:
        """The JSON body of one Messages call, images written out as base64 (no network)."""
        return self._body(request, sampling, schema, inline_image)

    def encode_body(self, request: JudgeRequest, sampling: Sampling, schema: dict[str, Any]) -> bytes:
        """`build_params` as the UTF-8 JSON bytes sent on the wire, images spliced in as bytes."""
        blobs = BodyBlobs()
        return encode_json_body(self._body(request, sampling, schema, blobs.placeholder), blobs.blobs)

    def _body(
        self, request: JudgeRequest, sampling: Sampling, schema: dict[str, Any], image: ImageString
    ) -> dict[str, Any]:
        content: list[dict[str, Any]] = []
        for part in request.parts:
            if isinstance(part, TextPart):
                if part.text:  # the API rejects empty text blocks
                    content.append({"type": "text", "text": part.text})
            elif isinstance(part, ImagePart):
                content.append(
                    {
                        "type": "image",
                        "source": {
                            "type": "base64",
                            "media_type": part.media_type,
                            "data": image("", part.data),
                        },
                    }
                )
        params: dict[str, Any] = {
            "model": self.model,
            "max_tokens": sampling.max_tokens,
            "system": [{"type": "text", "text": request.system, "cache_control": {"type": "ephemeral"}}],
            "messages": [{"role": "user", "content": content}],
            "output_config": {"format": {"type": "json_schema", "schema": schema}},
        }
        # SDK 2.x has no temperature/top_p arguments: they are plain body fields, sent only when set.
        if sampling.temperature is not None:
            params["temperature"] = sampling.temperature
        if sampling.top_p is not None:
            params["top_p"] = sampling.top_p
        return params

    async def complete(
        self, request: JudgeRequest, sampling: Sampling, schema: dict[str, Any]
    ) -> ProviderReply:
        """One judge call. Raises `InfrastructureError` after the SDK's retries, `UserError` for setup problems."""
        body = self.encode_body(request, sampling, schema)
        try:
            message = await self._client.post("/v1/messages", cast_to=Message, content=body)
        except (anthropic.APIError, ValueError) as exc:
            raise map_sdk_error(
                exc,
                anthropic,
                provider=self.name,
                model=self.model,
                where=self.where,
                key_env=KEY_ENV,
                secret=self._secret,
                retries=self._max_retries,
                ever_succeeded=self._ever_succeeded,
            ) from None
        self._ever_succeeded = True
        text = "".join(block.text for block in message.content if block.type == "text")
        usage = message.usage
        return ProviderReply(
            text=text,
            model=message.model or self.model,
            input_tokens=usage.input_tokens or 0,
            output_tokens=usage.output_tokens or 0,
            cache_read_tokens=usage.cache_read_input_tokens or 0,
            cache_write_tokens=usage.cache_creation_input_tokens or 0,
            raw={"id": message.id, "stop_reason": message.stop_reason},
        )

    async def aclose(self) -> None:
        """Close the SDK's HTTP connection pool."""
        await self._client.close()
