"""Run sessions: start or resume an optimisation run (its record, branch and label set; an unfinished
run closed or resumed; the end-of-run summary). Typed entry points the CLI and the TUI call; each takes
the workspace's loop lock (one `run`, `decide` or `confirm` per workspace) and reports through an
``events`` listener. A waiting candidate's decision is `optimizer.loop.decide`'s, the held-out
confirmation `optimizer.loop.confirm`'s.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from optimizer.devset.corrections import LabelSetName, label_set, labels_as_stored
from optimizer.devset.heldout import check_apart
from optimizer.devset.labels import fingerprint, load_labels
from optimizer.devset.split import Split, open_split
from optimizer.errors import UserError
from optimizer.evaluation.batch import BATCH_PROVIDERS, check_batch_settings
from optimizer.evaluation.cache import JudgeCache
from optimizer.evaluation.inspect_log import require_inspect
from optimizer.evaluation.judging import IMAGE_CACHE_DIRNAME
from optimizer.evaluation.oversize import oversized_items
from optimizer.evaluation.stopping import Aborted, StopRequest
from optimizer.events import (
    Listener,
    Message,
    PassProgress,
    RunStopped,
    StageChanged,
    StopKind,
    StopReason,
    ignore,
)
from optimizer.judge.harness import check_budget, check_confinement
from optimizer.judge.prompts import JudgeSettings, PromptSet
from optimizer.judge.providers import Usage, check_judge_key
from optimizer.ledger import Ledger, Run, RunSpec, RunStatus
from optimizer.loop import trust
from optimizer.loop.context import RunContext
from optimizer.loop.records import fmt3
from optimizer.loop.runner import LoopRunner
from optimizer.loop.strategies import Strategy, make_strategy
from optimizer.loop.strategies.manual import ManualStrategy, capture_edits, restore_manual_edit
from optimizer.loop.waves import check_wave
from optimizer.models import Label
from optimizer.report import export_experiments_tsv, write_markdown_report
from optimizer.runsettings import Limits, RunOverrides, RunSettings
from optimizer.stats.decision import detectable_gain_line
from optimizer.stats.policies import policy_for
from optimizer.vocab import PolicyName, RunStrategyName, StageKind
from optimizer.workspace import gitops
from optimizer.workspace.config import MAX_WAVE, JudgeOverrides, JudgeSection, LoopSection
from optimizer.workspace.paths import check_prompts_tree
from optimizer.workspace.workspace import Workspace, command_lock

Say = Callable[[str], None]
StrategyName = RunStrategyName  # --strategy: a proposing strategy or "manual"
# The runs of a `judgeloop mcp` session: a coding agent proposes through the MCP server (`optimizer.mcp`).
MCP_PROPOSER = "mcp"


@dataclass(frozen=True)
class RunOptions:
    """What `judgeloop run` was asked; None means "the configuration's value". When resuming, the
    run's own settings apply, and what a resume may change is `RunSettings.from_run`'s to say."""

    split: str | None = None
    strategy: StrategyName | None = None
    message: str | None = None  # --strategy manual: the edit's rationale
    policy: PolicyName | None = None
    max_experiments: int | None = None
    budget_usd: float | None = None
    hours: float | None = None
    patience: int | None = None
    replicates: int | None = None
    propose_only: bool = False
    judge: JudgeOverrides = field(default_factory=JudgeOverrides)
    batch: bool = False  # judge each pass as one batch (no early stopping); a resumed run keeps its mode
    wave: int | None = None  # candidates per round (None: [loop] wave); a resumed run keeps its own

    def __post_init__(self) -> None:
        # The CLI refuses these first; an engine caller (the TUI, a script) gets the same one-line refusal.
        for name, value in (("max_experiments", self.max_experiments), ("patience", self.patience)):
            if value is not None and value < 1:
                raise UserError(f"{name} must be at least 1 (got {value})")
        for name, amount in (("budget_usd", self.budget_usd), ("hours", self.hours)):
            if amount is not None and not (math.isfinite(amount) and amount > 0):
                raise UserError(f"{name} must be a number above 0 (got {amount})")
        if self.replicates is not None and not 1 <= self.replicates <= 15:
            raise UserError(f"replicates must be 1 to 15 (got {self.replicates})")
        if self.wave is not None and not 1 <= self.wave <= MAX_WAVE:
            raise UserError(f"wave must be 1 to {MAX_WAVE} candidates (got {self.wave})")


@dataclass(frozen=True)
class RunOutcome:
    run_id: str
    status: RunStatus
    stop: StopReason
    aborted: bool = False  # a second Ctrl-C or SIGTERM: the run stopped mid-step (`--resume` continues it)


def _status_for(stop: StopReason) -> RunStatus:
    if stop.kind is StopKind.WAITING:
        return "waiting"
    if stop.kind in (StopKind.INTERRUPTED, StopKind.STOP_FILE):
        return "stopped"
    return "finished"


def _overrides(options: RunOptions) -> RunOverrides:
    return RunOverrides(
        judge=options.judge,
        policy=options.policy,
        replicates=options.replicates,
        batch=options.batch,
        max_experiments=options.max_experiments,
        budget_usd=options.budget_usd,
        hours=options.hours,
        patience=options.patience,
        propose_only=options.propose_only,
        wave=options.wave,
    )


@dataclass
class StartedRun:
    """A run ready to drive: recorded in the ledger, its branch checked out (`open_run`, a resume)."""

    run: Run
    split: Split
    settings: RunSettings  # read back from the run's record, on its start as on a resume
    spent: float
    strategy_name: str
    labels: dict[str, Label]  # the label set the run decides with, fixed at its start

    def context(
        self, ws: Workspace, ledger: Ledger, events: Listener = ignore, stop: StopRequest | None = None
    ) -> RunContext:
        """The run as the loop's rooms see it (`optimizer.loop.context.RunContext`), its spend so far counted."""
        return RunContext(
            ws=ws,
            ledger=ledger,
            run=self.run,
            split=self.split,
            labels=self.labels,
            settings=self.settings,
            events=events,
            stop=stop or StopRequest(),
            spent_usd=self.spent,
        )


