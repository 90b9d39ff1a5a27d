"""The first room of a candidate's life: propose → guards → validate → cost guard → commit.

`prepare` asks the strategy for an edit on the incumbent (or takes one a strategy made for a whole wave),
reads the files it changes (only allowed ones, never through a link), records the experiment, runs the
guards (the rationale, the allowed files and diff size, the overfit lint, a copied memory case), checks the
candidate can be judged with (`validate`) and is not too costly (`optimizer.loop.costs.cost_guard`), writes
and commits it, then guards the whole incumbent → candidate diff as git has it (`whole_diff_guard`). It
hands on a `Rejected` record (the row decided) or a `Prepared` one (the row ``running``, the commit made).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from optimizer.errors import UserError
from optimizer.evaluation.judging import IMAGE_CACHE_DIRNAME
from optimizer.events import CandidateProposed, GuardRejected
from optimizer.judge.memory import CASES_JSONL, MEMORY_FILES, PRINCIPLES_MD, Case, parse_cases
from optimizer.judge.prompts import PromptSet
from optimizer.judge.provenance import ItemIndex
from optimizer.judge.providers.pricing import Usage
from optimizer.judge.types import Provider, stable_json
from optimizer.ledger import Experiment, ExperimentOutcome, ProposedEdit
from optimizer.loop import trust
from optimizer.loop.context import RunContext
from optimizer.loop.costs import cost_guard
from optimizer.loop.guards import (
    DevMaterial,
    check_candidate,
    check_rationale,
    clipped_rationale,
    instruction_ngrams,
    instruction_values,
    trajectory_values,
)
from optimizer.loop.records import Prepared, Rejected, decision_trailers, one_line, unified_diff
from optimizer.loop.stack import carries_trailers
from optimizer.loop.strategies import (
    IN_WAVE,
    POOLED,
    Disagreement,
    PastExperiment,
    Proposal,
    ProposalContext,
    ProposalError,
    ReviewNote,
    Strategy,
)
from optimizer.loop.validate import candidate_files, validate_prompts
from optimizer.vocab import StageKind
from optimizer.workspace import gitops
from optimizer.workspace.paths import allowed_name, read_prompt_file, write_prompt_file

Changed = dict[str, tuple[str | None, str | None]]  # path → (old text, new text); None: no such file


@dataclass
class WaveSlot:
    """A wave candidate's place in its wave: ``siblings``, the wave's earlier candidates (shown to the
    strategy, this one appended once committed); ``meta``, the row's proposal meta ``wave``; ``seen``,
    an earlier candidate's files → its id (a duplicate is rejected)."""

    meta: dict[str, Any]
    siblings: list[PastExperiment] = field(default_factory=list)
    seen: dict[str, int] = field(default_factory=dict)


def proposal_context(ctx: RunContext, incumbent: Experiment, seq: int) -> ProposalContext:
    """What a strategy sees to propose candidate ``seq`` on ``incumbent``: the allowed files' texts, the
    incumbent's disagreements with the labels, the run's history, the guidance and the dev reviews."""
    cfg = ctx.ws.config
    allowed = list(cfg.optimizer.allowed_files)
    # With structure moves on, strategies see judge.toml too (they change it through set_structure).
    current = {
        p: text for p in cfg.optimizer.editable_files if (text := read_prompt_file(ctx.root, p)) is not None
    }
    guidance, reviews = _guidance_and_reviews(ctx)
    settings = PromptSet.from_dir(ctx.ws.prompts_dir).settings
    return ProposalContext(
        workspace_root=ctx.root,
        allowed_files=allowed,
        current_files=current,
        disagreements=_disagreements(ctx, incumbent),
        history=_history(ctx),
        guidance=guidance,
        split=ctx.split,
        rng_seed=ctx.settings.seed,
        experiment_seq=seq,
        judge_mode=settings.mode,
        judge_memory=settings.memory,
        earlier=earlier_from_same_prompts(ctx, incumbent),
        reviews=reviews,
        structure_moves=list(cfg.optimizer.structure_moves),
        max_members=cfg.optimizer.max_members,
    )


