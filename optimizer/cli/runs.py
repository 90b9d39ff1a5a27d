"""`judgeloop runs prune` and `judgeloop completion`."""

from __future__ import annotations

import argparse

from optimizer.errors import UserError
from optimizer.ledger import Ledger
from optimizer.prune import DEFAULT_KEEP, plan_prune, prune_runs
from optimizer.workspace.workspace import Workspace


def cmd_runs_prune(args: argparse.Namespace) -> int:
    """List what a prune removes (the default, nothing changed); with --yes remove it."""
    ws = Workspace.open(args.workspace)
    if not ws.ledger_path.exists():
        print("no runs yet: nothing to prune")
        return 0
    keep = DEFAULT_KEEP if args.keep is None else args.keep
    with Ledger.open_readonly(ws.ledger_path) as ledger:
        plan = plan_prune(ws, ledger, keep)
    for run_id, why in plan.spared.items():
        print(f"keep   run {run_id}: {why}")
    for item in plan.remove:
        what = [f"branch {item.branch}"] if item.branch else []
        what += [f"folder {item.folder.relative_to(ws.root)}"] if item.folder else []
        print(f"remove run {item.run_id}: {' and '.join(what)}")
    if not plan.remove:
        print("nothing to prune")
        return 0
    if not args.yes:
        print(
            f"dry run: nothing removed; `judgeloop runs prune --keep {keep} --yes` removes the "
            f"{len(plan.remove)} run(s) above (the ledger keeps their rows, git their commits under "
            "refs/judgeloop/pruned/)"
        )
        return 0
    for line in prune_runs(ws, plan):
        print(line)
    return 0


def cmd_completion(args: argparse.Namespace) -> int:
    """Print the shell code that completes judgeloop's commands and options (argcomplete)."""
    try:
        import argcomplete
    except ImportError:
        raise UserError("shell completion needs the argcomplete package: `pip install argcomplete`") from None
    print(argcomplete.shellcode(["judgeloop"], shell=args.shell))
    return 0
