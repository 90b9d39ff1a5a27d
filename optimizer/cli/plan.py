"""`judgeloop plan`: what a budget buys before a run."""

from __future__ import annotations

import argparse
import json

from optimizer.cli.eval import judge_overrides
from optimizer.devset.split import open_split
from optimizer.judge.prompts import PromptSet
from optimizer.plan import make_plan
from optimizer.workspace.workspace import Workspace


def cmd_plan(args: argparse.Namespace) -> int:
    """``judgeloop plan --budget-usd X [--hours H] [--wave K] [--json]``."""
    ws = Workspace.open(args.workspace)
    cfg = ws.config
    judge = judge_overrides(args).apply(cfg.judge)
    split = open_split(ws, args.split or cfg.workspace.dev_split)
    replicates = args.replicates or PromptSet.from_dir(ws.prompts_dir).settings.replicates
    plan = make_plan(
        ws,
        split,
        judge,
        policy=args.policy or cfg.loop.policy,
        replicates=replicates,
        budget_usd=args.budget_usd,
        hours=args.hours,
        wave=args.wave or cfg.loop.wave,
    )
    if args.json:
        print(json.dumps(plan.as_dict()))
    else:
        print("\n".join(plan.lines()))
    return 0
