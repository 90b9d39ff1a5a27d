"""The full text renderings: ``judgeloop report`` as text and Markdown, the TSV exports, the
attribution table. Built on `optimizer.report.data` and `optimizer.report.lines`; the TUI never imports it."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

from optimizer.ledger import FLIP_KEYS, Attribution, Ledger, Run
from optimizer.report.data import (
    REPORT_SUSPECTS,
    accounting,
    cascade_cost,
    delta,
    fp_by_type_all,
    gain_of,
    overall_flips,
    panel_cost,
    parents_by_id,
    short,
    significant,
    spend,
    triage,
)
from optimizer.report.lines import (
    accounting_line,
    cache_reads_line,
    endpoint_lines,
    flip_summary,
    fp_by_type_line,
    git_audit,
    interval,
    num,
    one_line,
    p_cell,
    signed,
    status_label,
    test_line,
    token_split,
)
from optimizer.runsettings import RunSettings
from optimizer.stats.metrics import FLIP_ARROWS, FLIP_ROWS
from optimizer.workspace.workspace import Workspace

TSV_COLUMNS: tuple[str, ...] = (
    "id",
    "seq",
    "parent",
    "created",
    "strategy",
    "decision",
    "kappa",
    "kappa_delta",
    "fpr",
    "fpr_delta",
    "balanced_accuracy",
    "p_value",
    "tp_to_fn",
    "fn_to_tp",
    "tn_to_fp",
    "fp_to_tn",
    "early_stopped",
    "items_evaluated",
    "calls",
    "cache_hits",
    "input_tokens",
    "output_tokens",
    "cost_usd",
    "duration_s",
    "commit",
    "files_changed",
    "insertions",
    "deletions",
    "reason",
    "rationale",
    "optimizer_calls",
    "optimizer_input_tokens",
    "optimizer_output_tokens",
    "optimizer_cost_usd",
    "cache_read_tokens",
    "cache_write_tokens",
    "alpha",
    "adaptive_keep",
    "rejudge_calls",
    "rejudge_cost_usd",
    "keep_kind",
    "verdict_cost_usd",
    "decided_by",
    "overrule",
)


ATTRIBUTION_TSV_COLUMNS: tuple[str, ...] = (
    "experiment",
    "commit",
    "gain_when_kept",
    "items",
    "kappa_delta",
    "fpr_delta",
    "fixed",
    "broken",
    "p_value",
    "significant",
    "cost_usd",
    "entangled_with",
    "note",
)


def attribution_lines(ledger: Ledger, attribution: Attribution | None) -> list[str]:
    """The attribution section of the text report."""
    if attribution is None:
        return ["what the kept edits contribute at the end: not measured yet (`judgeloop attribute`)"]
    a = attribution
    where = "the history of HEAD" if a.scope == "history" else "this run"
    lines = [
        f"what the kept edits contribute at the end (attribution {a.id}, {a.status}; kept edits in {where}; final "
        f"{short(a.final_commit)} vs it without each edit; {a.judge}, {a.replicates} judgement(s) per item, "
        f"disagreeing items re-judged {a.rejudge} more time(s); ${a.cost_usd:.4f})",
        f"  {'edit':>6} {'commit':<10} {'kept':>7} {'items':>7} {'Δκ':>7} {'ΔFPR':>7} {'fixed':>5} {'broken':>6} "
        f"{'p':>6} {'cost$':>8}  note",
    ]
    for e in a.edits:
        gain = gain_of(ledger, e.experiment)
        flag = "" if significant(e, a.alpha) is not False else "  (not significant at the end)"
        lines.append(
            f"  {'#' + str(e.experiment):>6} {short(e.commit):<10} {signed(gain, 2):>7} {signed(e.items, 2):>7} "
            f"{signed(e.kappa_delta):>7} {signed(e.fpr_delta):>7} {len(e.fixed):>5} {len(e.broken):>6} "
            f"{num(e.p_value):>6} {e.cost_usd:>8.4f}  {(e.note or '') + flag}".rstrip()
        )
    fvb = a.final_vs_baseline
    if fvb is not None and fvb.items is not None:
        lines.append(
            f"  final vs baseline ({short(a.baseline_commit)}): {signed(fvb.items, 2)} items, Δκ "
            f"{signed(fvb.kappa_delta)}, ΔFPR {signed(fvb.fpr_delta)}, fixed {len(fvb.fixed)}, broken "
            f"{len(fvb.broken)}, p {num(fvb.p_value)}, ${fvb.cost_usd:.4f}"
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
            gain = gain_of(ledger, e.experiment) if ledger is not None else None
            sig = significant(e, attribution.alpha)
            row: dict[str, Any] = {
                "experiment": "final_vs_baseline" if e.experiment is None else e.experiment,
                "commit": e.commit,
                "gain_when_kept": gain,
                "items": e.items,
                "kappa_delta": e.kappa_delta,
                "fpr_delta": e.fpr_delta,
                "fixed": ",".join(e.fixed),
                "broken": ",".join(e.broken),
                "p_value": e.p_value,
                "significant": "" if sig is None else int(sig),
                "cost_usd": e.cost_usd,
                "entangled_with": ",".join(str(x) for x in e.entangled_with),
                "note": one_line(e.note, 10_000),
            }
            writer.writerow(["" if row[c] is None else row[c] for c in ATTRIBUTION_TSV_COLUMNS])
    return path


def report_text(ledger: Ledger, run: Run, ws: Workspace | None = None, *, with_triage: bool = True) -> str:
    """The full human-readable audit of one run; ``with_triage=False`` leaves out the label-triage sections
    (corrections and suspects are answers: what the MCP server hands an optimising agent)."""
    experiments = ledger.experiments(run.id)
    parents = parents_by_id(experiments)
    out: list[str] = [
        f"run {run.id}  ({run.status}{'; ' + run.stop_reason if run.stop_reason else ''})",
        f"branch {run.branch}  start {short(run.start_rev)}  strategy {run.strategy}  policy {run.policy}",
        f"split {run.split} (fingerprint {run.split_fingerprint[:12]})  created {run.created:%Y-%m-%d %H:%M:%S}Z"
        + (f"  finished {run.finished:%Y-%m-%d %H:%M:%S}Z" if run.finished else ""),
    ]
    if run.budgets:
        shown = {k: v for k, v in run.budgets.items() if v is not None and k != "top_ups"}
        out.append("budgets " + ", ".join(f"{k}={v}" for k, v in shown.items()))
        for top_up in run.budgets.get("top_ups") or []:  # `optimizer.mcp.topup`: a person's decision
            out.append(
                f"budget top-up +${top_up.get('usd', 0):g} (to ${top_up.get('budget_usd', 0):g}) decided by "
                f"the {top_up.get('by')} ({top_up.get('via')}) at {top_up.get('at')}"
            )
    current = ws.config if ws else None
    if (run.config or {}).get("judge"):  # a run recorded without one (a hand-made ledger) names none
        judge = RunSettings.from_run(run, current).judge
        out.append(
            f"judge {judge.provider}:{judge.model}"
            + (
                "  (demonstration-quality offline judge: its numbers show the mechanics only)"
                if judge.provider == "local"
                else ""
            )
        )
    out.append("")
    out.append("experiments")
    fps_of = fp_by_type_all(ledger, run, experiments)
    for e in experiments:
        parent = parents.get(e.parent_id) if e.parent_id is not None else None
        out.append(
            f"  #{e.id} ({e.strategy or '-'}) {status_label(e).upper()}  commit {short(e.commit_sha)}"
            + (f"  parent #{e.parent_id}" if e.parent_id is not None else "")
            + (f"  carries {', '.join(f'#{i}' for i in e.carries)}" if e.carries else "")
        )
        if e.reason:
            out.append(f"    reason: {e.reason}")
        if e.decided_by in ("person", "mcp"):  # the policy's own decisions need no line
            out.append(
                f"    decided by {'a person' if e.decided_by == 'person' else 'the MCP client'}"
                + (f"; {e.overrule}" if e.overrule and e.overrule != e.reason else "")
                + (" (over the policy)" if e.overrule else "")
            )
        if e.metrics:
            out.append(
                f"    kappa {num(e.kappa)}{interval(e, 'kappa')} (Δ {signed(delta(e.kappa, parent.kappa if parent else None))})"
                f"   FPR {num(e.fpr)}{interval(e, 'fpr')} (Δ {signed(delta(e.fpr, parent.fpr if parent else None))})"
                f"   BA {num(e.balanced_accuracy)}{interval(e, 'balanced_accuracy')}"
            )
        if e.flips is not None or e.p_value is not None:
            counts = e.flip_counts()
            cells = " · ".join(
                f"{words} " + ", ".join(f"{FLIP_ARROWS[k]} {counts[k]}" for k in keys)
                for words, keys in FLIP_ROWS
            )
            policies = ""
            if e.literal_keep is not None or e.paired_keep is not None:
                policies = f"   literal {'keep' if e.literal_keep else 'roll back'}, paired {'keep' if e.paired_keep else 'roll back'}"
            if e.adaptive_keep is not None:
                policies += f", adaptive {'keep' if e.adaptive_keep else 'roll back'}"
            first_p = (e.test or {}).get("mcnemar_p", e.p_value) if e.test else e.p_value
            # Stopped early, the p-value is the best case's: a bound, said as one.
            p_text = f"≥ {num(first_p)} (a bound: stopped early)" if e.early_stopped else num(first_p)
            out.append(f"    flips {cells}   McNemar p {p_text}{policies}")
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
            f"${e.judge_cost_usd:.4f}" + (f", {e.duration_s:.1f}s" if e.duration_s is not None else "")
        )
        panel = panel_cost(ledger, e.id)
        if panel is not None:
            split = ", ".join(f"{name} ${cost:.4f}" for name, cost in panel.members.items())
            out.append(
                f"    panel: ${panel.cost_per_verdict_usd:.4f} per verdict over {panel.verdicts} "
                f"verdicts ({split})"
            )
        cascade = cascade_cost(ledger, e.id)
        if cascade is not None:
            out.append(
                f"    cascade: {cascade.escalated} of {cascade.verdicts} verdicts escalated "
                f"({cascade.escalated / cascade.verdicts:.0%}); per verdict first ${cascade.first_per_verdict_usd:.4f}, "
                f"second ${cascade.second_per_verdict_usd:.4f}"
            )
        reads = cache_reads_line(e.planned_cache_read_tokens, e.cache_read_tokens)
        if reads is not None:
            out.append(f"    {reads}")
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
        out.append("  " + " → ".join(f"#{e.id} (κ {num(e.kappa)}, FPR {num(e.fpr)})" for e in chain))
        if len(chain) > 1:
            first, last = chain[0], chain[-1]
            out.append(
                f"  baseline → final: kappa {signed(delta(last.kappa, first.kappa))}, FPR {signed(delta(last.fpr, first.fpr))}"
            )
    else:
        out.append("  (no baseline recorded yet)")
    out.append("")
    out.append("decisions")
    out.append("  " + accounting_line(run, experiments, current))
    for kept in accounting(run, experiments, current).kept:
        cheap = " as cheaper, not worse" if kept.kind == "cheaper" else ""
        out.append(
            f"  kept #{kept.experiment}{cheap}: p={num(kept.p_value)} at alpha {num(kept.alpha)}, "
            f"{kept.rejudged_items} item(s) re-judged ({kept.rejudge_calls} extra calls), "
            f"${kept.cost_usd:.4f}"
        )

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

    if with_triage:
        out.extend(triage_lines(ledger, run, ws))

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
    endpoints = ledger.endpoint_figures(run.id)
    if endpoints:  # [judge] base_urls: what each replica served over the run's passes
        out.append(f"endpoints ({len(endpoints)}):")
        out.extend(f"  {line}" for line in endpoint_lines(endpoints))
    by_status: dict[str, int] = {}
    for e in experiments:
        by_status[e.status] = by_status.get(e.status, 0) + 1
    out.append("outcomes: " + ", ".join(f"{k} {v}" for k, v in sorted(by_status.items())))
    if ws is not None:
        out.extend(git_audit(ws, run, experiments))
    return "\n".join(out) + "\n"


def triage_lines(ledger: Ledger, run: Run, ws: Workspace | None) -> list[str]:
    """The label-triage sections: the labels the run decided with, both label sets' kappa/FPR per
    experiment when there are corrections, and the top of the label-suspects queue."""
    t = triage(ledger, run, ws)
    if t is None:
        return []
    fp = f" (fingerprint {t.labels_fingerprint[:12]})" if t.labels_fingerprint else ""
    out = ["", f"labels: the run decided with the labels {t.label_set}{fp}"]
    if t.problem:
        return [*out, f"  label triage unavailable: {t.problem}"]
    if t.given_corrected:
        out.append(
            f"  {t.corrections} correction(s) in devset/{run.split}/corrections.jsonl; "
            "each experiment under the labels as given | as corrected:"
        )
        for r in t.given_corrected:
            out.append(
                f"  #{r.experiment_id}  given kappa {num(r.given.kappa)} FPR {num(r.given.fpr)}"
                f"  |  corrected kappa {num(r.corrected.kappa)} FPR {num(r.corrected.fpr)}"
            )
    out.append("")
    out.append(
        f"label suspects ({len(t.suspects)}; every run on split {run.split}, ranked by the confidence-"
        "weighted share of judgements against the label)"
    )
    if not t.suspects:
        out.append("  none")
    for s in t.suspects[:REPORT_SUSPECTS]:
        out.append("  " + s.line())
    if len(t.suspects) > REPORT_SUSPECTS:
        out.append(
            f"  ... and {len(t.suspects) - REPORT_SUSPECTS} more (the TUI's suspects view, key L, lists all)"
        )
    if t.suspects:
        out.append('  correct one: judgeloop label-fix ID --label success|failure --reason "..."')
    return out


def export_experiments_tsv(ledger: Ledger, run_id: str, path: Path) -> Path:
    """Write the run's experiments as TSV (``TSV_COLUMNS``; empty cells where not computed)."""
    experiments = ledger.experiments(run_id)
    parents = parents_by_id(experiments)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8", newline="") as fh:
        writer = csv.writer(fh, delimiter="\t", lineterminator="\n")
        writer.writerow(TSV_COLUMNS)
        for e in experiments:
            parent = parents.get(e.parent_id) if e.parent_id is not None else None
            counts = e.flip_counts() if e.flips is not None else dict.fromkeys(FLIP_KEYS)
            row: dict[str, Any] = {
                "id": e.id,
                "seq": e.seq,
                "parent": e.parent_id,
                "created": e.created.isoformat(),
                "strategy": e.strategy,
                "decision": e.status,
                "kappa": e.kappa,
                "kappa_delta": delta(e.kappa, parent.kappa if parent else None),
                "fpr": e.fpr,
                "fpr_delta": delta(e.fpr, parent.fpr if parent else None),
                "balanced_accuracy": e.balanced_accuracy,
                "p_value": e.p_value,
                **counts,
                "early_stopped": int(e.early_stopped),
                "items_evaluated": e.items_evaluated,
                "calls": e.calls,
                "cache_hits": e.cache_hits,
                "input_tokens": e.input_tokens,
                "output_tokens": e.output_tokens,
                "cost_usd": e.cost_usd,
                "duration_s": e.duration_s,
                "commit": e.commit_sha,
                "files_changed": ",".join(e.files_changed),
                "insertions": e.insertions,
                "deletions": e.deletions,
                "reason": one_line(e.reason, 10_000),
                "rationale": one_line(e.rationale, 10_000),
                "optimizer_calls": e.optimizer_calls,
                "optimizer_input_tokens": e.optimizer_input_tokens,
                "optimizer_output_tokens": e.optimizer_output_tokens,
                "optimizer_cost_usd": e.optimizer_cost_usd,
                "cache_read_tokens": e.cache_read_tokens,
                "cache_write_tokens": e.cache_write_tokens,
                "alpha": e.alpha,
                "adaptive_keep": None if e.adaptive_keep is None else int(e.adaptive_keep),
                "rejudge_calls": e.rejudge_calls,
                "rejudge_cost_usd": e.rejudge_cost_usd,
                "keep_kind": e.keep_kind,
                "verdict_cost_usd": e.verdict_cost_usd,
                "decided_by": e.decided_by,
                "overrule": e.overrule,
            }
            writer.writerow(["" if row[c] is None else row[c] for c in TSV_COLUMNS])
    return path


