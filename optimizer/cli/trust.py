"""`judgeloop selftest` and `judgeloop certify`: can the workspace's judge be trusted (engine:
`optimizer.trust.selftest`, `optimizer.trust.certify`)."""

from __future__ import annotations

import argparse
import json
import sys

from optimizer.cli.eval import judge_overrides
from optimizer.cli.progress import TerminalEvents
from optimizer.events import Event, Listener, said
from optimizer.trust.certify import CertifyOptions, certify
from optimizer.trust.selftest import DEFAULT_REPEATS, SelftestOptions, selftest
from optimizer.workspace.workspace import Workspace


def _events(as_json: bool, terminal: TerminalEvents) -> Listener:
    """Events on the terminal; with --json stdout is one JSON object, so status lines go to stderr."""

    def events(event: Event) -> None:
        line = said(event)
        if as_json and line is not None:
            print(line.text, file=sys.stderr, flush=True)
        else:
            terminal(event)

    return events


def cmd_selftest(args: argparse.Namespace) -> int:
    """A/A repeats, the planted degradation and the minimum detectable gain on the dev split; --json
    prints the recorded result as one object."""
    repeats = DEFAULT_REPEATS if args.repeats is None else args.repeats
    options = SelftestOptions(budget_usd=args.budget_usd, repeats=repeats, judge=judge_overrides(args))
    with TerminalEvents() as terminal:
        result = selftest(Workspace.open(args.workspace), options, _events(args.json, terminal))
    if args.json:
        print(json.dumps(result.to_json()))
    return 0


def cmd_certify(args: argparse.Namespace) -> int:
    """Certify the prompts at REV (default HEAD); --json prints the certificate as one object."""
    options = CertifyOptions(
        rev=args.rev, transfer_model=args.transfer_model, judge=judge_overrides(args), bias=not args.no_bias
    )
    with TerminalEvents() as terminal:
        cert = certify(Workspace.open(args.workspace), options, _events(args.json, terminal))
    if args.json:
        print(json.dumps(cert.to_json()))
    return 0
