"""Held-out splits are seen only through `confirm` (issue 16, item 3).

`eval` and `score` refuse a split listed in ``[workspace] heldout_splits`` (pointing to `confirm`,
which counts and caps each look); `run` and `confirm` refuse a dev split that shares trajectories
with a held-out split, before anything is judged or recorded.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from optimizer.cli import main
from optimizer.devset.split import open_split
from optimizer.ledger import Ledger
from optimizer.workspace.workspace import Workspace
from tests.support.fakeserver import FakeLLMServer
from tests.support.heldout import import_held
from tests.support.loop import GOOD_ENTRY, FakeJudge, judge_args, judge_eval, run_loop
from tests.support.scripted import ScriptedStrategy, install, toggle


def dev_and_rest(root: Path) -> tuple[list[str], list[str]]:
    ws = Workspace.open(root)
    dev = open_split(ws, "small").ids
    return dev, [t for t in open_split(ws, "sample").ids if t not in dev]


def one_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert err and "Traceback" not in "\n".join(err)
    return err[-1]


def runs(root: Path) -> int:
    path = root / "experiments" / "ledger.sqlite"
    if not path.exists():
        return 0
    with Ledger(path) as led:
        return len(led.runs())


@pytest.mark.slow
def test_eval_and_score_refuse_a_heldout_split_and_point_to_confirm(
    ws: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _, rest = dev_and_rest(ws)
    held = rest[:6]
    import_held(ws, held)
    capsys.readouterr()
    code, sent = judge_eval(ws, tmp_path / "out", "--split", "held")
    assert sent == []
    captured = capsys.readouterr()
    assert code == 2 and "kappa" not in captured.out
    assert (
        captured.err.count("\n") == 1 and "judgeloop confirm" in captured.err and "held out" in captured.err
    )

    results = tmp_path / "verdicts"
    results.mkdir()
    for tid in held:
        (results / f"{tid}.json").write_text(
            json.dumps({"success": True, "reasoning": "", "confidence": "high"})
        )
    assert main(["score", str(results), "--split", "held", "-w", str(ws)]) == 2
    captured = capsys.readouterr()
    assert "kappa" not in captured.out
    assert captured.err.count("\n") == 1 and "judgeloop confirm" in captured.err


def test_run_refuses_a_dev_split_sharing_trajectories_with_a_heldout_split(
    ws: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dev, rest = dev_and_rest(ws)
    import_held(ws, [rest[0], dev[3], rest[1], dev[0]])
    capsys.readouterr()
    with FakeLLMServer(default=FakeJudge(ws)) as server:
        assert run_loop(ws, server.openai_base_url, "--max-experiments", "1") == 2
        assert server.inference_requests() == []
    err = one_line(capsys)
    assert "dev split 'small'" in err and "held-out split 'held'" in err
    assert "share 2 trajectory id(s)" in err and f"first {dev[3]}" in err
    assert runs(ws) == 0


@pytest.mark.slow
def test_confirm_and_resume_refuse_a_heldout_split_sharing_trajectories_with_the_runs_split(
    ws: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    dev, rest = dev_and_rest(ws)
    install(monkeypatch, ScriptedStrategy([toggle(GOOD_ENTRY)]))
    with FakeLLMServer(default=FakeJudge(ws)) as server:
        assert run_loop(ws, server.openai_base_url, "--max-experiments", "1") == 0
        # Imported (and held out) after the run: only confirm can notice.
        import_held(ws, [*rest[:4], *dev])
        sent = len(server.inference_requests())
        capsys.readouterr()
        code = main(judge_args("confirm", ws, server.openai_base_url, "--split", "held"))
        assert len(server.inference_requests()) == sent  # nothing judged
        assert code == 2
        err = one_line(capsys)
        assert "held-out split 'held'" in err and f"share {len(dev)} trajectory id(s)" in err
        with Ledger(ws / "experiments" / "ledger.sqlite") as led:
            assert led.confirmations("held") == []
            run = led.latest_run()
            assert run is not None
            led.set_run_status(run.id, "stopped", stop_reason="interrupted (as by Ctrl-C)")
            experiments = len(led.experiments(run.id))
        # Resuming that run meets the same refusal, before anything is judged.
        assert run_loop(ws, server.openai_base_url, "--resume", "--max-experiments", "2") == 2
        assert f"share {len(dev)} trajectory id(s)" in one_line(capsys)
        assert len(server.inference_requests()) == sent
    with Ledger(ws / "experiments" / "ledger.sqlite") as led:
        assert len(led.experiments(run.id)) == experiments


def test_eval_and_score_treat_a_split_holding_heldout_items_as_held_out(
    ws: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # `init --sample` leaves split `sample`, a superset of every split imported from the bundled set:
    # held out by its items, whatever its name.
    _, rest = dev_and_rest(ws)
    import_held(ws, rest[:6])
    capsys.readouterr()
    code, sent = judge_eval(ws, tmp_path / "out", "--split", "sample")
    assert sent == []
    captured = capsys.readouterr()
    assert code == 2 and "kappa" not in captured.out.lower() and not (tmp_path / "out").exists()
    assert captured.err.count("\n") == 1 and "judgeloop confirm --split held" in captured.err
    assert "'sample'" in captured.err and "held out" in captured.err
    results = tmp_path / "verdicts"
    results.mkdir()
    for tid in open_split(Workspace.open(ws), "sample").ids:
        (results / f"{tid}.json").write_text(
            json.dumps({"success": True, "reasoning": "", "confidence": "high"})
        )
    assert main(["score", str(results), "--split", "sample", "-w", str(ws)]) == 2
    captured = capsys.readouterr()
    assert "kappa" not in captured.out.lower()
    assert captured.err.count("\n") == 1 and "judgeloop confirm --split held" in captured.err
    # The dev split, apart from the held-out one, is evaluated as before.
    assert judge_eval(ws, tmp_path / "dev", "--limit", "4")[0] == 0
    assert "kappa" in capsys.readouterr().out.lower()


@pytest.mark.slow
def test_a_review_note_on_a_heldout_item_never_reaches_the_strategies_guidance(
    ws: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dev, rest = dev_and_rest(ws)
    import_held(ws, rest[:4])
    with Ledger(ws / "experiments" / "ledger.sqlite") as led:
        led.add_review(rest[0], "judge_wrong", "HELDOUT-NOTE the held-out answer is success")
        led.add_review(dev[0], "judge_wrong", "DEV-NOTE check the saved file")
    strategy = ScriptedStrategy([toggle(GOOD_ENTRY)])
    install(monkeypatch, strategy)
    with FakeLLMServer(default=FakeJudge(ws)) as server:
        assert run_loop(ws, server.openai_base_url, "--max-experiments", "1") == 0
    [ctx] = strategy.contexts
    assert "DEV-NOTE" in ctx.guidance  # dev items' reviews reach it
    assert "HELDOUT-NOTE" not in ctx.guidance and rest[0] not in ctx.guidance
    assert all("HELDOUT-NOTE" not in r.note for r in ctx.reviews)
