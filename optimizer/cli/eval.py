"""`judgeloop eval`, and the judge overrides every judging command accepts."""

from __future__ import annotations

import argparse
import json
import sys
from functools import partial
from pathlib import Path

from optimizer import fmt
from optimizer.cli.progress import TerminalEvents
from optimizer.cli.signals import stop_on_signals
from optimizer.errors import UserError
from optimizer.evaluation.scored import EvalOptions, evaluate
from optimizer.evaluation.stopping import Interrupted
from optimizer.report import token_split
from optimizer.stats.metrics import Metrics
from optimizer.workspace.config import JudgeOverrides
from optimizer.workspace.workspace import Workspace


def judge_overrides(args: argparse.Namespace) -> JudgeOverrides:
    """``--provider/--model/--base-url/--concurrency`` (and ``--batch-cold``) as typed overrides of ``[judge]``."""
    if getattr(args, "batch_cold", False) and not getattr(args, "batch", False):
        raise UserError("--batch-cold applies to a batch pass only: add --batch, or drop --batch-cold")
    return JudgeOverrides(
        provider=args.provider,
        model=args.model,
        base_url=args.base_url,
        concurrency=args.concurrency,
        batch_cold=bool(getattr(args, "batch_cold", False)),
    )


# The score table shows a missing rate as "n/a".
_fmt = partial(fmt.num, missing=fmt.NA)


def format_metrics(metrics: Metrics) -> str:
    """The protocol metrics as a small aligned table."""
    rows = [
        ("items", str(metrics.n)),
        ("balanced accuracy", _fmt(metrics.balanced_accuracy)),
        ("TPR (positive acc.)", _fmt(metrics.tpr)),
        ("TNR (negative acc.)", _fmt(metrics.tnr)),
        ("FPR", _fmt(metrics.fpr)),
        ("FNR", _fmt(metrics.fnr)),
        ("Cohen's kappa", _fmt(metrics.kappa)),
        ("invalid (parse failures)", str(metrics.invalid)),
        ("missing", str(metrics.missing)),
    ]
    for kind, value in metrics.mistake_type_recall.items():
        rows.append((f"recall: {kind}", _fmt(value)))
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"  {name:<{width}}  {value}" for name, value in rows)


def cmd_eval(args: argparse.Namespace) -> int:
    """Judge a split with the prompts at a revision, write verdict files, print metrics; 130 when a
    Ctrl-C or SIGTERM stopped it (after the calls in flight; nothing written)."""
    options = EvalOptions(
        split=args.split,
        rev=args.rev,
        replicates=args.replicates,
        limit=args.limit,
        out=Path(args.out) if args.out else None,
        judge=judge_overrides(args),
        batch=bool(args.batch),
        inspect_log=Path(args.inspect_log) if args.inspect_log else None,
    )
    with TerminalEvents(prefix="judgeloop eval: ") as events, stop_on_signals("the evaluation") as stop:
        try:
            outcome = evaluate(Workspace.open(args.workspace), options, events, stop)
        except Interrupted as exc:
            events.clear()
            print(f"judgeloop eval: stopped by {stop.reason}: {exc}", file=sys.stderr)
            return 130
    run, metrics = outcome.run, outcome.metrics
    if args.json:
        figures: dict[str, object] = dict(metrics.protocol_dict())
        if len(run.endpoints) > 1:  # [judge] base_urls: `score --json`'s keys, then one more
            figures["endpoints"] = run.endpoints
        print(json.dumps(figures))
    else:
        print(format_metrics(metrics))
        print(
            f"calls: {run.calls_made} new, {run.cache_hits} cached · "
            f"{token_split(run.input_tokens, run.cache_read_tokens, run.cache_write_tokens, run.output_tokens)} · "
            f"cost: ${run.cost_usd:.4f} (cached calls saved ${run.cached_cost_usd:.4f})"
        )
        if run.infra_error_ids:
            print(
                f"infrastructure errors: {len(run.infra_error_ids)} item(s), not scored as verdicts; "
                "re-run to retry them:"
            )
            for item in run.items:
                if item.infra_error:
                    print(f"  {item.trajectory_id}: {item.error}")
        print(f"results: {outcome.out}")
        if outcome.inspect_log is not None:
            print(f"inspect log: {outcome.inspect_log} (open it with `inspect view`)")
    for note in run.notes:
        print(f"note: {note}", file=sys.stderr)
    if run.infra_error_ids:
        print(
            f"judgeloop eval: {len(run.infra_error_ids)} item(s) hit infrastructure errors; they count as missing",
            file=sys.stderr,
        )
    return 0
