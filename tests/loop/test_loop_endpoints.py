"""Per-endpoint figures of a run with ``[judge] base_urls`` (two fake servers, real openai SDK): the
ledger's per-pass rows and ``judgeloop report``'s lines equal what each server answered."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from optimizer.cli import main
from tests.support.fakeserver import FakeLLMServer
from tests.support.loop import GOOD_ENTRY, FakeJudge, commit_all
from tests.support.scripted import ScriptedStrategy, install, latest, ledger_of, toggle


@pytest.mark.slow
def test_a_run_s_endpoint_figures_are_each_server_s_count_per_pass_and_in_the_report(
    ws: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    judge = FakeJudge(ws)
    install(monkeypatch, ScriptedStrategy([toggle(GOOD_ENTRY)]))
    with FakeLLMServer(default=judge) as a, FakeLLMServer(default=judge) as b:
        urls = [a.openai_base_url, b.openai_base_url]
        cfg = ws / "judgeloop.toml"
        text = cfg.read_text(encoding="utf-8").replace('provider = "local"', 'provider = "openai"', 1)
        cfg.write_text(
            re.sub(r"(?m)^# base_urls = .*$", f"base_urls = {json.dumps(urls)}", text, count=1),
            encoding="utf-8",
        )
        commit_all(ws, "two replicas")
        assert (
            main(
                [
                    "run",
                    "-w",
                    str(ws),
                    "--provider",
                    "openai",
                    "--model",
                    "fake-judge",
                    "--concurrency",
                    "8",
                    "--max-experiments",
                    "1",
                ]
            )
            == 0
        )
        served = {s.openai_base_url: len(s.inference_requests()) for s in (a, b)}
    run, exps = latest(ws)
    assert all(served.values()), served  # both replicas took items
    with ledger_of(ws) as led:
        figures = led.endpoint_figures(run.id)
        per_pass = led._conn.execute(
            "SELECT experiment_id, pass, endpoint, calls FROM endpoint_passes ORDER BY id"
        ).fetchall()
    assert {u: f["calls"] for u, f in figures.items()} == served
    assert sum(served.values()) == sum(e.calls for e in exps)  # the experiments' own call counts agree
    # One row per pass and endpoint: the baseline's pass, the candidate's first pass and its re-judging.
    for exp in exps:
        mine = [r for r in per_pass if r[0] == exp.id]
        assert sum(r[3] for r in mine) == exp.calls and {r[2] for r in mine} == set(urls)
    assert all(f["failures"] == 0 and f["drained"] == 0 for f in figures.values())
    capsys.readouterr()
    assert main(["report", "-w", str(ws), "--run", run.id]) == 0
    report = capsys.readouterr().out
    assert "endpoints (2):" in report
    for url, calls in served.items():
        assert f"  {url}: {calls} calls, " in report and "0 failed calls" in report