def start_run(
    ws: Workspace, options: RunOptions, events: Listener = ignore, stop: StopRequest | None = None
) -> RunOutcome:
    """Start a new optimisation run on the dev split and drive it until a limit stops it. ``stop``
    (a Ctrl-C, SIGTERM, or any caller): no new judge call starts; the run records where it stopped
    (an evaluation it cut stays ``running``, for `resume_run`) and ends as ``stopped``. A KeyboardInterrupt
    (a second signal) aborts it mid-step, as ``stopped`` too."""
    with command_lock(ws, "run"):
        return _run(ws, options, events, resume=False, stop=stop or StopRequest())


def resume_run(
    ws: Workspace, options: RunOptions, events: Listener = ignore, stop: StopRequest | None = None
) -> RunOutcome:
    """Continue the last unfinished run: restore the tree, re-evaluate an interrupted candidate from
    the cache (nothing paid for is paid again) and go on. Limits not given keep the run's own.
    ``stop``: as for `start_run`."""
    with command_lock(ws, "run"):
        return _run(ws, options, events, resume=True, stop=stop or StopRequest())


def _run(
    ws: Workspace, options: RunOptions, events: Listener, *, resume: bool, stop: StopRequest
) -> RunOutcome:
    def say(text: str) -> None:
        events(Message(text))

    cfg = ws.config
    judge = options.judge.apply(
        cfg.judge
    )  # a new run's; a resumed one keeps its own (`RunSettings.from_run`)
    if not resume and options.batch and judge.provider not in BATCH_PROVIDERS:
        check_batch_settings(judge.provider, "direct")  # refused before anything else is checked or changed
    if gitops.clear_stale_index_lock(ws.root):
        say("removed a stale .git/index.lock (left by a process killed in the middle of a git command)")
    if ws.stop_path.exists():
        # Older than this run, so meant for none: it would end the run after its baseline.
        ws.stop_path.unlink()
        say(
            f"removed a leftover {ws.stop_path.relative_to(ws.root)} (it predates this run); create it again "
            "to stop the run after its current step"
        )
    if not resume and options.budget_usd is not None:  # before anything starts; `judgeloop plan` says more
        from optimizer.plan import budget_warning

        if warning := budget_warning(
            ws, judge, options.split, options.policy, options.replicates, options.budget_usd
        ):
            events(Message(warning, stream="note"))
    check_prompts_tree(ws.root)
    ledger = Ledger(ws.ledger_path)
    manual_edit: str | None = None
    try:
        # The proposer first: an LLM strategy checks its key here, before a run row, a branch or a checkout
        # exists (a missing ANTHROPIC_API_KEY used to leave a `running` ghost run behind).
        name = _resumable_run(ledger).strategy if resume else (options.strategy or cfg.optimizer.strategy)
        proposer = None if name == "manual" else make_strategy(name, cfg.optimizer, cfg.prices)
        if resume:
            prepared = _prepare_resume(ws, ledger, options, say)
        else:
            prepared = open_run(ws, ledger, options, judge, say)
        run, split, settings = prepared.run, prepared.split, prepared.settings
        if prepared.strategy_name == "manual":
            manual_edit = str(run.budgets.get("manual_edit", ""))
        strategy: Strategy
        if proposer is None:
            strategy = ManualStrategy(ws.root / str(run.budgets.get("manual_edit", "")))
        else:
            strategy = proposer
        runner = LoopRunner(prepared.context(ws, ledger, events, stop), strategy)
        if not resume:  # before the baseline: every candidate pays for an item of megabytes again
            for line in oversized_items(
                split,
                PromptSet.from_dir(ws.prompts_dir),
                settings.judge,
                prices=cfg.prices,
                image_cache_dir=ws.experiments_dir / IMAGE_CACHE_DIRNAME,
                replicates=settings.replicates,
            ):
                events(Message(f"warning: {line}", stream="note"))
        try:
            ended = asyncio.run(runner.loop())
        except (KeyboardInterrupt, asyncio.CancelledError) as exc:
            who = exc.who if isinstance(exc, Aborted) else "Ctrl-C"
            aborted = StopReason(StopKind.INTERRUPTED, f"aborted by a second {who}")
            ledger.set_run_status(run.id, "stopped", stop_reason=aborted.message)
            say(f"run {run.id} aborted; `judgeloop run --resume` continues it")
            return RunOutcome(run.id, "stopped", aborted, aborted=True)
        except UserError as exc:
            ledger.set_run_status(run.id, "crashed", stop_reason=str(exc))
            raise
        except BaseException as exc:
            ledger.set_run_status(run.id, "crashed", stop_reason=f"{type(exc).__name__}: {exc}")
            raise
        status = _status_for(ended)
        ledger.set_run_status(run.id, status, stop_reason=ended.message)
        if ended.kind is StopKind.STOP_FILE and ws.stop_path.exists():
            ws.stop_path.unlink()
        _summary(ledger, run.id, ended, events, settings.loop)
        if manual_edit is not None:
            _manual_outcome(ws, ledger, run.id, manual_edit, say)
            manual_edit = None
        out = ws.experiments_dir / "runs" / run.id
        write_markdown_report(ledger, run.id, out / "report.md", ws)
        export_experiments_tsv(ledger, run.id, out / "experiments.tsv")
        say(f"  wrote {(out / 'report.md').relative_to(ws.root)} and experiments.tsv")
        return RunOutcome(run.id, status, ended)
    finally:
        if manual_edit is not None:  # crashed or aborted: the edit must not vanish with the run
            _manual_outcome(ws, ledger, run.id, manual_edit, say)
        ledger.close()


