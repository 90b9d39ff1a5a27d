"""Driving runs from the TUI: start `judgeloop run` as a detached process, stop it, decide a candidate
(in process, through the engine).

A run started here is its own process in its own session (``start_new_session=True``) writing to
``experiments/runs/<timestamp>.log``, so closing the TUI — or the TUI crashing — never stops it.
Stopping is the loop's own protocol: create ``experiments/STOP``; the loop finishes its current step.
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from optimizer.errors import UserError
from optimizer.vocab import FLAG_PROVIDERS, MANUAL, POLICIES, RunStrategyName
from optimizer.workspace.paths import WorkspacePaths
from optimizer.workspace.workspace import Workspace, lock_holder

# `judgeloop run --strategy`'s names (optimizer.vocab) in the start-run form's order: the offline one first,
# then by cost, "manual" last (a test holds this a permutation of RUN_STRATEGIES).
STRATEGIES: tuple[RunStrategyName, ...] = ("library", "memory", "reflect", "agent", MANUAL)
# How the start-run form names them ("manual" judges the prompts as you edited them in the working tree).
STRATEGY_LABELS: dict[str, str] = {MANUAL: "manual (judge my edit of the prompts)"}
# `judgeloop run --provider`'s names: never the harness judge ("command"), which the flag refuses (a
# workspace configured for it keeps it by passing no --provider).
PROVIDERS: tuple[str, ...] = FLAG_PROVIDERS


@dataclass(frozen=True)
class RunChoices:
    """What the start-run form offers: the workspace's splits a run may use (never a held-out one) and
    the config's split, policy and provider (the form's defaults)."""

    splits: tuple[str, ...]
    split: str
    policy: str
    provider: str
    heldout: tuple[str, ...] = ()
    policies: tuple[str, ...] = POLICIES
    providers: tuple[str, ...] = PROVIDERS


def run_choices(ws_root: Path) -> RunChoices:
    """The start-run form's choices from the workspace's ``judgeloop.toml`` and ``devset/`` (UserError
    for a config it cannot read). The configured dev split is offered even before it is imported
    (the run then says what to do); a held-out split never is."""
    from optimizer.devset.split import list_splits

    ws = Workspace.open(ws_root)
    heldout = tuple(ws.config.workspace.heldout_splits)
    dev = ws.config.workspace.dev_split
    splits = [name for name in list_splits(ws) if name not in heldout]
    if dev not in splits and dev not in heldout:
        splits.insert(0, dev)
    return RunChoices(
        splits=tuple(splits),
        split=dev,
        policy=ws.config.loop.policy,
        provider=ws.config.judge.provider,
        heldout=heldout,
    )


@dataclass(frozen=True)
class RunOptions:
    """What the start-run form asks; None means "the workspace config decides"."""

    strategy: str | None = None
    max_experiments: int | None = None
    budget_usd: float | None = None
    hours: float | None = None
    propose_only: bool = False
    resume: bool = False
    split: str | None = None
    policy: str | None = None
    provider: str | None = None

    def argv(self, ws_root: Path) -> list[str]:
        """The `judgeloop run` command line for these options."""
        cmd = [sys.executable, "-m", "optimizer.cli", "run", "-w", str(ws_root)]
        if self.resume:
            return [*cmd, "--resume"]
        if self.strategy:
            if self.strategy not in STRATEGIES:
                raise UserError(f"unknown strategy {self.strategy!r}; choose one of {', '.join(STRATEGIES)}")
            cmd += ["--strategy", self.strategy]
        for flag, value, names in (
            ("--policy", self.policy, POLICIES),
            ("--provider", self.provider, PROVIDERS),
        ):
            if value:
                if value not in names:
                    raise UserError(f"unknown {flag[2:]} {value!r}; choose one of {', '.join(names)}")
                cmd += [flag, value]
        if self.split:
            if self.split.startswith("-"):  # a name, never an option of its own
                raise UserError(
                    f"split {self.split!r} is not a split name; choose one of the workspace's splits"
                )
            cmd += ["--split", self.split]
        if self.max_experiments is not None:
            cmd += ["--max-experiments", str(self.max_experiments)]
        if self.budget_usd is not None:
            cmd += ["--budget-usd", f"{self.budget_usd:g}"]
        if self.hours is not None:
            cmd += ["--hours", f"{self.hours:g}"]
        if self.propose_only:
            cmd.append("--propose-only")
        return cmd


@dataclass(frozen=True)
class StartedRun:
    pid: int
    log_path: Path
    argv: list[str]
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False, compare=False)


def early_outcome(started: StartedRun, wait_s: float = 3.0) -> tuple[int, str] | None:
    """(exit code, last log line) if the run ended within ``wait_s`` seconds, else None. A refusal
    (a dirty tree, a missing key, no edit for --strategy manual) is one line at the end of its log."""
    if started.process is None:
        return None
    try:
        code = started.process.wait(timeout=wait_s)
    except subprocess.TimeoutExpired:
        return None
    try:
        lines = [
            ln.strip() for ln in started.log_path.read_text(encoding="utf-8", errors="replace").splitlines()
        ]
    except OSError:
        lines = []
    return code, next((ln for ln in reversed(lines) if ln), "(no output)")


def start_run(ws_root: Path, options: RunOptions) -> StartedRun:
    """Start `judgeloop run` detached from the TUI; returns its pid and log file. Never waits for it."""
    ws_root = Path(ws_root).resolve()
    runs_dir = WorkspacePaths(ws_root).runs
    runs_dir.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    log_path = runs_dir / f"{stamp}.log"
    n = 1
    while log_path.exists():  # two starts in one second get two logs
        n += 1
        log_path = runs_dir / f"{stamp}-{n}.log"
    argv = options.argv(ws_root)
    if options.split and not options.resume:
        heldout = Workspace.open(ws_root).config.workspace.heldout_splits
        if options.split in heldout:  # the optimiser must never see it; `judgeloop confirm` evaluates it
            raise UserError(
                f"split {options.split!r} is held out ([workspace] heldout_splits): a run never uses it; "
                "pick a dev split"
            )
    with log_path.open("ab") as log:
        proc = subprocess.Popen(
            argv,
            cwd=ws_root,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own session: no SIGHUP/SIGINT from the TUI's terminal
        )
    return StartedRun(pid=proc.pid, log_path=log_path, argv=argv, process=proc)


def running_command(ws_root: Path) -> str | None:
    """The judgeloop command holding the workspace's loop lock (e.g. "judgeloop run, pid 12"), or None."""
    return lock_holder(Workspace.open(ws_root))


