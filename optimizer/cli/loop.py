"""`judgeloop run`, `judgeloop decide`, `judgeloop confirm`."""

from __future__ import annotations

import argparse

from optimizer.cli.eval import format_metrics, judge_overrides
from optimizer.cli.progress import TerminalEvents
from optimizer.loop.session import RunOptions, confirm, decide, resume_run, start_run
from optimizer.workspace import Workspace


def cmd_run(args: argparse.Namespace) -> int:
    """Start (or with --resume continue) the optimisation loop; 130 when a second Ctrl-C aborted it."""
    options = RunOptions(
        split=args.split, strategy=args.strategy, message=args.message, policy=args.policy,
        max_experiments=args.max_experiments, budget_usd=args.budget_usd, hours=args.hours,
        patience=args.patience, replicates=args.replicates, propose_only=bool(args.propose_only),
        judge=judge_overrides(args), batch=bool(args.batch),
    )
    ws = Workspace.open(args.workspace)
    # The loop's progress goes to the ledger (the TUI follows it); the terminal gets its status lines.
    with TerminalEvents(progress=False) as events:
        outcome = (resume_run if args.resume else start_run)(ws, options, events)
    return 130 if outcome.aborted else 0


def cmd_decide(args: argparse.Namespace) -> int:
    with TerminalEvents(progress=False) as events:
        decide(Workspace.open(args.workspace), args.experiment, args.decision == "keep", events)
    return 0


def cmd_confirm(args: argparse.Namespace) -> int:
    """Evaluate a run's final prompts once on a held-out split; each use is recorded and capped."""
    with TerminalEvents(progress=False) as events:
        outcome = confirm(Workspace.open(args.workspace), args.split, run_id=args.run,
                          judge_overrides=judge_overrides(args), events=events, batch=bool(args.batch))
    print(format_metrics(outcome.metrics))
    return 0
