"""Result files: one AgentHorizon verdict file per item (`<trajectory_id>.json`) and `_summary.json`."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from optimizer.errors import UserError
from optimizer.evaluation.results import EvalRun, ItemResult, ReplicateResult
from optimizer.judge.prompts import PromptSet


def redacted_url(url: str | None) -> str | None:
    """The base URL without any user:password part (never write credentials to a file)."""
    if not url:
        return url
    parts = urlsplit(url)
    host = parts.hostname or ""
    if parts.port:
        host = f"{host}:{parts.port}"
    return urlunsplit((parts.scheme, host, parts.path, "", ""))


def settings_record(prompts: PromptSet) -> dict[str, Any]:
    """judge.toml's settings as results record them (a cascade's second judge's addresses redacted)."""
    data = prompts.settings.dump()
    cascade = data.get("cascade")
    second = cascade.get("second") if isinstance(cascade, dict) else None
    if isinstance(second, dict):
        second["base_url"] = redacted_url(second.get("base_url"))
        if second.get("base_urls"):
            second["base_urls"] = [redacted_url(url) for url in second["base_urls"]]
    return data


def _member_entry(m: ReplicateResult) -> dict[str, Any]:
    """One panel member's call in a verdict file."""
    return {
        "member": m.member,
        "success": m.success,
        "parse_status": m.status,
        "reasoning": m.verdict.reasoning if m.verdict is not None else None,
        "mistake_type": m.verdict.mistake_type if m.verdict is not None else None,
        "cached": m.cached,
        "input_tokens": m.input_tokens,
        "output_tokens": m.output_tokens,
        "cache_read_tokens": m.cache_read_tokens,
        "cache_write_tokens": m.cache_write_tokens,
        "cost_usd": round(m.cost_usd, 8),
        **({"parse_error": m.parse_error, "raw_response": m.reply_text} if m.status == "parse_error" else {}),
    }


def _verdict_file(item: ItemResult, run: EvalRun) -> dict[str, Any]:
    reps = item.replicates
    meta: dict[str, Any] = {
        "model": reps[0].model if reps else run.meta.model,
        "provider": run.meta.provider,
        "prompt_hash": run.meta.prompt_hash,
        # A harness judge: how its CLI ran ("bwrap", or "none": unconfined, it could read the labels).
        **({"judge_confinement": run.meta.judge_confinement} if run.meta.judge_confinement else {}),
        "input_tokens": sum(r.input_tokens for r in reps),
        "output_tokens": sum(r.output_tokens for r in reps),
        "cost_usd": round(item.cost_usd, 8),
        "duration_s": round(sum(r.duration_s for r in reps), 3),
        "parse_status": "ok" if item.verdict is not None else "parse_error",
        "cached": all(r.cached for r in reps),
        "unstable": item.unstable,
        "replicates": [
            {
                "index": r.index,
                "success": r.success,
                "parse_status": r.status,
                "cached": r.cached,
                "input_tokens": r.input_tokens,
                "output_tokens": r.output_tokens,
                "cost_usd": round(r.cost_usd, 8),
                "duration_s": round(r.duration_s, 3),
                **(
                    {"parse_error": r.parse_error, "raw_response": r.reply_text}
                    if r.status == "parse_error"
                    else {}
                ),
                **({"turns": r.turns, "tool_calls": [str(t) for t in r.trace]} if r.trace else {}),
                # A panel: each member's verdict behind this replicate's vote.
                **({"members": [_member_entry(m) for m in r.members]} if r.members else {}),
            }
            for r in reps
        ],
        "preprocessing": list(item.notes),
        # Where the official tools look (compare_runs.py reads `_meta.raw.usage`, `raw.turns` and
        # `raw.tool_calls`): the same token totals as above, the model calls and the tool calls.
        "raw": {
            "usage": {
                "input_tokens": sum(r.input_tokens for r in reps),
                "output_tokens": sum(r.output_tokens for r in reps),
            },
            "turns": sum(r.turns for r in reps),
            "tool_calls": sum(len(r.trace) for r in reps),
        },
    }
    if item.verdict is None:
        failed = next((r for r in reps if r.status == "parse_error"), None)
        return {
            "raw_response": failed.reply_text if failed is not None else "",
            "parse_error": failed.parse_error if failed is not None else "no majority verdict",
            "_meta": meta,
        }
    v = item.verdict
    extra = v.model_extra or {}
    return {
        "success": v.success,
        "reasoning": v.reasoning,
        "confidence": v.confidence,
        "mistake_type": v.mistake_type,
        # A criteria / reviewed verdict's record (`optimizer.judge.criteria`): what was checked, where; a
        # cascade's (`optimizer.judge.cascade`): the rule, whether it escalated, the first verdict.
        **{
            k: extra[k]
            for k in ("criteria", "stated_success", "evidence_steps", "review", "first_verdict", "cascade")
            if k in extra
        },
        "_meta": meta,
    }


