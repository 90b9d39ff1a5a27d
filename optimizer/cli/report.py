"""`judgeloop report`, `judgeloop history`, `judgeloop reviews`."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from optimizer.errors import UserError
from optimizer.ledger import Ledger
from optimizer.report import history_lines, one_line, report_json, report_text
from optimizer.workspace.workspace import Workspace


def _open(args: argparse.Namespace) -> tuple[Workspace, Ledger]:
    ws = Workspace.open(args.workspace)
    return ws, Ledger.open_readonly(ws.ledger_path)


def cmd_report(args: argparse.Namespace) -> int:
    """``judgeloop report [--run ID] [--json]``."""
    ws, ledger = _open(args)
    with ledger:
        run = ledger.resolve_run(args.run)
        if args.json:
            print(json.dumps(report_json(ledger, run, ws)))
        else:
            print(report_text(ledger, run, ws), end="")
    return 0


def cmd_history(args: argparse.Namespace) -> int:
    """``judgeloop history [--run ID]``: the experiments table."""
    _, ledger = _open(args)
    with ledger:
        run = ledger.resolve_run(args.run)
        experiments = ledger.experiments(run.id)
    print(f"run {run.id}  branch {run.branch}  policy {run.policy}  ({len(experiments)} experiments)")
    print("\n".join(history_lines(experiments)))
    return 0


def cmd_reviews(args: argparse.Namespace) -> int:
    """``judgeloop reviews [--export FILE]``: list human reviews or export them as JSONL."""
    _, ledger = _open(args)
    with ledger:
        if args.export:
            try:
                count = ledger.export_reviews(Path(args.export))
            except OSError as exc:
                raise UserError(
                    f"cannot write {args.export} ({exc.strerror}); choose a writable path"
                ) from None
            print(f"exported {count} review{'s' if count != 1 else ''} to {args.export}")
            return 0
        reviews = ledger.reviews()
    if not reviews:
        print("no reviews yet (mark items in `judgeloop tui`)")
        return 0
    for r in reviews:
        where = f" exp #{r.experiment_id}" if r.experiment_id is not None else ""
        print(
            f"{r.id:>4} {r.created:%Y-%m-%d %H:%M} {r.kind:<16} {r.trajectory_id}{where} [{r.author}] "
            f"{one_line(r.note, 80)}"
        )
    return 0
