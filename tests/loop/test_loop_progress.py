"""The progress line of `judgeloop run` and `judgeloop eval`, through a real pty (the terminal case) and
through pipes (the quiet case). A small terminal emulator (carriage return, erase-line, newline) turns
the pty's bytes into the lines a person would see at the end."""

from __future__ import annotations

import fcntl
import os
import re
import struct
import subprocess
import sys
import termios
from pathlib import Path

import pytest

from tests.support.fakeserver import FakeLLMServer
from tests.support.loop import FakeJudge
from tests.support.paths import REPO_ROOT

COLUMNS = 80
CLEAR = "\r\x1b[K"


def _args(ws: Path, server: FakeLLMServer, *command: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "optimizer.cli",
        *command,
        "-w",
        str(ws),
        "--provider",
        "openai",
        "--base-url",
        server.openai_base_url,
        "--model",
        "fake-judge",
        "--concurrency",
        "4",
    ]


def _env() -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "TERM": "xterm"}
    env.pop("COLUMNS", None)
    return env


def _in_pty(args: list[str]) -> tuple[int, str]:
    """Run ``args`` with stdout and stderr on one pty of COLUMNS x 24; (exit code, every byte it wrote)."""
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, COLUMNS, 0, 0))
    proc = subprocess.Popen(
        args, cwd=REPO_ROOT, env=_env(), stdin=subprocess.DEVNULL, stdout=slave, stderr=slave
    )
    os.close(slave)
    chunks: list[bytes] = []
    try:
        while True:
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: the child closed its end
                break
            if not data:
                break
            chunks.append(data)
        rc = proc.wait(timeout=120)
    finally:
        os.close(master)
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
    return rc, b"".join(chunks).decode("utf-8", "replace")


def _screen(raw: str) -> list[str]:
    """The lines left on a terminal: "\\r" goes back to column 0, "ESC[K" erases to the end of the line."""
    lines: list[str] = []
    line: list[str] = []
    col = 0
    i = 0
    text = raw.replace("\r\n", "\n")
    while i < len(text):
        if text.startswith("\x1b[K", i):
            del line[col:]
            i += 3
            continue
        ch = text[i]
        if ch == "\r":
            col = 0
        elif ch == "\n":
            lines.append("".join(line))
            line, col = [], 0
        else:
            if col < len(line):
                line[col] = ch
            else:
                line.append(ch)
            col += 1
        i += 1
    if line:
        lines.append("".join(line))
    return lines


@pytest.mark.slow
def test_run_in_a_terminal_shows_a_live_progress_line_erased_before_each_status_line(ws: Path) -> None:
    with FakeLLMServer(default=FakeJudge(ws, delay_s=0.02)) as server:
        rc, raw = _in_pty([*_args(ws, server, "run"), "--strategy", "library", "--max-experiments", "1"])
    assert rc == 0, raw
    drawn = [seg.split("\r")[0].split("\n")[0] for seg in raw.split(CLEAR)[1:]]
    progress = [seg for seg in drawn if seg.startswith("judged ")]
    assert progress, "no progress line was drawn"
    assert any(
        re.search(r"judged \d+/32 items · \d+ calls \+ \d+ cached · \$\d\.\d{4} · \d+s elapsed", seg)
        for seg in progress
    )
    assert any(" · ETA " in seg or "…" in seg for seg in progress)
    assert all(len(seg) <= COLUMNS - 1 for seg in progress), "a progress line wider than the terminal"
    screen = _screen(raw)
    # Nothing of the progress line is left, and every status line starts at column 0 on its own line.
    assert not [line for line in screen if re.search(r"judged \d+/\d+ items", line)], screen
    assert any(
        line.startswith("experiment ") and "(baseline): evaluating 32 items" in line for line in screen
    )
    assert any(line.startswith("  baseline kappa=") for line in screen)
    assert any(re.match(r"run \S+ finished: reached --max-experiments 1", line) for line in screen), screen


@pytest.mark.slow
def test_run_and_eval_through_pipes_print_no_terminal_codes_and_sparse_progress(ws: Path) -> None:
    with FakeLLMServer(default=FakeJudge(ws, delay_s=0.01)) as server:
        run = subprocess.run(
            [*_args(ws, server, "run"), "--strategy", "library", "--max-experiments", "1"],
            cwd=REPO_ROOT,
            env=_env(),
            capture_output=True,
            text=True,
            timeout=120,
        )
        ev = subprocess.run(
            _args(ws, server, "eval"), cwd=REPO_ROOT, env=_env(), capture_output=True, text=True, timeout=120
        )
    for proc in (run, ev):
        assert proc.returncode == 0, proc.stderr
        assert "\r" not in proc.stderr + proc.stdout and "\x1b" not in proc.stderr + proc.stdout
        # Progress never mixes with the command's own output.
        assert not re.search(r"judged \d+/\d+ items", proc.stdout)
    # Plain lines at about every tenth of an evaluation, never one per item.
    assert 0 < sum(line.startswith("judged ") for line in ev.stderr.splitlines()) <= 12
    finals = [line for line in ev.stderr.splitlines() if line.startswith("judged 32/32 items")]
    assert len(finals) == 1
    assert "balanced accuracy" in ev.stdout
