"""Inspect AI logs (`optimizer.evaluation.inspect_log`): `eval --inspect-log`, `confirm --inspect-log` and
``[loop] inspect_logs`` write a ``.eval`` that Inspect's own `read_eval_log` reads back with every item,
score and usage equal to the verdict files; without Inspect installed, one line says how to install it.

End to end through the real CLI and the real openai SDK against tests/support/fakeserver.py.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from inspect_ai.log import read_eval_log

from optimizer.cli import main
from optimizer.devset.labels import load_labels
from optimizer.devset.split import open_split
from optimizer.workspace.workspace import Workspace
from tests.support.evaluation import SECRET, Data, by_label, make_data, verdict_text, write_config
from tests.support.fakeserver import FakeLLMServer, RecordedRequest, reply
from tests.support.fakewire import Usage
from tests.support.loop import GOOD_ENTRY, FakeJudge, commit_all, run_loop, set_toml_key
from tests.support.scripted import ScriptedStrategy, add_heldout_split, install, latest, toggle


@pytest.fixture
def data(tmp_path: Path) -> Data:
    return make_data(tmp_path)


def _behaviour(data: Data) -> Any:
    """Verdicts by label, except: one item answers with evidence steps and a wrong verdict, one is garbled."""
    base = by_label(data, garbled=data.items[2].trajectory_id)
    odd = data.items[1].trajectory_id

    def behave(recorded: RecordedRequest) -> Any:
        item = data.recorded_item(recorded)
        if item.trajectory_id != odd:
            return base(recorded)
        body = json.loads(verdict_text(item.label != "positive", None))
        body |= {"reasoning": "step 3 shows the wrong file saved", "evidence_steps": [3, 7]}
        return reply(
            json.dumps(body), usage=Usage(input_tokens=1234, output_tokens=56, cache_read_tokens=200)
        )

    return behave


def test_eval_inspect_log_reads_back_with_every_item_score_and_usage_of_the_verdict_files(
    data: Data, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    with FakeLLMServer() as server:
        server.default = _behaviour(data)
        write_config(data.ws, server)
        out, log_path = tmp_path / "out", tmp_path / "logs" / "pass.eval"
        argv = ["eval", "-w", str(data.ws.root), "--base-url", server.openai_base_url, "--out", str(out)]
        assert main([*argv, "--inspect-log", str(log_path), "--json"]) == 0, capsys.readouterr().err
    figures = json.loads(capsys.readouterr().out)
    log = read_eval_log(str(log_path))
    assert log.status == "success" and log.samples is not None
    labels = load_labels(data.split)
    verdicts = {p.stem: json.loads(p.read_text()) for p in out.glob("*.json") if p.name != "_summary.json"}
    # One sample per item (the reader orders them its own way).
    assert sorted(str(s.id) for s in log.samples) == sorted(data.split.ids) == sorted(verdicts)
    for sample in log.samples:
        tid, file = str(sample.id), verdicts[str(sample.id)]
        meta = file["_meta"]
        assert sample.target == labels[tid].label
        assert data.split.trajectory(tid).task.instruction in str(sample.input)
        assert sample.scores is not None
        score = sample.scores["judgeloop"]
        if "success" in file:
            assert score.answer == ("positive" if file["success"] else "negative")
            assert score.value == ("C" if score.answer == labels[tid].label else "I")
            assert score.explanation == file["reasoning"]
            assert score.metadata is not None
            assert score.metadata["mistake_type"] == file["mistake_type"]
            assert score.metadata["evidence_steps"] == file.get("evidence_steps", [])
        else:  # a parse failure is a wrong answer, with the parser's reason
            assert score.value == "I" and score.answer is None and score.explanation == file["parse_error"]
        (usage,) = sample.model_usage.values()
        assert (usage.input_tokens, usage.output_tokens) == (meta["input_tokens"], meta["output_tokens"])
        assert usage.total_cost == pytest.approx(meta["cost_usd"])
    odd = data.items[1].trajectory_id
    odd_score = next(s for s in log.samples if s.id == odd).scores
    assert odd_score is not None and odd_score["judgeloop"].metadata is not None
    assert odd_score["judgeloop"].metadata["evidence_steps"] == [3, 7] == verdicts[odd]["evidence_steps"]
    assert (
        next(s for s in log.samples if s.id == odd).model_usage["openai/gpt-4o-mini"].input_tokens_cache_read
        == 200
    )
    # The eval's figures: the pass's (what `eval --json` printed) and its usage summed over the samples.
    assert log.results is not None
    metrics = log.results.scores[0].metrics
    assert metrics["kappa"].value == pytest.approx(figures["kappa"])
    assert metrics["fpr"].value == pytest.approx(figures["fpr"])
    total = log.stats.model_usage["openai/gpt-4o-mini"]
    assert total.input_tokens == sum(v["_meta"]["input_tokens"] for v in verdicts.values())
    assert (
        log.eval.model == "openai/gpt-4o-mini" and SECRET not in log.model_dump_json()
    )  # the file is compressed: read it


def _without_inspect(monkeypatch: pytest.MonkeyPatch) -> None:
    """As if Inspect AI were not installed: importing it (or its log API) fails."""
    for name in ("inspect_ai", "inspect_ai.log"):
        monkeypatch.setitem(sys.modules, name, None)


def test_inspect_log_without_inspect_installed_says_how_to_install_it_in_one_line_before_any_call(
    data: Data, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    _without_inspect(monkeypatch)
    with FakeLLMServer() as server:
        server.default = by_label(data)
        write_config(data.ws, server)
        argv = ["eval", "-w", str(data.ws.root), "--base-url", server.openai_base_url]
        capsys.readouterr()
        assert main([*argv, "--inspect-log", str(tmp_path / "pass.eval")]) == 2
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and "pip install 'judgeloop[inspect]'" in err
        assert "Traceback" not in err
        assert server.inference_requests() == []
    assert not (tmp_path / "pass.eval").exists()


@pytest.mark.slow
def test_loop_inspect_logs_without_inspect_installed_is_refused_at_the_runs_start(
    ws: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _without_inspect(monkeypatch)
    set_toml_key(ws, "loop", "inspect_logs", "true")
    commit_all(ws, "inspect logs on")
    with FakeLLMServer(default=FakeJudge(ws)) as server:
        capsys.readouterr()
        assert run_loop(ws, server.openai_base_url, "--max-experiments", "1") == 2
        err = capsys.readouterr().err
        assert (
            len(err.strip().splitlines()) == 1
            and "[loop] inspect_logs" in err
            and "judgeloop[inspect]" in err
        )
        assert server.inference_requests() == []  # before the baseline is paid for


def test_inspect_log_refuses_a_file_that_is_not_a_log_before_any_call(
    data: Data, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    with FakeLLMServer() as server:
        write_config(data.ws, server)
        argv = ["eval", "-w", str(data.ws.root), "--base-url", server.openai_base_url]
        assert main([*argv, "--inspect-log", str(tmp_path / "pass.txt")]) == 2
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and "name a .eval file" in err
        assert server.inference_requests() == []


@pytest.mark.slow
def test_loop_inspect_logs_and_confirm_inspect_log_write_each_pass_as_an_inspect_log(
    ws: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _dev, held = add_heldout_split(ws)
    set_toml_key(ws, "loop", "inspect_logs", "true")
    commit_all(ws, "inspect logs on")
    install(monkeypatch, ScriptedStrategy([toggle(GOOD_ENTRY)]))
    with FakeLLMServer(default=FakeJudge(ws)) as server:
        assert run_loop(ws, server.openai_base_url, "--max-experiments", "1") == 0
        run, exps = latest(ws)
        held_log = tmp_path / "held.eval"
        capsys.readouterr()
        assert main(["confirm", "-w", str(ws), "--split", "held", "--inspect-log", str(held_log)]) == 0
        assert f"inspect log: {held_log}" in capsys.readouterr().out
    workspace = Workspace.open(ws)
    dev = open_split(workspace, "small")
    dev_labels = load_labels(dev)
    for exp in exps:  # the baseline and the candidate, each its first pass
        log = read_eval_log(
            str(ws / "experiments" / "runs" / run.id / "inspect" / f"experiment-{exp.id}.eval")
        )
        assert log.samples is not None and log.samples
        assert {str(s.id) for s in log.samples} <= set(dev.ids)
        assert all(s.target == dev_labels[str(s.id)].label for s in log.samples)
    log = read_eval_log(str(held_log))
    held_labels = load_labels(open_split(workspace, "held"))
    assert log.samples is not None and sorted(str(s.id) for s in log.samples) == sorted(held)
    assert all(s.target == held_labels[str(s.id)].label for s in log.samples)
    assert log.results is not None and "kappa" in log.results.scores[0].metrics