def _disagreements(ctx: RunContext, incumbent: Experiment) -> list[Disagreement]:
    out = []
    for row in ctx.ledger.item_verdicts(incumbent.id):
        label = ctx.labels.get(row.trajectory_id)
        if label is None or (row.status == "ok" and row.success == label.is_positive):
            continue
        first = next((r for r in row.replicates if r.success == row.success), None)
        out.append(
            Disagreement(
                trajectory_id=row.trajectory_id,
                instruction=ctx.split.trajectory(row.trajectory_id).task.instruction,
                label_positive=label.is_positive,
                mistake_type=label.mistake_type,
                judge_success=row.success,
                reasoning=(first.reasoning if first else "") or "",
                confidence=first.confidence if first else None,
                unstable=row.unstable,
                judge_tools=tuple(first.tools) if first else (),
            )
        )
    return out


def _history(ctx: RunContext) -> list[PastExperiment]:
    # The whole history: `library` reads it to never repeat a tried set; the LLM strategies trim
    # what they show their model themselves.
    history = []
    for exp in ctx.ledger.experiments(ctx.run.id):
        if exp.seq == 0:
            continue
        full = ctx.ledger.get_experiment(exp.id)
        history.append(
            PastExperiment(
                id=exp.id,
                decision=POOLED if exp.pooled_on is not None and exp.status == "rolled_back" else exp.status,
                reason=exp.reason or "",
                rationale=exp.rationale or "",
                kappa=exp.kappa,
                fpr=exp.fpr,
                diff=full.diff_text or "",
                meta=exp.proposal_meta,
            )
        )
    return history


def _guidance_and_reviews(ctx: RunContext) -> tuple[str, list[ReviewNote]]:
    guidance = ctx.ws.guidance_path.read_text(encoding="utf-8") if ctx.ws.guidance_path.is_file() else ""
    # Only the dev split's reviews reach a strategy, in the guidance as in the notes: the ledger holds
    # every review, a held-out item's too (the run's split shares no item with a held-out one: check_apart).
    dev_ids = set(ctx.split.ids)
    reviews = [r for r in ctx.ledger.reviews() if r.trajectory_id in dev_ids]
    if reviews:
        guidance += "\n\n## Human reviews of judge verdicts\n" + "\n".join(
            f"- {r.kind.replace('_', ' ')} on {r.trajectory_id}: {r.note}" for r in reviews
        )
    notes = [
        ReviewNote(r.trajectory_id, r.kind, r.note, ctx.split.trajectory(r.trajectory_id).task.instruction)
        for r in reviews
    ]
    return guidance.strip(), notes


def earlier_from_same_prompts(ctx: RunContext, incumbent: Experiment) -> list[PastExperiment]:
    """Decided candidates of earlier runs on this split whose parent had the incumbent's prompts (the
    same git tree): a new run from the same prompts would only repeat them (their calls are cached)."""
    tree = gitops.prompts_tree(ctx.root, incumbent.commit_sha) if incumbent.commit_sha else None
    if tree is None:
        return []
    trees: dict[str, str | None] = {}
    out: list[PastExperiment] = []
    for run in ctx.ledger.runs():
        if run.id == ctx.run.id or run.split != ctx.split.name:
            continue
        by_id = {e.id: e for e in ctx.ledger.experiments(run.id)}
        for exp in by_id.values():
            parent = by_id.get(exp.parent_id) if exp.parent_id else None
            if exp.seq == 0 or parent is None or not parent.commit_sha:
                continue
            if parent.commit_sha not in trees:
                trees[parent.commit_sha] = gitops.prompts_tree(ctx.root, parent.commit_sha)
            if trees[parent.commit_sha] == tree:
                out.append(
                    PastExperiment(
                        id=exp.id,
                        decision=exp.status,
                        reason=exp.reason or "",
                        rationale=exp.rationale or "",
                        kappa=exp.kappa,
                        fpr=exp.fpr,
                        diff="",
                        meta=exp.proposal_meta,
                    )
                )
    return out


def optimizer_usage(spent: Proposal | ProposalError) -> Usage:
    """What the optimiser spent on a proposal (or before it failed): calls, input and output tokens, US dollars."""
    return Usage(
        calls=spent.calls,
        input_tokens=spent.input_tokens,
        output_tokens=spent.output_tokens,
        cost_usd=spent.cost_usd,
    )


