"""Commands find their workspace from a subfolder, as git finds its repository; `-w` means exactly
the folder it names; `init` is untouched. All through the real CLI."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from optimizer.cli import main
from optimizer.scaffold import init_workspace
from optimizer.workspace.workspace import CONFIG_NAME, Workspace, find_root


@pytest.fixture(scope="module")
def sample_ws(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return init_workspace(tmp_path_factory.mktemp("discovery") / "ws", sample=True).root


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.slow
@pytest.mark.parametrize("sub", ["", "prompts", "devset/sample", "devset/sample/sandbox", "experiments"])
def test_a_command_run_in_a_subfolder_works_on_the_workspace_above(
    sample_ws: Path, sub: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = sample_ws / sub
    assert folder.is_dir()
    expected_list = _run(["-w", str(sample_ws), "devset", "list"], capsys)
    expected_verify = _run(["-w", str(sample_ws), "devset", "verify", "sample"], capsys)
    assert expected_list[0] == 0 and "sample" in expected_list[1] and expected_verify[0] == 0
    monkeypatch.chdir(folder)
    assert _run(["devset", "list"], capsys) == expected_list
    assert _run(["devset", "verify", "sample"], capsys) == expected_verify
    assert find_root(Path.cwd()) == sample_ws.resolve()


def test_paths_on_the_command_line_stay_relative_to_the_current_folder(
    sample_ws: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # As with git: the workspace is found above, but a path the user types means where they are.
    here = sample_ws / "prompts"
    (here / "results").mkdir()
    monkeypatch.chdir(here)
    code, out, _ = _run(
        ["score", "results", "--split", "sample"], capsys
    )  # ws/prompts/results, not ws/results
    assert code == 0 and "missing 88" in out
    (here / "results").rmdir()
    monkeypatch.chdir(sample_ws)
    code, _, err = _run(["score", "results", "--split", "sample"], capsys)
    assert code == 2 and "results is not a folder" in err


def test_the_nearest_workspace_wins(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    outer = init_workspace(tmp_path / "outer", sample=False).root
    inner = init_workspace(outer / "experiments" / "inner", sample=False).root
    monkeypatch.chdir(inner / "prompts")
    assert Workspace.open().root == inner
    monkeypatch.chdir(outer / "prompts")
    assert Workspace.open().root == outer
    capsys.readouterr()


def test_w_means_exactly_that_folder_and_names_the_workspace_above(
    sample_ws: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    code, out, err = _run(["devset", "list", "-w", str(sample_ws / "prompts")], capsys)
    assert code == 2 and out == "" and err.count("\n") == 1 and "Traceback" not in err
    assert f"{sample_ws / 'prompts'} is not a judgeloop workspace" in err
    assert f"pass -w {sample_ws}" in err
    # Even from inside the workspace, an explicit -w elsewhere is not overridden by the one found.
    monkeypatch.chdir(sample_ws / "prompts")
    other = tmp_path / "not-a-ws"
    other.mkdir()
    code, _, err = _run(["-w", str(other), "devset", "list"], capsys)
    assert code == 2 and f"{other} is not a judgeloop workspace" in err and "judgeloop init DIR" in err


def test_no_workspace_above_is_one_line_saying_what_to_do(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    deep = tmp_path / "a" / "b"
    deep.mkdir(parents=True)
    (tmp_path / "a" / CONFIG_NAME).mkdir()  # a folder of that name is not a workspace's config
    monkeypatch.chdir(deep)
    for argv in (["devset", "list"], ["report"], ["run"], ["tui"]):
        code, out, err = _run(argv, capsys)
        assert code == 2 and out == "", argv
        assert err.count("\n") == 1 and "Traceback" not in err
        assert (
            f"no judgeloop workspace here: neither {deep.resolve()} nor any folder above it holds {CONFIG_NAME}"
            in err
        )
        assert "`judgeloop init DIR`" in err and "-w DIR" in err


def test_a_deleted_current_folder_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    gone = tmp_path / "gone"
    gone.mkdir()
    monkeypatch.chdir(gone)
    os.rmdir(gone)
    code, _, err = _run(["devset", "list"], capsys)
    assert code == 2 and err.count("\n") == 1 and "the current folder no longer exists" in err


def test_init_is_not_affected_by_discovery(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # Outside any workspace, init works (it needs none) and creates DIR where the user is.
    monkeypatch.chdir(tmp_path)
    assert _run(["init", "fresh"], capsys)[0] == 0
    assert (tmp_path / "fresh" / CONFIG_NAME).is_file()
    # Inside one, DIR is still relative to the current folder, never to the workspace found above.
    ws = init_workspace(tmp_path / "ws", sample=False).root
    scratch = ws / "experiments" / "scratch"
    scratch.mkdir()
    monkeypatch.chdir(scratch)
    assert _run(["init", "nested"], capsys)[0] == 0
    assert (scratch / "nested" / CONFIG_NAME).is_file()
    assert not (ws / "nested").exists()


def test_a_config_found_above_without_git_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # A stray judgeloop.toml above is found but never used as a workspace without its git repository.
    (tmp_path / CONFIG_NAME).write_text("", encoding="utf-8")
    (tmp_path / "sub").mkdir()
    monkeypatch.chdir(tmp_path / "sub")
    code, out, err = _run(["devset", "list"], capsys)
    assert code == 2 and out == "" and err.count("\n") == 1
    assert f"{tmp_path.resolve()} has {CONFIG_NAME} but is not a git repository" in err
