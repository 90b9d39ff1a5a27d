"""``judgeloop run --batch``: every pass of a candidate is one batch (OpenAI Batch API through the real
SDK against the fake server); recorded in the ledger; ``--resume`` after ``kill -9`` collects it."""

from __future__ import annotations

from pathlib import Path

import pytest

from optimizer.ledger import Ledger
from optimizer.vocab import ExperimentStatus, StageKind
from tests.support.fakeserver import FakeLLMServer
from tests.support.loop import FakeJudge, commit_all, run_loop, wait_for
from tests.support.processes import killed_cli
from tui.watch import LiveState, apply_events


def poll_fast(root: Path) -> None:
    """Poll batches every 10 ms (at most 40 ms): committed, as `run` refuses a dirty tree."""
    path = root / "judgeloop.toml"
    text = path.read_text(encoding="utf-8")
    assert "\n[judge]\n" in text
    path.write_text(
        text.replace("\n[judge]\n", "\n[judge]\nbatch_poll_s = 0.01\nbatch_poll_max_s = 0.04\n", 1),
        encoding="utf-8",
    )
    commit_all(root, "poll batches fast")


def outcome(
    root: Path,
) -> tuple[list[tuple[int, ExperimentStatus, int]], list[tuple[int | None, str | None, str, int]]]:
    """(seq, status, items evaluated) per experiment; (experiment, batch id, status, calls) per batch."""
    with Ledger(root / "experiments" / "ledger.sqlite") as led:
        run = led.latest_run()
        assert run is not None
        exps = [(e.seq, e.status, e.items_evaluated) for e in led.experiments(run.id)]
        batches = [(b.experiment_id, b.batch_id, b.status, len(b.custom_ids)) for b in led.batches(run.id)]
    return exps, batches


@pytest.mark.slow
def test_run_batch_judges_every_item_and_decides_as_direct_calls(
    ws: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    poll_fast(ws)
    direct_ws = tmp_path / "direct"
    import shutil

    shutil.copytree(ws, direct_ws, symlinks=True)
    with FakeLLMServer(default=FakeJudge(direct_ws)) as server:
        assert (
            run_loop(direct_ws, server.openai_base_url, "--strategy", "library", "--max-experiments", "3")
            == 0
        )
        assert server.batch_creations == []
    direct, _ = outcome(direct_ws)
    capsys.readouterr()

    with FakeLLMServer(default=FakeJudge(ws), batch_polls=2) as server:
        assert (
            run_loop(ws, server.openai_base_url, "--strategy", "library", "--max-experiments", "3", "--batch")
            == 0
        )
        out = capsys.readouterr().out
    exps, batches = outcome(ws)
    n_items = exps[0][2]
    assert [(seq, status) for seq, status, _ in exps] == [(seq, status) for seq, status, _ in direct]
    evaluated = [e for e in exps if e[1] != "guard_rejected"]
    assert all(items == n_items for _, _, items in evaluated)  # no early stopping inside a batch
    assert [b[1] for b in batches] == server.batch_creations  # every batch recorded, in order
    assert all(status == "collected" for _, _, status, _ in batches)
    assert "early stopping does not apply" in out and f"batch {server.batch_creations[0]}: " in out


@pytest.mark.slow
def test_kill_9_with_a_run_batch_pending_then_resume_collects_it(ws: Path) -> None:
    poll_fast(ws)
    judge = FakeJudge(ws)
    with FakeLLMServer(default=judge, batch_polls=10**9) as server:
        args = [
            "run",
            "-w",
            str(ws),
            "--provider",
            "openai",
            "--base-url",
            server.openai_base_url,
            "--model",
            "fake-judge",
            "--strategy",
            "library",
            "--max-experiments",
            "1",
            "--batch",
        ]

        def recorded() -> bool:
            if not (ws / "experiments" / "ledger.sqlite").exists() or not server.batch_creations:
                return False
            return [b[1] for b in outcome(ws)[1]] == server.batch_creations[:1]

        def submitted_and_polled() -> None:
            wait_for(recorded, "the baseline's batch to be submitted and recorded", 60)
            wait_for(
                lambda: sum(r.path.endswith(server.batch_creations[0]) for r in server.requests) >= 2,
                "the run to poll its batch",
            )

        killed_cli(args, submitted_and_polled)
        pending = server.batch_creations[0]
        server.end_batches()
        server.batch_polls = 1
        assert run_loop(ws, server.openai_base_url, "--resume") == 0  # batch mode is the run's own
    exps, batches = outcome(ws)
    baseline_batches = [b for b in batches if b[0] == batches[0][0]]
    assert baseline_batches == [(batches[0][0], pending, "collected", exps[0][2])]  # collected, never re-sent
    assert server.batch_creations.count(pending) == 1
    assert exps[0][1] == "baseline" and len(exps) == 2
    # The TUI's live strip follows the batch's state through the ledger's stage events.
    with Ledger(ws / "experiments" / "ledger.sqlite") as led:
        run = led.latest_run()
        assert run is not None
        stages = [e for e in led.events_since(0, run_id=run.id) if e.kind == "stage"]
    assert {e.payload["stage"] for e in stages} <= set(
        StageKind
    )  # every stage is a kind, none a display line
    strip = [apply_events(LiveState(), [e]).stage or "" for e in stages]
    assert any(s.startswith(f"batch {server.batch_creations[0]}: ") for s in strip)
