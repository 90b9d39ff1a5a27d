"""Audit commands over the ledger: ``judgeloop report``, ``history`` and ``reviews``, plus the exports
(TSV of experiments, markdown report) the loop writes at the end of a run.

Everything here reads the ledger only (``Ledger.open_readonly``), so it works on a finished run, a
running one in another process, or a ledger copied from another machine. ``report`` additionally
cross-checks git when the run's branch exists in the workspace.
"""

from __future__ import annotations

import csv
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from optimizer.config import Config
from optimizer.decision import AdaptiveTest, ItemShares
from optimizer.ledger import FLIP_KEYS, Attribution, EditContribution, Experiment, Ledger, Run
from optimizer.metrics import FLIP_ARROWS, FLIP_ROWS, Answer
from optimizer.runsettings import RunSettings
from optimizer.vocab import TESTED_STATUSES
from optimizer.workspace import Workspace

# ``calls`` are the judge's; ``cost_usd`` is the experiment's total (judge + optimiser); the optimiser's
# part follows in its own keys. The judge's tokens are split as billed: uncached input, cache reads,
# cache writes, output; ``judge_cost_usd`` is what they cost.
JSON_EXPERIMENT_KEYS: tuple[str, ...] = (
    "id", "parent", "commit", "decision", "reason", "early_stopped", "kappa", "fpr", "balanced_accuracy",
    "p_value", "calls", "cost_usd", "optimizer_calls", "optimizer_input_tokens", "optimizer_output_tokens",
    "optimizer_cost_usd", "input_tokens", "cache_read_tokens", "cache_write_tokens", "output_tokens",
    "judge_cost_usd", "fp_by_type", "incumbent_fp_by_type", "alpha", "adaptive_keep", "rejudge_calls",
    "rejudge_cost_usd", "rejudged", "test",
)
TSV_COLUMNS: tuple[str, ...] = (
    "id", "seq", "parent", "created", "strategy", "decision", "kappa", "kappa_delta", "fpr", "fpr_delta",
    "balanced_accuracy", "p_value", "tp_to_fn", "fn_to_tp", "tn_to_fp", "fp_to_tn", "early_stopped",
    "items_evaluated", "calls", "cache_hits", "input_tokens", "output_tokens", "cost_usd", "duration_s",
    "commit", "files_changed", "insertions", "deletions", "reason", "rationale", "optimizer_calls",
    "optimizer_input_tokens", "optimizer_output_tokens", "optimizer_cost_usd", "cache_read_tokens",
    "cache_write_tokens", "alpha", "adaptive_keep", "rejudge_calls", "rejudge_cost_usd",
)


# ---------------------------------------------------------------------------------------------
# Small formatting helpers


