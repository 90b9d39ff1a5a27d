"""`judgeloop devset import|verify|show|list`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from optimizer.devset.formats.common import ImportRequest
from optimizer.devset.formats.registry import import_benchmark
from optimizer.devset.labels import LabelCounts, describe_counts
from optimizer.devset.split import Split, format_trajectory, list_splits, open_split, split_meta
from optimizer.devset.verify import VerifyReport, verify_split
from optimizer.errors import UserError
from optimizer.evaluation.judging import IMAGE_CACHE_DIRNAME
from optimizer.evaluation.oversize import oversized_items
from optimizer.judge.prompts import PromptSet
from optimizer.workspace.workspace import Workspace


def warn(message: str) -> None:
    print(f"judgeloop: warning: {message}", file=sys.stderr)


def cmd_import(args: argparse.Namespace) -> int:
    """`judgeloop devset import SRC --name NAME (--manifest FILE | --all | --rebuild-ahd) [--link] [--format F]`."""
    ws = Workspace.open(args.workspace)
    request = ImportRequest(
        format=args.format,
        manifest=Path(args.manifest) if args.manifest else None,
        all_items=bool(args.all),
        rebuild_ahd=bool(args.rebuild_ahd),
        link=bool(args.link),
        warn=warn,
    )
    split = import_benchmark(ws, Path(args.src), args.name, request)
    meta = split_meta(split.root)
    print(f"imported {len(split.ids)} items into {split.root.relative_to(ws.root)}")
    # Priced with the workspace's judge and prompts, as `judgeloop eval` would send them.
    prompts = PromptSet.from_dir(ws.prompts_dir)
    for line in oversized_items(
        split,
        prompts,
        ws.config.judge,
        prices=ws.config.prices,
        image_cache_dir=ws.experiments_dir / IMAGE_CACHE_DIRNAME,
        replicates=prompts.settings.replicates,
    ):
        warn(line)
    counts = LabelCounts.from_json(meta.counts)
    if counts is not None:  # (always: the import has just written them)
        print(describe_counts(counts))
    print(f"fingerprint {split.fingerprint}")
    print(
        f"next: judgeloop devset verify {split.name}  (committing devset/{split.name} is optional: "
        "splits are pinned by their fingerprint)"
    )
    return 0


def _print_report(report: VerifyReport) -> None:
    print(f"split {report.name}  fingerprint {report.fingerprint[:12]}")
    counts = report.counts
    print(f"items={counts.items} positives={counts.positives} negatives={counts.negatives}")
    for type_name, n in counts.mistake_types.items():
        print(f"  {type_name}: {n}")
    if report.ok:
        print("ok")
        return
    for problem in report.problems:
        print(f"problem: {problem}", file=sys.stderr)
    print(f"split {report.name}: {len(report.problems)} problem(s)", file=sys.stderr)


def cmd_verify(args: argparse.Namespace) -> int:
    """`judgeloop devset verify [NAME]`: exit 0 when every checked split is complete, 1 otherwise."""
    ws = Workspace.open(args.workspace)
    names = [args.name] if args.name else list_splits(ws)
    if not names:
        raise UserError(
            "this workspace has no splits; import one with `judgeloop devset import SRC --name NAME --manifest FILE`"
        )
    failed = 0
    for name in names:
        report = verify_split(open_split(ws, name))
        _print_report(report)
        failed += not report.ok
    return 1 if failed else 0


def _resolve_item(split: Split, wanted: str) -> str:
    if wanted in split.ids:
        return wanted
    matches = [tid for tid in split.ids if tid.startswith(wanted)]
    if len(matches) == 1:
        return matches[0]
    if matches:
        raise UserError(
            f"{wanted!r} matches {len(matches)} items of split {split.name!r}; give more of the id"
        )
    raise UserError(f"no item {wanted!r} in split {split.name!r}; see {split.root / 'manifest.txt'}")


def cmd_show(args: argparse.Namespace) -> int:
    """`judgeloop devset show NAME ID` (ID may be a unique prefix)."""
    ws = Workspace.open(args.workspace)
    split = open_split(ws, args.name)
    sys.stdout.write(format_trajectory(split, _resolve_item(split, args.id)))
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    """`judgeloop devset list`: each split with its counts and fingerprint."""
    ws = Workspace.open(args.workspace)
    names = list_splits(ws)
    if not names:
        print("no splits; import one with `judgeloop devset import SRC --name NAME --manifest FILE`")
        return 0
    rows = [("NAME", "ITEMS", "POS", "NEG", "FINGERPRINT", "SOURCE")]
    for name in names:
        meta = split_meta(ws.split_dir(name))
        counts = meta.counts or {}
        rows.append(
            (
                name,
                str(counts.get("items", "?")),
                str(counts.get("positives", "?")),
                str(counts.get("negatives", "?")),
                meta.fingerprint[:12],
                str(meta.source or ""),
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=False)) + "  " + row[-1])
    return 0
