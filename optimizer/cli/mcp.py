"""`judgeloop mcp`: serve one optimisation session to a coding agent over MCP (stdio). Engine:
`optimizer.mcp`. Standard output is the protocol's; every line for the person goes to stderr."""

from __future__ import annotations

import argparse
import sys

import anyio

from optimizer.cli.eval import judge_overrides
from optimizer.events import Event, Message, said
from optimizer.mcp.server import serve
from optimizer.mcp.session import SessionOptions, open_session
from optimizer.workspace.workspace import Workspace


def _to_stderr(event: Event) -> None:
    line = said(event)
    if line is not None:
        print(f"judgeloop mcp: {line.text}", file=sys.stderr, flush=True)


def cmd_mcp(args: argparse.Namespace) -> int:
    """Open the session (the loop lock; its run starts when a call needs one), serve it until the client
    disconnects, close it."""
    options = SessionOptions(
        budget_usd=args.budget_usd,
        policy=args.policy,
        replicates=args.replicates,
        judge=judge_overrides(args),
    )
    with open_session(Workspace.open(args.workspace), options, _to_stderr) as session:
        _to_stderr(
            Message(
                f"session open (budget ${options.budget_usd:g}; its run starts with the first disagreements or "
                f"propose, on dev split {session.split.name}); serving MCP on stdio"
            )
        )
        anyio.run(serve, session)
    return 0
