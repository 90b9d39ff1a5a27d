"""``judgeloop run --batch`` with ``[judge] batch_engine = "vllm-run-batch"``: each pass is an input file
that a fake playing ``vllm run-batch``'s file contract answers (tests/support/fake_run_batch.py, the loop
tests' deterministic judge); ``kill -9`` while the baseline's file waits, then ``--resume``, collects that
file's output instead of writing a second batch, and decides as a run with direct calls does."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from optimizer.judge.providers.run_batch import INPUT_SUFFIX, OUTPUT_SUFFIX, run_batch_command
from optimizer.ledger import Ledger
from optimizer.vocab import ExperimentStatus
from tests.support.fakeserver import FakeLLMServer
from tests.support.loop import BAD_ENTRY, GOOD_ENTRY, FakeJudge, commit_all, run_args, run_loop, wait_for
from tests.support.paths import REPO_ROOT
from tests.support.processes import killed_cli
from tests.support.scripted import ScriptedStrategy, install, latest, ledger_of, toggle

MODEL = "fake-judge"  # run_loop's --model
NEUTRAL = "lib-harmless-exploration"  # changes nothing the fake judge answers: a no-op candidate
FAKE = Path(__file__).parent.parent / "support" / "fake_run_batch.py"


def use_run_batch(root: Path) -> Path:
    """Batches through run-batch files, polled every 10 ms (committed: `run` refuses a dirty tree); the folder."""
    path = root / "judgeloop.toml"
    text = path.read_text(encoding="utf-8")
    settings = 'batch_poll_s = 0.01\nbatch_poll_max_s = 0.04\nbatch_engine = "vllm-run-batch"\n'
    path.write_text(text.replace("\n[judge]\n", f"\n[judge]\n{settings}", 1), encoding="utf-8")
    commit_all(root, "batches through vllm run-batch files")
    return root / "experiments" / "run-batch"


class Answerer:
    """Runs the command judgeloop prints for every input file without an output, as a person (or a job
    scheduler) running ``vllm run-batch`` would, until stopped."""

    def __init__(self, root: Path, folder: Path, *knobs: str) -> None:
        self.root, self.folder, self.knobs = root, folder, " ".join(knobs)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Answerer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(60)

    def _run(self) -> None:
        env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
        fake = f"{shlex.quote(sys.executable)} {shlex.quote(str(FAKE))} --fake-judge {shlex.quote(str(self.root))} {self.knobs} "
        while not self.stop.wait(0.02):
            for source in sorted(self.folder.glob(f"*{INPUT_SUFFIX}")):
                batch_id = source.name.removesuffix(INPUT_SUFFIX)
                if not (self.folder / f"{batch_id}{OUTPUT_SUFFIX}").exists():
                    command = run_batch_command(self.folder, batch_id, MODEL).replace(
                        "vllm run-batch ", fake, 1
                    )
                    subprocess.run(command, shell=True, check=True, timeout=120, env=env, cwd=REPO_ROOT)


def outcome(root: Path) -> tuple[list[tuple[int, ExperimentStatus]], list[tuple[str | None, str, int]]]:
    """(seq, status) per experiment; (batch id, status, calls) per recorded batch."""
    with Ledger(root / "experiments" / "ledger.sqlite") as led:
        run = led.latest_run()
        assert run is not None
        exps = [(e.seq, e.status) for e in led.experiments(run.id)]
        batches = [(b.batch_id, b.status, len(b.custom_ids)) for b in led.batches(run.id)]
    return exps, batches


@pytest.mark.slow
def test_kill_9_while_the_baseline_file_waits_then_resume_collects_it_and_decides_as_direct(
    ws: Path, tmp_path: Path
) -> None:
    folder = use_run_batch(ws)
    direct_ws = tmp_path / "direct"
    shutil.copytree(ws, direct_ws, symlinks=True)
    args = ["--strategy", "library", "--max-experiments", "1"]
    with FakeLLMServer(default=FakeJudge(direct_ws)) as server:
        assert run_loop(direct_ws, server.openai_base_url, *args) == 0
    direct, _ = outcome(direct_ws)

    with FakeLLMServer(default=FakeJudge(ws)) as server:
        cli = run_args(ws, server.openai_base_url, concurrency=None)

        def waiting() -> None:
            wait_for(lambda: len(list(folder.glob(f"*{INPUT_SUFFIX}"))) == 1, "the baseline's input file", 60)
            [source] = folder.glob(f"*{INPUT_SUFFIX}")
            batch_id = source.name.removesuffix(INPUT_SUFFIX)
            wait_for(
                lambda: (
                    (ws / "experiments" / "ledger.sqlite").exists()
                    and [(b, s) for b, s, _ in outcome(ws)[1]] == [(batch_id, "submitted")]
                ),
                "the baseline's batch to be recorded",
            )

        killed_cli([*cli, *args, "--batch"], waiting)
        [pending] = [p.name.removesuffix(INPUT_SUFFIX) for p in folder.glob(f"*{INPUT_SUFFIX}")]
        with Answerer(ws, folder):
            assert run_loop(ws, server.openai_base_url, "--resume") == 0  # batch mode is the run's own
        assert server.batch_creations == []  # no provider batch: files only
    exps, batches = outcome(ws)
    assert exps == direct
    assert batches[0][:2] == (pending, "collected")  # the baseline's file, collected, never written again
    assert [b for b, _, _ in batches].count(pending) == 1
    assert all(status == "collected" for _, status, _ in batches)
    written = sorted(p.name.removesuffix(INPUT_SUFFIX) for p in folder.glob(f"*{INPUT_SUFFIX}"))
    assert written == sorted(b for b, _, _ in batches if b is not None)  # one file per recorded batch


@pytest.mark.slow
def test_a_wave_writes_one_file_per_wave_pass_and_decides_as_direct_calls(
    ws: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = use_run_batch(ws)
    direct_ws = tmp_path / "direct"
    shutil.copytree(ws, direct_ws, symlinks=True)
    steps = [toggle(NEUTRAL), toggle(GOOD_ENTRY), toggle(BAD_ENTRY)]
    args = ["--wave", "3", "--max-experiments", "3"]
    install(monkeypatch, ScriptedStrategy(list(steps)))
    with FakeLLMServer(default=FakeJudge(direct_ws, good_fixes_neg=0.45)) as server:
        assert run_loop(direct_ws, server.openai_base_url, *args) == 0
    install(monkeypatch, ScriptedStrategy(list(steps)))
    with (
        FakeLLMServer(default=FakeJudge(ws, good_fixes_neg=0.45)) as server,
        Answerer(ws, folder, "--good-fixes-neg 0.45"),
    ):
        assert run_loop(ws, server.openai_base_url, *args, "--batch") == 0
        assert server.batch_creations == []
    assert [s for _, s in outcome(ws)[0]] == [s for _, s in outcome(direct_ws)[0]]
    with ledger_of(ws) as led:
        records = led.batches(latest(ws)[0].id)
    members: dict[str | None, set[int | None]] = {}
    for record in records:
        members.setdefault(record.batch_id, set()).add(record.experiment_id)
    assert any(len(m) == 3 for m in members.values())  # the wave's candidates shared one file
    written = {p.name.removesuffix(INPUT_SUFFIX) for p in folder.glob(f"*{INPUT_SUFFIX}")}
    assert written == set(members) and all(r.status == "collected" for r in records)
