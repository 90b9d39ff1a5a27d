"""`judgeloop confirm`: a run's final prompts evaluated once on a held-out split, each use recorded in the
ledger and capped by ``[confirm] max_uses`` (every look at a held-out split spends its honesty). Takes the
workspace's loop lock, like `run` and `decide`.

The cap goes by item: a split's use count is the most times any of its items has been measured, through
whatever split held it (a re-import of the same items under another name spends the same uses). A held-out
split of another benchmark (imported with ``devset import --format``) is confirmed the same way; its use
is recorded with its benchmark, so a certificate shows it as transfer evidence (`optimizer.trust.certify`).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path

from optimizer.devset.heldout import check_apart
from optimizer.devset.labels import load_labels
from optimizer.devset.split import open_split, split_meta
from optimizer.errors import UserError
from optimizer.evaluation.batch import BatchOptions, check_batch_settings
from optimizer.evaluation.evaluator import PassOptions, evaluate_items
from optimizer.evaluation.inspect_log import check_log_path, require_inspect, write_inspect_log
from optimizer.evaluation.stopping import Interrupted, StopRequest
from optimizer.events import Listener, Message, Progress, ProgressSnapshot, ignore
from optimizer.judge.prompts import PromptSet
from optimizer.ledger import Ledger, MeasuredSplit
from optimizer.runsettings import RunOverrides, RunSettings
from optimizer.stats.metrics import Metrics, score
from optimizer.workspace.config import JudgeOverrides
from optimizer.workspace.workspace import Workspace, command_lock


@dataclass(frozen=True)
class ConfirmOutcome:
    run_id: str
    experiment_id: int
    split: str
    metrics: Metrics
    inspect_log: Path | None = None
    benchmark: str = "agenthorizon"  # the held-out split's import format
    dev_benchmark: str | None = None  # the run's split's (None when that split is gone)

    @property
    def transfer(self) -> bool:
        """Measured on another benchmark than the one the run's prompts were tuned on."""
        return self.dev_benchmark is not None and self.benchmark != self.dev_benchmark


def confirm(
    ws: Workspace,
    split_name: str,
    *,
    run_id: str | None = None,
    judge_overrides: JudgeOverrides | None = None,
    events: Listener = ignore,
    batch: bool = False,
    stop: StopRequest | None = None,
    inspect_log: Path | None = None,
) -> ConfirmOutcome:
    """Evaluate a run's final prompts once on a held-out split; each use is recorded and capped by
    ``[confirm] max_uses``. A use that hit infrastructure errors records nothing and is not counted.
    ``batch``: through the provider's batch API (recorded in the judge cache, so a killed `confirm`
    run again collects its batch). ``stop`` requested: no new call starts and `Interrupted` is raised;
    nothing is recorded and the use is not counted. ``inspect_log``: also write the pass there as an Inspect
    AI log (`optimizer.evaluation.inspect_log`; refused before the use is spent when Inspect is missing)."""
    cfg = ws.config
    if inspect_log is not None:
        check_log_path(inspect_log)
        require_inspect()
    with command_lock(ws, "confirm"), Ledger(ws.ledger_path) as ledger:
        run = ledger.resolve_run(run_id)
        settings = RunSettings.from_run(run, cfg, RunOverrides(judge=judge_overrides or JudgeOverrides()))
        judge = settings.judge  # the run's: its final prompts are confirmed by the judge that chose them
        if split_name == run.split or split_name == cfg.workspace.dev_split:
            raise UserError(
                f"{split_name!r} is the dev split; confirm evaluates a held-out split "
                "(list it under [workspace] heldout_splits)"
            )
        if split_name not in cfg.workspace.heldout_splits:
            raise UserError(
                f"split {split_name!r} is not listed in [workspace] heldout_splits; add it there "
                "so the loop can never use it, then retry"
            )
        split = open_split(ws, split_name)
        used, touching = ledger.item_uses(split.name, split.ids)  # rationed by item, not by name
        if used >= cfg.confirm.max_uses:
            others = sorted({c.split for c in touching if c.split != split.name})
            via = f" (its items were measured through split {', '.join(others)} too)" if others else ""
            raise UserError(
                f"split {split_name!r} was already used {used} time(s){via} ([confirm] max_uses = "
                f"{cfg.confirm.max_uses}); every look at a held-out split spends its honesty"
            )
        if run.incumbent_experiment is None:
            raise UserError(f"run {run.id} has no incumbent yet; let it finish its baseline first")
        inc = ledger.get_experiment(run.incumbent_experiment)
        check_apart(ws, split.name, others=[run.split])  # the items the run's optimiser saw
        prompts = PromptSet.from_rev(ws, inc.commit_sha or run.start_rev)
        labels = load_labels(split)
        events(
            Message(
                f"confirming run {run.id}'s final prompts (experiment {inc.id}, {(inc.commit_sha or '')[:12]}) "
                f"on held-out split {split.name} ({len(split.ids)} items); use {used + 1} of {cfg.confirm.max_uses}"
            )
        )
        options = None
        if batch:
            check_batch_settings(judge.provider, prompts.settings.mode)
            options = BatchOptions.from_judge(
                judge, on_state=lambda state: events(Message(state.line(), "note"))
            )

        def progress(snapshot: ProgressSnapshot) -> None:
            events(Progress(snapshot))

        result = asyncio.run(
            evaluate_items(
                ws,
                split,
                prompts,
                judge,
                item_ids=split.ids,
                replicates=settings.replicates,
                options=PassOptions(batch=options, progress=progress, stop=stop),
            )
        )
        if stop is not None and stop.is_set() and result.not_evaluated:
            raise Interrupted(
                f"{len(result.items)} of {len(split.ids)} items judged; nothing recorded and the use "
                "is not counted (the calls made are cached: `judgeloop confirm` again pays only "
                "for the rest)"
            )
        warning = result.cache_reads.warning()  # billed cache reads fell below plan
        if warning is not None:
            events(Message(warning, "note"))
        if result.infra_error_ids:
            raise UserError(
                f"{len(result.infra_error_ids)} item(s) hit infrastructure errors; nothing recorded, "
                "the use is not counted — retry when the provider is healthy"
            )
        metrics = score(labels, result.answers())
        benchmark = split_meta(split.root).benchmark
        ledger.add_confirmation(
            split.name,
            inc.commit_sha or run.start_rev,
            metrics,
            run_id=run.id,
            measured=MeasuredSplit(benchmark, split.fingerprint, tuple(split.ids)),
        )
        written = (
            None if inspect_log is None else write_inspect_log(inspect_log, result, split, labels, metrics)
        )
        dev_root = ws.split_dir(run.split)
        dev_benchmark = split_meta(dev_root).benchmark if (dev_root / "split.json").is_file() else None
        return ConfirmOutcome(
            run.id,
            inc.id,
            split.name,
            metrics,
            inspect_log=written,
            benchmark=benchmark,
            dev_benchmark=dev_benchmark,
        )
