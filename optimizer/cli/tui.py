"""`judgeloop tui`: the terminal UI (imported only when the command runs: the engine never needs Textual)."""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

from optimizer.errors import UserError
from optimizer.workspace.workspace import Workspace


def cmd_tui(args: argparse.Namespace) -> int:
    """Open the app, or with --screenshot render one view to SVG and exit (argparse has checked --screen)."""
    from tui.app import JudgeloopApp, parse_size, render_screenshot

    ws = Workspace.open(args.workspace)
    experiment_id: int | None = None
    if args.experiment is not None:
        try:
            experiment_id = int(args.experiment)
        except ValueError:
            raise UserError(
                f"--experiment {args.experiment!r} is not an experiment id; see `judgeloop history`"
            ) from None
    run_id: str | None = None
    if getattr(args, "run", None):  # an unknown id: one line naming the newest runs
        from tui.data import check_run

        run_id = check_run(ws.ledger_path, args.run)
    if args.screenshot:
        out = Path(args.screenshot)
        if out.suffix.lower() != ".svg":
            raise UserError(f"--screenshot {out} must end in .svg (convert to PNG afterwards)")
        asyncio.run(
            render_screenshot(
                ws.root,
                out,
                screen=args.screen,
                experiment_id=experiment_id,
                size=parse_size(args.size),
                run_id=run_id,
            )
        )
        print(f"wrote {out}")
        return 0
    JudgeloopApp(ws.root, start_view=args.screen, experiment_id=experiment_id, run_id=run_id).run()
    return 0