def _json_object(path: Path) -> dict[str, Any] | None:
    try:
        value = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def previous_evaluation(out: Path) -> list[Path]:
    """The files of a previous judgeloop evaluation in ``out``, which writing there replaces; [] when
    ``out`` does not exist or is empty. Those files are its ``_summary.json`` and the verdict files
    carrying the same prompt hash. Anything else in the folder is someone else's: UserError naming it
    (stale verdict files must never be scored by mistake, and nothing is deleted that judgeloop did
    not write)."""
    if not out.exists():
        return []
    if not out.is_dir():
        raise UserError(f"{out} is a file, not a folder; choose another --out folder")
    entries = sorted(out.iterdir())
    if not entries:
        return []
    summary = _json_object(out / "_summary.json")
    if summary is None or not isinstance(summary.get("counts"), dict) or "prompt_hash" not in summary:
        raise UserError(
            f"{out} is not empty and holds no judgeloop evaluation (no judgeloop _summary.json); "
            "choose a new or empty --out folder"
        )
    ours: list[Path] = []
    other: list[str] = []
    for entry in entries:
        body = _json_object(entry) if entry.is_file() and entry.suffix == ".json" else None
        meta = body.get("_meta") if body is not None else None
        if entry.name == "_summary.json" or (
            isinstance(meta, dict) and meta.get("prompt_hash") == summary["prompt_hash"]
        ):
            ours.append(entry)
        else:
            other.append(entry.name)
    if other:
        more = f" and {len(other) - 5} more" if len(other) > 5 else ""
        raise UserError(
            f"{out} holds a previous judgeloop evaluation and also {', '.join(other[:5])}{more}, "
            "which judgeloop did not write; move them or choose another --out folder"
        )
    return ours


# The version of `_summary.json`'s shape: raised when a key changes meaning or goes away (new keys may
# appear without a raise), so a script reading it can refuse a shape it does not know.
SUMMARY_FORMAT_VERSION = 1


def write_results(out_dir: Path | str, run: EvalRun, *, replacing: Sequence[Path] = ()) -> Path:
    """Write one AgentHorizon verdict file per evaluated item and ``_summary.json``; return the folder.

    ``_summary.json`` starts with ``format_version`` (`SUMMARY_FORMAT_VERSION`, integer 1), then the
    judge, split and parameters, counts, tokens and cost of the evaluation.

    Infrastructure errors and items not evaluated get no file; they are listed in the summary.
    The folder must be new or empty, or hold exactly a previous evaluation's files, passed as
    ``replacing`` (see `previous_evaluation`); those are removed first, so stale verdict files can
    never be scored by mistake.
    """
    out = Path(out_dir)
    expected = set(replacing)
    if out.exists() and (not out.is_dir() or any(p not in expected for p in out.iterdir())):
        raise UserError(f"{out} already exists and is not an empty folder; choose a new --out folder")
    for path in replacing:
        path.unlink(missing_ok=True)
    out.mkdir(parents=True, exist_ok=True)
    parse_failures = 0
    for item in run.items:
        if item.infra_error:
            continue
        if item.verdict is None:
            parse_failures += 1
        body = _verdict_file(item, run)
        (out / f"{item.trajectory_id}.json").write_text(
            json.dumps(body, indent=2, ensure_ascii=False) + "\n", encoding="utf-8"
        )
    notes = Counter(note for item in run.items for note in item.notes)
    summary = {
        "format_version": SUMMARY_FORMAT_VERSION,
        **{
            k: getattr(run.meta, k)
            for k in (
                "prompt_hash",
                "provider",
                "model",
                "judge_label",
                "judge_confinement",
                "base_url",
                "split",
                "split_fingerprint",
                "md_dir",
            )
        },
        **({"base_urls": run.meta.base_urls} if run.meta.base_urls else {}),
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "parameters": {
            k: getattr(run.meta, k)
            for k in (
                "sampling",
                "replicates",
                "max_concurrency",
                "timeout_s",
                "max_retries",
                "budget_usd",
                "settings",
            )
        },
        "preprocessing": {
            "text_only": run.meta.text_only,
            "run_notes": run.notes,
            "item_notes": [{"note": note, "items": count} for note, count in notes.most_common(50)],
        },
        "counts": {
            "items": len(run.item_ids),
            "evaluated": len(run.items) - len(run.infra_error_ids),
            "verdict_files": len(run.items) - len(run.infra_error_ids),
            "parse_failures": parse_failures,
            "unstable": sum(1 for item in run.items if item.unstable),
            "infra_errors": len(run.infra_error_ids),
            "not_evaluated": len(run.not_evaluated),
            "calls_made": run.calls_made,
            "cache_hits": run.cache_hits,
        },
        "input_tokens": run.input_tokens,
        "output_tokens": run.output_tokens,
        "cost_usd": round(run.cost_usd, 8),
        "cached_cost_usd": round(run.cached_cost_usd, 8),
        "duration_s": round(run.duration_s, 3),
        "stopped_early": run.stopped_early,
        "stop_reason": run.stop_reason,
        "infra_error_ids": run.infra_error_ids,
        "infra_errors": {item.trajectory_id: item.error for item in run.items if item.infra_error},
        "not_evaluated_ids": run.not_evaluated,
        # Judging with memory only: k, the cases, and the pair-aware folds (k, digest, every item's fold).
        **({"memory": run.meta.memory} if run.meta.memory else {}),
        # A cascade only: the rule, the escalation share, the second judge and each stage's calls and cost.
        **({"cascade": run.meta.cascade} if run.meta.cascade else {}),
    }
    (out / "_summary.json").write_text(
        json.dumps(summary, indent=2, ensure_ascii=False) + "\n", encoding="utf-8"
    )
    return out


# The contract name in docs/ARCHITECTURE.md.
write_verdict_files = write_results
