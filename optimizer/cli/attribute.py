"""`judgeloop attribute`: what each kept edit still contributes at the end (engine:
`optimizer.loop.attribute`)."""

from __future__ import annotations

import argparse
import json
import sys

from optimizer.cli.eval import judge_overrides
from optimizer.cli.progress import TerminalEvents
from optimizer.cli.signals import stop_on_signals
from optimizer.events import Event, said
from optimizer.loop.attribute import AttributeOptions, attribute
from optimizer.report import attribution_json
from optimizer.workspace.workspace import Workspace


def cmd_attribute(args: argparse.Namespace) -> int:
    """Measure the kept edits newest first within --budget-usd; --json prints the result as one object
    (status lines then go to stderr). A Ctrl-C or SIGTERM stops it after the calls in flight; what was
    measured is kept (exit 0, the attribution partial)."""
    options = AttributeOptions(run=args.run, budget_usd=args.budget_usd, judge=judge_overrides(args))
    with TerminalEvents() as terminal, stop_on_signals("the attribution") as stop:

        def events(event: Event) -> None:
            line = said(event)
            if args.json and line is not None:
                print(line.text, file=sys.stderr, flush=True)
            else:
                terminal(event)

        result = attribute(Workspace.open(args.workspace), options, events, stop)
    if args.json:
        print(json.dumps({"run": result.run_id, **attribution_json(result)}))
    return 0