def _prepare_resume(ws: Workspace, ledger: Ledger, options: RunOptions, say: Say) -> StartedRun:
    cfg = ws.config
    run = _resumable_run(ledger)
    settings = RunSettings.from_run(run, cfg, _overrides(options))  # its refusals come before any change
    check_wave(settings.loop, strategy=run.strategy, propose_only=options.propose_only)
    if settings.loop.inspect_logs:  # before any call is paid for
        require_inspect("[loop] inspect_logs", "set it to false")
    if settings.batch:
        _check_batch_judge(ws, settings.judge, run.start_rev)
    if run.split in cfg.workspace.heldout_splits:
        raise UserError(f"run {run.id} names held-out split {run.split!r}; the loop never sees it")
    split = open_split(ws, run.split)
    if split.fingerprint != run.split_fingerprint:
        raise UserError(
            f"split {run.split!r} changed since run {run.id} started (fingerprint differs); start a new run"
        )
    check_apart(ws, split.name)  # a held-out split imported since the run started may share its items
    dirty = [p for p in gitops.dirty_paths(ws.root) if p not in cfg.optimizer.editable_files]
    if dirty:
        raise UserError(
            f"the working tree has changes outside the loop's files ({', '.join(dirty[:5])}); "
            "commit or discard them before `judgeloop run --resume` (it resets the tree)"
        )
    if not ledger.experiments(run.id) and not gitops.branch_exists(ws.root, run.branch):
        # Killed between recording the run and creating its branch: nothing happened yet.
        gitops.ensure_clean(ws.root, "judgeloop run --resume")
        gitops.create_run_branch(ws.root, run.id, run.start_rev)
        say(f"run {run.id} was interrupted before its branch existed; created {run.branch} at its start")
    labels = _resumed_labels(ledger, run, split, settings.loop.labels, say)
    gitops.checkout_branch(ws.root, run.branch)
    _check_resumed_tip(ws, ledger, run)
    # Calls paid before a crash come back from the cache on resume and are not re-counted by
    # the resumed evaluation: put them on the interrupted experiment's row first. The last
    # progress event's running total is a floor (it is throttled, so it may lag the cache).
    record_spend_before_crash(ledger, ws, run.id)
    spent = max(sum(e.cost_usd for e in ledger.experiments(run.id)), _last_reported_spend(ledger, run.id))
    ledger.set_run_status(run.id, "running", pid=os.getpid())
    say(f"resuming run {run.id} on {run.branch} (spent so far ${spent:.4f})")
    if settings.loop_note:
        say(f"  {settings.loop_note}")
    if settings.batch:
        pending = [b for b in ledger.batches(run.id, open_only=True) if b.batch_id]
        for b in pending:
            say(
                f"  pending batch {b.batch_id} ({len(b.custom_ids)} call(s), experiment {b.experiment_id}): "
                "collecting it instead of submitting again"
            )
    return StartedRun(run, split, settings, spent, run.strategy, labels)


