"""`judgeloop score RESULTS_DIR --split NAME [--json]`."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from optimizer.answers.scoring import format_table, score_folder
from optimizer.workspace.workspace import Workspace


def cmd_score(args: argparse.Namespace) -> int:
    result = score_folder(Workspace.open(args.workspace), Path(args.results_dir), args.split)
    if result.skipped:
        print(
            f"judgeloop score: note: skipped {len(result.skipped)} file(s) not named by a trajectory id: "
            f"{', '.join(result.skipped[:5])}{' ...' if len(result.skipped) > 5 else ''}",
            file=sys.stderr,
        )
    if args.json:
        print(json.dumps(result.metrics.protocol_dict()))
    else:
        print(format_table(result.split, result.metrics, result.intervals))
    return 0
