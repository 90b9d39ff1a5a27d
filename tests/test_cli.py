"""The command line's own conventions (the shell over the engine)."""

from __future__ import annotations

from pathlib import Path

import pytest

from optimizer.cli import build_parser, main
from optimizer.workspace import Workspace


def test_workspace_option_goes_before_or_after_the_command(
    empty_workspace: Workspace, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
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
    assert "is not a judgeloop workspace" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["devset", "list"], "."),
        (["-w", "A", "devset", "list"], "A"),
        (["devset", "list", "-w", "B"], "B"),
        (["-w", "A", "eval", "-w", "B"], "B"),  # the nearer one wins, as for any repeated option
    ],
)
def test_workspace_value_wherever_it_is_given(argv: list[str], expected: str) -> None:
    assert build_parser().parse_args(argv).workspace == expected
