"""Shared helpers for the SDK-backed providers: secret handling and error wording."""

from __future__ import annotations

import base64
import os
from types import ModuleType

import httpx2

from optimizer.errors import UserError
from optimizer.judge_types import InfrastructureError

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


def key_from_env(env_var: str, *, required: bool) -> Secret | None:
    """The API key in ``env_var``; a missing key is a UserError when ``required``, else None."""
    value = os.environ.get(env_var, "").strip()
    if value:
        return Secret(value)
    if required:
        raise UserError(f"{env_var} is not set; export it or use --provider local")
    return None


def data_b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def quote_server_message(message: str, secret: Secret | None) -> str:
    """A short, single-line, key-free excerpt of a server's error message."""
    text = " ".join(str(message).split())
    if secret is not None:
        text = secret.scrub(text)
    return text if len(text) <= _MAX_QUOTE else text[: _MAX_QUOTE - 1] + "…"


def map_sdk_error(
    exc: Exception,
    sdk: ModuleType,
    *,
    provider: str,
    model: str,
    where: str,
    key_env: str,
    secret: Secret | None,
    retries: int,
    ever_succeeded: bool,
) -> Exception:
    """Turn an ``anthropic``/``openai`` SDK exception (both SDKs share the class names) into the error
    judgeloop raises: `UserError` for what only the user can fix, `InfrastructureError` for transport
    failures that outlived the SDK's own retries. Messages never contain the key.

    A connection that could not even be opened (refused, DNS) before any call to this provider ever
    succeeded is a wrong or stopped server, so it is a UserError; later it is an InfrastructureError.
    """
    label = f"{provider} model {model!r} at {where}"
    after = f"after {retries} retr{'y' if retries == 1 else 'ies'}"
    if isinstance(exc, sdk.APITimeoutError):
        return InfrastructureError(f"{label}: timed out {after}")
    if isinstance(exc, sdk.APIConnectionError):
        refused = isinstance(exc.__cause__, httpx2.ConnectError)
        if refused and not ever_succeeded:
            return UserError(f"cannot connect to {where} for {provider}; start the server or fix --base-url")
        return InfrastructureError(f"{label}: connection failed {after}")
    if isinstance(exc, sdk.APIStatusError):
        status = exc.status_code
        said = quote_server_message(getattr(exc, "message", ""), secret)
        if isinstance(exc, sdk.AuthenticationError | sdk.PermissionDeniedError):
            return UserError(
                f"{key_env} was rejected by {where} (HTTP {status}); check the key or use --provider local"
            )
        if isinstance(exc, sdk.NotFoundError):
            return UserError(f"model {model!r} was not found at {where} (HTTP 404); check --model")
        if isinstance(exc, sdk.RateLimitError):
            return InfrastructureError(f"{label}: rate limited (HTTP 429) {after}")
        return InfrastructureError(f"{label}: HTTP {status} {after}: {said}")
    if isinstance(exc, sdk.APIResponseValidationError | ValueError):
        # A 200 whose body is not the JSON the SDK expects (ValueError covers json.JSONDecodeError).
        return InfrastructureError(f"{label}: the server's answer was not valid JSON")
    if isinstance(exc, sdk.APIError):
        return InfrastructureError(f"{label}: {type(exc).__name__}: {quote_server_message(str(exc), secret)}")
    raise exc
