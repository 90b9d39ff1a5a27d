"""``provider = "command"``: a harness judge, a coding-agent CLI run once per call in a fresh sandbox.

Each call (`CommandProvider.complete`) makes a temporary folder outside the workspace (the system's
temp folder), lays the item's sandbox out in it (`optimizer.judge.harness.write_sandbox`), runs the
command there — cwd the sandbox, its own process group, an environment without other providers'
keys (`optimizer.judge.harness.child_env`), killed with the process group after ``[judge] timeout_s``
and, on Linux, when judgeloop itself dies — reads the verdict (``<id>.json`` in the sandbox, else the
CLI's final message) and removes the folder, whatever happened.

A timeout, a non-zero exit or a failure to start is retried ``[judge] max_retries`` times, then raised
as `InfrastructureError` (never cached; the evaluation's infrastructure rounds judge the item again).
A CLI that answered is a reply like any model's, cached and parsed strictly: a malformed verdict is a
parse failure. A program that is not installed is a `UserError` at the first call.

Cost: what the CLI reports (Claude Code ``total_cost_usd``, OpenCode's per-step cost), else
``[judge] price_per_call_usd``, else the reported tokens priced by ``[prices]`` / the built-in table
when they know the model, else unknown (counted at $0, said in the run's notes).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import sys
import tempfile
from pathlib import Path
from typing import Any

from optimizer.config import JudgeSection
from optimizer.errors import UserError
from optimizer.judge.harness import (
    HarnessSpec,
    child_env,
    command_line,
    harness_spec,
    parse_output,
    verdict_file_text,
    write_sandbox,
)
from optimizer.judge.types import InfrastructureError, JudgeRequest, ProviderReply, ProviderTraits, Sampling

SANDBOX_PREFIX = "judgeloop-harness-"
# Bytes of the CLI's stderr kept in a failure's message.
STDERR_TAIL = 300


def _die_with_parent() -> None:
    """In the child, before exec: SIGKILL when the process that started it dies (Linux prctl), so a
    judgeloop killed with -9 leaves no CLI running. Elsewhere nothing (the timeout still applies)."""
    if sys.platform.startswith("linux"):
        import ctypes

        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _kill_group(proc: asyncio.subprocess.Process) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


class CommandProvider:
    """`optimizer.judge.types.Provider` running a harness CLI per call (see the module docstring)."""

    name = "command"

    def __init__(self, judge: JudgeSection) -> None:
        self.spec: HarnessSpec = harness_spec(judge)
        self._judge = judge
        # What results say answered: the harness and, when set, the model it was told to use.
        self.model = f"{self.spec.name}/{judge.model}" if judge.model else self.spec.name
        self.unpriced_calls = 0  # calls whose cost nobody reported (no CLI cost, no per-call price)
        self.traits = ProviderTraits(
            sandbox=self.spec.identity(),
            priced_per_call=True,
            call_price_usd=judge.price_per_call_usd,
        )
        # Resolved now: the CLI runs with the sandbox as its cwd, where a relative program path means nothing.
        program = shutil.which(self.spec.argv[0])
        if program is None:
            raise UserError(f"the harness command {self.spec.argv[0]!r} is not installed or not on PATH; "
                            "install it or fix [judge] command / harness")
        self._program = os.path.abspath(program)

    def __repr__(self) -> str:
        return f"CommandProvider(harness={self.spec.name!r}, argv0={self.spec.argv[0]!r})"

    async def complete(
        self,
        request: JudgeRequest,
        sampling: Sampling,  # noqa: ARG002 - the CLI runs with its own sampling settings
        schema: dict[str, Any],  # noqa: ARG002 - the verdict contract is in the instructions
    ) -> ProviderReply:
        """Run the CLI on ``request``'s sandbox (retried on timeouts and failed runs, see the module)."""
        sandbox = request.sandbox
        if sandbox is None:
            raise ValueError("a command judge needs a sandbox request (optimizer.judge.harness.sandbox_request)")
        prompt = "".join(getattr(p, "text", "") for p in request.parts)
        failure = ""
        for _attempt in range(self._judge.max_retries + 1):
            outcome = await self._run_once(request, prompt)
            if isinstance(outcome, ProviderReply):
                return outcome
            failure = outcome
        tries = self._judge.max_retries + 1
        raise InfrastructureError(f"{failure} ({tries} attempt{'s' if tries > 1 else ''})")

    async def _run_once(self, request: JudgeRequest, prompt: str) -> ProviderReply | str:
        """One run in a fresh sandbox: the reply, or why the run failed."""
        sandbox = request.sandbox
        assert sandbox is not None
        folder = Path(tempfile.mkdtemp(prefix=SANDBOX_PREFIX))
        try:
            await asyncio.to_thread(write_sandbox, sandbox, folder)
            argv, stdin = command_line(self.spec, prompt, sandbox.trajectory_id)
            argv[0] = self._program
            try:
                proc = await asyncio.create_subprocess_exec(
                    *argv, cwd=folder, env=child_env(self.spec, self._judge.pass_env, folder),
                    stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
                    stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
                    start_new_session=True, preexec_fn=_die_with_parent,
                )
            except FileNotFoundError:
                raise UserError(f"the harness command {argv[0]!r} is not installed or not on PATH; "
                                "install it or fix [judge] command / harness") from None
            except OSError as exc:
                return f"could not start {argv[0]} ({exc.strerror or exc})"
            try:
                stdout, stderr = await asyncio.wait_for(proc.communicate(stdin), timeout=self._judge.timeout_s)
            except TimeoutError:
                _kill_group(proc)
                await proc.wait()
                return f"{self.spec.name} did not finish within {self._judge.timeout_s:g} s (timeout_s); killed"
            except BaseException:  # cancelled: the CLI and its children do not outlive the call
                _kill_group(proc)
                with contextlib.suppress(Exception):
                    await asyncio.shield(proc.wait())
                raise
            _kill_group(proc)  # anything the CLI left running in its group
            if proc.returncode != 0:
                tail = stderr.decode(errors="replace").strip()[-STDERR_TAIL:]
                return f"{self.spec.name} exited with status {proc.returncode}" + (f": {tail}" if tail else "")
            out = parse_output(self.spec.output, stdout.decode(errors="replace"))
            written = await asyncio.to_thread(verdict_file_text, folder, sandbox.trajectory_id)
        finally:
            await asyncio.to_thread(shutil.rmtree, folder, True)
        cost = out.cost_usd if out.cost_usd is not None else self._judge.price_per_call_usd
        if cost is None:
            self.unpriced_calls += 1
        return ProviderReply(
            text=written if written is not None else out.text,
            # The model that answered, as the price table names it (the provider's `model` adds the harness).
            model=out.model or self._judge.model or self.spec.name,
            input_tokens=out.input_tokens,
            output_tokens=out.output_tokens,
            cache_read_tokens=out.cache_read_tokens,
            cache_write_tokens=out.cache_write_tokens,
            cost_usd=cost,
            raw={"verdict_source": "file" if written is not None else "final message", "harness": self.spec.name},
        )

    async def aclose(self) -> None:
        """Nothing stays open between calls (each call's process and folder end with it)."""

    def run_notes(self) -> tuple[str, ...]:
        if not self.unpriced_calls:
            return ()
        return (f"{self.unpriced_calls} {self.spec.name} call(s) reported no cost: priced from their token "
                "counts where [prices] or the built-in table knows the model, else counted at $0 (cost unknown); "
                "set [judge] price_per_call_usd",)
