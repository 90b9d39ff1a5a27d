"""Short one-line renderings of the report's figures, shared by the text report and the TUI (numbers,
the adaptive test's line, accounting, false positives by type, token splits, the history table)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import partial

from optimizer.fmt import num, signed
from optimizer.fmt import one_line as one_line  # the report's free text (rationales, notes) on one line
from optimizer.ledger import Experiment, Run
from optimizer.report.data import accounting, delta, parents_by_id
from optimizer.stats.decision import AdaptiveTest
from optimizer.workspace.config import Config
from optimizer.workspace.workspace import Workspace

# The text report shows a missing figure as "-" (the TUI's cells as "—").
_num = partial(num, missing="-")
_signed = partial(signed, missing="-")


def interval(exp: Experiment, name: str) -> str:
    if not exp.intervals or name not in exp.intervals:
        return ""
    lo, hi = exp.intervals[name]
    return f" [{lo:.3f}, {hi:.3f}]"


def test_line(exp: Experiment, limit: int = 6) -> str | None:
    """``"re-judged 5 items (abc… 1/3 → 3/3, …); sign-flip p=0.031 at alpha 0.1, gain +3.67 items"``."""
    if not exp.test:
        return None
    test = AdaptiveTest.model_validate(exp.test)
    items = [i for i in test.items if i.rejudged]
    shown = ", ".join(f"{i.trajectory_id[:8]} {i.draws()}" for i in items[:limit])
    more = f", … {len(items) - limit} more" if len(items) > limit else ""
    listed = f" ({shown}{more})" if limit else ""
    judged = (
        f"re-judged {len(items)} item(s) ×{test.rejudge} under each prompt{listed}"
        if items
        else "nothing re-judged"
    )
    return (
        f"{judged}; sign-flip p={test.p_value:.3g} at alpha {test.alpha:.3g}"
        f"{'' if test.draws == 0 else f' ({test.draws} draws, seed {test.seed})'}, "
        f"gain {test.statistic:+.2f} items"
    )


def accounting_line(run: Run, experiments: Sequence[Experiment], current: Config | None = None) -> str:
    """One line for the report and the TUI: tested candidates and expected false keeps."""
    acc = accounting(run, experiments, current)
    if acc.expected_false_keeps is None:
        return (
            f"{acc.tested} candidate(s) decided under the literal policy, which runs no test: the number of "
            "no-op edits it keeps is not bounded"
        )
    control = f"online FDR control (LORD++) at {acc.fdr:g}" if acc.fdr else "each at alpha"
    also = f", {acc.cheaper_tested} of them also for cheaper-not-worse" if acc.cheaper_tested else ""
    return (
        f"{acc.tested} candidate(s) tested ({control}{also}): expected false keeps if every one were a no-op "
        f"≤ {acc.expected_false_keeps:.2f}"
    )


def fp_by_type_line(mine: dict[str, int], incumbent: dict[str, int] | None) -> str:
    """``FP by type (incumbent → this): Critical Mistake 4 → 3, ...`` (or the counts alone)."""
    if incumbent is None:
        return "FP by type: " + ", ".join(f"{kind} {n}" for kind, n in mine.items())
    return "FP by type (incumbent → this, same items): " + ", ".join(
        f"{kind} {incumbent[kind]} → {n}" for kind, n in mine.items()
    )


def git_audit(ws: Workspace, run: Run, experiments: Sequence[Experiment]) -> list[str]:
    """Lines comparing the ledger with git: kept commits on the branch, rejected refs present."""
    from optimizer.workspace import gitops

    try:
        branch_commits = {sha for sha, _ in gitops.branch_log(ws, run.branch, since=run.start_rev)}
        rejected = gitops.rejected_refs(ws)
    except Exception as exc:  # noqa: BLE001 - a copied ledger has no branch here; say so and go on
        return [f"git: cannot read branch {run.branch} in this workspace ({type(exc).__name__})"]
    kept = [e for e in experiments if e.status == "kept"]
    rolled = [e for e in experiments if e.status == "rolled_back"]
    kept_ok = sum(1 for e in kept if e.commit_sha in branch_commits)
    rolled_ok = sum(1 for e in rolled if e.id in rejected)
    lines = [
        f"git: {kept_ok}/{len(kept)} kept candidates on {run.branch} "
        f"({len(branch_commits)} commits since the start revision); "
        f"{rolled_ok}/{len(rolled)} rolled-back candidates under refs/judgeloop/rejected/",
    ]
    if len(branch_commits) != len(kept) or kept_ok != len(kept) or rolled_ok != len(rolled):
        lines.append("git: WARNING the branch and the ledger disagree; inspect `git log` and the ledger")
    return lines


def token_split(uncached: int, cache_read: int, cache_write: int, output: int) -> str:
    """``"12,000 in (+30,000 cache read, 0 cache write) / 800 out tokens"``: the judge's tokens as billed
    (the cache figures only when there are any)."""
    cache = f" (+{cache_read:,} cache read, {cache_write:,} cache write)" if cache_read or cache_write else ""
    return f"{uncached:,} in{cache} / {output:,} out tokens"


def p_cell(exp: Experiment) -> str:
    """The p-value cell; "≥" marks an early-stopped candidate's, the best case's bound."""
    text = _num(exp.p_value)
    return f"≥{text}" if exp.early_stopped and exp.p_value is not None else text


def flip_summary(exp: Experiment) -> str:
    if exp.flips is None:
        return "-"
    c = exp.flip_counts()
    return f"+{c['fn_to_tp'] + c['fp_to_tn']}/-{c['tp_to_fn'] + c['tn_to_fp']}"


def status_label(e: Experiment) -> str:
    """An experiment's outcome as history and the report show it: ``kept (overruled)`` for a person's keep
    against the policy's roll back (`Experiment.overrule`), ``kept (cheaper)`` for a cheaper-not-worse keep,
    ``kept (stacked)`` for a merged candidate's keep (`Experiment.carries`), ``pooled`` for a rolled-back
    candidate that pointed the right way and joined its incumbent's pool (`[loop] stack`)."""
    if e.status == "kept" and e.overrule:
        return "kept (overruled)"
    if e.status == "kept" and e.carries:
        return "kept (stacked)"
    if e.status == "rolled_back" and e.pooled_on is not None:
        return "pooled"
    return "kept (cheaper)" if e.status == "kept" and e.keep_kind == "cheaper" else e.status