def _last_kept_sha(ledger: Ledger, run: Run) -> str:
    """The commit of the run's incumbent (its last kept candidate or its baseline), else its start."""
    inc = ledger.get_experiment(run.incumbent_experiment) if run.incumbent_experiment else None
    return inc.commit_sha if inc is not None and inc.commit_sha else run.start_rev


def _loop_made(ws: Workspace, ledger: Ledger, run: Run, base: str) -> set[str]:
    """The commits on top of ``base`` the loop made for ``run`` and recorded (or is about to): its running and
    waiting candidates' commits, its parked wave candidates, and a pending commit at the branch's tip whose
    trailers name a running candidate of the run not yet recorded (killed between the commit and the record)."""
    open_exps = [
        *ledger.experiments_with_status("running", run.id),
        *ledger.experiments_with_status("waiting", run.id),
    ]
    made = {e.commit_sha for e in open_exps if e.commit_sha and e.seq > 0}
    parked = gitops.parked_candidates(ws.root)
    made |= {parked[e.id] for e in open_exps if e.id in parked}
    if gitops.branch_exists(ws.root, run.branch):
        tip = gitops.rev_parse(ws.root, run.branch)
        trailers = gitops.parse_trailers(gitops.commit_message(ws.root, tip))
        pending = {str(e.id) for e in open_exps if e.status == "running" and not e.commit_sha and e.seq > 0}
        if (
            trailers.get("Judgeloop-Experiment") in pending
            and trailers.get("Judgeloop-Decision") == gitops.PENDING
            and gitops.parents(ws.root, tip) == [base]
        ):
            made.add(tip)  # rolled back, never evaluated: a commit of the loop's, never trusted to be judged
    return made


def _check_resumed_tip(ws: Workspace, ledger: Ledger, run: Run) -> None:
    """Refuse a resume whose branch tip is neither the incumbent's commit nor one the loop made for it."""
    base = _last_kept_sha(ledger, run)
    problem = trust.branch_problem(ws.root, run.branch, base, _loop_made(ws, ledger, run, base))
    if problem is not None:
        raise UserError(trust.refusal(problem, run.branch, base))


def close_unfinished_runs(ws: Workspace, ledger: Ledger, say: Say) -> None:
    """Close every run a kill, a crash or a stop left unfinished, before a new run or MCP session starts (the
    caller holds the loop lock and has checked the tree is clean, so no run is alive and nothing is lost):
    each undecided candidate is recorded as an error and kept under ``refs/judgeloop/rejected/<id>``, a waiting
    one under ``refs/judgeloop/waiting/<id>`` (still decidable), the run's branch goes back to its last kept
    commit and a killed run is marked ``stopped``. A branch with commits the loop did not make is refused
    (one line naming them), not reset. `run --resume` does not call this: it continues the run instead."""
    for run in ledger.runs():
        if run.status == "running" or ledger.experiments_with_status("running", run.id):
            _close_run(ws, ledger, run, say)


