"""`judgeloop attribute`: what each kept edit still contributes at the end of a run, and the whole
kept chain against the prompts it started from, on fresh judgements of the dev split.

Scope: the kept edits in the history of the workspace's HEAD (every run's kept commits HEAD descends
from — manual runs included), or with ``run`` those of one run (its kept chain, up to its incumbent).
A merged keep (`[loop] stack`) counts as its parts: each pooled candidate it carries is one edit, measured
by reverting that candidate's own commit (`with_parts`). For each kept edit, newest first, the final
prompts with that edit reverted: a three-way revert of
its commit on top of the final commit, made in a scratch git worktree (the user's working tree and
branch are never touched). An edit whose revert conflicts is *entangled*: later kept edits changed
the same lines. The kept commits it conflicts with are found (the smallest set whose revert, newest
first, lets it revert cleanly), named, and reverted together with it for its measurement.

Each variant is compared with the final prompts by `optimizer.loop.compare.compare_prompts` — the
normal evaluator (cache, replicates, budget), the items the two disagree on re-judged ``[loop]
rejudge`` more times, the sign-flip test of the adaptive policy — on the run's dev split only.
Every edit's result is stored as it is measured, so an interrupted or budget-stopped attribution
continues where it stopped, and every call already paid for comes back from the cache.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, field

from optimizer import fmt
from optimizer.devset.corrections import labels_as_stored
from optimizer.devset.labels import load_labels
from optimizer.devset.split import Split, open_split
from optimizer.errors import UserError
from optimizer.evaluation.budget import Budget
from optimizer.evaluation.cache import JudgeCache
from optimizer.evaluation.stopping import StopRequest
from optimizer.events import Listener, Message, Progress, ProgressSnapshot, ignore
from optimizer.judge.prompts import PromptSet
from optimizer.judge.providers import make_provider
from optimizer.judge.types import Provider
from optimizer.ledger import (
    Attribution,
    AttributionSpec,
    EditContribution,
    Experiment,
    ItemShare,
    Ledger,
    Run,
)
from optimizer.loop.compare import Comparison, JudgingSetup, compare_prompts
from optimizer.report import export_attribution_tsv, export_experiments_tsv, write_markdown_report
from optimizer.runsettings import RunOverrides, RunSettings
from optimizer.workspace import gitops
from optimizer.workspace.config import JudgeOverrides, LoopSection, experiment_seed
from optimizer.workspace.workspace import Workspace, command_lock, lock_holder


@dataclass(frozen=True)
class AttributeOptions:
    """What `judgeloop attribute` was asked: one run (None: HEAD's history), a budget (US dollars,
    over the attribution's whole spend, resumed parts included), judge overrides (base URL,
    concurrency; a different provider or model is refused: see `RunSettings.from_run`)."""

    run: str | None = None
    budget_usd: float | None = None
    judge: JudgeOverrides = field(default_factory=JudgeOverrides)
    # A caller's own budget to spend from instead of ``budget_usd`` (the MCP session's, shared with its run).
    budget: Budget | None = None


@dataclass
class Variant:
    """The final prompts without one kept edit (and, when entangled, the edits it conflicts with)."""

    edit: gitops.KeptCommit
    prompts: PromptSet | None
    entangled_with: list[gitops.KeptCommit] = field(default_factory=list)
    problem: str | None = None  # why it cannot be measured

    @property
    def reverted(self) -> list[int]:
        return [c.experiment for c in self.entangled_with] + [self.edit.experiment]


@dataclass(frozen=True)
class Scope:
    run: Run  # the run the attribution is recorded under
    kind: str  # "history" | "run"
    final: str
    baseline: str
    edits: list[gitops.KeptCommit]  # newest first
    runs: list[str]  # every run an edit belongs to


def _short(sha: str) -> str:
    return sha[:10]


def with_parts(ws: Workspace, ledger: Ledger, edits: Sequence[gitops.KeptCommit]) -> list[gitops.KeptCommit]:
    """``edits`` with each merged keep (`[loop] stack`) replaced by the pooled candidates it carries, each its
    own edit (its commit under ``refs/judgeloop/rejected/<id>``, whose diff is that part alone), newest first;
    a merged keep whose parts' refs are gone stays one edit."""
    out: list[gitops.KeptCommit] = []
    for edit in edits:
        try:
            carried = ledger.get_experiment(edit.experiment).carries
            parts = [
                gitops.KeptCommit(gitops.rev_parse(ws, f"{gitops.REJECTED_PREFIX}{part}"), part)
                for part in reversed(carried)
            ]
        except UserError:
            parts = []
        out.extend(parts or [edit])
    return out


