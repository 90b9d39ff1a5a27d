"""`judgeloop label-fix`: a person's correction of one label, into ``devset/<split>/corrections.jsonl``."""

from __future__ import annotations

import argparse
import os

from optimizer.devset.corrections import record_correction
from optimizer.devset.split import open_split
from optimizer.workspace import Workspace


def cmd_label_fix(args: argparse.Namespace) -> int:
    """``judgeloop label-fix ID --label success|failure --reason TEXT [--split NAME] [--by WHO]``."""
    ws = Workspace.open(args.workspace)
    split = open_split(ws, args.split or ws.config.workspace.dev_split)
    by = args.by if args.by is not None else os.environ.get("USER") or None
    print(record_correction(split, args.id, args.label, args.reason, by))
    return 0
