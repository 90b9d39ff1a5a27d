"""`judgeloop init`."""

from __future__ import annotations

import argparse
from pathlib import Path

from optimizer.scaffold import init_workspace


def cmd_init(args: argparse.Namespace) -> int:
    ws = init_workspace(Path(args.dir), sample=args.sample)
    print(f"created workspace {ws.root}")
    if args.sample:
        print("imported the bundled sample set as split 'sample'")
    print(f"next: cd {args.dir} && judgeloop devset verify")
    return 0
