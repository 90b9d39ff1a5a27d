"""The self-test's files under ``experiments/selftest/``: where they are, reading one back strictly
(`read_selftest`, `latest_selftest`), and its findings as Markdown (`summary_lines`, `markdown_lines`), which a
certificate quotes. Written by `optimizer.trust.selftest.write_selftest`."""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import (
    ValidationError,
)

from optimizer.trust.selftest_records import (
    SELFTEST_VERSION,
    ResultFiles,
    SelftestResult,
)
from optimizer.workspace.workspace import Workspace

SELFTEST_DIR = "selftest"


def result_files(ws: Workspace, path: Path) -> ResultFiles:
    """A result's JSON file at ``path`` and its Markdown beside it, relative to the workspace."""
    return ResultFiles(
        json=str(path.relative_to(ws.root)), markdown=str(path.with_suffix(".md").relative_to(ws.root))
    )


def selftest_dir(ws: Workspace) -> Path:
    return ws.experiments_dir / SELFTEST_DIR


def read_selftest(text: str) -> SelftestResult | None:
    """A recorded self-test from its file's text, or None when it is not one a certificate can cite: not
    this `SELFTEST_VERSION`, a value of the wrong type (strict: no coercion), or findings that do not
    render (a file edited by hand, or cut short by a full disk, is skipped rather than cited)."""
    try:
        data = json.loads(text)
        if not isinstance(data, dict) or data.get("selftest_version") != SELFTEST_VERSION:
            return None
        result = SelftestResult.model_validate_json(text, strict=True)
        summary_lines(result)
    except (json.JSONDecodeError, ValidationError, TypeError, ValueError, IndexError):
        return None
    return result


def latest_selftest(ws: Workspace) -> SelftestResult | None:
    """The newest self-test recorded under ``experiments/selftest/`` (by its ``created`` time), or None.
    Files that do not read as a self-test (`read_selftest`) are skipped."""
    best: SelftestResult | None = None
    folder = selftest_dir(ws)
    if not folder.is_dir():
        return None
    for path in sorted(folder.glob("*.json")):
        try:
            found = read_selftest(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError):
            continue
        if found is None:
            continue
        found = found.model_copy(update={"files": result_files(ws, path)})
        if best is None or found.created >= best.created:
            best = found
    return best


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.1%}"


def summary_lines(result: SelftestResult) -> list[str]:
    """The self-test's findings as Markdown bullets (also what a certificate quotes)."""
    aa, bench = result.aa, result.benchmark
    pol = result.policy
    lines: list[str] = []
    if aa.repeats:
        if aa.keep_rate_interval is None:
            raise ValueError("a decided A/A repeat without a keep-rate interval")
        lo, hi = aa.keep_rate_interval
        lines.append(
            f"- A/A: {aa.kept} of {aa.repeats} byte-identical candidates kept "
            f"({_pct(aa.keep_rate)}, exact 95% interval {lo:.1%}–{hi:.1%}) under {pol.name} at level "
            f"{pol.level:g}"
        )
    else:
        lines.append("- A/A: no repeat decided")
    ref = bench.reference
    if ref is not None and bench.agrees is not None:
        lines.append(
            f"- decision-power benchmark, same policy: a no-op kept {_pct(ref.noop_fresh)} of the time "
            f"against a fresh incumbent (n = {ref.noop_fresh_n}; {_pct(ref.noop_in_run)} inside a run); "
            + (
                "consistent with this judge's A/A rate"
                if bench.agrees
                else "OUTSIDE this judge's A/A interval: its noise differs from the benchmark's judge"
            )
        )
    inst = aa.instability
    if inst.items_judged_twice:
        lines.append(
            f"- instability: {inst.unstable_items} of {inst.items_judged_twice} items "
            f"({_pct(inst.unstable_share)}) got different verdicts from identical prompts; "
            f"{inst.first_pass_flips} of {inst.first_pass_compared} first-pass verdicts "
            f"({_pct(inst.flip_rate)}) differ between two evaluations"
        )
    planted = result.planted
    if planted is None:
        lines.append("- planted degradation: not run")
    elif not planted.decided:
        lines.append(f"- planted degradation: not decided ({planted.reason})")
    else:
        lines.append(
            f"- planted degradation ({planted.where} + 'accept what claims success'): "
            + ("rolled back" if planted.rolled_back else "KEPT")
            + f"; FPR {_pct(planted.fpr_incumbent)} → {_pct(planted.fpr_planted)} on the "
            f"{planted.items_judged} items judged"
            + (
                ""
                if planted.judge_obeyed
                else " — the judge barely reacted to the rule, so for it this was close to a no-op"
            )
        )
    lines.append(f"- minimum detectable gain: {result.detectable.line}")
    return lines


def markdown_lines(result: SelftestResult) -> list[str]:
    """The self-test as a Markdown document."""
    judge, split = result.judge, result.split
    head = [
        f"# judgeloop selftest, {result.created}",
        "",
        f"Judge `{judge.provider}:{judge.model}`, dev split `{split.name}` ({split.items} items, "
        f"fingerprint `{split.fingerprint[:12]}`), prompts at `{result.revision[:10]}` "
        f"(hash `{result.prompt_hash[:12]}`); {result.calls} judge calls made, {result.cache_hits} "
        f"cached, ${result.cost_usd:.4f}."
        + ("" if result.complete else f" Incomplete: {result.stopped or 'fewer repeats than asked'}."),
        "",
    ]
    return head + summary_lines(result)
