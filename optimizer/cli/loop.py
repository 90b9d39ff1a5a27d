"""`judgeloop run`, `judgeloop decide`, `judgeloop confirm`."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

from optimizer.cli.eval import format_metrics, judge_overrides
from optimizer.cli.progress import TerminalEvents
from optimizer.cli.signals import stop_on_signals
from optimizer.errors import UserError
from optimizer.evaluation.stopping import Interrupted
from optimizer.events import StopKind
from optimizer.loop.confirm import confirm
from optimizer.loop.decide import decide
from optimizer.loop.session import RunOptions, resume_run, start_run
from optimizer.workspace.workspace import Workspace


def cmd_run(args: argparse.Namespace) -> int:
    """Start (or with --resume continue) the optimisation loop. 130 when Ctrl-C or SIGTERM stopped it
    (the first stops it cleanly after the judge calls in flight, a second at once), so a script's
    `judgeloop run && ...` does not go on as if the run had ended; 0 for any other end (experiments/STOP,
    the limits, propose-only waiting)."""
    options = RunOptions(
        split=args.split,
        strategy=args.strategy,
        message=args.message,
        policy=args.policy,
        max_experiments=args.max_experiments,
        budget_usd=args.budget_usd,
        hours=args.hours,
        patience=args.patience,
        replicates=args.replicates,
        propose_only=bool(args.propose_only),
        judge=judge_overrides(args),
        batch=bool(args.batch),
        wave=args.wave,
    )
    ws = Workspace.open(args.workspace)
    # Status lines on stdout; each evaluation's progress line on stderr (a terminal only; the ledger
    # has it too, for the TUI).
    with TerminalEvents() as events, stop_on_signals("the run") as stop:
        outcome = (resume_run if args.resume else start_run)(ws, options, events, stop)
    return 130 if outcome.aborted or outcome.stop.kind is StopKind.INTERRUPTED else 0


def cmd_decide(args: argparse.Namespace) -> int:
    """Keep or discard a waiting candidate. A keep the policy would roll back is asked about on a terminal
    (y to keep) and needs --force elsewhere: a person's overrule is never silent."""
    with TerminalEvents(progress=False) as events:
        decide(
            Workspace.open(args.workspace),
            args.experiment,
            args.decision == "keep",
            events,
            confirm_overrule=_ask_overrule(bool(args.force)),
        )
    return 0


def _ask_overrule(force: bool) -> Callable[[str], bool]:
    """The `ConfirmOverrule` of `judgeloop decide`: yes with --force; a y/N question on a terminal; without
    one (a script, a pipe) a `UserError` saying to add --force."""

    def ask(question: str) -> bool:
        if force:
            return True
        if not (sys.stdin.isatty() and sys.stdout.isatty()):
            raise UserError(f"{question}; add --force to keep it anyway (no terminal to ask on)")
        try:
            answer = input(f"{question}.\nKeep it anyway? [y/N] ")
        except EOFError:
            answer = ""
        return answer.strip().lower() in ("y", "yes")

    return ask


def cmd_confirm(args: argparse.Namespace) -> int:
    """Evaluate a run's final prompts once on a held-out split; each use is recorded and capped.
    130 when a signal stopped it (nothing recorded, the use not counted)."""
    with TerminalEvents(prefix="judgeloop confirm: ") as events, stop_on_signals("the confirmation") as stop:
        try:
            outcome = confirm(
                Workspace.open(args.workspace),
                args.split,
                run_id=args.run,
                judge_overrides=judge_overrides(args),
                events=events,
                batch=bool(args.batch),
                stop=stop,
                inspect_log=Path(args.inspect_log) if args.inspect_log else None,
            )
        except Interrupted as exc:
            events.clear()
            print(f"judgeloop confirm: stopped by {stop.reason}: {exc}", file=sys.stderr)
            return 130
    print(format_metrics(outcome.metrics))
    if outcome.transfer:
        print(
            f"transfer evidence: prompts tuned on {outcome.dev_benchmark}, measured on {outcome.benchmark} "
            f"(split {outcome.split}); `judgeloop certify` reports it under benchmark transfer"
        )
    if outcome.inspect_log is not None:
        print(f"inspect log: {outcome.inspect_log} (open it with `inspect view`)")
    return 0
