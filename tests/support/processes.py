"""A CLI command killed with ``kill -9`` at a chosen moment, as a crash or a user's SIGKILL would."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable, Sequence

from tests.support.paths import REPO_ROOT

CLI = ("-m", "optimizer.cli")


def killed_cli(args: Sequence[str], until: Callable[[], object], *, launcher: Sequence[str] = CLI) -> None:
    """Run ``python <launcher> <args>`` against this checkout, call ``until`` (it waits for the moment to
    kill, failing the test if it never comes), then SIGKILL the child; it is never left running."""
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    proc = subprocess.Popen(
        [sys.executable, *launcher, *args],
        cwd=REPO_ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        until()
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
    assert proc.returncode == -signal.SIGKILL, (
        f"the child ended by itself (exit {proc.returncode}) before the kill"
    )
