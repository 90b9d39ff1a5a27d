"""`judgeloop attribute` end to end: a real loop run (the real openai SDK against the fake server, real git,
real SQLite), then the attribution of its kept edits through the normal evaluator.

The judge here is `MarkerJudge`: a marker phrase in the rubric makes a fixed set of 10 dev items right
(reliably: every judgement), another marker another 10, and a few positives are coin flips drawn afresh
for every call (a hash of the item, the whole system prompt and the call's number), so an edit that
changes nothing real can still be kept by the literal policy — and must then contribute about 0.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from optimizer.cli import main
from optimizer.ledger import Ledger
from optimizer.loop.strategies import Proposal, ProposalContext
from optimizer.workspace import gitops
from tests.support.attribution import (
    MARKER_A,
    MARKER_B,
    NOOP_NOTES,
    MarkerJudge,
    add_line,
    attribute,
    run_chain,
)
from tests.support.fakeserver import FakeLLMServer
from tests.support.loop import commit_all, git, present, report_json, wait_for
from tests.support.processes import killed_cli


def a_b_then_noops() -> list[Callable[[ProposalContext], Proposal]]:
    return [
        add_line(MARKER_A, at=0),
        add_line(MARKER_B, at=1),
        *(add_line(note, at=2 + i) for i, note in enumerate(NOOP_NOTES)),
    ]


def by_experiment(result: dict[str, Any]) -> dict[int, dict[str, Any]]:
    return {row["experiment"]: row for row in result["attribution"]}


@pytest.mark.slow
def test_a_and_b_contribute_ten_items_each_and_a_kept_noop_about_zero(
    ws: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    judge = MarkerJudge(ws)
    with FakeLLMServer(default=judge) as server:
        exps = run_chain(ws, monkeypatch, judge, server, a_b_then_noops())
        kept = [e for e in exps if e.status == "kept"]
        assert [e.seq for e in kept[:2]] == [1, 2], "A and B are real gains: both kept"
        noops = [e for e in kept if e.seq > 2]
        assert noops, "the literal policy keeps some no-op by chance (the noisy items)"
        before = len(server.inference_requests())
        result = attribute(ws, server, capsys)
        paid = len(server.inference_requests()) - before
    rows = by_experiment(result)
    # Newest kept edit first, every kept edit in HEAD's history.
    assert [r["experiment"] for r in result["attribution"]] == [e.id for e in reversed(kept)]
    a, b = rows[kept[0].id], rows[kept[1].id]
    assert paid > 0  # measuring the chain made judge calls (the figures are in the README's audit section)
    assert abs(a["items"] - 10) <= 3 and abs(b["items"] - 10) <= 3
    assert set(judge.a_items) <= set(a["fixed"]) and set(judge.b_items) <= set(b["fixed"])
    assert a["p_value"] < 0.05 and b["p_value"] < 0.05
    assert a["kappa_delta"] > 0 and a["fpr_delta"] < 0  # final minus without A: A lowered FPR
    for e in noops:
        assert abs(rows[e.id]["items"]) <= 3 and rows[e.id]["p_value"] > 0.05
        assert not set(rows[e.id]["fixed"]) - judge.noisy and not set(rows[e.id]["broken"]) - judge.noisy
    assert all(r["entangled_with"] == [] for r in rows.values())
    assert abs(result["final_vs_baseline"]["items"] - 20) <= 4
    assert (
        result["attribution_meta"]["status"] == "complete"
        and result["attribution_meta"]["scope"] == "history"
    )
    # report --json carries the same table; the Markdown report and the TSV export include it.
    report = report_json(ws, capsys)
    assert [r["items"] for r in report["attribution"]] == [r["items"] for r in result["attribution"]]
    assert set(report["attribution"][0]) == {
        "experiment",
        "commit",
        "items",
        "kappa_delta",
        "fpr_delta",
        "fixed",
        "broken",
        "p_value",
        "cost_usd",
        "entangled_with",
    }
    assert report["final_vs_baseline"]["items"] == result["final_vs_baseline"]["items"]
    run_dir = ws / "experiments" / "runs" / report["run"]
    assert "## What helped (attribution)" in (run_dir / "report.md").read_text(encoding="utf-8")
    tsv = (run_dir / "attribution.tsv").read_text(encoding="utf-8").splitlines()
    assert tsv[0].startswith("experiment\tcommit\tgain_when_kept\titems") and len(tsv) == 1 + len(kept) + 1
    # The user's branch and working tree are untouched; the scratch worktree is gone.
    assert git(ws, "status", "--porcelain", "--", ".", ":!experiments").strip() == ""
    assert git(ws, "worktree", "list").count("\n") == 1


@pytest.mark.slow
def test_when_b_needs_a_the_contribution_of_a_includes_bs(
    ws: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    judge = MarkerJudge(ws, b_needs_a=True)
    with FakeLLMServer(default=judge) as server:
        exps = run_chain(ws, monkeypatch, judge, server, [add_line(MARKER_A, at=0), add_line(MARKER_B, at=1)])
        assert [e.status for e in exps[1:]] == ["kept", "kept"]
        rows = by_experiment(attribute(ws, server, capsys, "--run", exps[0].run_id))
    a, b = rows[exps[1].id], rows[exps[2].id]
    assert abs(a["items"] - 20) <= 3 and abs(b["items"] - 10) <= 3
    assert set(judge.a_items | judge.b_items) <= set(a["fixed"])


@pytest.mark.slow
def test_entangled_edits_are_reported_and_measured_together(
    ws: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    judge = MarkerJudge(ws)
    steps = [add_line(MARKER_A, at=0), add_line(replace=(f"- {MARKER_A}", f"- {MARKER_A} {MARKER_B}"))]
    with FakeLLMServer(default=judge) as server:
        exps = run_chain(ws, monkeypatch, judge, server, steps)
        assert [e.status for e in exps[1:]] == ["kept", "kept"]
        result = attribute(ws, server, capsys)
    first, second = exps[1].id, exps[2].id
    rows = by_experiment(result)
    assert rows[second]["entangled_with"] == [] and abs(rows[second]["items"] - 10) <= 3
    # The first edit's lines were rewritten by the second: it is reverted together with it (back to the baseline).
    assert rows[first]["entangled_with"] == [second]
    assert abs(rows[first]["items"] - 20) <= 3
    with Ledger(ws / "experiments" / "ledger.sqlite") as led:
        att = led.latest_attribution(exps[0].run_id)
        assert att is not None and "entangled" in (att.edit(first).note or "")  # type: ignore[union-attr]
    assert git(ws, "worktree", "list").count("\n") == 1


def _priced(ws: Path) -> None:
    cfg = ws / "judgeloop.toml"
    cfg.write_text(
        cfg.read_text(encoding="utf-8") + '\n[prices."fake-judge"]\ninput = 10.0\noutput = 10.0\n',
        encoding="utf-8",
    )
    commit_all(ws, "prices")


def _drop_cache(ws: Path) -> None:
    for suffix in ("", "-wal", "-shm"):
        (ws / "experiments" / f"cache.sqlite{suffix}").unlink(missing_ok=True)


@pytest.mark.slow
def test_budget_stops_cleanly_then_a_rerun_finishes_and_a_third_costs_nothing(
    ws: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _priced(ws)
    judge = MarkerJudge(ws)
    with FakeLLMServer(default=judge) as server:
        exps = run_chain(ws, monkeypatch, judge, server, [add_line(MARKER_A, at=0), add_line(MARKER_B, at=1)])
        baseline_cost = exps[0].cost_usd
        _drop_cache(ws)  # everything is paid again, so the budget bites
        budget = round(baseline_cost * 4.2, 6)  # one comparison (2 first passes + 4 x 10 re-judged), not two
        stopped = attribute(ws, server, capsys, "--budget-usd", str(budget))
        meta = stopped["attribution_meta"]
        assert meta["status"] == "partial" and meta["cost_usd"] <= budget + 1e-9
        measured = [r for r in stopped["attribution"] if r["items"] is not None]
        assert [r["experiment"] for r in measured] == [exps[2].id]  # newest first
        assert exps[1].id in meta["not_measured"] and "final_vs_baseline" in meta["not_measured"]
        assert "budget" in meta["note"]
        # Again without a budget: what was measured is kept, the rest is measured.
        done = attribute(ws, server, capsys)
        assert (
            done["attribution_meta"]["status"] == "complete" and done["attribution_meta"]["id"] == meta["id"]
        )
        assert by_experiment(done)[exps[2].id] == measured[0]
        assert abs(by_experiment(done)[exps[1].id]["items"] - 10) <= 3
        # Again: every call comes from the cache.
        requests = len(server.inference_requests())
        again = attribute(ws, server, capsys)
        assert len(server.inference_requests()) == requests
        assert again["attribution"] == done["attribution"]
        # With the ledger's record gone, the whole measurement again costs nothing: the cache has it.
        with Ledger(ws / "experiments" / "ledger.sqlite") as led, led.transaction() as cur:
            cur.execute("DELETE FROM attribution_edits")
            cur.execute("DELETE FROM attributions")
        fresh = attribute(ws, server, capsys)
        assert len(server.inference_requests()) == requests
        assert fresh["attribution_meta"]["cost_usd"] == 0
        assert [r["items"] for r in fresh["attribution"]] == [r["items"] for r in done["attribution"]]


def _cached_calls(root: Path) -> int:
    conn = sqlite3.connect(root / "experiments" / "cache.sqlite", timeout=5)
    try:
        return conn.execute("SELECT COUNT(*) FROM calls").fetchone()[0]
    finally:
        conn.close()


@pytest.mark.slow
def test_kill_9_mid_attribution_then_rerun_pays_for_nothing_twice(
    ws: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    judge = MarkerJudge(ws)
    with FakeLLMServer(default=judge) as server:
        run_chain(ws, monkeypatch, judge, server, [add_line(MARKER_A, at=0), add_line(MARKER_B, at=1)])
        judge.gate_after = len(judge.answered) + 40  # the attribution gets 40 answers, then the server stalls
        args = [
            "attribute",
            "-w",
            str(ws),
            "--provider",
            "openai",
            "--base-url",
            server.openai_base_url,
            "--model",
            "fake-judge",
            "--concurrency",
            "8",
        ]

        def cached_and_stalled() -> None:
            wait_for(lambda: len(judge.answered) >= present(judge.gate_after), "the gated calls", 60)
            wait_for(lambda: _cached_calls(ws) == len(judge.answered), "the answered calls to be cached")

        killed_cli(args, cached_and_stalled)
        judge.abandon_gated = True  # the dead process's calls stuck at the gate are dropped, never answered
        judge.gate_after = None
        judge.gate.set()
        result = attribute(ws, server, capsys)
    assert result["attribution_meta"]["status"] == "complete"
    # Every call answered is in the cache exactly once: nothing was paid for twice.
    assert _cached_calls(ws) == len(judge.answered)
    assert gitops.current_branch(ws) is not None and git(ws, "worktree", "list").count("\n") == 1


@pytest.mark.slow
def test_attribute_is_refused_in_one_line_while_the_run_is_running(
    ws: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    judge = MarkerJudge(ws)
    with FakeLLMServer(default=judge) as server:
        exps = run_chain(ws, monkeypatch, judge, server, [add_line(MARKER_A, at=0)])
        with Ledger(ws / "experiments" / "ledger.sqlite") as led:
            led.set_run_status(exps[0].run_id, "running")
        from optimizer.workspace.workspace import Workspace, command_lock

        capsys.readouterr()
        with command_lock(Workspace.open(ws), "run"):  # as a live `judgeloop run` holds it
            assert main(["attribute", "-w", str(ws)]) == 2
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0 and f"run {exps[0].run_id} is running" in err
        # The run's process is gone but its status says running: resume it first.
        assert main(["attribute", "-w", str(ws)]) == 2
        assert "--resume" in capsys.readouterr().err


@pytest.mark.slow
def test_report_json_attribution_is_null_before_attribute_ran(
    ws: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    judge = MarkerJudge(ws)
    with FakeLLMServer(default=judge) as server:
        run_chain(ws, monkeypatch, judge, server, [add_line(MARKER_A, at=0)])
    report = report_json(ws, capsys)
    assert report["attribution"] is None and report["final_vs_baseline"] is None