def _close_run(ws: Workspace, ledger: Ledger, run: Run, say: Say) -> None:
    base = _last_kept_sha(ledger, run)
    has_branch = gitops.branch_exists(ws.root, run.branch)
    if has_branch:
        problem = trust.branch_problem(ws.root, run.branch, base, _loop_made(ws, ledger, run, base))
        if problem is not None:
            raise UserError(
                f"run {run.id} did not finish and is closed before a new one starts, but "
                + trust.refusal(problem, run.branch, base)
            )
    killed = run.status == "running"
    who = (
        "the MCP session was killed"
        if run.strategy == MCP_PROPOSER
        else (f"run {run.id} was killed" if killed else f"run {run.id} ended ({run.status})")
    )
    record_spend_before_crash(ledger, ws, run.id)
    parked = gitops.parked_candidates(ws.root)
    rolled: list[int] = []
    for exp in ledger.experiments_with_status("running", run.id):
        if exp.commit_sha and exp.seq > 0:
            gitops.store_rejected(ws.root, exp.commit_sha, exp.id)
        if exp.id in parked:
            gitops.unpark(ws.root, exp.id)
        ledger.record_error(
            exp.id,
            f"interrupted: {who} before it was decided; rolled back when the next command started",
            cost_usd=exp.cost_usd,
        )
        rolled.append(exp.id)
    waiting = ledger.experiments_with_status("waiting", run.id)
    for exp in waiting:
        if exp.commit_sha:
            gitops.park_waiting(ws.root, exp.commit_sha, exp.id)
    if has_branch and gitops.rev_parse(ws.root, run.branch) != base:
        if gitops.current_branch(ws.root) == run.branch:
            gitops.restore_tree(ws.root, base)
        else:
            gitops.set_branch(ws.root, run.branch, base)
    if waiting:
        ledger.set_run_status(
            run.id,
            "waiting",
            stop_reason=f"{who}; experiment {waiting[0].id} waits for "
            f"`judgeloop decide {waiting[0].id} keep|discard`",
        )
    elif killed:
        ledger.set_run_status(run.id, "stopped", stop_reason=f"{who}; closed by the next command")
    say(
        f"closed run {run.id} ({who})"
        + (
            f": experiment(s) {', '.join(map(str, rolled))} rolled back under refs/judgeloop/rejected/"
            if rolled
            else ""
        )
        + f"; {run.branch} is at its last kept commit {base[:12]}"
    )


def loop_split(ws: Workspace, name: str | None = None) -> Split:
    """The split a run may judge: ``name`` (None: ``[workspace] dev_split``), refused in one line when it is
    held out or shares an item or recording with a held-out split. Reads only."""
    cfg = ws.config
    split_name = name or cfg.workspace.dev_split
    if split_name in cfg.workspace.heldout_splits:
        raise UserError(
            f"split {split_name!r} is held out ([workspace] heldout_splits); the loop may only "
            "use the dev split — evaluate held-out splits with `judgeloop confirm`"
        )
    split = open_split(ws, split_name)
    check_apart(ws, split.name)  # no item or recording of a held-out split in the loop's split
    return split


