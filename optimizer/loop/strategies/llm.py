"""The optimiser's own model: SDK clients, usage and cost accounting, and error mapping.

Keys come only from ``ANTHROPIC_API_KEY`` / ``OPENAI_API_KEY`` and are never logged or stored. A
transport failure that survives the SDK's retries becomes `ProposalError` (the loop records it and
continues); a rejected key or an unknown model becomes `UserError` (every later experiment would
fail the same way, so the run must stop and say what to fix).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import anthropic
import openai

from optimizer.errors import UserError
from optimizer.loop.strategies import ProposalError

if TYPE_CHECKING:
    from optimizer.config import OptimizerSection, Price

DEFAULT_TIMEOUT_S = 300.0
DEFAULT_MAX_RETRIES = 4
DEFAULT_MAX_OUTPUT_TOKENS = 4096


def check_key(cfg: OptimizerSection) -> None:
    """Refuse a missing key in one line (an OpenAI-compatible server at ``base_url`` may need none)."""
    if cfg.provider == "anthropic" and not os.environ.get("ANTHROPIC_API_KEY"):
        raise UserError(
            "the optimiser uses provider 'anthropic' but ANTHROPIC_API_KEY is not set; "
            "export it, or run with --strategy library (no key needed)"
        )
    if cfg.provider == "openai" and not cfg.base_url and not os.environ.get("OPENAI_API_KEY"):
        raise UserError(
            "the optimiser uses provider 'openai' but OPENAI_API_KEY is not set; "
            "export it, set [optimizer] base_url for a local server, or run with --strategy library"
        )


def make_client(cfg: OptimizerSection, *, timeout_s: float, max_retries: int) -> anthropic.AsyncAnthropic | openai.AsyncOpenAI:
    """A fresh SDK client for one proposal (closed by the caller); ``base_url`` from ``[optimizer]``."""
    check_key(cfg)
    if cfg.provider == "anthropic":
        return anthropic.AsyncAnthropic(
            api_key=os.environ["ANTHROPIC_API_KEY"], base_url=cfg.base_url, timeout=timeout_s, max_retries=max_retries
        )
    return openai.AsyncOpenAI(
        api_key=os.environ.get("OPENAI_API_KEY") or "not-needed",
        base_url=cfg.base_url,
        timeout=timeout_s,
        max_retries=max_retries,
    )


@dataclass
class Usage:
    """What the optimiser spent during one proposal."""

    calls: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float = 0.0

    def add_anthropic(self, usage: Any, price: Price | None) -> None:
        """Count one Anthropic Messages reply's ``usage`` (cache reads/writes priced when known)."""
        inp = int(getattr(usage, "input_tokens", 0) or 0)
        out = int(getattr(usage, "output_tokens", 0) or 0)
        cache_read = int(getattr(usage, "cache_read_input_tokens", 0) or 0)
        cache_write = int(getattr(usage, "cache_creation_input_tokens", 0) or 0)
        self.calls += 1
        self.input_tokens += inp + cache_read + cache_write
        self.output_tokens += out
        if price is not None:
            read_rate = price.cache_read if price.cache_read is not None else price.input
            write_rate = price.cache_write if price.cache_write is not None else price.input
            self.cost_usd += (inp * price.input + out * price.output + cache_read * read_rate
                              + cache_write * write_rate) / 1e6

    def add_openai(self, usage: Any, price: Price | None) -> None:
        """Count one Chat Completions reply's ``usage`` (``prompt_tokens`` include cached ones)."""
        inp = int(getattr(usage, "prompt_tokens", 0) or 0) if usage is not None else 0
        out = int(getattr(usage, "completion_tokens", 0) or 0) if usage is not None else 0
        details = getattr(usage, "prompt_tokens_details", None) if usage is not None else None
        cached = min(inp, int(getattr(details, "cached_tokens", 0) or 0)) if details is not None else 0
        self.calls += 1
        self.input_tokens += inp
        self.output_tokens += out
        if price is not None:
            read_rate = price.cache_read if price.cache_read is not None else price.input
            self.cost_usd += ((inp - cached) * price.input + cached * read_rate + out * price.output) / 1e6

    def error(self, reason: str) -> ProposalError:
        """A `ProposalError` carrying what was spent so far."""
        return ProposalError(reason, calls=self.calls, input_tokens=self.input_tokens,
                             output_tokens=self.output_tokens, cost_usd=self.cost_usd)


def price_for(prices: Mapping[str, Price], model: str) -> Price | None:
    """The price of ``model``: ``[prices]`` overrides first, then the built-in table; None when unknown
    (its cost then counts as 0)."""
    from optimizer.judge.providers.pricing import price_for as lookup

    return lookup(model, prices)


@contextmanager
def sdk_errors(usage: Usage, provider: str, model: str) -> Iterator[None]:
    """Map SDK exceptions: bad key / unknown model → `UserError`; anything transport → `ProposalError`."""
    try:
        yield
    except (anthropic.AuthenticationError, openai.AuthenticationError,
            anthropic.PermissionDeniedError, openai.PermissionDeniedError):
        key = "ANTHROPIC_API_KEY" if provider == "anthropic" else "OPENAI_API_KEY"
        raise UserError(f"the optimiser's {provider} key was rejected; check {key}") from None
    except (anthropic.NotFoundError, openai.NotFoundError):
        raise UserError(
            f"the optimiser's {provider} endpoint does not know model {model!r}; fix [optimizer] model or base_url"
        ) from None
    except (anthropic.APIStatusError, openai.APIStatusError) as exc:
        raise usage.error(f"optimiser {provider} call failed: HTTP {exc.status_code}") from exc
    except (anthropic.APIConnectionError, openai.APIConnectionError) as exc:
        kind = "timed out" if isinstance(exc, anthropic.APITimeoutError | openai.APITimeoutError) else "could not connect"
        raise usage.error(f"optimiser {provider} call {kind}") from exc
    except (anthropic.APIError, openai.APIError) as exc:
        raise usage.error(f"optimiser {provider} call failed: {type(exc).__name__}") from exc


_FENCE = re.compile(r"```(?:json)?\s*\n(.*?)\n```", re.DOTALL)


def extract_json_object(text: str) -> dict[str, Any] | None:
    """The JSON object in a reply: the whole text, a fenced block, or the outermost ``{...}``."""
    candidates = [text.strip()]
    candidates += [m.group(1) for m in _FENCE.finditer(text)]
    start, end = text.find("{"), text.rfind("}")
    if 0 <= start < end:
        candidates.append(text[start : end + 1])
    for candidate in candidates:
        try:
            value = json.loads(candidate)
        except json.JSONDecodeError:
            continue
        if isinstance(value, dict):
            return value
    return None
