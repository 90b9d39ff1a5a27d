"""`vllm run-batch` as the batch engine of an OpenAI-compatible server (``[judge] batch_engine =
"vllm-run-batch"``): a server without a batch API answers ``--batch`` passes through files.

`RunBatchFiles` wraps the `OpenAIProvider` of the server (``base_url``/``base_urls``) and is a
`BatchingProvider` like the Anthropic and OpenAI batch APIs, so the batch pass
(`optimizer.evaluation.batch`) records, resumes, caches and accounts its batches exactly as theirs:

- ``submit_batch`` writes the OpenAI batch file the provider would upload (one ``{"custom_id", "method",
  "url", "body"}`` line per call, ``body`` exactly what a direct call posts) as ``<id>.input.jsonl`` in
  ``[judge] batch_dir`` (written whole, then renamed into place); the batch id is ``<id>``;
- ``batch_state`` polls for ``<id>.output.jsonl``: the batch has ended once that file exists. vLLM streams
  its output file while it runs, so the command judgeloop prints (`run_batch_command`) writes to
  ``<id>.output.jsonl.part`` and renames it when vLLM exits successfully; an output file made elsewhere
  is imported by copying it to that name;
- ``batch_results`` reads the output file line by line: a line that is not JSON, or not an object, is
  skipped and recorded (`run_notes`, the pass's notes); a line whose answer is not a chat completion
  is an errored entry; a call without a line is not answered (the pass re-submits it alone);
- direct calls (a pass without ``--batch``) go to the server as usual, and the
  cache keys name the server, so batch and direct answers are one cache.

``traits.batch_offline``: a batch is billed as direct calls (vLLM has no batch price), and no cold item is
warmed by a direct call first (the server's prefix cache is not the one `vllm run-batch` reads).
Judge-input side: never reads labels.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import secrets
import shlex
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from optimizer.errors import UserError
from optimizer.judge.endpoints import EndpointFigures
from optimizer.judge.providers.openai_provider import OpenAIProvider
from optimizer.judge.types import (
    AssistantTurn,
    BatchEntry,
    BatchState,
    ConversationMessage,
    JudgeRequest,
    ProviderReply,
    ProviderTraits,
    Sampling,
    ToolSpec,
)

INPUT_SUFFIX = ".input.jsonl"
OUTPUT_SUFFIX = ".output.jsonl"
# The batch ids this engine makes (and the only ones it turns into paths): a UTC time and 32 random bits.
BATCH_ID = re.compile(r"rb-\d{8}T\d{6}-[0-9a-f]{8}")
# An input line starts with its custom id (`OpenAIProvider.batch_input` writes it first): read from its head.
_CUSTOM_ID = re.compile(rb'\{"custom_id":"([0-9A-Za-z_.:-]+)"')
HEAD_BYTES = 200
# A skipped output line is quoted in its note up to this many characters.
QUOTE_CHARS = 80


def run_batch_command(folder: Path, batch_id: str, model: str) -> str:
    """The shell command that answers batch ``batch_id`` in ``folder`` with ``vllm run-batch`` for ``model``
    (its output renamed into place only once vLLM exits successfully)."""
    source = shlex.quote(str(folder / f"{batch_id}{INPUT_SUFFIX}"))
    output = folder / f"{batch_id}{OUTPUT_SUFFIX}"
    part = shlex.quote(f"{output}.part")
    return f"vllm run-batch -i {source} -o {part} --model {shlex.quote(model)} && mv {part} {shlex.quote(str(output))}"


class RunBatchFiles:
    """The server's provider, with batches as files `vllm run-batch` answers (see the module docstring)."""

    def __init__(self, inner: OpenAIProvider, folder: Path) -> None:
        self.inner = inner
        self.folder = folder
        self.name = inner.name
        self.model = inner.model
        # The cache keys the server (`optimizer.evaluation.cache.provider_endpoint`): the same as direct calls.
        self.default_base_url = inner.default_base_url
        self.base_url = inner.base_url
        self.base_urls = inner.base_urls
        # A batch id means something only in its folder: the batch store keys open batches by this.
        self.where = folder.resolve().as_uri()
        self._notes: list[str] = []

    @property
    def traits(self) -> ProviderTraits:
        return dataclasses.replace(self.inner.traits, batch_offline=True)

    async def complete(
        self, request: JudgeRequest, sampling: Sampling, schema: dict[str, Any]
    ) -> ProviderReply:
        return await self.inner.complete(request, sampling, schema)

    async def converse(
        self,
        system: str,
        messages: list[ConversationMessage],
        tools: list[ToolSpec],
        sampling: Sampling,
        *,
        cache_conversation: bool = True,
    ) -> tuple[AssistantTurn, ProviderReply]:
        return await self.inner.converse(
            system, messages, tools, sampling, cache_conversation=cache_conversation
        )

    def run_notes(self) -> tuple[str, ...]:
        """The server's own notes, then what this engine saw in output files since the last call."""
        mine, self._notes = self._notes, []
        return (*self.inner.run_notes(), *mine)

    def take_endpoint_pass(self) -> EndpointFigures:
        return self.inner.take_endpoint_pass()

    async def aclose(self) -> None:
        await self.inner.aclose()

    # -- the batch files --------------------------------------------------------------------------

    def _paths(self, batch_id: str) -> tuple[Path, Path] | None:
        if not BATCH_ID.fullmatch(batch_id):  # not one of ours (a store edited by hand): no path from it
            return None
        return self.folder / f"{batch_id}{INPUT_SUFFIX}", self.folder / f"{batch_id}{OUTPUT_SUFFIX}"

    async def submit_batch(
        self, requests: Sequence[tuple[str, JudgeRequest]], sampling: Sampling, schema: dict[str, Any]
    ) -> BatchState:
        """Write the batch's input file; its state says the command that answers it."""
        data = self.inner.batch_input(requests, sampling, schema)
        batch_id = f"rb-{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}-{secrets.token_hex(4)}"
        source = self.folder / f"{batch_id}{INPUT_SUFFIX}"
        staged = self.folder / f".{batch_id}{INPUT_SUFFIX}.tmp"
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            staged.write_bytes(data)
            os.replace(staged, source)  # a watcher never sees half a file
        except OSError as exc:
            staged.unlink(missing_ok=True)
            raise UserError(
                f"cannot write the batch file {source} ({exc.strerror or exc}); make [judge] batch_dir "
                "a writable folder"
            ) from None
        return BatchState(batch_id, self._waiting(batch_id), ended=False, counts={"total": len(requests)})

    def _waiting(self, batch_id: str) -> str:
        return f"waiting for its output file; run: {run_batch_command(self.folder, batch_id, self.model)}"

    @staticmethod
    def _custom_ids(source: Path) -> set[str] | None:
        """The custom ids of an input file (None when it cannot be read: then no line is refused for it)."""
        try:
            with source.open("rb") as f:
                ids = {_CUSTOM_ID.match(line[:HEAD_BYTES]) for line in f}
        except OSError:
            return None
        return {m.group(1).decode() for m in ids if m is not None}

    async def batch_state(self, batch_id: str) -> BatchState:
        """Ended once the output file exists (or when the batch cannot be answered here any more: its
        input file is gone, or the id is not one this engine made; then no entry is returned)."""
        paths = self._paths(batch_id)
        if paths is None:
            return BatchState(batch_id, "not a vllm-run-batch id; its calls are sent again", ended=True)
        source, output = paths
        if output.is_file():
            return BatchState(batch_id, "output file found", ended=True)
        if not source.is_file():
            return BatchState(batch_id, f"input file {source} is gone; its calls are sent again", ended=True)
        return BatchState(batch_id, self._waiting(batch_id), ended=False)

    async def batch_results(self, batch_id: str) -> list[BatchEntry]:
        """Every well-formed line of the output file (none when there is no file)."""
        paths = self._paths(batch_id)
        if paths is None or not paths[1].is_file():
            return []
        output = paths[1]
        try:
            text = output.read_bytes().decode("utf-8", errors="replace")
        except OSError as exc:
            self._notes.append(
                f"batch {batch_id}: cannot read {output} ({exc.strerror or exc}); its calls are sent again"
            )
            return []
        asked = self._custom_ids(paths[0])
        entries: list[BatchEntry] = []
        skipped: list[str] = []
        foreign = 0
        for number, raw in enumerate(text.splitlines(), start=1):
            if not raw.strip():
                continue
            try:
                line = json.loads(raw)
            except ValueError:
                skipped.append(f"line {number} is not JSON ({raw[:QUOTE_CHARS]!r})")
                continue
            if not isinstance(line, dict) or not isinstance(line.get("custom_id"), str):
                skipped.append(f"line {number} is not an output object with a custom_id")
                continue
            if asked is not None and line["custom_id"] not in asked:
                foreign += 1  # an output file of another batch, imported under this name: never an answer
                continue
            entries.append(self.inner.batch_entry(line))
        if foreign:
            self._notes.append(
                f"batch {batch_id}: {foreign} line(s) of {output.name} answer no call of its input file "
                "(the output of another input file?); ignored"
            )
        if skipped:
            self._notes.append(
                f"batch {batch_id}: {len(skipped)} malformed line(s) in {output.name} skipped (their calls count "
                f"as not answered): " + "; ".join(skipped[:5]) + ("; ..." if len(skipped) > 5 else "")
            )
        return entries
