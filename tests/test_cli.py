"""The command line's own conventions (the shell over the engine)."""

from __future__ import annotations

from pathlib import Path

import pytest

from optimizer.cli import main
from optimizer.workspace.workspace import Workspace


def test_workspace_option_goes_before_or_after_the_command(
    empty_workspace: Workspace,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    root = str(empty_workspace.root)
    monkeypatch.chdir(tmp_path)  # not a workspace: only -w can make these work
    assert main(["-w", root, "devset", "list"]) == 0
    before = capsys.readouterr().out
    assert main(["devset", "list", "-w", root]) == 0
    assert capsys.readouterr().out == before and before.startswith("no splits")
    assert main(["--workspace", root, "report"]) == 2  # reached the workspace: it has no run yet
    assert "not a judgeloop workspace" not in capsys.readouterr().err
    assert main(["devset", "list"]) == 2
    assert "no judgeloop workspace here" in capsys.readouterr().err
