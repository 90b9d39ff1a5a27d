"""The TUI's live strip and the runs it drives (start detached, decide a waiting candidate, stop), over a
copy of the session's real short run (`ws_copy`, tests/conftest.py). Moved from tests/test_tui.py."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, cast

import pytest
from textual.widgets import DataTable, Input

from tests.support.loop import present
from tests.support.tui_driving import (
    capture_notifications,
    drive,
    svg_text,
    wait_until,
)
from tests.support.tui_runs import RealRun, ledger_of, make_real_run
from tui.app import JudgeloopApp, settle
from tui.modals import ConfirmModal, StartRunModal
from tui.views import DisagreementsView, ExperimentView, HistoryView
from tui.widgets import StatusStrip

# ---------------------------------------------------------------------------------------------
# Live strip


@pytest.mark.slow
def test_live_strip_follows_events_another_process_appends(ws_copy: Path) -> None:
    with ledger_of(ws_copy) as ledger:
        run_id = present(ledger.latest_run()).id
    app = JudgeloopApp(ws_copy, image_mode="halfcell", watch=True, watch_interval_s=0.05)
    writer = (
        "import sys\n"
        "from optimizer.events import PassProgress, StageChanged\n"
        "from optimizer.ledger import Ledger\n"
        "with Ledger(sys.argv[1]) as led:\n"
        "    led.add_event(sys.argv[2], StageChanged('evaluating'))\n"
        "    led.add_event(sys.argv[2], PassProgress(done=7, total=99, errors=2, calls=9,\n"
        "        cache_hits=0, input_tokens=1000, output_tokens=234, cost_usd=0.5, elapsed_s=12))\n"
    )

    async def scenario(pilot: Any) -> None:
        strip = app.screen.query_one(StatusStrip)
        assert "judged 7/99" not in str(strip.render())
        subprocess.run(
            [sys.executable, "-c", writer, str(ws_copy / "experiments" / "ledger.sqlite"), run_id],
            check=True,
            cwd=Path(__file__).resolve().parents[1],
        )
        await wait_until(
            pilot,
            lambda: "judged 7/99" in str(app.screen.query_one(StatusStrip).render()),
            "the watcher thread's message",
        )
        line = str(app.screen.query_one(StatusStrip).render())
        assert "stage evaluating" in line and "judged 7/99" in line and "2 errors" in line
        assert "1,234 tokens" in line and "$0.5000" in line
        await pilot.press("d")  # input still works while the watcher runs
        await settle(app, pilot)
        assert isinstance(app.screen, DisagreementsView)

    drive(app, scenario)


# ---------------------------------------------------------------------------------------------
# Driving runs


@pytest.mark.slow
def test_run_started_from_the_tui_is_detached_and_keeps_going_after_quit(
    ws_copy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The run is provably mid-evaluation when the app quits (its first judge call is held at the
    server), and finishes afterwards, as a second app following the ledger sees."""
    import signal
    import threading

    from optimizer.workspace.workspace import JUDGELOOP_ACTOR, Workspace, repo_at
    from tests.support.config import write_config
    from tests.support.fakeserver import Behaviour, FakeLLMServer
    from tests.support.tui_runs import prompt_sensitive_judge

    # Nothing cached, so the new run's first judge call reaches the server (and waits there).
    for cache_file in (ws_copy / "experiments").glob("cache.sqlite*"):
        cache_file.unlink()
    answer = prompt_sensitive_judge(ws_copy, "mini")
    reached, release = threading.Event(), threading.Event()

    def held(request: Any) -> Behaviour:
        reached.set()
        release.wait(timeout=120)  # bounded: a failed test never leaves the run hanging for long
        return answer(request)

    monkeypatch.setenv("OPENAI_API_KEY", "dummy-key-for-the-fake-server")  # the run inherits it
    pid: int | None = None
    with FakeLLMServer() as server:
        server.default = held
        config = Workspace.open(ws_copy).config
        write_config(
            ws_copy,
            config.model_copy(
                update={
                    "workspace": config.workspace.model_copy(update={"dev_split": "mini"}),
                    "judge": config.judge.model_copy(
                        update={
                            "provider": "openai",
                            "model": "fake-judge",
                            "base_url": server.openai_base_url,
                        }
                    ),
                }
            ),
        )
        with repo_at(ws_copy) as repo:
            repo.git.checkout("main")
            repo.index.add(["judgeloop.toml"])
            repo.index.commit(
                "test: judge on the fake server", author=JUDGELOOP_ACTOR, committer=JUDGELOOP_ACTOR
            )
        with ledger_of(ws_copy) as ledger:
            runs_before = {r.id for r in ledger.runs()}

        app = JudgeloopApp(ws_copy, image_mode="halfcell", watch=False)
        seen = capture_notifications(app)

        async def start(pilot: Any) -> None:
            nonlocal pid
            await pilot.press("r")
            await pilot.pause()
            assert isinstance(app.screen, StartRunModal)
            cast(Input, app.screen.query_one("#run-max")).value = "1"
            await pilot.click("#start")
            await settle(app, pilot)
            announced = [m for s in seen if (m := re.match(r"run started \(pid (\d+)\)", s))]
            assert announced, seen
            pid = int(announced[0].group(1))
            for _ in range(1200):  # bounded wait until the run is judging: its first call is at the server
                if reached.is_set():
                    break
                await pilot.pause(0.05)
            assert reached.is_set(), "the run never called the judge"

        try:
            drive(app, start)  # the app quits here, with the run's judge call still held
            with ledger_of(ws_copy) as ledger:
                [run] = [r for r in ledger.runs() if r.id not in runs_before]
                assert ledger.get_run(run.id).status == "running"
            release.set()

            follower = JudgeloopApp(ws_copy, image_mode="halfcell", watch=True, watch_interval_s=0.05)

            async def follow(pilot: Any) -> None:
                for _ in range(2400):  # bounded wait for the ledger to say the run finished
                    if f"run {run.id} · finished" in str(app_strip(follower)):
                        break
                    await pilot.pause(0.05)

            drive(follower, follow)
            with ledger_of(ws_copy) as ledger:
                status = ledger.get_run(run.id).status
            logs = sorted((ws_copy / "experiments" / "runs").glob("*.log"))
            assert len(logs) == 1
            assert status == "finished", logs[0].read_text()[-2000:]
            assert "reached --max-experiments 1" in logs[0].read_text()
        finally:
            release.set()
            if pid is not None and _alive(pid):  # only on failure: the run this test started
                os.kill(pid, signal.SIGTERM)