def resolve_scope(ws: Workspace, ledger: Ledger, run_id: str | None) -> Scope:
    """The kept edits to attribute, the final and baseline commits, and the run that records it."""
    if run_id is not None:
        run = ledger.get_run(run_id)
        chain = ledger.kept_chain(run.id)
        if not chain or chain[-1].commit_sha is None:
            raise UserError(f"run {run.id} has no incumbent yet; nothing to attribute")
        kept = [gitops.KeptCommit(e.commit_sha, e.id) for e in reversed(chain) if e.seq > 0 and e.commit_sha]
        if not kept:
            raise UserError(f"run {run.id} kept no edit; nothing to attribute")
        for edit in kept:
            gitops.rev_parse(ws, edit.sha)  # a ledger copied without its git history: one clear line
        return Scope(run, "run", chain[-1].commit_sha, run.start_rev, with_parts(ws, ledger, kept), [run.id])
    head = gitops.rev_parse(ws, "HEAD")
    found = gitops.kept_commits(ws, head)
    edits: list[gitops.KeptCommit] = []
    experiments: dict[int, Experiment] = {}
    for commit in found:
        try:
            experiments[commit.experiment] = ledger.get_experiment(commit.experiment)
        except UserError:
            continue  # a kept commit recorded in another workspace's ledger: not ours to measure
        edits.append(commit)
    if not edits:
        raise UserError(
            f"HEAD ({_short(head)}) has no kept judgeloop edit in its history; nothing to attribute "
            "(run `judgeloop run` first, or pass --run R)"
        )
    runs = list(dict.fromkeys(experiments[e.experiment].run_id for e in edits))
    recording = ledger.get_run(runs[0])  # the run of the newest kept edit
    baseline = ledger.get_run(runs[-1]).start_rev  # where the run of the oldest one started
    return Scope(recording, "history", head, baseline, with_parts(ws, ledger, edits), runs)


def _refuse_unfinished(ws: Workspace, ledger: Ledger, run_ids: Sequence[str]) -> None:
    for run_id in run_ids:
        run = ledger.get_run(run_id)
        if run.status == "running":
            holder = lock_holder(ws)
            if holder is not None:
                raise UserError(
                    f"run {run.id} is running ({holder}); attribute it once it has stopped "
                    "(`touch experiments/STOP` stops it after its current step)"
                )
            raise UserError(
                f"run {run.id} did not finish (it was interrupted); `judgeloop run --resume` it first"
            )
        if run.status == "waiting":
            waiting = ledger.experiments_with_status("waiting", run.id)
            which = f"experiment {waiting[0].id}" if waiting else "a candidate"
            raise UserError(
                f"run {run.id} has {which} waiting for a decision; "
                f"`judgeloop decide {waiting[0].id if waiting else 'ID'} keep|discard` first"
            )


def build_variants(ws: Workspace, final: str, edits: Sequence[gitops.KeptCommit]) -> list[Variant]:
    """For each kept edit (newest first), the final prompts with it reverted, found in a scratch
    worktree at ``final``; entangled edits are reverted together with the kept commits they
    conflict with (see the module docstring)."""
    variants: list[Variant] = []
    with gitops.scratch_worktree(ws, final) as tree:
        for i, edit in enumerate(edits):
            later = list(edits[:i])  # newer kept edits, newest first
            together: list[gitops.KeptCommit] = []
            if not gitops.revert_in(tree, [edit.sha], final):
                if not gitops.revert_in(tree, [c.sha for c in later] + [edit.sha], final):
                    variants.append(
                        Variant(
                            edit,
                            None,
                            problem=(
                                "its revert conflicts even with every later kept edit reverted (a commit outside the "
                                "kept chain changed the same lines): not measured"
                            ),
                        )
                    )
                    continue
                together = list(later)
                for other in list(together):  # the smallest set that still lets it revert cleanly
                    trial = [c for c in together if c != other]
                    if gitops.revert_in(tree, [c.sha for c in trial] + [edit.sha], final):
                        together = trial
                gitops.revert_in(tree, [c.sha for c in together] + [edit.sha], final)
            try:
                prompts = PromptSet.from_dir(tree / "prompts")
            except UserError as exc:
                variants.append(
                    Variant(edit, None, together, problem=f"the prompts without it are not valid ({exc})")
                )
                continue
            variants.append(Variant(edit, prompts, together))
    return variants