def write_markdown_report(ledger: Ledger, run_id: str, path: Path, ws: Workspace | None = None) -> Path:
    """Write ``experiments/runs/<run>/report.md``: a summary table, the kept chain and the full audit."""
    run = ledger.get_run(run_id)
    experiments = ledger.experiments(run_id)
    parents = parents_by_id(experiments)
    chain = ledger.kept_chain(run_id)
    lines = [
        f"# judgeloop run {run.id}",
        "",
        f"- branch `{run.branch}` from `{short(run.start_rev)}`; strategy `{run.strategy}`; policy `{run.policy}`",
        f"- split `{run.split}` (fingerprint `{run.split_fingerprint[:12]}`); status **{run.status}**"
        + (f" ({run.stop_reason})" if run.stop_reason else ""),
    ]
    if len(chain) >= 1:
        first, last = chain[0], chain[-1]
        lines.append(
            f"- baseline kappa {num(first.kappa)}, FPR {num(first.fpr)} → final (#{last.id}) kappa "
            f"{num(last.kappa)}, FPR {num(last.fpr)}"
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
            f"| {e.id} | {status_label(e)} | {num(e.kappa)} | {signed(delta(e.kappa, parent.kappa if parent else None))} "
            f"| {num(e.fpr)} | {signed(delta(e.fpr, parent.fpr if parent else None))} | {p_cell(e)} "
            f"| {flip_summary(e)} | {e.cost_usd:.4f} | {rationale} |"
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
        return [
            *lines,
            "Not measured yet: `judgeloop attribute` measures what each kept edit still contributes.",
        ]
    a = attribution
    lines += [
        f"Final `{short(a.final_commit)}` against the final prompts without each kept edit ({a.status}; "
        f"{a.judge}, disagreeing items re-judged {a.rejudge} more time(s); ${a.cost_usd:.4f}). Items = Σ over items "
        "of the change in the share of judgements that are correct; deltas are final minus without the edit.",
        "",
        "| edit | commit | gain when kept | items at the end | Δkappa | ΔFPR | fixed | broken | p | cost $ | note |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    rows = list(a.edits) + ([a.final_vs_baseline] if a.final_vs_baseline is not None else [])
    for e in rows:
        name = "final vs baseline" if e.experiment is None else f"#{e.experiment}"
        gain = gain_of(ledger, e.experiment)
        note = (e.note or "") + (" (not significant)" if significant(e, a.alpha) is False else "")
        lines.append(
            f"| {name} | `{short(e.commit)}` | {signed(gain, 2)} | {signed(e.items, 2)} | {signed(e.kappa_delta)} "
            f"| {signed(e.fpr_delta)} | {len(e.fixed)} | {len(e.broken)} | {num(e.p_value)} | {e.cost_usd:.4f} "
            f"| {note.replace('|', '/')} |"
        )
    if a.note:
        lines += ["", a.note]
    return lines
