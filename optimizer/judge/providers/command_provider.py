"""``provider = "command"``: a harness judge, a coding-agent CLI run once per call in a fresh sandbox.

Each call (`CommandProvider.complete`) makes a sandbox folder outside the workspace (the system's temp
folder, `optimizer.judge.sandbox.new_folder`), lays the item's sandbox out in it
(`optimizer.judge.harness.write_sandbox`) and runs the command there, confined by bubblewrap
(`optimizer.judge.sandbox`: own PID/mount/IPC/UTS namespaces, the folder its only writable place and
cwd, no workspace, labels or parent ``/proc``, an allow-listed environment) unless ``[judge] sandbox =
"none"``. Its output is read capped and its life bounded (`harness_process.run_bounded`: killed with
its whole namespace after ``[judge] timeout_s`` and when judgeloop dies); the verdict is read
(``<id>.json`` in the sandbox, else the CLI's final message) and the folder removed, whatever happened.
Folders left by a judgeloop killed with -9 are removed when the next provider starts.

A timeout, a non-zero exit or a failure to start is retried ``[judge] max_retries`` times, then raised
as `InfrastructureError` (never cached; the evaluation's infrastructure rounds judge the item again).
A CLI that answered is a reply like any model's, cached and parsed strictly: a malformed or oversized
verdict is a parse failure. A program that is not installed, or bubblewrap missing or unusable, is a
`UserError` when the provider is made.

Cost: what the CLI reports (Claude Code ``total_cost_usd``, OpenCode's per-step cost), else
``[judge] price_per_call_usd``, else the reported tokens priced by ``[prices]`` / the built-in table
when they know the model, else unknown (counted at $0, said in the run's notes). A budget reserves the
call ceiling per call (`optimizer.judge.call_ceiling`: it rises with the costs calls report).
"""

from __future__ import annotations

import asyncio
import os
import shutil
from pathlib import Path
from typing import Any

from optimizer.errors import UserError
from optimizer.judge.call_ceiling import CallCeiling
from optimizer.judge.harness import (
    HarnessSpec,
    child_env,
    command_line,
    harness_spec,
    parse_output,
    verdict_file_text,
    write_sandbox,
)
from optimizer.judge.providers.harness_process import STDOUT_KEEP, RunResult, die_with_parent, run_bounded
from optimizer.judge.sandbox import (
    SANDBOX_MOUNT,
    args_fd,
    bwrap_arguments,
    new_folder,
    program_views,
    prune_stale,
    require_bwrap,
)
from optimizer.judge.types import InfrastructureError, JudgeRequest, ProviderReply, ProviderTraits, Sampling
from optimizer.workspace.config import JudgeSection

# Bytes of the CLI's stderr kept in a failure's message.
STDERR_TAIL = 300
UNCONFINED_NOTE = (
    'the harness judge ran unconfined ([judge] sandbox = "none"): its CLI could read the '
    "workspace, its labels and this user's files"
)