def contribution(
    comparison: Comparison,
    *,
    experiment: int | None,
    commit: str,
    entangled_with: Sequence[int] = (),
    reverted: Sequence[int] = (),
    cost_before: float = 0.0,
) -> EditContribution:
    """An `EditContribution` from a complete comparison of the final prompts (``other``) against the
    prompts without the edit (``base``)."""
    decision = comparison.decision
    assert decision is not None and decision.test is not None
    base, final = comparison.base_metrics, comparison.other_metrics

    def delta(name: str) -> float | None:
        a = None if base is None else getattr(base, name)
        b = None if final is None else getattr(final, name)
        return None if a is None or b is None else b - a

    shares = [
        ItemShare(
            trajectory_id=s.trajectory_id,
            without_correct=s.incumbent_correct,
            without_total=s.incumbent_total,
            final_correct=s.candidate_correct,
            final_total=s.candidate_total,
        )
        for s in decision.test.items
    ]
    return EditContribution(
        experiment=experiment,
        commit=commit,
        items=round(decision.test.statistic, 6),
        kappa_delta=delta("kappa"),
        fpr_delta=delta("fpr"),
        fixed=list(comparison.fixed),
        broken=list(comparison.broken),
        p_value=decision.test.p_value,
        cost_usd=cost_before + comparison.cost_usd,
        entangled_with=list(entangled_with),
        reverted=list(reverted),
        rejudged=len(comparison.rejudged),
        calls=comparison.calls,
        cache_hits=comparison.cache_hits,
        shares=shares,
    )


