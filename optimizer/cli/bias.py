"""`judgeloop bias`: the bias battery for computer-use trajectories (engine: `optimizer.trust.bias`)."""

from __future__ import annotations

import argparse
import json
import sys

from optimizer.cli.eval import judge_overrides
from optimizer.cli.progress import TerminalEvents
from optimizer.events import Event, said
from optimizer.trust.bias import run_battery
from optimizer.workspace.workspace import Workspace


def cmd_bias(args: argparse.Namespace) -> int:
    """Run the battery on the prompts at REV; print its table (or, with --json, one object: status lines
    then go to stderr)."""
    # An unknown name is the engine's one-line UserError.
    probes = None if args.probes is None else [n.strip() for n in args.probes.split(",")]
    with TerminalEvents(prefix="judgeloop bias: ") as terminal:

        def events(event: Event) -> None:
            line = said(event)
            if args.json and line is not None:
                print(line.text, file=sys.stderr, flush=True)
            else:
                terminal(event)

        result = run_battery(
            Workspace.open(args.workspace),
            args.rev,
            split=args.split,
            events=events,
            budget_usd=args.budget_usd,
            probes=probes,
            judge=judge_overrides(args),
        )
    if args.json:
        print(json.dumps(result.to_json()))
    else:
        print("\n".join(result.markdown_lines()))
    return 0