def request_stop(ws_root: Path) -> Path | None:
    """Create ``experiments/STOP`` when a run is going (it stops after its current step) and return the
    path; None, creating nothing, when no run is going: a STOP left behind would end the next run."""
    holder = running_command(ws_root)
    if holder is None or "judgeloop run" not in holder:
        return None
    path = WorkspacePaths(Path(ws_root)).stop
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("stop requested from the TUI\n", encoding="utf-8")
    return path


@dataclass(frozen=True)
class CommandResult:
    returncode: int
    output: str


def decide(ws_root: Path, experiment_id: int, decision: str) -> CommandResult:
    """Keep or discard a waiting candidate in this process, through the engine's `decide` (the
    same function `judgeloop decide` calls); returns an exit code and what it said, as the command
    would (0, or 2 with the one-line error). Takes the workspace's loop lock like the command."""
    from optimizer.events import Event
    from optimizer.events import said as said_line
    from optimizer.loop.decide import decide as decide_candidate
    from optimizer.workspace.workspace import Workspace

    if decision not in ("keep", "discard"):
        raise UserError(f"unknown decision {decision!r}; use keep or discard")
    said: list[str] = []

    def collect(event: Event) -> None:
        line = said_line(event)
        if line is not None:
            said.append(line.text)

    try:
        decide_candidate(Workspace.open(ws_root), experiment_id, decision == "keep", collect)
    except UserError as exc:
        return CommandResult(2, "\n".join([*said, f"judgeloop: error: {exc}"]))
    return CommandResult(0, "\n".join(said))


def opener_command(path: Path, environ: dict[str, str]) -> list[str] | None:
    """How to open a file outside the terminal: ``$OPENER``, else xdg-open/open if installed; else None."""
    import shlex
    import shutil

    if environ.get("OPENER"):
        return [*shlex.split(environ["OPENER"]), str(path)]
    for name in ("xdg-open", "open"):
        found = shutil.which(name)
        if found:
            return [found, str(path)]
    return None
