"""Model providers behind one small interface (`optimizer.judge.types.Provider`), for the judge and
the optimiser alike.

- ``anthropic`` — `AnthropicProvider` (the ``anthropic`` SDK, key from ``ANTHROPIC_API_KEY``).
- ``openai`` — `OpenAIProvider` (the ``openai`` SDK, key from ``OPENAI_API_KEY``; ``base_url`` for any
  OpenAI-compatible server).
- ``local`` — `LocalProvider`, the offline demonstration-quality judge (SmolLM2-135M via xllamacpp).
- ``command`` — `CommandProvider`, a harness judge: a coding-agent CLI run per item in a sandbox
  (`optimizer.judge.harness`).

`make_provider` builds the judge's from ``[judge]``; `make_optimizer_provider` builds the optimiser's
own model from ``[optimizer]`` with the same classes, so both share one key check, one error mapping,
one retry policy (the SDK's ``max_retries`` and ``timeout_s`` from the section), one token convention
(`ProviderReply`) and one price table (`pricing`). Only the wording of errors differs (`Role`).

Errors: transport failures that survive the SDK's retries raise `InfrastructureError`; a missing or
rejected key, an unknown model (HTTP 404), a server that cannot be reached before any judge call has
succeeded, or missing local runtime/weights raise `UserError`. Keys never appear in messages or reprs.
"""

from __future__ import annotations

from pathlib import Path

from optimizer.errors import UserError
from optimizer.judge.providers._common import JUDGE, OPTIMISER, Role
from optimizer.judge.providers.pricing import BUILTIN_PRICES, Usage, cost_usd, price_for
from optimizer.judge.types import ConversingProvider, Provider
from optimizer.workspace.config import JudgeSection, OptimizerSection

__all__ = [
    "BUILTIN_PRICES",
    "JUDGE",
    "OPTIMISER",
    "ConversingProvider",
    "Provider",
    "Role",
    "Usage",
    "check_judge_key",
    "check_optimizer_key",
    "cost_usd",
    "make_optimizer_provider",
    "make_provider",
    "price_for",
]


def make_provider(judge: JudgeSection, *, role: Role = JUDGE, root: Path | None = None) -> Provider:
    """The provider named by ``judge.provider``, configured from the section (model, base_url,
    timeout_s, max_retries). Raises `UserError` at once for a missing key, runtime or weights.
    Concurrency (``max_concurrency``) is the caller's to enforce. With ``batch_engine = "vllm-run-batch"``
    and the workspace ``root`` (``batch_dir`` is relative to it), the server's batches are files
    `vllm run-batch` answers (`optimizer.judge.providers.run_batch`); without ``root`` (a caller that
    never batches) the server's provider alone."""
    if judge.batch_engine == "vllm-run-batch" and root is not None and judge.provider != "openai":
        # Checked here, not in the config: --provider may set "openai" over the file's provider.
        raise UserError(
            f'batch_engine = "vllm-run-batch" needs provider = "openai" (the vLLM server\'s OpenAI API), not '
            f'{judge.provider!r}: pass --provider openai, or set batch_engine = "provider"'
        )
    if judge.provider == "anthropic":
        from optimizer.judge.providers.anthropic_provider import AnthropicProvider

        return AnthropicProvider(judge, role=role)
    if judge.provider == "openai":
        from optimizer.judge.providers.openai_provider import OpenAIProvider

        if judge.batch_engine == "vllm-run-batch" and root is not None:
            from optimizer.judge.providers.run_batch import RunBatchFiles

            if judge.base_url is None and judge.base_urls is None:
                raise UserError(
                    'batch_engine = "vllm-run-batch" needs the vLLM server\'s address for its direct calls and '
                    "cache keys: set [judge] base_url or pass --base-url"
                )
            server = OpenAIProvider(judge, role=role)
            return RunBatchFiles(server, root / judge.batch_dir)
        return OpenAIProvider(judge, role=role)
    if judge.provider == "local":
        from optimizer.judge.providers.local_provider import LocalProvider

        return LocalProvider(judge)
    if judge.provider == "command":
        from optimizer.judge.providers.command_provider import CommandProvider

        return CommandProvider(judge)
    raise ValueError(f"unknown provider {judge.provider!r}")  # config validation makes this unreachable


def make_optimizer_provider(optimizer: OptimizerSection) -> ConversingProvider:
    """The optimiser's own model (``anthropic`` or ``openai``), configured from ``[optimizer]`` (model,
    base_url, timeout_s, max_retries) through `make_provider`; its errors name the optimiser. Raises
    `UserError` at once for a missing key. Close it with ``aclose``."""
    return make_provider(_optimizer_settings(optimizer), role=OPTIMISER)  # type: ignore[return-value]


def check_judge_key(judge: JudgeSection) -> None:
    """The key check `make_provider` makes for the judge, without building a client: a `UserError` when
    the key its provider needs is not set, so a run or a session refuses before it creates anything."""
    if judge.provider == "anthropic":
        from optimizer.judge.providers.anthropic_provider import AnthropicProvider

        AnthropicProvider.read_key(judge, JUDGE)
    elif judge.provider == "openai":
        from optimizer.judge.providers.openai_provider import OpenAIProvider

        OpenAIProvider.read_key(judge, JUDGE)


def check_optimizer_key(optimizer: OptimizerSection) -> None:
    """The key check `make_optimizer_provider` makes, without building a client: a `UserError` naming
    the optimiser when the key its provider needs is not set (so a run fails before any experiment)."""
    settings = _optimizer_settings(optimizer)
    if settings.provider == "anthropic":
        from optimizer.judge.providers.anthropic_provider import AnthropicProvider

        AnthropicProvider.read_key(settings, OPTIMISER)
    else:
        from optimizer.judge.providers.openai_provider import OpenAIProvider

        OpenAIProvider.read_key(settings, OPTIMISER)


def _optimizer_settings(optimizer: OptimizerSection) -> JudgeSection:
    # The providers read their connection settings from a JudgeSection; the optimiser's are the same
    # fields of [optimizer], one conversation at a time.
    return JudgeSection(
        provider=optimizer.provider,
        model=optimizer.model,
        base_url=optimizer.base_url,
        timeout_s=optimizer.timeout_s,
        max_retries=optimizer.max_retries,
        max_concurrency=1,
    )
