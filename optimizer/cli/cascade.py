"""`judgeloop cascade calibrate`: a cascade's escalation rule chosen on one fold, reported on the other
(engine: `optimizer.answers.cascade`)."""

from __future__ import annotations

import argparse
import json
import sys

from optimizer.answers.cascade import CalibrateOptions, calibrate, calibration_lines
from optimizer.cli.eval import judge_overrides
from optimizer.cli.progress import TerminalEvents
from optimizer.events import Event, said
from optimizer.workspace.workspace import Workspace


def cmd_cascade_calibrate(args: argparse.Namespace) -> int:
    """Judge the dev split with both judges, print every rule's figures (or, with --json, one object)."""
    with TerminalEvents(prefix="judgeloop cascade calibrate: ") as terminal:

        def events(event: Event) -> None:
            line = said(event)
            if args.json and line is not None:
                print(line.text, file=sys.stderr, flush=True)
            else:
                terminal(event)

        result = calibrate(
            Workspace.open(args.workspace),
            CalibrateOptions(
                split=args.split,
                rev=args.rev,
                folds=args.folds,
                tune_fold=args.tune_fold,
                judge=judge_overrides(args),
            ),
            events,
        )
    print(json.dumps(result.as_json()) if args.json else "\n".join(calibration_lines(result)))
    return 0