def history_lines(experiments: Sequence[Experiment]) -> list[str]:
    """The experiments table, one line per experiment (deltas against each one's parent)."""
    parents = parents_by_id(experiments)
    header = (
        f"{'id':>5} {'created':<19} {'strategy':<9} {'decision':<16} {'kappa':>6} {'Δκ':>7} "
        f"{'FPR':>6} {'ΔFPR':>7} {'BA':>6} {'p':>6} {'flips':>7} {'calls':>6} {'+rej':>5} {'cost$':>8}  rationale"
    )
    lines = [header]
    for e in experiments:
        parent = parents.get(e.parent_id) if e.parent_id is not None else None
        lines.append(
            f"{e.id:>5} {e.created.strftime('%Y-%m-%d %H:%M:%S'):<19} {(e.strategy or '-')[:9]:<9} "
            f"{status_label(e):<16} {_num(e.kappa):>6} {_signed(delta(e.kappa, parent.kappa if parent else None)):>7} "
            f"{_num(e.fpr):>6} {_signed(delta(e.fpr, parent.fpr if parent else None)):>7} "
            f"{_num(e.balanced_accuracy):>6} {p_cell(e):>6} {flip_summary(e):>7} {e.calls:>6} "
            f"{e.rejudge_calls or '':>5} {e.cost_usd:>8.4f}  "
            f"{one_line(e.rationale, 60)}"
        )
    return lines


def endpoint_lines(figures: Mapping[str, Mapping[str, int]]) -> list[str]:
    """One line per ``[judge] base_urls`` endpoint: ``"http://a:8000/v1: 40 calls, 30,000 of 41,000
    prompt tokens cached (73%), 1 failed call, drained in 1 pass"`` (nothing without base_urls)."""
    lines = []
    for name, f in figures.items():
        prompt, cached = f.get("prompt_tokens", 0), f.get("cached_tokens", 0)
        share = f" ({cached / prompt:.0%})" if prompt else ""
        failures, drained = f.get("failures", 0), f.get("drained", 0)
        lines.append(
            f"{name}: {f.get('calls', 0)} calls, {cached:,} of {prompt:,} prompt tokens cached{share}, "
            f"{failures} failed call{'' if failures == 1 else 's'}"
            + (f", drained in {drained} pass{'' if drained == 1 else 'es'}" if drained else "")
        )
    return lines


def cache_reads_line(planned: int, billed: int) -> str | None:
    """``"cache reads: 28,000 billed of 30,000 planned tokens (93%)"``, with a warning below the
    threshold (`optimizer.evaluation.warmup.LOW_READS_SHARE`); None when nothing was planned."""
    from optimizer.evaluation.warmup import CacheReads

    reads = CacheReads(planned=planned, billed=billed)
    if not planned:
        return None
    return f"cache reads: {billed:,} billed of {planned:,} planned tokens ({billed / planned:.0%})" + (
        " — WARNING below plan: calls paid cache writes instead" if reads.low else ""
    )