def open_run(
    ws: Workspace,
    ledger: Ledger,
    options: RunOptions,
    judge: JudgeSection,
    say: Say,
    proposer: str | None = None,
) -> StartedRun:
    """Start a new run's record and branch (the caller holds the loop lock): unfinished runs closed first,
    the tree clean, the dev split only, the label set fixed. ``proposer``: who proposes when it is not a
    strategy of `make_strategy` (``"mcp"``: `optimizer.mcp`)."""
    cfg = ws.config
    loop_cfg = cfg.loop.model_copy(update={"policy": options.policy} if options.policy else {})
    if options.wave is not None:
        loop_cfg = loop_cfg.model_copy(update={"wave": options.wave})
    strategy_name = proposer or options.strategy or cfg.optimizer.strategy
    if options.message is not None and strategy_name != "manual":
        raise UserError(
            f"-m/--message is the rationale of a hand edit (--strategy manual); the {strategy_name} "
            "strategy writes its own: drop -m, or add --strategy manual to judge your edit"
        )
    # Every key, provider and setting check before anything changes (no closed run, captured edit, row or
    # branch for a refused run); checks that need the start's prompts come after HEAD is settled, below.
    check_wave(loop_cfg, strategy=strategy_name, propose_only=options.propose_only)
    if loop_cfg.inspect_logs:  # before any call is paid for
        require_inspect("[loop] inspect_logs", "set it to false")
    check_budget(judge, options.budget_usd)  # a harness judge's cost is unbounded without a per-call price
    check_confinement(judge)  # bubblewrap missing
    check_judge_key(judge)
    if strategy_name != "manual":
        gitops.ensure_clean(ws.root, "judgeloop run")
        close_unfinished_runs(ws, ledger, say)
    waiting = ledger.experiments_with_status("waiting")
    if waiting:
        raise UserError(
            f"experiment {waiting[0].id} is waiting for a decision; run "
            f"`judgeloop decide {waiting[0].id} keep|discard` first"
        )
    split = loop_split(ws, options.split)
    limits = Limits(
        max_experiments=options.max_experiments,
        budget_usd=options.budget_usd,
        hours=options.hours,
        patience=options.patience if options.patience is not None else cfg.loop.patience,
        propose_only=options.propose_only,
    )
    manual_dir: Path | None = None
    if strategy_name == "manual":
        # Save the edit, reset the files: the run starts clean and proposes the saved copy once.
        manual_dir = capture_edits(
            ws.root,
            ws.experiments_dir,
            cfg.optimizer.editable_files,
            options.message,
            structure=(cfg.optimizer.structure_moves, cfg.optimizer.max_members),
        )
        gitops.ensure_clean(ws.root, "judgeloop run")
        close_unfinished_runs(ws, ledger, say)  # after the capture: its reset must not take the edit
        limits = dataclasses.replace(limits, max_experiments=1)
        say(f"your edit is saved in {manual_dir.relative_to(ws.root)} and judged as one candidate")
    start_rev = gitops.rev_parse(ws.root, "HEAD")
    try:
        start_settings = PromptSet.from_rev(ws, start_rev).settings
    except UserError as exc:
        pending = next(
            (e for e in ledger.experiments_with_status("running") if e.commit_sha == start_rev), None
        )
        if pending is None:
            raise
        raise UserError(
            f"{exc} — HEAD is candidate {pending.id} of run {pending.run_id}, never evaluated: "
            "`judgeloop run --resume` rolls it back and goes on"
        ) from None
    if start_settings.mode == "agentic" and judge.provider == "local":
        raise UserError(
            'prompts/judge.toml sets mode = "agentic", which needs a provider that can use '
            'tools (anthropic or openai); the local judge supports mode = "direct" only'
        )
    replicates = options.replicates or start_settings.replicates
    if options.batch:
        _check_batch_judge(ws, judge, start_rev)
    labels = label_set(split, loop_cfg.labels)  # read once: a later edit of corrections.jsonl changes nothing
    run = ledger.create_run(
        RunSpec(
            strategy=strategy_name,
            policy=loop_cfg.policy,
            split=split.name,
            split_fingerprint=split.fingerprint,
            start_rev=start_rev,
            labels_fingerprint=labels.fingerprint,
            budgets=limits.as_dict()
            | {"replicates": replicates}
            | ({"batch": True} if options.batch else {})
            | ({"wave": options.wave} if options.wave is not None else {})
            | ({"manual_edit": str(manual_dir.relative_to(ws.root))} if manual_dir else {}),
            config=cfg.model_dump(mode="json")
            | {"judge": judge.model_dump(mode="json")}
            | _memory_folds_record(split, start_settings),
        )
    )
    gitops.create_run_branch(ws.root, run.id, start_rev)
    ledger.set_labels(run.id, labels.labels)  # for the TUI and the report, never for a judge
    say(
        f"run {run.id}: branch {run.branch}, split {split.name} ({len(split.ids)} items), "
        f"strategy {strategy_name}, policy {loop_cfg.policy}, judge {judge.provider}:{judge.model}"
    )
    if labels.name == "corrected":
        say(
            f"  labels: as corrected ({len(labels.corrections)} correction(s) in devset/{split.name}/"
            f"corrections.jsonl), fingerprint {labels.fingerprint[:12]}, fixed for this run"
        )
    if judge.provider == "local":
        say(
            "  note: the local SmolLM2-135M judge is a demonstration-quality judge (text only, 8k context); "
            "its verdicts show the mechanics, not a useful judge"
        )
    if options.batch:
        say(
            "  batch mode: each pass is one batch at half price (answers within 24 h); early stopping does not "
            "apply, so every candidate is judged on every item; `judgeloop run --resume` collects a pending batch"
        )
    # Decided from its record from the first candidate on, as a resume will (`RunSettings.from_run`).
    settings = RunSettings.from_run(run, cfg, RunOverrides(propose_only=options.propose_only))
    return StartedRun(run, split, settings, 0.0, strategy_name, labels.labels)


