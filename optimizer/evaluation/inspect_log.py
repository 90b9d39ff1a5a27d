"""One judged pass as an Inspect AI evaluation log (``.eval``), built with Inspect's own log API
(`inspect_ai.log`: `EvalLog`, `EvalSample`, `Score`, `ModelUsage`, `write_eval_log`), so `inspect view`,
Inspect Scout and the other tools that read Inspect logs open judgeloop's passes as they are.

Inspect AI is an optional extra (``pip install 'judgeloop[inspect]'``): this module imports it only
inside its functions, so the engine runs without it; `require_inspect` refuses in one line, before any
call is paid for, when it is missing.

The log is written after the answers are in, by the callers that score them (`eval`, `confirm`, the
loop's evaluation room): they hand the labels in as data (this module imports no label reader). One
sample per evaluated item: id = the trajectory id, input = the instruction and a reference to the
trajectory the judge read (the rendered request, screenshots included, is megabytes), target = the
label, the majority verdict as its one score (value ``C``/``I``: whether it agrees with the label;
answer = ``positive``/``negative`` as judged; explanation = the reasoning; metadata = mistake type,
confidence, evidence steps, replicates), and its usage and cost as the verdict file's ``_meta`` has them.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from optimizer.errors import UserError
from optimizer.evaluation.files import redacted_url
from optimizer.evaluation.results import EvalRun, ItemResult
from optimizer.models import Label
from optimizer.stats.metrics import Metrics

if TYPE_CHECKING:
    from inspect_ai.log import EvalResults, EvalSample
    from inspect_ai.model import ModelUsage
    from inspect_ai.scorer import Score

    from optimizer.devset.split import Split

INSTALL_HINT = "pip install 'judgeloop[inspect]'"
# The scorer's name in the log: each sample's one score and the eval's results are under it.
SCORER = "judgeloop"
LOG_SUFFIXES = (".eval", ".json")  # Inspect's two log formats, chosen by the file's extension


def require_inspect(what: str = "--inspect-log", otherwise: str = "drop --inspect-log") -> None:
    """UserError (one line: what to install, or ``otherwise`` what to do) when Inspect AI's log API
    cannot be imported; ``what`` names the option that asked for a log."""
    try:
        import inspect_ai.log  # noqa: F401
    except ImportError:
        raise UserError(
            f"{what} writes an Inspect AI log, but Inspect AI is not installed: {INSTALL_HINT} (or {otherwise})"
        ) from None


def check_log_path(path: Path) -> Path:
    """``path`` when it names an Inspect log file (``.eval``, or ``.json`` for Inspect's JSON format)
    that can be written; UserError otherwise. Checked before any call is paid for."""
    if path.suffix not in LOG_SUFFIXES:
        raise UserError(
            f"--inspect-log {path}: name a .eval file (Inspect's log format), e.g. {path.stem}.eval"
        )
    if path.is_dir():
        raise UserError(f"--inspect-log {path} is a folder; name a .eval file")
    return path


def _model_name(run: EvalRun, item: ItemResult | None = None) -> str:
    """Inspect's ``provider/model`` name of the judge."""
    model = (item.replicates[0].model if item is not None and item.replicates else None) or run.meta.model
    return f"{run.meta.provider or 'judgeloop'}/{model or 'unknown'}"


def _usage(item: ItemResult) -> ModelUsage:
    """The item's calls as its verdict file's ``_meta`` counts them (tokens, US dollars)."""
    from inspect_ai.model import ModelUsage

    u = item.usage
    return ModelUsage(
        input_tokens=u.input_tokens,
        output_tokens=u.output_tokens,
        total_tokens=u.input_tokens + u.cache_read_tokens + u.cache_write_tokens + u.output_tokens,
        input_tokens_cache_read=u.cache_read_tokens,
        input_tokens_cache_write=u.cache_write_tokens,
        total_cost=round(u.cost_usd, 8),
    )


def _input_text(split: Split, tid: str, prompt_hash: str | None) -> str:
    """The instruction the judge was asked about and where the trajectory it read is stored."""
    traj = split.trajectory(tid)
    where = split.markdown_path(tid)
    return (
        f"{traj.task.instruction}\n\n"
        f"[trajectory {tid}: {len(traj.steps)} steps, {where}; "
        f"judged with prompts {(prompt_hash or 'unknown')[:12]}]"
    )


def _score(item: ItemResult, label: Label) -> Score:
    """The item's majority verdict as Inspect's score: ``C`` when it agrees with the label, else ``I``
    (a parse failure too: it counts as a wrong answer, DESIGN.md)."""
    from inspect_ai.scorer import CORRECT, INCORRECT, Score

    v = item.verdict
    if v is None:
        failed = next((r for r in item.replicates if r.status == "parse_error"), None)
        return Score(
            value=INCORRECT,
            answer=None,
            explanation=(failed.parse_error if failed is not None else None) or "no majority verdict",
            metadata={"parse_status": "parse_error"},
        )
    answer = "positive" if v.success else "negative"
    return Score(
        value=CORRECT if answer == label.label else INCORRECT,
        answer=answer,
        explanation=v.reasoning,
        metadata={
            "parse_status": "ok",
            "success": v.success,
            "confidence": v.confidence,
            "mistake_type": v.mistake_type,
            "evidence_steps": list((v.model_extra or {}).get("evidence_steps") or []),
        },
    )


def _sample(item: ItemResult, run: EvalRun, split: Split, label: Label) -> EvalSample:
    """One item: its input (a reference), target (the label), verdict (the score), usage and cost."""
    from inspect_ai.log import EvalError, EvalSample
    from inspect_ai.model import ChatMessageUser, ModelOutput

    tid, model = item.trajectory_id, _model_name(run, item)
    text = _input_text(split, tid, run.meta.prompt_hash)
    metadata: dict[str, Any] = {
        "label_mistake_type": label.mistake_type,
        "unstable": item.unstable,
        "cached": all(r.cached for r in item.replicates),
        "replicates": [
            {"index": r.index, "success": r.success, "parse_status": r.status} for r in item.replicates
        ],
        "prompt_hash": run.meta.prompt_hash,
    }
    sample = EvalSample(
        id=tid,
        epoch=1,
        input=text,
        target=label.label,
        messages=[ChatMessageUser(content=text)],
        metadata=metadata,
        model_usage={model: _usage(item)},
        total_time=round(sum(r.duration_s for r in item.replicates), 3),
    )
    if item.infra_error:  # no verdict file either: the item is missing, not a wrong answer
        sample.error = EvalError(
            message=item.error or "infrastructure error", traceback="", traceback_ansi=""
        )
        return sample
    reply = next((r.reply_text for r in item.replicates if r.reply_text is not None), None)
    sample.output = ModelOutput.from_content(model=model, content=reply or "")
    sample.messages.append(sample.output.message)
    sample.scores = {SCORER: _score(item, label)}
    return sample


def _results(run: EvalRun, samples: list[EvalSample], metrics: Metrics | None) -> EvalResults:
    """The eval's results: accuracy (agreement with the labels) over the scored samples, and the
    protocol's figures (kappa, FPR, ...) when the pass was scored whole."""
    from inspect_ai.log import EvalMetric, EvalResults, EvalScore
    from inspect_ai.scorer import CORRECT

    scored = [s for s in samples if s.scores]
    values: dict[str, float] = {}
    if scored:
        values["accuracy"] = sum(1 for s in scored if s.scores and s.scores[SCORER].value == CORRECT) / len(
            scored
        )
    if metrics is not None:
        for name in ("balanced_accuracy", "kappa", "tpr", "tnr", "fpr", "fnr"):
            value = getattr(metrics, name)
            if value is not None:
                values[name] = float(value)
    return EvalResults(
        total_samples=len(run.item_ids) or len(samples),
        completed_samples=len(scored),
        scores=[
            EvalScore(
                name=SCORER,
                scorer=SCORER,
                scored_samples=len(scored),
                unscored_samples=len(samples) - len(scored),
                metrics={k: EvalMetric(name=k, value=v) for k, v in values.items()},
            )
        ],
    )


def write_inspect_log(
    path: Path, run: EvalRun, split: Split, labels: Mapping[str, Label], metrics: Metrics | None = None
) -> Path:
    """Write ``run`` (one judged pass of ``split``) as an Inspect log at ``path`` (``.eval``, or
    ``.json``) and return it; ``labels`` holds at least every evaluated item's label (the targets),
    ``metrics`` the pass's scores when it was scored whole. Items not evaluated get no sample."""
    from inspect_ai.log import EvalConfig, EvalDataset, EvalLog, EvalSpec, EvalStats, write_eval_log

    rank = {tid: i for i, tid in enumerate(run.item_ids)}  # the manifest's order, not the finishing order
    items = sorted(run.items, key=lambda item: rank.get(item.trajectory_id, len(rank)))
    samples = [_sample(item, run, split, labels[item.trajectory_id]) for item in items]
    usage: dict[str, ModelUsage] = {}
    for sample in samples:
        for model, used in sample.model_usage.items():
            usage[model] = usage[model] + used if model in usage else used
    now = datetime.now(UTC).isoformat(timespec="seconds")
    meta = run.meta
    log = EvalLog(
        status="cancelled" if run.stopped_early or run.not_evaluated else "success",
        eval=EvalSpec(
            eval_id=uuid.uuid4().hex,
            run_id=uuid.uuid4().hex,
            task_id=uuid.uuid4().hex,
            created=now,
            task=f"judgeloop/{meta.split or split.name}",
            task_version=meta.prompt_hash or 0,
            dataset=EvalDataset(
                name=split.name,
                location=str(split.root),
                samples=len(run.item_ids),
                sample_ids=list(run.item_ids),
            ),
            model=_model_name(run),
            model_base_url=redacted_url(meta.base_url),  # never a user:password part
            config=EvalConfig(epochs=1),
            metadata={
                "judgeloop": {
                    "prompt_hash": meta.prompt_hash,
                    "split_fingerprint": meta.split_fingerprint,
                    "replicates": meta.replicates,
                    "sampling": meta.sampling,
                    "calls_made": run.calls_made,
                    "cache_hits": run.cache_hits,
                    "cost_usd": round(run.cost_usd, 8),  # what this pass paid (cached calls free)
                    "stop_reason": run.stop_reason,
                    "not_evaluated_ids": list(run.not_evaluated),
                }
            },
        ),
        results=_results(run, samples, metrics),
        stats=EvalStats(started_at=now, completed_at=now, model_usage=usage),
        samples=samples,
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    write_eval_log(log, str(path))
    return path