def _key(scope: Scope, split: Split, judge: str, replicates: int, loop_cfg: LoopSection) -> str:
    payload = {
        "scope": scope.kind,
        "final": scope.final,
        "baseline": scope.baseline,
        "edits": [e.sha for e in scope.edits],
        "split": split.fingerprint,
        "judge": judge,
        "replicates": replicates,
        "rejudge": loop_cfg.rejudge,
        "alpha": loop_cfg.alpha,
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


def fmt_contribution(c: EditContribution) -> str:
    """One line: items, p-value, deltas, flips, cost."""
    if c.items is None:
        return f"not measured — {c.note or 'no result'}"

    p = fmt.num(c.p_value, missing=fmt.NA)
    kappa, fpr = fmt.signed(c.kappa_delta, missing=fmt.NA), fmt.signed(c.fpr_delta, missing=fmt.NA)
    return (
        f"{c.items:+.2f} items (p={p}), Δkappa {kappa}, ΔFPR {fpr}, "
        f"fixed {len(c.fixed)}, broken {len(c.broken)}, re-judged {c.rejudged}, ${c.cost_usd:.4f} "
        f"({c.calls} calls, {c.cache_hits} cached)"
    )


def attribute(
    ws: Workspace, options: AttributeOptions, events: Listener = ignore, stop: StopRequest | None = None
) -> Attribution:
    """Measure what each kept edit in scope still contributes at the end, and the final prompts against
    the baseline (see the module docstring); returns the attribution as recorded in the ledger.
    ``stop`` requested: no new call starts; what is measured is kept and the rest is noted, as when
    the budget stops it."""
    if not ws.ledger_path.is_file():
        raise UserError(f"no ledger yet at {ws.ledger_path}; run `judgeloop run` first")
    with Ledger(ws.ledger_path) as ledger:
        scope = resolve_scope(ws, ledger, options.run)
        _refuse_unfinished(ws, ledger, scope.runs)
        with command_lock(ws, "attribute"):
            # What a killed attribute left in the repository (a scratch worktree and its folder) goes
            # first, and whatever this one leaves (a crash in git) goes at the end.
            gitops.prune_scratch_worktrees(ws)
            try:
                return attribute_scope(ws, ledger, scope, options, events, stop)
            finally:
                gitops.prune_scratch_worktrees(ws)


def attribute_scope(
    ws: Workspace,
    ledger: Ledger,
    scope: Scope,
    options: AttributeOptions,
    events: Listener,
    stop: StopRequest | None = None,
) -> Attribution:
    """`attribute` over a resolved ``scope``, the caller holding what it must (the loop lock; `judgeloop
    mcp` its session's, paying from its budget): measured, recorded and returned."""

    def tell(text: str) -> None:
        events(Message(text))

    cfg = ws.config
    run = scope.run
    if run.split in cfg.workspace.heldout_splits:
        raise UserError(
            f"run {run.id} names held-out split {run.split!r}; attribution evaluates the dev split only"
        )
    split = open_split(ws, run.split)
    if split.fingerprint != run.split_fingerprint:
        raise UserError(
            f"split {run.split!r} changed since run {run.id} started (fingerprint differs); "
            "its edits cannot be measured on the same items"
        )
    # The label set the run decided with (its stored labels), not what corrections.jsonl says now.
    stored = ledger.labels(run.id) if run.labels_fingerprint else {}
    labels = labels_as_stored(split, stored) if stored else load_labels(split)
    settings = RunSettings.from_run(run, cfg, RunOverrides(judge=options.judge))
    judge, loop_cfg, replicates = settings.judge, settings.loop, settings.replicates
    judge_name = f"{judge.provider}:{judge.model}"
    dirty = gitops.dirty_paths(ws.root) if scope.kind == "history" else []
    tell(
        f"attributing {len(scope.edits)} kept edit(s) "
        + (
            f"in the history of HEAD ({_short(scope.final)})"
            if scope.kind == "history"
            else f"of run {run.id} (final {_short(scope.final)})"
        )
        + f" against baseline {_short(scope.baseline)}; split {split.name} ({len(split.ids)} items), judge "
        f"{judge_name}, {replicates} judgement(s) per item, disagreeing items re-judged {loop_cfg.rejudge} more "
        f"time(s); recorded under run {run.id}"
    )
    if settings.loop_note:
        tell(f"  {settings.loop_note}")
    if dirty:
        tell(
            f"  note: uncommitted changes ({', '.join(dirty[:3])}) are not part of it: the committed HEAD is measured"
        )
    variants = build_variants(ws, scope.final, scope.edits)
    final_prompts = PromptSet.from_rev(ws, scope.final)
    baseline_prompts = PromptSet.from_rev(ws, scope.baseline)

    att = ledger.open_attribution(
        run.id,
        AttributionSpec(
            key=_key(scope, split, judge_name, replicates, loop_cfg),
            scope=scope.kind,
            final_commit=scope.final,
            baseline_commit=scope.baseline,
            split=split.name,
            judge=judge_name,
            replicates=replicates,
            rejudge=loop_cfg.rejudge,
            alpha=loop_cfg.alpha,
        ),
    )
    budget = (
        Budget(options.budget_usd, spent_usd=att.cost_usd)
        if options.budget_usd is not None
        else options.budget
    )
    if att.edits or att.final_vs_baseline is not None:
        tell(
            f"  resuming attribution {att.id}: {sum(e.items is not None for e in att.edits)} edit(s) measured "
            f"before, ${att.cost_usd:.4f} spent"
        )

    def progress(snap: ProgressSnapshot) -> None:
        events(Progress(snap))

    async def measure() -> tuple[list[str], float]:
        """Measure what is missing; returns (why each unmeasured thing was not measured, spend not on a row)."""
        provider: Provider = make_provider(judge)
        cache = JudgeCache(ws.cache_path)
        setup = JudgingSetup(
            ws, split, judge, loop_cfg, provider, cache, budget=budget, progress=progress, stop=stop
        )
        stopped: str | None = None
        missing: list[str] = []
        loose_cost = 0.0
        try:
            for position, variant in enumerate(variants):
                exp_id = variant.edit.experiment
                before = att.edit(exp_id)
                if before is not None and before.items is not None:
                    tell(
                        f"  #{exp_id} ({_short(variant.edit.sha)}): measured before: {fmt_contribution(before)}"
                    )
                    continue
                entangled = [c.experiment for c in variant.entangled_with]
                row = EditContribution(
                    experiment=exp_id,
                    commit=variant.edit.sha,
                    entangled_with=entangled,
                    reverted=variant.reverted,
                    cost_usd=before.cost_usd if before else 0.0,
                )
                if variant.problem is not None:
                    row.note = variant.problem
                elif stopped is not None:
                    row.note = f"not measured: {stopped}"
                if row.note is not None or variant.prompts is None:
                    missing.append(f"#{exp_id}")
                    ledger.record_attribution_edit(att.id, position, row, new_cost_usd=0.0)
                    tell(f"  #{exp_id} ({_short(variant.edit.sha)}): {row.note}")
                    continue
                if entangled:
                    tell(
                        f"  #{exp_id} ({_short(variant.edit.sha)}): entangled — its revert conflicts with kept "
                        f"edit(s) {', '.join(f'#{e}' for e in entangled)}; measured by reverting them together"
                    )
                else:
                    tell(f"  #{exp_id} ({_short(variant.edit.sha)}): reverted cleanly; measuring")
                comparison = await compare_prompts(
                    setup,
                    labels,
                    variant.prompts,
                    final_prompts,
                    replicates=replicates,
                    seed=experiment_seed(settings.seed, exp_id),
                )
                if comparison.decision is None:
                    stopped = comparison.budget_stop or comparison.error or "incomplete"
                    if comparison.budget_stop and budget is not None:
                        which = (
                            f"--budget-usd {options.budget_usd:g}"
                            if options.budget_usd is not None
                            else f"${budget.max_usd:g}"
                        )
                        stopped = f"the {which} budget is spent ({comparison.budget_stop})"
                    row.note = f"not measured: {stopped}"
                    row.cost_usd += comparison.cost_usd
                    missing.append(f"#{exp_id}")
                    ledger.record_attribution_edit(att.id, position, row, new_cost_usd=comparison.cost_usd)
                    tell(f"  #{exp_id}: {row.note}")
                    continue
                result = contribution(
                    comparison,
                    experiment=exp_id,
                    commit=variant.edit.sha,
                    entangled_with=entangled,
                    reverted=variant.reverted,
                    cost_before=row.cost_usd,
                )
                if entangled:
                    result.note = "entangled: measured by reverting it together with " + ", ".join(
                        f"#{e}" for e in entangled
                    )
                # The row's cost includes what an earlier, stopped try paid; only the new spend is added.
                ledger.record_attribution_edit(att.id, position, result, new_cost_usd=comparison.cost_usd)
                tell(f"  #{exp_id}: {fmt_contribution(result)}")
            if att.final_vs_baseline is not None and att.final_vs_baseline.items is not None:
                tell(f"  final vs baseline: measured before: {fmt_contribution(att.final_vs_baseline)}")
                return missing, loose_cost
            if stopped is not None:
                missing.append("final vs baseline")
                return missing, loose_cost
            tell(f"  final ({_short(scope.final)}) vs baseline ({_short(scope.baseline)}): measuring")
            comparison = await compare_prompts(
                setup,
                labels,
                baseline_prompts,
                final_prompts,
                replicates=replicates,
                seed=experiment_seed(settings.seed, 0),
            )
            if comparison.decision is None:
                why = comparison.budget_stop or comparison.error or "incomplete"
                missing.append("final vs baseline")
                tell(f"  final vs baseline: not measured: {why}")
                return missing, comparison.cost_usd
            overall = contribution(comparison, experiment=None, commit=scope.final)
            ledger.finish_attribution(
                att.id,
                status="running",
                note=None,
                final_vs_baseline=overall,
                extra_cost_usd=overall.cost_usd,
            )
            tell(f"  final vs baseline: {fmt_contribution(overall)}")
            return missing, loose_cost
        finally:
            await provider.aclose()
            cache.close()

    missing, loose_cost = asyncio.run(measure())
    if missing:
        note = (
            f"not measured: {', '.join(missing)}; `judgeloop attribute` again (with a larger --budget-usd if "
            "the budget stopped it) measures them; what is measured is kept"
        )
        done = ledger.finish_attribution(att.id, status="partial", note=note, extra_cost_usd=loose_cost)
    else:
        done = ledger.finish_attribution(att.id, status="complete", note=None, extra_cost_usd=loose_cost)
    out = ws.paths.runs / run.id
    write_markdown_report(ledger, run.id, out / "report.md", ws)
    export_experiments_tsv(ledger, run.id, out / "experiments.tsv")
    export_attribution_tsv(done, out / "attribution.tsv", ledger)
    tell(
        f"attribution {done.id} of run {run.id}: {done.status}, ${done.cost_usd:.4f} spent in all"
        + (f"; {done.note}" if done.note else "")
    )
    tell(
        f"  wrote {(out / 'report.md').relative_to(ws.root)} and attribution.tsv; `judgeloop report --run {run.id}`"
    )
    return done
