"""`evaluate`: judge a split with the prompts at a revision, write the result files and score them
against the labels — what `judgeloop eval` does. Label side: this module reads labels after judging.

A held-out split, by name or by item (`optimizer.devset.heldout.refuse_heldout`), is refused before
anything is judged; with ``[loop] labels = "corrected"`` the split's ``corrections.jsonl`` is checked
against its record first (`optimizer.devset.corrections.read_corrections`), so a file changed outside
`label-fix` and the TUI is named before a baseline is paid for (eval itself scores the labels as given)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from optimizer.devset.corrections import read_corrections
from optimizer.devset.heldout import refuse_heldout
from optimizer.devset.labels import load_labels
from optimizer.devset.split import Split, open_split
from optimizer.errors import UserError
from optimizer.evaluation.batch import BatchOptions, check_batch_settings
from optimizer.evaluation.evaluator import PassOptions, evaluate_items
from optimizer.evaluation.files import previous_evaluation, write_results
from optimizer.evaluation.inspect_log import check_log_path, require_inspect, write_inspect_log
from optimizer.evaluation.judging import IMAGE_CACHE_DIRNAME
from optimizer.evaluation.oversize import oversized_items
from optimizer.evaluation.results import EvalRun
from optimizer.evaluation.stopping import Interrupted, StopRequest
from optimizer.events import Listener, Message, Progress, ProgressSnapshot, ignore
from optimizer.judge.prompts import PromptSet
from optimizer.stats.metrics import Metrics, score
from optimizer.workspace.config import JudgeOverrides
from optimizer.workspace.workspace import Workspace, lock_holder


@dataclass(frozen=True)
class EvalOptions:
    split: str | None = None  # default: [workspace] dev_split
    rev: str | None = None  # a git revision of prompts/; None: the working tree
    replicates: int | None = None  # default: judge.toml's replicates
    limit: int | None = None  # only the first N manifest items
    out: Path | None = None  # default: experiments/evals/<stamp>-<prompt hash>
    judge: JudgeOverrides = field(default_factory=JudgeOverrides)
    batch: bool = False  # send the uncached calls as one batch through the provider's batch API
    inspect_log: Path | None = None  # also write the pass as an Inspect AI log there (.eval)


@dataclass(frozen=True)
class EvalOutcome:
    split: Split
    run: EvalRun
    metrics: Metrics
    out: Path
    inspect_log: Path | None = None


def _out_dir(ws: Workspace, wanted: Path | None, prompt_hash: str) -> Path:
    if wanted is not None:
        out = wanted
    else:
        stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
        out = ws.experiments_dir / "evals" / f"{stamp}-{prompt_hash[:8]}"
        n = 1
        while out.exists():  # two evaluations of one revision within a second get two folders
            n += 1
            out = ws.experiments_dir / "evals" / f"{stamp}-{prompt_hash[:8]}-{n}"
    return out


def evaluate(
    ws: Workspace, options: EvalOptions, events: Listener = ignore, stop: StopRequest | None = None
) -> EvalOutcome:
    """Judge ``options.split`` with the prompts at ``options.rev``, write one verdict file per item and
    ``_summary.json``, and score the answers against the labels. Progress and notes go to ``events``.
    ``stop`` requested: no new call starts and `Interrupted` is raised, nothing written (what was
    judged is cached: the same evaluation again pays only for the rest)."""
    judge = options.judge.apply(ws.config.judge)
    if options.inspect_log is not None:  # refused before any call is paid for
        check_log_path(options.inspect_log)
        require_inspect()
    split_name = options.split or ws.config.workspace.dev_split
    refuse_heldout(ws, split_name, "eval")  # its figures only through confirm, counted and capped
    split = open_split(ws, split_name)
    if ws.config.loop.labels == "corrected":
        read_corrections(split)  # the runs here decide with them: a forged file is refused now, not at `run`
    prompts = PromptSet.from_rev(ws, options.rev) if options.rev else PromptSet.from_dir(ws.prompts_dir)
    if options.batch:
        check_batch_settings(judge.provider, prompts.settings.mode)
    replicates = options.replicates if options.replicates is not None else prompts.settings.replicates
    item_ids = list(split.ids)
    if options.limit is not None:
        if options.limit < 1:
            raise UserError(f"--limit must be at least 1 (got {options.limit})")
        item_ids = item_ids[: options.limit]
    prompt_hash = prompts.prompt_hash()
    out = _out_dir(ws, options.out, prompt_hash)
    replacing = previous_evaluation(out)  # checked before any call is paid for
    events(
        Message(
            f"split {split.name!r} ({len(item_ids)} items), prompts {options.rev or 'working tree'} "
            f"[{prompt_hash[:8]}], {judge.provider}:{judge.model}, {replicates} replicate(s), "
            f"concurrency {judge.max_concurrency}",
            "note",
        )
    )
    if options.rev is None:
        holder = lock_holder(ws)
        if holder is not None:
            events(
                Message(
                    f"note: {holder} is working in this workspace, so the working tree may be one of "
                    "its candidates; pass --rev to evaluate a fixed revision",
                    "note",
                )
            )
    # Before any call: an item whose request is megabytes costs dollars a pass (`optimizer.evaluation.oversize`).
    for line in oversized_items(
        split,
        prompts,
        judge,
        prices=ws.config.prices,
        item_ids=item_ids,
        image_cache_dir=ws.experiments_dir / IMAGE_CACHE_DIRNAME,
        replicates=replicates,
    ):
        events(Message(f"warning: {line}", "note"))
    if judge.provider == "local":
        events(
            Message(
                "the local judge (SmolLM2-135M, text only) is demonstration-quality: "
                "its numbers show the mechanics, not a useful judge",
                "note",
            )
        )

    def progress(snapshot: ProgressSnapshot) -> None:
        events(Progress(snapshot))

    batch = None
    if options.batch:
        batch = BatchOptions.from_judge(judge, on_state=lambda state: events(Message(state.line(), "note")))
        events(
            Message(
                "batch mode: the uncached calls go out as one batch at half price and may take up to "
                "24 h; a killed `eval` run again with the same options collects it",
                "note",
            )
        )
    run = asyncio.run(
        evaluate_items(
            ws,
            split,
            prompts,
            judge,
            item_ids=item_ids,
            replicates=replicates,
            options=PassOptions(progress=progress, batch=batch, stop=stop),
        )
    )
    if stop is not None and stop.is_set() and run.not_evaluated:
        raise Interrupted(
            f"{len(run.items)} of {len(item_ids)} items judged, nothing written; their calls are "
            f"cached, so the same `judgeloop eval` again pays only for the other "
            f"{len(run.not_evaluated)}"
        )
    if replacing:
        events(Message(f"replacing the previous evaluation in {out} ({len(replacing)} files)", "note"))
    write_results(out, run, replacing=replacing)
    labels = load_labels(split)
    metrics = score({tid: labels[tid] for tid in item_ids}, run.answers())
    inspect_log = None
    if options.inspect_log is not None:
        inspect_log = write_inspect_log(options.inspect_log, run, split, labels, metrics)
    return EvalOutcome(split=split, run=run, metrics=metrics, out=out, inspect_log=inspect_log)
