"""Shared set-up of the harness-judge tests: a workspace whose judge is a fake CLI reached through a
state server (`tests.support.harness_state`), a private temp folder for the sandboxes, and the checks
that find what the CLIs left behind (processes by their marker, sandbox folders)."""

from __future__ import annotations

import json
import os
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from optimizer.workspace.config import load_config
from tests.support.config import write_config
from tests.support.harness_state import StateServer
from tests.support.loop import commit_all

SUPPORT = Path(__file__).parent
FAKE_CLI = SUPPORT / "fake_harness_cli.py"
HOSTILE_CLI = SUPPORT / "hostile_harness_cli.py"


@dataclass(frozen=True)
class HarnessState:
    """The fakes' state folder, the URL it is served at, and the folder sandboxes are made in."""

    folder: Path
    url: str
    temp: Path


@pytest.fixture
def harness_state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[HarnessState]:
    """A served state folder; sandboxes in a temp folder of this test's own (``TMPDIR``, inherited by
    subprocesses); the interpreter of this test first on PATH (the fakes run ``env python3``)."""
    folder = tmp_path / "state"
    folder.mkdir()
    temp = tmp_path / "tmp"
    temp.mkdir()
    monkeypatch.setenv("TMPDIR", str(temp))
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    monkeypatch.setenv(
        "PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', os.defpath)}"
    )
    with StateServer(folder) as server:
        yield HarnessState(folder, server.url, temp)
    # Nothing a fake started outlives its test (bounded: they sleep 120 s at most anyway).
    for pid in survivors(server.url):
        os.kill(pid, 9)


def configure(root: Path, state: HarnessState, *, program: Path = FAKE_CLI, **judge: Any) -> None:
    """The workspace's judge: ``program`` (the fake CLI) as a claude-format harness (prompt as its last
    argument), confined by bubblewrap unless ``sandbox`` says otherwise."""
    config = load_config(root / "judgeloop.toml")
    settings: dict[str, Any] = {
        "provider": "command",
        "model": "",
        "harness": "claude",
        "command": [str(program), "--state", state.url, "--format", "claude", "{{PROMPT}}"],
        "timeout_s": 20.0,
        "max_retries": 0,
        "max_concurrency": 4,
        "pass_env": ["FAKE_HARNESS_PASS"],
        **judge,
    }
    loop = config.loop.model_copy(update={"infra_retry_rounds": 0})
    write_config(
        root, config.model_copy(update={"judge": config.judge.model_copy(update=settings), "loop": loop})
    )
    commit_all(root, "harness judge")


def records(state: HarnessState, name: str = "invocations.jsonl") -> list[dict[str, Any]]:
    """The JSON lines the fakes appended to ``name`` in the state folder."""
    log = state.folder / name
    if not log.exists():
        return []
    return [json.loads(line) for line in log.read_text(encoding="utf-8").splitlines() if line.strip()]


def survivors(marker: str) -> list[int]:
    """Live processes (not zombies) whose command line holds ``marker``, as this host sees them."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().decode(errors="replace")
            status = (entry / "status").read_text()
        except OSError:
            continue
        if marker in cmdline and "\nState:\tZ" not in status:
            found.append(int(entry.name))
    return found


def sandbox_folders(state: HarnessState) -> list[Path]:
    """The sandbox folders left in this test's temp folder."""
    return sorted(state.temp.glob("judgeloop-harness-*"))