def _resumed_labels(
    ledger: Ledger, run: Run, split: Split, which: LabelSetName, say: Say
) -> dict[str, Label]:
    """The label set ``run`` started with, rebuilt from the labels it stored and checked against its
    fingerprint; what ``corrections.jsonl`` says now is only compared (a run never changes labels)."""
    stored = ledger.labels(run.id)
    if run.labels_fingerprint is None:  # recorded before label sets existed: the given labels
        labels = load_labels(split)
        if not stored:
            ledger.set_labels(run.id, labels)  # for the TUI and the report, never for a judge
        return labels
    labels = labels_as_stored(split, stored)
    if fingerprint(labels.values()) != run.labels_fingerprint:
        raise UserError(
            f"the labels run {run.id} stored do not match the fingerprint it started with "
            f"({run.labels_fingerprint[:12]}); its decisions cannot go on with the same labels: start "
            "a new run"
        )
    try:
        now: str | None = label_set(split, which).fingerprint
        problem = ""
    except UserError as exc:
        now, problem = None, f" ({exc})"
    if now != run.labels_fingerprint:
        say(
            f"  labels: devset/{split.name}/corrections.jsonl changed since run {run.id} started{problem}; the run "
            f"goes on deciding with the labels {which} as they were at its start (fingerprint "
            f"{run.labels_fingerprint[:12]}); a new run reads the file as it is now"
        )
    return labels


def _memory_folds_record(split: Split, settings: JudgeSettings) -> dict[str, Any]:
    """The pair-aware folds judging with memory uses on this split (fixed by its fingerprint and the start's
    memory_folds), recorded in the run's config as ``memory_folds``; nothing when memory is off."""
    if settings.memory == "off":
        return {}
    from optimizer.judge.memory import split_folds

    return {"memory_folds": split_folds(split, settings.memory_folds).as_record()}


def _check_batch_judge(ws: Workspace, judge: JudgeSection, rev: str) -> None:
    """--batch needs anthropic or openai and the direct judge mode: a `UserError` before anything starts."""
    check_batch_settings(judge.provider, PromptSet.from_rev(ws, rev).settings.mode)


def _manual_outcome(ws: Workspace, ledger: Ledger, run_id: str, saved: str, say: Say) -> None:
    """Tell the person where their hand edit went; an edit the run did not judge goes back into the
    working tree (`restore_manual_edit`), so no way a manual run ends removes it unseen."""
    cand = next((e for e in ledger.experiments(run_id) if e.seq == 1), None)
    if cand is not None and cand.status == "kept":
        say(f"  your edit was kept: it is the tip of the run branch (experiment {cand.id})")
    elif cand is not None and cand.status == "waiting":
        say(f"  your edit is experiment {cand.id}'s commit, the tip of the run branch")
    elif cand is not None and cand.status == "rolled_back":
        say(
            f"  your edit was not kept (rolled back); to work on it again: "
            f"`git checkout refs/judgeloop/rejected/{cand.id} -- prompts/` or copy it from {saved}"
        )
    elif cand is not None and cand.status == "running":
        say(
            f"  your edit's evaluation was cut short (experiment {cand.id}); `judgeloop run --resume` "
            f"finishes it (a copy is in {saved})"
        )
    else:
        why = (
            "the run ended before judging it"
            if cand is None
            else f"it was not judged: {cand.status.replace('_', ' ')}, {cand.reason or 'no reason recorded'}"
        )
        restored, kept_back = restore_manual_edit(ws.root, ws.root / saved)
        if restored:
            say(f"  {why}; your edit is back in {', '.join(restored)} (a copy is in {saved})")
        if kept_back:
            say(
                f"  {why}; {', '.join(kept_back)} changed meanwhile, so your edit was not put back: "
                f"it is in {saved}"
            )
        if not restored and not kept_back:
            say(f"  {why}; your edit is in {saved}")


