"""`judgeloop init`."""

from __future__ import annotations

import argparse
from pathlib import Path

from optimizer.errors import UserError
from optimizer.scaffold import init_workspace


def cmd_init(args: argparse.Namespace) -> int:
    target = Path(args.dir).absolute()
    for path in (target, *target.parents):  # a file where the folder (or one above it) would go
        if path.exists() and not path.is_dir():
            raise UserError(f"{path} exists and is not a folder; choose a new folder for the workspace")
    ws = init_workspace(target, sample=args.sample)
    print(f"created workspace {ws.root}")
    if args.sample:
        print("imported the bundled sample set as split 'sample'")
        print(f"next: cd {args.dir} && judgeloop devset verify")
        return 0
    # No split yet: `devset verify` would only say so. The next step is the import.
    print(
        f"next: cd {args.dir} && judgeloop devset import SRC --name dev --all   (SRC: a folder of labelled "
        "AgentHorizon items),"
    )
    print(
        '      then set dev_split = "dev" in judgeloop.toml; or start over with `judgeloop init DIR --sample`'
    )
    return 0
