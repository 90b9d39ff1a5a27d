"""Shared helpers for the SDK-backed providers: secret handling, error wording, request bodies."""

from __future__ import annotations

import base64
import functools
import json
import os
import re
import secrets
import ssl
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import httpx2

from optimizer.errors import UserError
from optimizer.judge.types import ConversationMessage, InfrastructureError, JudgeRequest, Sampling, ToolSpec

# Longest server message quoted in an error; bodies can be large and are not for the user's eyes.
_MAX_QUOTE = 200


class Secret:
    """An API key that never shows itself in a repr, str, log line or exception."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        return self._value

    def scrub(self, text: str) -> str:
        """``text`` with every occurrence of the key replaced by ``[redacted]``."""
        return text.replace(self._value, "[redacted]") if self._value else text

    def __repr__(self) -> str:
        return "Secret([redacted])"

    __str__ = __repr__


@dataclass(frozen=True)
class Role:
    """Whose model a provider serves: the judge's or the optimiser's.

    Failures map to the same exceptions for both (`map_sdk_error`); the role only words what a user
    reads (``str.format`` templates over ``provider``, ``model``, ``where``, ``env``, ``status``:
    which setting to fix, which way out needs no key), plus one rule: a server that refuses
    connections before any call succeeded stops the judge at once (``unreachable``: a `UserError`),
    while for the optimiser (``unreachable=None``) it is a transport failure like any other: the loop
    records the failed proposal and carries on.
    """

    name: str
    label: str  # how transport-error messages name the call
    missing_key: str
    missing_key_keyless_server: str  # when an OpenAI-compatible base_url could do without a key
    key_needed: str  # a keyless base_url server answered 401
    key_rejected: str
    unknown_model: str
    unreachable: str | None  # refused before any success: a UserError with this text, or None


JUDGE = Role(
    name="judge",
    label="{provider} model {model!r} at {where}",
    missing_key="{env} is not set; export it or use --provider local",
    missing_key_keyless_server="{env} is not set; export it or use --provider local",
    key_needed="{env} is not set but {where} requires a key; export it",
    key_rejected="{env} was rejected by {where} (HTTP {status}); check the key or use --provider local",
    unknown_model="model {model!r} was not found at {where} (HTTP 404); check --model",
    unreachable="cannot connect to {where} for {provider}; start the server or fix --base-url",
)
OPTIMISER = Role(
    name="optimiser",
    label="the optimiser's {provider} model {model!r} at {where}",
    missing_key="the optimiser uses provider {provider!r} but {env} is not set; "
    "export it, or run with --strategy library (no key needed)",
    missing_key_keyless_server="the optimiser uses provider {provider!r} but {env} is not set; "
    "export it, set [optimizer] base_url for a local server, or run with --strategy library",
    key_needed="{env} is not set but the optimiser's server {where} requires a key; export it",
    key_rejected="the optimiser's {provider} key was rejected by {where} (HTTP {status}); "
    "check {env}, or run with --strategy library",
    unknown_model="the optimiser's {provider} endpoint {where} does not know model {model!r} (HTTP 404); "
    "fix [optimizer] model or base_url",
    unreachable=None,
)


def key_from_env(
    env_var: str, *, required: bool, role: Role = JUDGE, provider: str = "", base_url_would_do: bool = False
) -> Secret | None:
    """The API key in ``env_var``; a missing key is a UserError when ``required``, else None.
    ``base_url_would_do``: the message may suggest a keyless server instead (OpenAI-compatible)."""
    value = os.environ.get(env_var, "").strip()
    if value:
        return Secret(value)
    if required:
        template = role.missing_key_keyless_server if base_url_would_do else role.missing_key
        raise UserError(template.format(provider=provider, env=env_var))
    return None


# The SDKs' own default pool (1000 connections, 100 kept alive) unless the concurrency is larger.
_MIN_CONNECTIONS = 1000
_MIN_KEEPALIVE = 100


@functools.cache
def _ssl_context() -> ssl.SSLContext:
    # httpx's default verifying context (CA bundle, SSL_CERT_FILE/DIR honoured). Loading the CA
    # bundle costs 50-150 ms, paid by every new SDK client otherwise; one context serves them all.
    return httpx2.create_ssl_context()


def http_client_options(concurrency: int) -> dict[str, Any]:
    """Keyword arguments for an SDK's ``DefaultAsyncHttpxClient``: the process-wide verifying SSL
    context and a connection pool that keeps at least ``concurrency`` connections alive."""
    return {
        "verify": _ssl_context(),
        "limits": httpx2.Limits(
            max_connections=max(_MIN_CONNECTIONS, concurrency),
            max_keepalive_connections=max(_MIN_KEEPALIVE, concurrency),
        ),
    }


def data_b64(data: bytes) -> str:
    """``data`` as standard base64 text."""
    return base64.b64encode(data).decode("ascii")


# Placeholders for image strings while the rest of a body is JSON-encoded. The per-process nonce
# means no text in a trajectory or prompt can imitate one; json.dumps writes NUL as \u0000.
_BLOB_NONCE = secrets.token_hex(8)
_BLOB_SPLIT = re.compile(r"\\u0000" + _BLOB_NONCE + r":(\d+)\\u0000")

ImageString = Callable[[str, bytes], str]
"""``(prefix, image bytes) -> str``: how a body builder writes the JSON string ``prefix + base64``;
`inline_image` writes it out, `BodyBlobs.placeholder` leaves a marker for `encode_json_body`."""


def inline_image(prefix: str, data: bytes) -> str:
    """``prefix`` followed by the base64 of ``data`` (an `ImageString` for readable bodies)."""
    return prefix + data_b64(data)


class BodyBlobs:
    """Collects image payloads while a provider builds a body, for `encode_json_body`.

    Each image's base64 goes into the body as bytes spliced between JSON fragments, so the large
    strings are never built as Python ``str``, scanned by the JSON encoder or re-encoded to UTF-8.
    """

    def __init__(self) -> None:
        self.blobs: list[bytes] = []

    def placeholder(self, prefix: str, data: bytes) -> str:
        """A marker string standing for the JSON string content ``prefix + base64(data)``."""
        # json.dumps escapes the prefix exactly as it would inside the full string; base64 needs none.
        escaped = json.dumps(prefix, ensure_ascii=False)[1:-1].encode()
        self.blobs.append(escaped + base64.b64encode(data))
        return _placeholder(len(self.blobs) - 1)


def encode_json_body(body: dict[str, Any], blobs: Sequence[bytes] = ()) -> bytes:
    """The UTF-8 JSON bytes of ``body``, encoded as the SDKs encode request bodies (compact, not
    ASCII-escaped, no NaN), with every `BodyBlobs` placeholder replaced by its payload."""
    text = _dumps(body)
    if not blobs:
        return text.encode()
    pieces = _BLOB_SPLIT.split(text)
    if pieces[1::2] != [str(i) for i in range(len(blobs))]:
        # Some text imitated a placeholder (it would have to guess the nonce): encode the slow way.
        table = {_placeholder(i): json.loads(b'"' + blob + b'"') for i, blob in enumerate(blobs)}
        return _dumps(_substitute(body, table)).encode()
    return b"".join(blobs[int(piece)] if k % 2 else piece.encode() for k, piece in enumerate(pieces))


def _placeholder(index: int) -> str:
    return f"\0{_BLOB_NONCE}:{index}\0"


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def _substitute(value: Any, table: dict[str, str]) -> Any:
    if isinstance(value, str):
        return table.get(value, value)
    if isinstance(value, dict):
        return {k: _substitute(v, table) for k, v in value.items()}
    if isinstance(value, list):
        return [_substitute(v, table) for v in value]
    return value


def quote_server_message(message: str, secret: Secret | None) -> str:
    """A short, single-line, key-free excerpt of a server's error message."""
    text = " ".join(str(message).split())
    if secret is not None:
        text = secret.scrub(text)
    return text if len(text) <= _MAX_QUOTE else text[: _MAX_QUOTE - 1] + "…"