def record_spend_before_crash(ledger: Ledger, ws: Workspace, run_id: str) -> None:
    """Add to the interrupted experiment's row what its judge calls cost before a crash.

    The experiment is the one the run's last stage event started evaluating; every call stored in
    the cache since that moment is its (a call made meanwhile by another process sharing the cache
    is counted too: the budget errs on the safe side).
    """
    row = ledger.last_event(run_id, "stage")
    stage = row.typed() if row is not None else None
    if (
        row is None
        or not isinstance(stage, StageChanged)
        or stage.stage not in (StageKind.BASELINE, StageKind.EVALUATING)
    ):
        return
    started_at = stage.started_at
    exp = next(
        (e for e in ledger.experiments_with_status("running", run_id) if e.id == row.experiment_id), None
    )
    if exp is None or started_at is None or not ws.cache_path.exists():
        return
    with JudgeCache(ws.cache_path) as cache:
        paid = cache.cost_since(float(started_at))
    if paid > 0:
        ledger.add_cost(exp.id, Usage(cost_usd=paid))
    # Counted once: a crash before the resumed evaluation starts must not count this window again.
    ledger.add_event(
        run_id, StageChanged(StageKind.RESUMING, paid_before_crash_usd=round(paid, 6)), experiment_id=exp.id
    )


def _last_reported_spend(ledger: Ledger, run_id: str) -> float:
    """The running total of the run's last progress event (0 when there is none)."""
    row = ledger.last_event(run_id, "progress")
    event = row.typed() if row is not None else None
    return event.cost_usd if isinstance(event, PassProgress) else 0.0


def _resumable_run(ledger: Ledger) -> Run:
    for run in ledger.runs():
        if run.status == "finished":
            continue
        if run.strategy == MCP_PROPOSER:
            raise UserError(
                f"run {run.id} was a `judgeloop mcp` session that was killed; start `judgeloop mcp` "
                "again (it closes that session first), or start a new `judgeloop run`"
            )
        if run.status == "waiting":
            waiting = ledger.experiments_with_status("waiting", run.id)
            if waiting:
                raise UserError(
                    f"run {run.id} has experiment {waiting[0].id} waiting; "
                    f"`judgeloop decide {waiting[0].id} keep|discard` first"
                )
        return run
    raise UserError("no unfinished run to resume; start one with `judgeloop run`")


def _summary(ledger: Ledger, run_id: str, ended: StopReason, events: Listener, loop: LoopSection) -> None:
    """The end-of-run lines, the first a `RunStopped`; ``loop``: the run's decision settings (`RunSettings.loop`)."""

    def say(text: str) -> None:
        events(Message(text))

    run = ledger.get_run(run_id)
    exps = ledger.experiments(run_id)
    kept = [e for e in exps if e.status == "kept"]
    base = next((e for e in exps if e.seq == 0), None)
    inc = ledger.get_experiment(run.incumbent_experiment) if run.incumbent_experiment else None
    cost = sum(e.cost_usd for e in exps)
    waiting = next((e for e in exps if e.status == "waiting"), None)
    if ended.kind is StopKind.WAITING and waiting is not None:
        # One outcome: the candidate is neither kept nor rolled back until a person decides.
        events(RunStopped(run_id, run.status, ended, waiting_for=waiting.id, spent_usd=cost))
        say(f"  audit: `judgeloop report --run {run_id}`, `git log {run.branch}`, `judgeloop tui`")
        return
    events(RunStopped(run_id, run.status, ended))
    cut = sum(e.status == "running" for e in exps if e.seq > 0)
    say(
        f"  {len(exps) - 1} candidate(s): {len(kept)} kept, "
        f"{sum(e.status == 'rolled_back' for e in exps)} rolled back, "
        f"{sum(e.status == 'guard_rejected' for e in exps)} guard-rejected, "
        f"{sum(e.status == 'error' for e in exps)} error(s)"
        + (f", {cut} interrupted" if cut else "")
        + f"; spent ${cost:.4f}"
    )
    if base and inc:
        say(
            f"  kappa {fmt3(base.kappa)} → {fmt3(inc.kappa)}, FPR {fmt3(base.fpr)} → {fmt3(inc.fpr)} "
            f"(incumbent: experiment {inc.id}, {(inc.commit_sha or '')[:12]})"
        )
    decided = [e for e in exps if e.seq > 0 and e.status != "running"]
    if not kept and decided and policy_for(loop).tests_at_alpha:
        n_items = len(ledger.labels(run_id))
        if n_items:
            say(f"  nothing kept: {detectable_gain_line(n_items, loop.alpha, loop.policy)}")
    say(f"  audit: `judgeloop report --run {run_id}`, `git log {run.branch}`, `judgeloop tui`")
