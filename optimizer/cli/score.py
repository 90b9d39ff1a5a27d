"""`judgeloop score RESULTS_DIR --split NAME [--json]`."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from optimizer.scoring import format_table, score_folder
from optimizer.workspace import Workspace


def cmd_score(args: argparse.Namespace) -> int:
    result = score_folder(Workspace.open(args.workspace), Path(args.results_dir), args.split)
    if args.json:
        print(json.dumps(result.metrics.protocol_dict()))
    else:
        print(format_table(result.split, result.metrics, result.intervals))
    return 0
