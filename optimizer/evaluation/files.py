"""Result files: one AgentHorizon verdict file per item (`<trajectory_id>.json`) and `_summary.json`."""

from __future__ import annotations

import json
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from optimizer.errors import UserError
from optimizer.evaluation.results import EvalRun, ItemResult


def redacted_url(url: str | None) -> str | None:
    """The base URL without any user:password part (never write credentials to a file)."""
    if not url:
        return url
    parts = urlsplit(url)
    host = parts.hostname or ""
    if parts.port:
        host = f"{host}:{parts.port}"
    return urlunsplit((parts.scheme, host, parts.path, "", ""))


def _verdict_file(item: ItemResult, run: EvalRun) -> dict[str, Any]:
    reps = item.replicates
    meta: dict[str, Any] = {
        "model": reps[0].model if reps else run.meta.get("model"),
        "provider": run.meta.get("provider"),
        "prompt_hash": run.meta.get("prompt_hash"),
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
                **({"parse_error": r.parse_error, "raw_response": r.reply_text} if r.status == "parse_error" else {}),
                **({"turns": r.turns, "tool_calls": [str(t) for t in r.trace]} if r.trace else {}),
            }
            for r in reps
        ],
        "preprocessing": list(item.notes),
    }
    if item.verdict is None:
        failed = next((r for r in reps if r.status == "parse_error"), None)
        return {
            "raw_response": failed.reply_text if failed is not None else "",
            "parse_error": failed.parse_error if failed is not None else "no majority verdict",
            "_meta": meta,
        }
    v = item.verdict
    return {
        "success": v.success,
        "reasoning": v.reasoning,
        "confidence": v.confidence,
        "mistake_type": v.mistake_type,
        "_meta": meta,
    }


def write_results(out_dir: Path | str, run: EvalRun) -> Path:
    """Write one AgentHorizon verdict file per evaluated item and ``_summary.json``; return the folder.

    Infrastructure errors and items not evaluated get no file; they are listed in the summary.
    The folder must be new or empty, so stale verdict files can never be scored by mistake.
    """
    out = Path(out_dir)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UserError(f"{out} already exists and is not an empty folder; choose a new --out folder")
    out.mkdir(parents=True, exist_ok=True)
    parse_failures = 0
    for item in run.items:
        if item.infra_error:
            continue
        if item.verdict is None:
            parse_failures += 1
        body = _verdict_file(item, run)
        (out / f"{item.trajectory_id}.json").write_text(json.dumps(body, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    notes = Counter(note for item in run.items for note in item.notes)
    summary = {
        **{
            k: run.meta.get(k)
            for k in ("prompt_hash", "provider", "model", "judge_label", "base_url", "split", "split_fingerprint")
        },
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "parameters": {
            k: run.meta.get(k)
            for k in ("sampling", "replicates", "max_concurrency", "timeout_s", "max_retries", "budget_usd", "settings")
        },
        "preprocessing": {
            "text_only": run.meta.get("text_only"),
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
    }
    (out / "_summary.json").write_text(json.dumps(summary, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return out


# The contract name in docs/ARCHITECTURE.md.
write_verdict_files = write_results