def _num(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _delta(value: float | None, parent: float | None) -> float | None:
    return None if value is None or parent is None else value - parent


def _signed(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:+.{digits}f}"


def one_line(text: str | None, limit: int = 70) -> str:
    flat = " ".join((text or "").split())
    return flat if len(flat) <= limit else flat[: limit - 1].rstrip() + "…"


def _short(sha: str | None) -> str:
    return sha[:10] if sha else "-"


def _interval(exp: Experiment, name: str) -> str:
    if not exp.intervals or name not in exp.intervals:
        return ""
    lo, hi = exp.intervals[name]
    return f" [{lo:.3f}, {hi:.3f}]"


def _parents(experiments: Sequence[Experiment]) -> dict[int, Experiment]:
    return {e.id: e for e in experiments}


# The version of the `report --json` object's shape: raised when a key changes meaning or goes away
# (new keys may appear without a raise), so a script reading it can refuse a shape it does not know.
REPORT_FORMAT_VERSION = 1


def report_json(ledger: Ledger, run: Run, ws: Workspace | None = None) -> dict[str, Any]:
    """The ``report --json`` object: ``format_version`` (`REPORT_FORMAT_VERSION`, an integer raised when
    a key changes meaning or goes away), run, branch, policy and one entry per experiment, baseline first.
    ``ws``: the workspace, whose configuration fills what an old run's record lacks (`RunSettings`)."""
    experiments = []
    all_exps = ledger.experiments(run.id)
    fps_of = fp_by_type_all(ledger, run, all_exps)
    for exp in all_exps:
        fps = fps_of[exp.id]
        experiments.append({
            "id": exp.id,
            "parent": exp.parent_id,
            "commit": exp.commit_sha,
            "decision": exp.status,
            "reason": exp.reason,
            "early_stopped": exp.early_stopped,
            "kappa": exp.kappa,
            "fpr": exp.fpr,
            "balanced_accuracy": exp.balanced_accuracy,
            "p_value": exp.p_value,
            "calls": exp.calls,
            "cost_usd": exp.cost_usd,
            "optimizer_calls": exp.optimizer_calls,
            "optimizer_input_tokens": exp.optimizer_input_tokens,
            "optimizer_output_tokens": exp.optimizer_output_tokens,
            "optimizer_cost_usd": exp.optimizer_cost_usd,
            "input_tokens": exp.input_tokens,
            "cache_read_tokens": exp.cache_read_tokens,
            "cache_write_tokens": exp.cache_write_tokens,
            "output_tokens": exp.output_tokens,
            "judge_cost_usd": exp.judge_cost_usd,
            # On the items this experiment was judged on; the incumbent's is null for the baseline.
            "fp_by_type": fps[0] if fps else None,
            "incumbent_fp_by_type": fps[1] if fps else None,
            # The adaptive policy's record: the level tested at, its outcome, the re-judging pass.
            "alpha": exp.alpha,
            "adaptive_keep": exp.adaptive_keep,
            "rejudge_calls": exp.rejudge_calls,
            "rejudge_cost_usd": exp.rejudge_cost_usd,
            "rejudged": [{"trajectory_id": i.trajectory_id, "draws": i.draws()} for i in rejudged_items(exp)],
            "test": exp.test,
        })
    attribution = ledger.latest_attribution(run.id)
    return {"format_version": REPORT_FORMAT_VERSION, "run": run.id, "branch": run.branch, "policy": run.policy, "experiments": experiments,
            "accounting": accounting(run, all_exps, ws.config if ws else None), **attribution_json(attribution)}


def rejudged_items(exp: Experiment) -> list[ItemShares]:
    """The items an adaptive decision re-judged, with their draws (empty for other decisions)."""
    if not exp.test:
        return []
    return [item for item in AdaptiveTest.model_validate(exp.test).items if item.rejudged]


def test_line(exp: Experiment, limit: int = 6) -> str | None:
    """``"re-judged 5 items (abc… 1/3 → 3/3, …); sign-flip p=0.031 at alpha 0.1, gain +3.67 items"``."""
    if not exp.test:
        return None
    test = AdaptiveTest.model_validate(exp.test)
    items = [i for i in test.items if i.rejudged]
    shown = ", ".join(f"{i.trajectory_id[:8]} {i.draws()}" for i in items[:limit])
    more = f", … {len(items) - limit} more" if len(items) > limit else ""
    listed = f" ({shown}{more})" if limit else ""
    judged = (f"re-judged {len(items)} item(s) ×{test.rejudge} under each prompt{listed}" if items
              else "nothing re-judged")
    return (f"{judged}; sign-flip p={test.p_value:.3g} at alpha {test.alpha:.3g}"
            f"{'' if test.draws == 0 else f' ({test.draws} draws, seed {test.seed})'}, "
            f"gain {test.statistic:+.2f} items")


def accounting(run: Run, experiments: Sequence[Experiment], current: Config | None = None) -> dict[str, Any]:
    """Run-level accounting of the decisions: how many candidates were tested, the expected number of
    false keeps if every one were a no-op (the sum of the levels they were tested at; None under the
    literal policy, which runs no test), the online-FDR target if one was set, and each kept edit's
    p-value, extra judgements and cost. The run's settings are its own (`RunSettings.from_run`;
    ``current`` fills what an old record lacks)."""
    loop_cfg = RunSettings.from_run(run, current).loop
    # Rows decided before the level was recorded (ledger schema < 4) were tested at the run's alpha.
    default_alpha = loop_cfg.alpha if loop_cfg.policy != "literal" else None

    def level(e: Experiment) -> float | None:
        return e.alpha if e.alpha is not None else default_alpha

    tested = [e for e in experiments if e.seq > 0 and e.status in TESTED_STATUSES
              and (e.alpha is not None or e.p_value is not None)]
    return {
        "tested": len(tested),
        "expected_false_keeps": None if loop_cfg.policy == "literal" else round(sum(level(e) or 0.0 for e in tested), 6),
        "fdr": loop_cfg.fdr,
        "kept": [
            {"experiment": e.id, "p_value": e.p_value, "alpha": level(e), "rejudge_calls": e.rejudge_calls,
             "rejudged_items": len(rejudged_items(e)), "cost_usd": e.cost_usd}
            for e in experiments if e.status == "kept"
        ],
    }


def accounting_line(run: Run, experiments: Sequence[Experiment], current: Config | None = None) -> str:
    """One line for the report and the TUI: tested candidates and expected false keeps."""
    acc = accounting(run, experiments, current)
    if acc["expected_false_keeps"] is None:
        return (f"{acc['tested']} candidate(s) decided under the literal policy, which runs no test: the number of "
                "no-op edits it keeps is not bounded")
    control = (f"online FDR control (LORD++) at {acc['fdr']:g}" if acc["fdr"]
               else "each at alpha")
    return (f"{acc['tested']} candidate(s) tested ({control}): expected false keeps if every one were a no-op "
            f"≤ {acc['expected_false_keeps']:.2f}")


# ---------------------------------------------------------------------------------------------
# Attribution (`judgeloop attribute`): what each kept edit still contributes at the end

ATTRIBUTION_TSV_COLUMNS: tuple[str, ...] = (
    "experiment", "commit", "gain_when_kept", "items", "kappa_delta", "fpr_delta", "fixed", "broken", "p_value",
    "significant", "cost_usd", "entangled_with", "note",
)


def attribution_json(attribution: Attribution | None) -> dict[str, Any]:
    """``attribution`` (one entry per kept edit in scope, newest first; ``items`` null when it was not
    measured), ``final_vs_baseline`` and ``attribution_meta``; all null before `attribute` ran."""
    if attribution is None:
        return {"attribution": None, "final_vs_baseline": None, "attribution_meta": None}
    fvb = attribution.final_vs_baseline
    return {
        "attribution": [e.public() for e in attribution.edits],
        "final_vs_baseline": fvb.public() if fvb is not None else None,
        "attribution_meta": {
            "id": attribution.id, "scope": attribution.scope, "final_commit": attribution.final_commit,
            "baseline_commit": attribution.baseline_commit, "split": attribution.split, "judge": attribution.judge,
            "replicates": attribution.replicates, "rejudge": attribution.rejudge, "alpha": attribution.alpha,
            "status": attribution.status, "note": attribution.note, "cost_usd": attribution.cost_usd,
            "not_measured": [e.experiment for e in attribution.edits if e.items is None]
            + (["final_vs_baseline"] if fvb is None or fvb.items is None else []),
        },
    }


def significant(edit: EditContribution, alpha: float) -> bool | None:
    """Whether an edit's contribution at the end is significant at ``alpha`` (None: not measured)."""
    return None if edit.p_value is None or edit.items is None else edit.p_value < alpha


def gain_when_kept(exp: Experiment) -> float | None:
    """A kept experiment's gain in items when it was kept: the adaptive test's statistic, else its net
    flips against its incumbent (newly right minus newly wrong); None when neither was recorded."""
    if exp.test and isinstance(exp.test.get("statistic"), int | float):
        return float(exp.test["statistic"])
    if exp.flips is not None:
        c = exp.flip_counts()
        return float(c["fn_to_tp"] + c["fp_to_tn"] - c["tp_to_fn"] - c["tn_to_fp"])
    return None


def _gain_of(ledger: Ledger, experiment_id: int | None) -> float | None:
    if experiment_id is None:
        return None
    try:
        return gain_when_kept(ledger.get_experiment(experiment_id))
    except Exception:  # noqa: BLE001 - an edit from another ledger: no gain on record here
        return None


def attribution_lines(ledger: Ledger, attribution: Attribution | None) -> list[str]:
    """The attribution section of the text report."""
    if attribution is None:
        return ["what the kept edits contribute at the end: not measured yet (`judgeloop attribute`)"]
    a = attribution
    where = "the history of HEAD" if a.scope == "history" else "this run"
    lines = [
        f"what the kept edits contribute at the end (attribution {a.id}, {a.status}; kept edits in {where}; final "
        f"{_short(a.final_commit)} vs it without each edit; {a.judge}, {a.replicates} judgement(s) per item, "
        f"disagreeing items re-judged {a.rejudge} more time(s); ${a.cost_usd:.4f})",
        f"  {'edit':>6} {'commit':<10} {'kept':>7} {'items':>7} {'Δκ':>7} {'ΔFPR':>7} {'fixed':>5} {'broken':>6} "
        f"{'p':>6} {'cost$':>8}  note",
    ]
    for e in a.edits:
        gain = _gain_of(ledger, e.experiment)
        flag = "" if significant(e, a.alpha) is not False else "  (not significant at the end)"
        lines.append(
            f"  {'#' + str(e.experiment):>6} {_short(e.commit):<10} {_signed(gain, 2):>7} {_signed(e.items, 2):>7} "
            f"{_signed(e.kappa_delta):>7} {_signed(e.fpr_delta):>7} {len(e.fixed):>5} {len(e.broken):>6} "
            f"{_num(e.p_value):>6} {e.cost_usd:>8.4f}  {(e.note or '') + flag}".rstrip()
        )
    fvb = a.final_vs_baseline
    if fvb is not None and fvb.items is not None:
        lines.append(
            f"  final vs baseline ({_short(a.baseline_commit)}): {_signed(fvb.items, 2)} items, Δκ "
            f"{_signed(fvb.kappa_delta)}, ΔFPR {_signed(fvb.fpr_delta)}, fixed {len(fvb.fixed)}, broken "
            f"{len(fvb.broken)}, p {_num(fvb.p_value)}, ${fvb.cost_usd:.4f}"
        )
    else:
        lines.append("  final vs baseline: not measured")
    if a.note:
        lines.append(f"  {a.note}")
    return lines


def export_attribution_tsv(attribution: Attribution, path: Path, ledger: Ledger | None = None) -> Path:
    """Write the attribution table as TSV (``ATTRIBUTION_TSV_COLUMNS``; the last row is final vs baseline)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8", newline="") as fh:
        writer = csv.writer(fh, delimiter="\t", lineterminator="\n")
        writer.writerow(ATTRIBUTION_TSV_COLUMNS)
        rows = list(attribution.edits)
        if attribution.final_vs_baseline is not None:
            rows.append(attribution.final_vs_baseline)
        for e in rows:
            gain = _gain_of(ledger, e.experiment) if ledger is not None else None
            sig = significant(e, attribution.alpha)
            row: dict[str, Any] = {
                "experiment": "final_vs_baseline" if e.experiment is None else e.experiment, "commit": e.commit,
                "gain_when_kept": gain, "items": e.items, "kappa_delta": e.kappa_delta, "fpr_delta": e.fpr_delta,
                "fixed": ",".join(e.fixed), "broken": ",".join(e.broken), "p_value": e.p_value,
                "significant": "" if sig is None else int(sig), "cost_usd": e.cost_usd,
                "entangled_with": ",".join(str(x) for x in e.entangled_with), "note": one_line(e.note, 10_000),
            }
            writer.writerow(["" if row[c] is None else row[c] for c in ATTRIBUTION_TSV_COLUMNS])
    return path


FpByType = tuple[dict[str, int], dict[str, int] | None]


def fp_by_type_all(ledger: Ledger, run: Run, experiments: Sequence[Experiment]) -> dict[int, FpByType | None]:
    """`fp_by_type` for each of ``experiments``, reading the run's labels once and each experiment's
    answers once (an incumbent's answers serve all the candidates compared with it)."""
    from optimizer.metrics import false_positives_by_type

    labels = ledger.labels(run.id)
    answers: dict[int, dict[str, Answer]] = {}

    def answers_of(experiment_id: int) -> dict[str, Answer]:
        if experiment_id not in answers:
            answers[experiment_id] = ledger.item_answers(experiment_id)
        return answers[experiment_id]

    out: dict[int, FpByType | None] = {}
    for exp in experiments:
        mine = answers_of(exp.id) if labels else {}
        if not mine:
            out[exp.id] = None
            continue
        judged = {tid: labels[tid] for tid in mine if tid in labels}
        theirs = None if exp.parent_id is None else false_positives_by_type(judged, answers_of(exp.parent_id))
        out[exp.id] = (false_positives_by_type(judged, mine), theirs)
    return out


def fp_by_type(ledger: Ledger, run: Run, exp: Experiment) -> FpByType | None:
    """False positives per mistake type of ``exp`` and of its incumbent (its parent) on the items
    ``exp`` was judged on, so a candidate stopped early is compared on the same items; None when the
    run stored no labels or the experiment has no verdicts. The incumbent's side is None for the baseline."""
    return fp_by_type_all(ledger, run, [exp])[exp.id]


def fp_by_type_line(mine: dict[str, int], incumbent: dict[str, int] | None) -> str:
    """``FP by type (incumbent → this): Critical Mistake 4 → 3, ...`` (or the counts alone)."""
    if incumbent is None:
        return "FP by type: " + ", ".join(f"{kind} {n}" for kind, n in mine.items())
    return "FP by type (incumbent → this, same items): " + ", ".join(
        f"{kind} {incumbent[kind]} → {n}" for kind, n in mine.items()
    )


def overall_flips(ledger: Ledger, run: Run) -> dict[str, list[str]] | None:
    """Items whose correctness changed between the baseline and the final incumbent, by direction.

    None when the run has no stored labels, no baseline verdicts, or no incumbent yet.
    """
    from optimizer.metrics import flip_table

    chain = ledger.kept_chain(run.id)
    labels = ledger.labels(run.id)
    if not chain or not labels:
        return None
    baseline, final = ledger.item_answers(chain[0].id), ledger.item_answers(chain[-1].id)
    if not baseline or not final:
        return None
    known = set(labels)
    table = flip_table(
        labels,
        {k: v for k, v in baseline.items() if k in known},
        {k: v for k, v in final.items() if k in known},
    )
    return {k: list(getattr(table, k)) for k in FLIP_KEYS}


def spend(experiments: Sequence[Experiment]) -> dict[str, float | int]:
    """Totals over experiments: the judge's calls, cache hits, tokens (uncached input, prompt-cache reads
    and writes, output) and seconds, the optimiser's calls and tokens, and dollars (``cost_usd`` = judge
    + optimiser, and each part)."""
    return {
        "calls": sum(e.calls for e in experiments),
        "cache_hits": sum(e.cache_hits for e in experiments),
        "input_tokens": sum(e.input_tokens for e in experiments),
        "output_tokens": sum(e.output_tokens for e in experiments),
        "cache_read_tokens": sum(e.cache_read_tokens for e in experiments),
        "cache_write_tokens": sum(e.cache_write_tokens for e in experiments),
        "cost_usd": sum(e.cost_usd for e in experiments),
        "duration_s": sum(e.duration_s or 0.0 for e in experiments),
        "judge_cost_usd": sum(e.judge_cost_usd for e in experiments),
        "optimizer_calls": sum(e.optimizer_calls for e in experiments),
        "optimizer_input_tokens": sum(e.optimizer_input_tokens for e in experiments),
        "optimizer_output_tokens": sum(e.optimizer_output_tokens for e in experiments),
        "optimizer_cost_usd": sum(e.optimizer_cost_usd for e in experiments),
    }


def git_audit(ws: Workspace, run: Run, experiments: Sequence[Experiment]) -> list[str]:
    """Lines comparing the ledger with git: kept commits on the branch, rejected refs present."""
    from optimizer import gitops

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


# ---------------------------------------------------------------------------------------------
# Text renderings


def token_split(uncached: int, cache_read: int, cache_write: int, output: int) -> str:
    """``"12,000 in (+30,000 cache read, 0 cache write) / 800 out tokens"``: the judge's tokens as billed
    (the cache figures only when there are any)."""
    cache = f" (+{cache_read:,} cache read, {cache_write:,} cache write)" if cache_read or cache_write else ""
    return f"{uncached:,} in{cache} / {output:,} out tokens"


def _flip_summary(exp: Experiment) -> str:
    if exp.flips is None:
        return "-"
    c = exp.flip_counts()
    return f"+{c['fn_to_tp'] + c['fp_to_tn']}/-{c['tp_to_fn'] + c['tn_to_fp']}"


def history_lines(experiments: Sequence[Experiment]) -> list[str]:
    """The experiments table, one line per experiment (deltas against each one's parent)."""
    parents = _parents(experiments)
    header = (
        f"{'id':>5} {'created':<19} {'strategy':<9} {'decision':<14} {'kappa':>6} {'Δκ':>7} "
        f"{'FPR':>6} {'ΔFPR':>7} {'BA':>6} {'p':>6} {'flips':>7} {'calls':>6} {'+rej':>5} {'cost$':>8}  rationale"
    )
    lines = [header]
    for e in experiments:
        parent = parents.get(e.parent_id) if e.parent_id is not None else None
        lines.append(
            f"{e.id:>5} {e.created.strftime('%Y-%m-%d %H:%M:%S'):<19} {(e.strategy or '-')[:9]:<9} "
            f"{e.status:<14} {_num(e.kappa):>6} {_signed(_delta(e.kappa, parent.kappa if parent else None)):>7} "
            f"{_num(e.fpr):>6} {_signed(_delta(e.fpr, parent.fpr if parent else None)):>7} "
            f"{_num(e.balanced_accuracy):>6} {_num(e.p_value):>6} {_flip_summary(e):>7} {e.calls:>6} "
            f"{e.rejudge_calls or '':>5} {e.cost_usd:>8.4f}  "
            f"{one_line(e.rationale, 60)}"
        )
    return lines


def report_text(ledger: Ledger, run: Run, ws: Workspace | None = None) -> str:
    """The full human-readable audit of one run."""
    experiments = ledger.experiments(run.id)
    parents = _parents(experiments)
    out: list[str] = [
        f"run {run.id}  ({run.status}{'; ' + run.stop_reason if run.stop_reason else ''})",
        f"branch {run.branch}  start {_short(run.start_rev)}  strategy {run.strategy}  policy {run.policy}",
        f"split {run.split} (fingerprint {run.split_fingerprint[:12]})  created {run.created:%Y-%m-%d %H:%M:%S}Z"
        + (f"  finished {run.finished:%Y-%m-%d %H:%M:%S}Z" if run.finished else ""),
    ]
    if run.budgets:
        out.append("budgets " + ", ".join(f"{k}={v}" for k, v in run.budgets.items() if v is not None))
    current = ws.config if ws else None
    if (run.config or {}).get("judge"):  # a run recorded without one (a hand-made ledger) names none
        judge = RunSettings.from_run(run, current).judge
        out.append(
            f"judge {judge.provider}:{judge.model}"
            + ("  (demonstration-quality offline judge: its numbers show the mechanics only)"
               if judge.provider == "local" else "")
        )
    out.append("")
    out.append("experiments")
    fps_of = fp_by_type_all(ledger, run, experiments)
    for e in experiments:
        parent = parents.get(e.parent_id) if e.parent_id is not None else None
        out.append(f"  #{e.id} ({e.strategy or '-'}) {e.status.upper()}  commit {_short(e.commit_sha)}"
                   + (f"  parent #{e.parent_id}" if e.parent_id is not None else ""))
        if e.reason:
            out.append(f"    reason: {e.reason}")
        if e.metrics:
            out.append(
                f"    kappa {_num(e.kappa)}{_interval(e, 'kappa')} (Δ {_signed(_delta(e.kappa, parent.kappa if parent else None))})"
                f"   FPR {_num(e.fpr)}{_interval(e, 'fpr')} (Δ {_signed(_delta(e.fpr, parent.fpr if parent else None))})"
                f"   BA {_num(e.balanced_accuracy)}{_interval(e, 'balanced_accuracy')}"
            )
        if e.flips is not None or e.p_value is not None:
            counts = e.flip_counts()
            cells = " · ".join(
                f"{words} " + ", ".join(f"{FLIP_ARROWS[k]} {counts[k]}" for k in keys) for words, keys in FLIP_ROWS
            )
            policies = ""
            if e.literal_keep is not None or e.paired_keep is not None:
                policies = f"   literal {'keep' if e.literal_keep else 'roll back'}, paired {'keep' if e.paired_keep else 'roll back'}"
            if e.adaptive_keep is not None:
                policies += f", adaptive {'keep' if e.adaptive_keep else 'roll back'}"
            first_p = (e.test or {}).get("mcnemar_p", e.p_value) if e.test else e.p_value
            out.append(f"    flips {cells}   McNemar p {_num(first_p)}{policies}")
        line = test_line(e)
        if line:
            out.append(f"    test: {line}")
        fps = fps_of[e.id]
        if fps is not None:
            out.append("    " + fp_by_type_line(*fps))
        out.append(
            f"    judge: {e.items_evaluated} items{' (stopped early)' if e.early_stopped else ''}, {e.calls} calls, "
            f"{e.cache_hits} cached"
            + (f" ({e.rejudge_calls} re-judging, ${e.rejudge_cost_usd:.4f})" if e.rejudge_calls else "")
            + f", {token_split(e.input_tokens, e.cache_read_tokens, e.cache_write_tokens, e.output_tokens)}, "
            f"${e.judge_cost_usd:.4f}"
            + (f", {e.duration_s:.1f}s" if e.duration_s is not None else "")
        )
        if e.optimizer_calls or e.optimizer_cost_usd:
            out.append(
                f"    optimiser: {e.optimizer_calls} calls, {e.optimizer_input_tokens}+{e.optimizer_output_tokens} "
                f"tokens, ${e.optimizer_cost_usd:.4f} (experiment total ${e.cost_usd:.4f})"
            )
        if e.files_changed:
            out.append(f"    files {', '.join(e.files_changed)} (+{e.insertions or 0}/-{e.deletions or 0})")
        if e.rationale:
            out.append(f"    rationale: {one_line(e.rationale, 200)}")
    out.append("")

    chain = ledger.kept_chain(run.id)
    out.append("kept chain")
    if chain:
        out.append("  " + " → ".join(f"#{e.id} (κ {_num(e.kappa)}, FPR {_num(e.fpr)})" for e in chain))
        if len(chain) > 1:
            first, last = chain[0], chain[-1]
            out.append(f"  baseline → final: kappa {_signed(_delta(last.kappa, first.kappa))}, FPR {_signed(_delta(last.fpr, first.fpr))}")
    else:
        out.append("  (no baseline recorded yet)")
    out.append("")
    out.append("decisions")
    out.append("  " + accounting_line(run, experiments, current))
    for kept in accounting(run, experiments, current)["kept"]:
        out.append(f"  kept #{kept['experiment']}: p={_num(kept['p_value'])} at alpha {_num(kept['alpha'])}, "
                   f"{kept['rejudged_items']} item(s) re-judged ({kept['rejudge_calls']} extra calls), "
                   f"${kept['cost_usd']:.4f}")

    flips = overall_flips(ledger, run)
    if flips is not None:
        out.append("")
        out.append("items that flipped between baseline and final")
        if not any(flips.values()):
            out.append("  none")
        for words, keys in FLIP_ROWS:
            for key in keys:
                if flips[key]:
                    out.append(f"  {words} {FLIP_ARROWS[key]} ({len(flips[key])}): {', '.join(flips[key])}")

    out.append("")
    out.extend(attribution_lines(ledger, ledger.latest_attribution(run.id)))

    rejected = [e for e in experiments if e.status == "guard_rejected"]
    out.append("")
    out.append(f"guard rejections ({len(rejected)})")
    for e in rejected:
        out.append(f"  #{e.id}: {e.reason or '-'}")

    totals = spend(experiments)
    out.append("")
    out.append(
        f"spend: ${totals['cost_usd']:.4f} over {totals['calls']} calls ({totals['cache_hits']} cached), "
        f"{token_split(int(totals['input_tokens']), int(totals['cache_read_tokens']), int(totals['cache_write_tokens']), int(totals['output_tokens']))}, "
        f"{totals['duration_s']:.0f}s judging"
    )
    out.append(
        f"  judge ${totals['judge_cost_usd']:.4f} ({totals['calls']} calls); optimiser "
        f"${totals['optimizer_cost_usd']:.4f} ({totals['optimizer_calls']} calls, "
        f"{totals['optimizer_input_tokens']}+{totals['optimizer_output_tokens']} tokens)"
    )
    by_status: dict[str, int] = {}
    for e in experiments:
        by_status[e.status] = by_status.get(e.status, 0) + 1
    out.append("outcomes: " + ", ".join(f"{k} {v}" for k, v in sorted(by_status.items())))
    if ws is not None:
        out.extend(git_audit(ws, run, experiments))
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------------------------------------
# Exports


def export_experiments_tsv(ledger: Ledger, run_id: str, path: Path) -> Path:
    """Write the run's experiments as TSV (``TSV_COLUMNS``; empty cells where not computed)."""
    experiments = ledger.experiments(run_id)
    parents = _parents(experiments)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8", newline="") as fh:
        writer = csv.writer(fh, delimiter="\t", lineterminator="\n")
        writer.writerow(TSV_COLUMNS)
        for e in experiments:
            parent = parents.get(e.parent_id) if e.parent_id is not None else None
            counts = e.flip_counts() if e.flips is not None else dict.fromkeys(FLIP_KEYS)
            row: dict[str, Any] = {
                "id": e.id, "seq": e.seq, "parent": e.parent_id, "created": e.created.isoformat(),
                "strategy": e.strategy, "decision": e.status, "kappa": e.kappa,
                "kappa_delta": _delta(e.kappa, parent.kappa if parent else None), "fpr": e.fpr,
                "fpr_delta": _delta(e.fpr, parent.fpr if parent else None),
                "balanced_accuracy": e.balanced_accuracy, "p_value": e.p_value, **counts,
                "early_stopped": int(e.early_stopped), "items_evaluated": e.items_evaluated, "calls": e.calls,
                "cache_hits": e.cache_hits, "input_tokens": e.input_tokens, "output_tokens": e.output_tokens,
                "cost_usd": e.cost_usd, "duration_s": e.duration_s, "commit": e.commit_sha,
                "files_changed": ",".join(e.files_changed), "insertions": e.insertions, "deletions": e.deletions,
                "reason": one_line(e.reason, 10_000), "rationale": one_line(e.rationale, 10_000),
                "optimizer_calls": e.optimizer_calls, "optimizer_input_tokens": e.optimizer_input_tokens,
                "optimizer_output_tokens": e.optimizer_output_tokens, "optimizer_cost_usd": e.optimizer_cost_usd,
                "cache_read_tokens": e.cache_read_tokens, "cache_write_tokens": e.cache_write_tokens,
                "alpha": e.alpha, "adaptive_keep": None if e.adaptive_keep is None else int(e.adaptive_keep),
                "rejudge_calls": e.rejudge_calls, "rejudge_cost_usd": e.rejudge_cost_usd,
            }
            writer.writerow(["" if row[c] is None else row[c] for c in TSV_COLUMNS])
    return path


def write_markdown_report(ledger: Ledger, run_id: str, path: Path, ws: Workspace | None = None) -> Path:
    """Write ``experiments/runs/<run>/report.md``: a summary table, the kept chain and the full audit."""
    run = ledger.get_run(run_id)
    experiments = ledger.experiments(run_id)
    parents = _parents(experiments)
    chain = ledger.kept_chain(run_id)
    lines = [
        f"# judgeloop run {run.id}",
        "",
        f"- branch `{run.branch}` from `{_short(run.start_rev)}`; strategy `{run.strategy}`; policy `{run.policy}`",
        f"- split `{run.split}` (fingerprint `{run.split_fingerprint[:12]}`); status **{run.status}**"
        + (f" ({run.stop_reason})" if run.stop_reason else ""),
    ]
    if len(chain) >= 1:
        first, last = chain[0], chain[-1]
        lines.append(
            f"- baseline kappa {_num(first.kappa)}, FPR {_num(first.fpr)} → final (#{last.id}) kappa "
            f"{_num(last.kappa)}, FPR {_num(last.fpr)}"
        )
    lines += [
        "",
        "| id | decision | kappa | Δkappa | FPR | ΔFPR | p | flips +/- | cost $ | rationale |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for e in experiments:
        parent = parents.get(e.parent_id) if e.parent_id is not None else None
        rationale = one_line(e.rationale, 80).replace("|", "\\|")
        lines.append(
            f"| {e.id} | {e.status} | {_num(e.kappa)} | {_signed(_delta(e.kappa, parent.kappa if parent else None))} "
            f"| {_num(e.fpr)} | {_signed(_delta(e.fpr, parent.fpr if parent else None))} | {_num(e.p_value)} "
            f"| {_flip_summary(e)} | {e.cost_usd:.4f} | {rationale} |"
        )
    lines += attribution_markdown(ledger, ledger.latest_attribution(run_id))
    lines += ["", "## Full audit", "", "```text", report_text(ledger, run, ws).rstrip("\n"), "```", ""]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines), encoding="utf-8")
    return path


def attribution_markdown(ledger: Ledger, attribution: Attribution | None) -> list[str]:
    """The report's "What helped" section: one table row per kept edit, then final vs baseline."""
    lines = ["", "## What helped (attribution)", ""]
    if attribution is None:
        return [*lines, "Not measured yet: `judgeloop attribute` measures what each kept edit still contributes."]
    a = attribution
    lines += [
        f"Final `{_short(a.final_commit)}` against the final prompts without each kept edit ({a.status}; "
        f"{a.judge}, disagreeing items re-judged {a.rejudge} more time(s); ${a.cost_usd:.4f}). Items = Σ over items "
        "of the change in the share of judgements that are correct; deltas are final minus without the edit.",
        "",
        "| edit | commit | gain when kept | items at the end | Δkappa | ΔFPR | fixed | broken | p | cost $ | note |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    rows = list(a.edits) + ([a.final_vs_baseline] if a.final_vs_baseline is not None else [])
    for e in rows:
        name = "final vs baseline" if e.experiment is None else f"#{e.experiment}"
        gain = _gain_of(ledger, e.experiment)
        note = (e.note or "") + (" (not significant)" if significant(e, a.alpha) is False else "")
        lines.append(
            f"| {name} | `{_short(e.commit)}` | {_signed(gain, 2)} | {_signed(e.items, 2)} | {_signed(e.kappa_delta)} "
            f"| {_signed(e.fpr_delta)} | {len(e.fixed)} | {len(e.broken)} | {_num(e.p_value)} | {e.cost_usd:.4f} "
            f"| {note.replace('|', '/')} |"
        )
    if a.note:
        lines += ["", a.note]
    return lines