def guard_inputs(ctx: RunContext) -> DevMaterial:
    """What the overfit lint checks against, built once per run (the instructions' 8-grams and values,
    the trajectories' typed texts and click targets, and per item for the memory's cases)."""
    if ctx.guard_cache is None:
        recordings = {lab.original_id for lab in ctx.labels.values()}
        recordings |= {lab.paired_id for lab in ctx.labels.values() if lab.paired_id}
        trajectories = [ctx.split.trajectory(t) for t in ctx.split.ids]
        instructions = [t.task.instruction for t in trajectories]
        ctx.guard_cache = DevMaterial.prebuilt(
            set(ctx.split.ids),
            recordings,
            instruction_ngrams(instructions),
            instruction_values(instructions),
            trajectory_values=trajectory_values(trajectories),
            items=ItemIndex(zip(ctx.split.ids, trajectories, strict=True)),
        )
    return ctx.guard_cache


def validate(
    ctx: RunContext, changed: Mapping[str, str | None], provider: Provider, base_rev: str = "HEAD"
) -> str | None:
    """Why the prompt set ``base_rev`` + ``changed`` cannot be judged with (`optimizer.loop.validate`), or None."""
    files = candidate_files(ctx.root, base_rev, changed)
    return validate_prompts(
        files,
        ctx.split,
        provider,
        batch=ctx.settings.batch,
        image_cache_dir=ctx.ws.experiments_dir / IMAGE_CACHE_DIRNAME,
    )


def committed_prompts(ctx: RunContext, sha: str, provider: Provider) -> tuple[PromptSet | None, str | None]:
    """A committed candidate's prompt set, or why the judge cannot be run with it (a commit left by an
    older judgeloop, or a hand-made one): (prompts, None) or (None or prompts, reason)."""
    try:
        prompts = PromptSet.from_rev(ctx.ws, sha)
        return prompts, validate(ctx, {}, provider, base_rev=sha)
    except UserError as exc:
        return None, str(exc)


def case_copy(ctx: RunContext, changed: Mapping[str, tuple[str | None, str | None]]) -> str | None:
    """Why the candidate is refused for copying a memory case into a file sent with every item (the
    rubric, judge.md, principles.md: a case states a dev item's verdict, and there it would reach the
    case's own fold), whoever made it; None when it copies none. The memory tools refuse the same."""
    from optimizer.loop.strategies.memoryedit import MemoryEditError, check_no_case_copy

    cases: list[Case] = []
    for text in (read_prompt_file(ctx.root, CASES_JSONL), changed.get(CASES_JSONL, (None, None))[1]):
        if text:
            try:
                cases += parse_cases(text)
            except UserError:  # a malformed cases.jsonl is the validation's to refuse, in its own words
                continue
    if not cases:
        return None
    for path, (old, new) in sorted(changed.items()):
        if (path in MEMORY_FILES and path != PRINCIPLES_MD) or new is None:
            continue
        try:
            check_no_case_copy(path, old, new, cases)
        except MemoryEditError as exc:
            return str(exc)
    return None


def check_tip(ctx: RunContext, incumbent: Experiment) -> None:
    """Refuse (`UserError`, one line naming the unexpected commits) unless the run's branch is checked out
    at the incumbent's commit: the loop builds a candidate only on a commit it made (`optimizer.loop.trust`)."""
    expected = incumbent.commit_sha or ctx.run.start_rev
    problem = trust.tip_problem(ctx.root, ctx.run.branch, expected)
    if problem is not None:
        raise UserError(trust.refusal(problem, ctx.run.branch, expected))


def whole_diff_guard(
    ctx: RunContext, incumbent_sha: str, sha: str, proposed: Mapping[str, tuple[str | None, str | None]]
) -> str | None:
    """Why the committed candidate ``sha`` is refused on its whole diff from the incumbent (read from
    git, not from the proposal), or None: the guards again over every file it changes, and no commit
    the loop did not make between the two (one slipped in while the strategy proposed)."""
    full = trust.full_diff(ctx.root, incumbent_sha, sha)
    opt = ctx.ws.config.optimizer
    guard = check_candidate(
        full,
        opt.allowed_files,
        opt.max_diff_lines,
        guard_inputs(ctx),
        structure_moves=opt.structure_moves,
        max_members=opt.max_members,
    )
    if not guard.ok:
        return f"its whole diff from the incumbent {incumbent_sha[:12]}: {guard.reason or 'rejected'}"
    slipped = trust.slipped_commits(ctx.root, incumbent_sha, sha)
    if slipped or set(full) != set(proposed):
        named = trust.commits_line(slipped) if slipped else "changes beside the proposal"
        return f"commits the loop did not make lie under the candidate: {named}"
    return None