@dataclass(frozen=True)
class CallSite:
    """Who made a failed call, for `map_sdk_error`'s messages: the provider, model and endpoint
    (``where``), the key's environment variable (never the key), the ``secret`` to scrub from a
    server's words, the SDK's ``retries``, whether a call to this provider ever succeeded, and the
    ``role`` that words the messages."""

    provider: str
    model: str
    where: str
    key_env: str
    secret: Secret | None
    retries: int
    ever_succeeded: bool
    role: Role = JUDGE


def map_sdk_error(exc: Exception, sdk: ModuleType, site: CallSite) -> Exception:
    """Turn an ``anthropic``/``openai`` SDK exception (both SDKs share the class names) into the error
    judgeloop raises: `UserError` for what only the user can fix, `InfrastructureError` for transport
    failures that outlived the SDK's own retries. Messages never contain the key; ``role`` words them.

    A connection that could not even be opened (refused, DNS) before any call to this provider ever
    succeeded is a wrong or stopped server, so it is a UserError for the judge; later (and always for
    the optimiser, see `Role.unreachable`) it is an InfrastructureError.
    """
    provider, model, where, role, secret = site.provider, site.model, site.where, site.role, site.secret
    label = role.label.format(provider=provider, model=model, where=where)
    after = f"after {site.retries} retr{'y' if site.retries == 1 else 'ies'}"
    if isinstance(exc, sdk.APITimeoutError):
        return InfrastructureError(f"{label}: timed out {after}")
    if isinstance(exc, sdk.APIConnectionError):
        refused = isinstance(exc.__cause__, httpx2.ConnectError)
        if refused and not site.ever_succeeded and role.unreachable is not None:
            return UserError(role.unreachable.format(provider=provider, where=where))
        return InfrastructureError(f"{label}: connection failed {after}")
    if isinstance(exc, sdk.APIStatusError):
        status = exc.status_code
        said = quote_server_message(getattr(exc, "message", ""), secret)
        if isinstance(exc, sdk.AuthenticationError | sdk.PermissionDeniedError):
            return UserError(
                role.key_rejected.format(provider=provider, env=site.key_env, where=where, status=status)
            )
        if isinstance(exc, sdk.NotFoundError):
            return UserError(role.unknown_model.format(provider=provider, model=model, where=where))
        if isinstance(exc, sdk.RateLimitError):
            return InfrastructureError(f"{label}: rate limited (HTTP 429) {after}")
        return InfrastructureError(f"{label}: HTTP {status} {after}: {said}")
    if isinstance(exc, sdk.APIResponseValidationError | ValueError):
        # A 200 whose body is not the JSON the SDK expects (ValueError covers json.JSONDecodeError).
        return InfrastructureError(f"{label}: the server's answer was not valid JSON")
    if isinstance(exc, sdk.APIError):
        return InfrastructureError(f"{label}: {type(exc).__name__}: {quote_server_message(str(exc), secret)}")
    raise exc


