"""Storage faults under real commands: a full disk, a read-only ``experiments/``, a refused
permission, a corrupt ledger or cache. Each is one line on stderr naming the file and what to do,
exit 2, no traceback, and nothing already stored is lost (the ledger still opens, whole).

The full disk is a real tmpfs of a few MiB mounted on ``experiments/`` and the read-only folder a
real read-only bind mount (tests run as root, so ``chmod`` would not stop a write); both are skipped
where this process may not mount. A permission refusal is injected at the seam (root passes every
permission check), and a corrupt page is written into a real ledger file.
"""

from __future__ import annotations

import errno
import hashlib
import shutil
import sqlite3
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from optimizer.cli import main
from optimizer.ledger import Ledger
from tests.support.fakeserver import Behaviour, FakeLLMServer, RecordedRequest
from tests.support.loop import FakeJudge, run_loop

URL_ARGS = ["--provider", "openai", "--model", "fake-judge"]


def one_line_error(capsys: pytest.CaptureFixture[str]) -> str:
    """The command's one error line: the last on stderr (status lines may come before it), no traceback."""
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert [line for line in lines if "error" in line] == lines[-1:], err
    return lines[-1]


def _mount(*args: str) -> bool:
    return subprocess.run(["mount", *args], capture_output=True).returncode == 0


def _umount(path: Path) -> None:
    if subprocess.run(["umount", str(path)], capture_output=True).returncode != 0:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