async def prepare(
    ctx: RunContext,
    strategy: Strategy,
    incumbent: Experiment,
    provider: Provider,
    *,
    wave: WaveSlot | None = None,
    given: Proposal | ProposalError | None = None,
) -> Rejected | Prepared:
    """Propose, guard and commit one candidate on the incumbent: `Rejected` when it ends before evaluation
    (optimiser failure, guards), else `Prepared`. ``wave``: its place in a wave (`WaveSlot`); ``given``:
    the proposal a strategy made for the whole wave at once."""
    check_tip(ctx, incumbent)
    seq = max(e.seq for e in ctx.ledger.experiments(ctx.run.id)) + 1
    wave_meta = wave.meta if wave is not None else None
    if given is None:
        ctx.stage(StageKind.PROPOSING, None, seq=seq, strategy=strategy.name)
        ctx.say(
            "next candidate: your edit"
            if strategy.name == "manual"
            else f"next candidate: asking the {strategy.name} optimiser for an edit"
        )
    try:
        if isinstance(given, ProposalError):
            raise given
        if given is not None:
            proposal: Proposal = given
        else:
            proposal_ctx = proposal_context(ctx, incumbent, seq)
            if wave is not None and wave.siblings:
                proposal_ctx.history = [*proposal_ctx.history, *wave.siblings]
            proposal = await strategy.propose(proposal_ctx)
    except ProposalError as exc:
        ctx.charge(exc.cost_usd)
        exp = ctx.ledger.start_experiment(
            ctx.run.id,
            parent_id=incumbent.id,
            strategy=strategy.name,
            seq=seq,
            edit=ProposedEdit(
                optimizer_usage=optimizer_usage(exc),
                proposal_meta={"wave": wave_meta} if wave_meta else None,  # a wave's failure is its member
            ),
        )
        ctx.say(f"  optimiser failed: {exc.reason}")
        # No judge call was made: the row's total cost is the optimiser's.
        return Rejected(
            ctx.ledger.record_error(exp.id, f"optimiser failed: {exc.reason}", cost_usd=exc.cost_usd)
        )
    ctx.charge(proposal.cost_usd)
    changed, link_error = read_changes(ctx, proposal)
    diff_text, ins, dels = unified_diff(
        {p: c for p, c in changed.items() if p in set(ctx.ws.config.optimizer.editable_files)}
    )
    exp = ctx.ledger.start_experiment(
        ctx.run.id,
        parent_id=incumbent.id,
        strategy=strategy.name,
        seq=seq,
        edit=ProposedEdit(
            files_changed=sorted(changed),
            insertions=ins,
            deletions=dels,
            diff_text=diff_text,
            rationale=clipped_rationale(proposal.rationale),
            optimizer_usage=optimizer_usage(proposal),
            proposal_meta=proposal.meta | ({"wave": wave_meta} if wave_meta else {}),
        ),
    )
    # The row's calls and tokens are the judge's (none yet); its cost is the experiment's total,
    # judge + optimiser, so budgets and spend sums count the optimiser too.
    ctx.events(CandidateProposed(exp.id, seq, strategy.name, tuple(sorted(changed)), ins, dels))
    ctx.stage(StageKind.GUARDS, exp.id)
    files_key = stable_json({p: n for p, (_, n) in sorted(changed.items())})
    reason = guard_reason(
        ctx,
        incumbent,
        proposal,
        changed,
        link_error=link_error,
        provider=provider,
        duplicate_of=wave.seen.get(files_key) if wave is not None and changed else None,
    )
    if reason is not None:
        ctx.events(GuardRejected(exp.id, reason))
        return Rejected(ctx.ledger.reject(exp.id, reason, cost_usd=proposal.cost_usd))
    committed = _commit(
        ctx, exp.id, incumbent, proposal, changed, trailers=carries_trailers(strategy.name, proposal.meta)
    )
    if isinstance(committed, Rejected):
        return committed
    if wave is not None:
        wave.seen[files_key] = exp.id
        wave.siblings.append(
            PastExperiment(
                id=exp.id,
                decision=IN_WAVE,
                reason="another candidate of this wave, judged together with yours "
                "against the same incumbent: propose a different edit",
                rationale=proposal.rationale,
                kappa=None,
                fpr=None,
                diff=diff_text,
                meta=proposal.meta,
            )
        )
    return committed