def app_strip(app: JudgeloopApp) -> str:
    return str(app.screen.query_one(StatusStrip).render())


def _alive(pid: int) -> bool:
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)  # reap it if it is our child and has ended
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.fixture(scope="session")
def waiting_ws(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A workspace after a real `run --propose-only --max-experiments 1`: one candidate waits at the branch tip."""
    ws = tmp_path_factory.mktemp("tui-waiting") / "ws"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("OPENAI_API_KEY", "dummy-key-for-the-fake-server")
        assert (
            make_real_run(
                ws, RealRun(max_experiments=1, replicates=1, items=16, screenshots="none", propose_only=True)
            )
            == 0
        )
    return ws


@pytest.mark.slow  # a propose-only run built, then `judgeloop decide` in a worker
@pytest.mark.parametrize(("key", "status"), [("k", "kept"), ("x", "rolled_back")])
def test_waiting_candidate_is_kept_or_discarded_from_the_experiment_view(
    waiting_ws: Path, tmp_path: Path, key: str, status: str
) -> None:
    from optimizer.workspace import gitops

    ws = tmp_path / "ws"
    shutil.copytree(waiting_ws, ws, symlinks=True)
    with ledger_of(ws) as ledger:
        run = present(ledger.latest_run())
        assert run is not None and run.status == "waiting"
        waiting = [e for e in ledger.experiments(run.id) if e.status == "waiting"]
    assert len(waiting) == 1 and gitops.rev_parse(ws, run.branch) == waiting[0].commit_sha
    candidate = waiting[0]
    app = JudgeloopApp(ws, image_mode="halfcell", watch=False)

    async def scenario(pilot: Any) -> None:
        assert isinstance(app.screen, HistoryView)
        assert f"experiment {candidate.id} waiting" in svg_text(app)
        table = cast(DataTable[Any], app.screen.query_one("#history-table"))
        table.focus()
        table.move_cursor(row=table.get_row_index(str(candidate.id)))
        await pilot.press("e")
        await settle(app, pilot)
        assert isinstance(app.screen, ExperimentView) and app.experiment_id == candidate.id
        assert "this candidate is waiting" in svg_text(app)
        await pilot.press(key)
        await pilot.pause()
        assert isinstance(app.screen, ConfirmModal)
        await pilot.press("y")
        await settle(app, pilot)  # the worker runs `judgeloop decide` to completion, then the view reloads
        assert isinstance(app.screen, ExperimentView)
        assert "this candidate is waiting" not in svg_text(app)

    drive(app, scenario)
    with ledger_of(ws) as ledger:
        decided = ledger.get_experiment(candidate.id)
        parent = ledger.get_experiment(present(candidate.parent_id))
        assert ledger.get_run(run.id).status == "stopped"
    assert decided.status == status
    tip = gitops.rev_parse(ws, run.branch)
    if status == "kept":
        assert tip == decided.commit_sha
        assert gitops.parse_trailers(gitops.commit_message(ws, tip))["Judgeloop-Decision"] == "kept"
    else:
        assert tip == parent.commit_sha  # the branch is back at the incumbent
        assert gitops.rejected_refs(ws)[candidate.id] == decided.commit_sha
        rejected = gitops.rev_parse(ws, f"refs/judgeloop/rejected/{candidate.id}")
        assert (
            gitops.parse_trailers(gitops.commit_message(ws, rejected))["Judgeloop-Decision"] == "rolled_back"
        )


@pytest.mark.slow
def test_stop_key_creates_the_stop_file_only_while_a_run_is_going(ws_copy: Path) -> None:
    from optimizer.workspace.workspace import Workspace, command_lock

    notes: list[str] = []

    async def scenario(pilot: Any) -> None:
        await pilot.press("s")
        await pilot.pause()
        notes.extend(str(n.message) for n in pilot.app._notifications)

    # No run going: a STOP left behind would end the next run after its baseline (the red team's case).
    drive(JudgeloopApp(ws_copy, image_mode="halfcell", watch=False), scenario)
    assert not (ws_copy / "experiments" / "STOP").exists()
    assert any("no run is going" in n for n in notes)

    with command_lock(Workspace.open(ws_copy), "run"):  # a run holds the workspace's loop lock
        drive(JudgeloopApp(ws_copy, image_mode="halfcell", watch=False), scenario)
        assert (ws_copy / "experiments" / "STOP").is_file()