@contextmanager
def experiments_on_tmpfs(root: Path, size: str) -> Iterator[Path]:
    """``root/experiments`` moved onto a fresh tmpfs of ``size`` (its files copied over) until the end
    of the block, when the tmpfs and what was written on it go."""
    exp = root / "experiments"
    aside = root.parent / "experiments-aside"
    shutil.move(exp, aside)
    exp.mkdir()
    if not _mount("-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(exp)):
        exp.rmdir()
        shutil.move(aside, exp)
        pytest.skip("mounting a tmpfs needs root (CAP_SYS_ADMIN)")
    try:
        shutil.copytree(aside, exp, dirs_exist_ok=True)
        yield exp
    finally:
        _umount(exp)
        shutil.rmtree(aside, ignore_errors=True)


@contextmanager
def read_only(folder: Path) -> Iterator[None]:
    """``folder`` read-only through a bind mount of itself, remounted ``ro``."""
    if not _mount("--bind", str(folder), str(folder)):
        pytest.skip("a bind mount needs root (CAP_SYS_ADMIN)")
    try:
        if not _mount("-o", "remount,ro,bind", str(folder)):
            pytest.skip("remounting read-only needs root (CAP_SYS_ADMIN)")
        yield
    finally:
        _umount(folder)


def fill(folder: Path) -> Path:
    """Write a file in ``folder`` until the disk is full; returns it."""
    filler = folder / "filler"
    with filler.open("wb", buffering=0) as fh:  # unbuffered: nothing left to flush at close
        try:
            while True:
                fh.write(b"\0" * 4096)
        except OSError as exc:
            assert exc.errno == errno.ENOSPC
    return filler


def ledger_state(root: Path) -> tuple[str, list[tuple[str, str]], int]:
    """(integrity check, (run id, status) of every run, experiments) of the workspace's ledger."""
    path = root / "experiments" / "ledger.sqlite"
    conn = sqlite3.connect(path)
    try:
        check = conn.execute("PRAGMA integrity_check").fetchone()[0]
    finally:
        conn.close()
    with Ledger.open_readonly(path) as led:
        runs = led.runs()
        return check, [(r.id, r.status) for r in runs], sum(len(led.experiments(r.id)) for r in runs)


@pytest.mark.slow
def test_a_full_disk_mid_run_is_one_line_and_the_run_resumes_once_there_is_room(
    ws: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    judge = FakeJudge(ws)
    with experiments_on_tmpfs(ws, "8m") as exp:
        filled: list[Path] = []

        def answer(request: RecordedRequest) -> Behaviour:
            if not filled:  # the disk fills up while the baseline's first call is out
                filled.append(fill(exp))
            return judge(request)

        with FakeLLMServer(default=answer) as server:
            capsys.readouterr()
            assert run_loop(ws, server.openai_base_url, "--max-experiments", "2") == 2
            err = one_line_error(capsys)
            assert "no space left on the disk holding" in err and str(exp) in err and "free some space" in err
            filled[0].unlink()
            check, runs, _ = ledger_state(ws)
            assert check == "ok" and len(runs) == 1  # the run is recorded, whole
            server.default = judge
            assert run_loop(ws, server.openai_base_url, "--max-experiments", "2", "--resume") == 0
        check, runs, experiments = ledger_state(ws)
        assert check == "ok" and runs == [(runs[0][0], "finished")] and experiments == 3


@pytest.mark.slow
def test_a_full_disk_before_anything_is_written_is_one_line(
    ws: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with FakeLLMServer(default=FakeJudge(ws)) as server:
        assert run_loop(ws, server.openai_base_url, "--max-experiments", "1") == 0
    with experiments_on_tmpfs(ws, "2m") as exp:
        fill(exp)
        for argv in (
            ["report"],
            ["history"],
            ["eval", "--base-url", "http://127.0.0.1:9/v1", *URL_ARGS],
            ["run", "--base-url", "http://127.0.0.1:9/v1", *URL_ARGS],
        ):
            capsys.readouterr()
            assert main(["-w", str(ws), *argv]) == 2, argv
            err = one_line_error(capsys)
            assert "no space left on the disk holding" in err and str(exp) in err, argv


@pytest.mark.slow
def test_a_read_only_experiments_folder_is_one_line_and_loses_nothing(
    ws: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    judge = FakeJudge(ws)
    with FakeLLMServer(default=judge) as server:
        assert run_loop(ws, server.openai_base_url, "--max-experiments", "1") == 0
        before = ledger_state(ws)
        exp = ws / "experiments"
        url = ["--base-url", server.openai_base_url, *URL_ARGS]
        with read_only(exp):
            for argv in (
                ["report"],
                ["history"],
                ["eval", *url],
                ["run", *url],
                ["confirm", "--split", "sample"],
                ["attribute", *url],
            ):
                capsys.readouterr()
                code = main(["-w", str(ws), *argv])
                if code == 0 and argv[0] in ("report", "history"):
                    continue  # a reader may still read the ledger (SQLite's -shm file is there and readable)
                assert code == 2, argv
                err = one_line_error(capsys)
                assert str(exp) in err and "read-only file system" in err and "make it writable" in err, argv
    assert ledger_state(ws) == before


def test_a_refused_permission_on_the_lock_is_one_line(
    ws: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Root passes every permission check: the refusal a user would meet is injected where the file opens.
    lock = ws / "experiments" / "loop.lock"
    real_open = Path.open

    def refusing(self: Path, *args: Any, **kwargs: Any) -> Any:
        if self == lock:
            raise PermissionError(errno.EACCES, "Permission denied", str(self))
        return real_open(self, *args, **kwargs)

    monkeypatch.setattr(Path, "open", refusing)
    capsys.readouterr()
    assert main(["-w", str(ws), "run", "--base-url", "http://127.0.0.1:9/v1", *URL_ARGS]) == 2
    err = one_line_error(capsys)
    assert f"permission denied for {lock}" in err


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _corrupt_page(path: Path, table: str) -> None:
    """Overwrite the root page of ``table`` (a page inside the file, not the header) with garbage."""
    conn = sqlite3.connect(path)
    try:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        page_size = conn.execute("PRAGMA page_size").fetchone()[0]
        root_page = conn.execute("SELECT rootpage FROM sqlite_master WHERE name=?", (table,)).fetchone()[0]
    finally:
        conn.close()
    assert root_page > 1
    with path.open("r+b") as fh:
        fh.seek((root_page - 1) * page_size)
        fh.write(b"\xde\xad\xbe\xef" * (page_size // 4))


@pytest.mark.slow
@pytest.mark.parametrize("damage", ["page", "header"])
def test_a_corrupt_ledger_is_one_line_and_is_never_deleted(
    ws: Path, capsys: pytest.CaptureFixture[str], damage: str
) -> None:
    judge = FakeJudge(ws)
    with FakeLLMServer(default=judge) as server:
        assert run_loop(ws, server.openai_base_url, "--max-experiments", "1") == 0
        path = ws / "experiments" / "ledger.sqlite"
        if damage == "page":
            _corrupt_page(path, "runs")
        else:
            with path.open("r+b") as fh:
                fh.write(b"this is not sqlite at all")
        digest = _digest(path)
        url = ["--base-url", server.openai_base_url, *URL_ARGS]
        for argv in (["report"], ["history"], ["run", *url], ["run", "--resume", *url], ["attribute", *url]):
            capsys.readouterr()
            assert main(["-w", str(ws), *argv]) == 2, argv
            err = one_line_error(capsys)
            assert f"the ledger {path} is corrupt" in err and "restore it from a backup" in err, argv
            assert "move it" in err and "never deletes it" in err
        assert path.is_file() and _digest(path) == digest


@pytest.mark.slow
def test_a_corrupt_judge_call_cache_is_one_line_and_is_never_deleted(
    ws: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    judge = FakeJudge(ws)
    with FakeLLMServer(default=judge) as server:
        assert run_loop(ws, server.openai_base_url, "--max-experiments", "1") == 0
        path = ws / "experiments" / "cache.sqlite"
        _corrupt_page(path, "calls")
        digest = _digest(path)
        capsys.readouterr()
        assert main(["-w", str(ws), "eval", "--base-url", server.openai_base_url, *URL_ARGS]) == 2
        err = one_line_error(capsys)
        assert f"the judge-call cache {path} is corrupt" in err and "move it aside" in err
        assert path.is_file() and _digest(path) == digest
