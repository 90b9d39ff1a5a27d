"""`judgeloop label-fix`: a person's correction of one label, into ``devset/<split>/corrections.jsonl``;
`judgeloop label-adopt`: a person's acceptance of that file as it is (a hand edit, or one from before
writes were recorded)."""

from __future__ import annotations

import argparse
import os

from optimizer.devset.corrections import adopt_corrections, record_correction
from optimizer.devset.split import open_split
from optimizer.workspace.workspace import Workspace


def _by(args: argparse.Namespace) -> str | None:
    return args.by if args.by is not None else os.environ.get("USER") or None


def cmd_label_fix(args: argparse.Namespace) -> int:
    """``judgeloop label-fix ID --label success|failure --reason TEXT [--split NAME] [--by WHO]``."""
    ws = Workspace.open(args.workspace)
    split = open_split(ws, args.split or ws.config.workspace.dev_split)
    print(record_correction(ws, split, args.id, args.label, args.reason, _by(args)))
    return 0


def cmd_label_adopt(args: argparse.Namespace) -> int:
    """``judgeloop label-adopt [--split NAME] [--by WHO]``."""
    ws = Workspace.open(args.workspace)
    split = open_split(ws, args.split or ws.config.workspace.dev_split)
    print(adopt_corrections(ws, split, _by(args)))
    return 0
