from __future__ import annotations

from pathlib import Path
from typing import cast

import pytest
from git.objects.base import IndexObject

from optimizer.cli import main
from optimizer.errors import UserError
from optimizer.workspace.workspace import Workspace, repo_at


def test_init_creates_git_workspace_with_initial_commit(empty_workspace: Workspace) -> None:
    root = empty_workspace.root
    assert (root / "judgeloop.toml").is_file()
    assert (root / "prompts").is_dir()
    assert (root / "experiments" / "README.md").is_file()
    with repo_at(root) as repo:
        assert not repo.is_dirty(untracked_files=True)
        assert cast(str, repo.head.commit.message).startswith("judgeloop: new workspace")
        tracked = {cast(IndexObject, e).path for e in repo.head.commit.tree.traverse()}
    assert "experiments/README.md" in tracked


def test_experiments_folder_is_ignored_except_readme(empty_workspace: Workspace) -> None:
    (empty_workspace.experiments_dir / "ledger.sqlite").write_bytes(b"x")
    with repo_at(empty_workspace.root) as repo:
        assert not repo.is_dirty(untracked_files=True)


def test_open_refuses_a_folder_that_is_not_a_workspace(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="not a judgeloop workspace"):
        Workspace.open(tmp_path)


def test_cli_reports_non_workspace_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["devset", "verify", "-w", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and "not a judgeloop workspace" in err


def test_init_refuses_a_non_empty_folder(tmp_path: Path) -> None:
    (tmp_path / "x").write_text("keep me")
    with pytest.raises(UserError, match="not empty"):
        from optimizer.scaffold import init_workspace

        init_workspace(tmp_path)
    assert (tmp_path / "x").read_text() == "keep me"


@pytest.mark.slow
def test_engine_does_not_import_textual() -> None:
    import subprocess
    import sys

    code = (
        "import sys, pkgutil, importlib, optimizer\n"
        "for m in pkgutil.walk_packages(optimizer.__path__, 'optimizer.'):\n"
        '    if m.name.endswith(".__main__"): continue\n'
        "    importlib.import_module(m.name)\n"
        "bad = [m for m in sys.modules if m == 'textual' or m.startswith('textual.')]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