def read_changes(ctx: RunContext, proposal: Proposal) -> tuple[Changed, str | None]:
    """The proposal's files that differ from the tree, by canonical name (old, new), and the first link
    refused on the way (a link in prompts/ is never read or written through), or None."""
    allowed = set(ctx.ws.config.optimizer.editable_files)
    changed: Changed = {}
    link_error: str | None = None
    for path, new in proposal.files.items():
        # One path rule: the guards judge, and the loop writes, the canonical name alone.
        name = allowed_name(path, allowed)
        if name is None or (name != path and name in proposal.files):
            # Never read a file outside the allowed set: its text would reach the ledger's diff and,
            # through the history, the optimiser (think devset/*/labels.jsonl). The guard rejects it.
            changed[path] = ("<not read: outside the allowed files>", new)
            continue
        try:
            old = read_prompt_file(ctx.root, name)
        except UserError as exc:  # a link in prompts/: never read or written through
            link_error = link_error or str(exc)
            continue
        if old != new:
            changed[name] = (old, new)
    return changed, link_error


def guard_reason(
    ctx: RunContext,
    incumbent: Experiment,
    proposal: Proposal,
    changed: Changed,
    *,
    link_error: str | None,
    provider: Provider,
    duplicate_of: int | None,
) -> str | None:
    """Why the guards refuse the candidate before it is committed, or None: the rationale, a link, the
    same edit as ``duplicate_of`` (a wave's earlier candidate), the allowed files, diff size and overfit
    lint, a copied memory case, a prompt set the judge cannot be run with, the cost guard."""
    opt = ctx.ws.config.optimizer
    guard = (
        check_candidate(
            changed,
            opt.allowed_files,
            opt.max_diff_lines,
            guard_inputs(ctx),
            structure_moves=opt.structure_moves,
            max_members=opt.max_members,
        )
        if changed
        else None
    )
    if not (told := check_rationale(proposal.rationale)).ok:
        return told.reason
    if link_error is not None:
        return link_error
    if duplicate_of is not None:
        return f"the same edit as experiment {duplicate_of} of this wave"
    if guard is None or not guard.ok:
        return "the proposal changed nothing" if guard is None else (guard.reason or "rejected")
    if (copied := case_copy(ctx, changed)) is not None:
        return copied
    # Complete before commit: a candidate the judge could not be run with is a rejection, not a crash.
    new_files = {p: n for p, (_, n) in changed.items()}
    invalid = validate(ctx, new_files, provider)
    if invalid is not None:
        return f"the candidate cannot be used: {invalid}"
    return cost_guard(ctx, incumbent, new_files, provider)


def _commit(
    ctx: RunContext,
    exp_id: int,
    incumbent: Experiment,
    proposal: Proposal,
    changed: Changed,
    *,
    trailers: Mapping[str, object] | None = None,
) -> Rejected | Prepared:
    """Write and commit the guarded files, guard the whole diff as git has it, mark the row evaluating;
    ``trailers``: more of the commit's trailers (a merged candidate's ``Judgeloop-Carries``)."""
    # Only guarded, allowed files are written (never through a link), and only they are committed.
    for path, (_, new_text) in changed.items():
        write_prompt_file(ctx.root, path, new_text or "")
    sha = gitops.commit_candidate(
        ctx.root,
        sorted(changed),
        f"judgeloop candidate {exp_id}: {one_line(proposal.rationale)}\n\n{proposal.rationale}",
        exp_id,
        trailers,
    )
    incumbent_sha = incumbent.commit_sha or ctx.run.start_rev
    slipped = whole_diff_guard(ctx, incumbent_sha, sha, changed)
    if slipped is not None:
        rejected = gitops.roll_back(
            ctx.root, sha, exp_id, incumbent_sha, decision_trailers(exp_id, None, "guard_rejected")
        )
        ctx.events(GuardRejected(exp_id, slipped))
        return Rejected(
            ctx.ledger.record_decision(
                exp_id,
                ExperimentOutcome(
                    status="guard_rejected",
                    reason=slipped,
                    extra_cost_usd=proposal.cost_usd,
                    commit_sha=rejected,
                ),
            )
        )
    ctx.ledger.mark_evaluating(exp_id, sha, cost_usd=proposal.cost_usd)
    return Prepared(exp_id, sha, proposal.cost_usd)