class CommandProvider:
    """`optimizer.judge.types.Provider` running a harness CLI per call (see the module docstring)."""

    name = "command"

    def __init__(self, judge: JudgeSection) -> None:
        self.spec: HarnessSpec = harness_spec(judge)
        self._judge = judge
        # What results say answered: the harness and, when set, the model it was told to use.
        self.model = f"{self.spec.name}/{judge.model}" if judge.model else self.spec.name
        self.unpriced_calls = 0  # calls whose cost nobody reported (no CLI cost, no per-call price)
        self.overflowed_calls = 0  # calls whose stdout went over the cap
        self.dropped_bytes = 0  # ... and the bytes of it dropped
        self.confinement = judge.sandbox
        self.ceiling = CallCeiling(
            judge.price_per_call_usd, judge.max_cost_per_call_usd, reports_cost=self.spec.reports_cost
        )
        self.traits = ProviderTraits(
            sandbox=self.spec.identity(self.confinement),
            priced_per_call=True,
            call_price_usd=judge.price_per_call_usd,
            call_ceiling=self.ceiling,
            confinement=self.confinement,
        )
        # Resolved now: the CLI runs with the sandbox as its cwd, where a relative program path means nothing.
        program = shutil.which(self.spec.argv[0])
        if program is None:
            raise UserError(
                f"the harness command {self.spec.argv[0]!r} is not installed or not on PATH; "
                "install it or fix [judge] command / harness"
            )
        self._program = os.path.abspath(program)
        self._home = Path(os.environ.get("HOME") or Path.home())
        self._bwrap: str | None = None
        if self.confinement == "bwrap":
            self._bwrap = require_bwrap()
            self._view = program_views(Path(self._program), os.environ.get("PATH", os.defpath), self._home)
        prune_stale()  # the folders of a judgeloop killed with -9

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
            raise ValueError(
                "a command judge needs a sandbox request (optimizer.judge.harness.sandbox_request)"
            )
        prompt = "".join(getattr(p, "text", "") for p in request.parts)
        failure = ""
        for _attempt in range(self._judge.max_retries + 1):
            outcome = await self._run_once(request, prompt)
            if isinstance(outcome, ProviderReply):
                return outcome
            failure = outcome
        tries = self._judge.max_retries + 1
        raise InfrastructureError(f"{failure} ({tries} attempt{'s' if tries > 1 else ''})")

    def _launch(self, argv: list[str], folder: Path) -> tuple[list[str], dict[str, str], tuple[int, ...]]:
        """The argv, environment and inherited descriptors that run ``argv`` on ``folder``: under
        bwrap (its options in a memory file), or as they are when unconfined."""
        if self._bwrap is None:
            return argv, child_env(self.spec, self._judge.pass_env, str(folder)), ()
        env = child_env(self.spec, self._judge.pass_env, SANDBOX_MOUNT)
        fd = args_fd(bwrap_arguments(folder, self._view, self._home, self.spec.config_paths, env))
        # bwrap starts with an empty environment: inside, it is PID 1 and its environ is readable.
        return [self._bwrap, "--args", str(fd), "--", *argv], {}, (fd,)

    async def _run_once(self, request: JudgeRequest, prompt: str) -> ProviderReply | str:
        """One run in a fresh sandbox: the reply, or why the run failed."""
        sandbox = request.sandbox
        assert sandbox is not None
        folder = new_folder()
        try:
            await asyncio.to_thread(write_sandbox, sandbox, folder)
            argv, stdin = command_line(self.spec, prompt, sandbox.trajectory_id)
            argv[0] = self._program
            launch, env, fds = self._launch(argv, folder)
            try:
                run = await run_bounded(
                    launch,
                    cwd=folder,
                    env=env,
                    stdin=stdin,
                    timeout_s=self._judge.timeout_s,
                    pass_fds=fds,
                    preexec_fn=die_with_parent,
                )
            except FileNotFoundError:
                raise UserError(
                    f"the harness command {launch[0]!r} is not installed or not on PATH; "
                    "install it or fix [judge] command / harness"
                ) from None
            except OSError as exc:
                return f"could not start {launch[0]} ({exc.strerror or exc})"
            finally:
                for fd in fds:
                    os.close(fd)
            if run.returncode is None:
                return (
                    f"{self.spec.name} did not finish within {self._judge.timeout_s:g} s (timeout_s); killed"
                )
            if run.returncode != 0:
                tail = run.stderr.decode(errors="replace").strip()[-STDERR_TAIL:]
                return f"{self.spec.name} exited with status {run.returncode}" + (f": {tail}" if tail else "")
            out = parse_output(self.spec.output, run.stdout.decode(errors="replace"))
            written = await asyncio.to_thread(verdict_file_text, folder, sandbox.trajectory_id)
        finally:
            await asyncio.to_thread(shutil.rmtree, folder, True)
        if out.cost_usd is not None:
            self.ceiling.observe(out.cost_usd)
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
            raw=self._raw(run, written is not None),
        )

    def _raw(self, run: RunResult, from_file: bool) -> dict[str, Any]:
        """The reply's notes: where the verdict came from, how the CLI ran, what of its output was dropped."""
        raw: dict[str, Any] = {
            "verdict_source": "file" if from_file else "final message",
            "harness": self.spec.name,
            "confinement": self.confinement,
        }
        if run.stdout_dropped:
            self.overflowed_calls += 1
            self.dropped_bytes += run.stdout_dropped
            raw["stdout_dropped_bytes"] = run.stdout_dropped
        if run.stderr_dropped:
            raw["stderr_dropped_bytes"] = run.stderr_dropped
        return raw

    async def aclose(self) -> None:
        """Nothing stays open between calls (each call's process and folder end with it)."""

    def run_notes(self) -> tuple[str, ...]:
        notes: list[str] = []
        if self.confinement == "none":
            notes.append(UNCONFINED_NOTE)
        if self.overflowed_calls:
            notes.append(
                f"{self.overflowed_calls} {self.spec.name} call(s) printed more than {STDOUT_KEEP} bytes: "
                f"{self.dropped_bytes} bytes of their output were dropped (its first and last "
                f"{STDOUT_KEEP // 2} bytes kept)"
            )
        if self.unpriced_calls:
            notes.append(
                f"{self.unpriced_calls} {self.spec.name} call(s) reported no cost: priced from their token "
                "counts where [prices] or the built-in table knows the model, else counted at $0 (cost "
                "unknown); set [judge] price_per_call_usd"
            )
        return tuple(notes)