class WireProvider(ABC):
    """What the anthropic and openai providers share: their request bodies are built once as plain
    JSON (`build_params`, images as base64 text) and encoded for the wire with the images spliced in as
    bytes (`encode_body`, `encode_conversation`), and every SDK error goes through `map_sdk_error` with
    the provider's own key, role and history. Subclasses define ``_body`` and ``_conversation_body``."""

    name: str
    model: str
    base_url: str | None
    role: Role
    default_base_url: str
    key_env: str
    _secret: Secret | None
    _max_retries: int
    _ever_succeeded: bool

    @property
    def where(self) -> str:
        return self.base_url or self.default_base_url

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, model={self.model!r}, base_url={self.base_url!r})"

    def run_notes(self) -> tuple[str, ...]:
        return ()

    @abstractmethod
    def _body(
        self, request: JudgeRequest, sampling: Sampling, schema: dict[str, Any], image: ImageString
    ) -> dict[str, Any]:
        """One judge call's body in this provider's wire format; ``image`` writes an image part."""

    @abstractmethod
    def _conversation_body(
        self,
        system: str,
        messages: list[ConversationMessage],
        tools: list[ToolSpec],
        sampling: Sampling,
        image: ImageString,
        cache_conversation: bool,
    ) -> dict[str, Any]:
        """One conversation turn's body in this provider's wire format."""

    def build_params(
        self, request: JudgeRequest, sampling: Sampling, schema: dict[str, Any]
    ) -> dict[str, Any]:
        """The JSON body of one judge call, images written out as base64 (no network)."""
        return self._body(request, sampling, schema, inline_image)

    def encode_body(self, request: JudgeRequest, sampling: Sampling, schema: dict[str, Any]) -> bytes:
        """`build_params` as the UTF-8 JSON bytes sent on the wire, images spliced in as bytes."""
        blobs = BodyBlobs()
        return encode_json_body(self._body(request, sampling, schema, blobs.placeholder), blobs.blobs)

    def encode_conversation(
        self,
        system: str,
        messages: list[ConversationMessage],
        tools: list[ToolSpec],
        sampling: Sampling,
        *,
        cache_conversation: bool = True,
    ) -> bytes:
        """The wire bytes of one conversation turn (images spliced in as bytes)."""
        blobs = BodyBlobs()
        body = self._conversation_body(
            system, messages, tools, sampling, blobs.placeholder, cache_conversation
        )
        return encode_json_body(body, blobs.blobs)

    def _sdk_error(self, exc: Exception, sdk: ModuleType) -> Exception:
        """``exc`` from the ``sdk`` client as the `UserError` or `InfrastructureError` to raise."""
        return map_sdk_error(
            exc,
            sdk,
            CallSite(
                provider=self.name,
                model=self.model,
                where=self.where,
                key_env=self.key_env,
                secret=self._secret,
                retries=self._max_retries,
                ever_succeeded=self._ever_succeeded,
                role=self.role,
            ),
        )
