"""The pieces of scripts/demo: the judgeloop.toml edit it commits (tools.configedit), the in-use
check before it deletes a previous demo folder (tools.inuse), and the script's refusals. The whole
demo is not run here (minutes of CPU judging); these refusals end before any judging starts."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import git
import pytest

from optimizer.errors import UserError
from optimizer.scaffold import init_workspace
from optimizer.workspace import gitops
from optimizer.workspace.config import DEFAULT_CONFIG_TOML, load_config
from optimizer.workspace.workspace import CONFIG_NAME
from tests.support.paths import REPO_ROOT
from tools.configedit import edited_config, set_config
from tools.inuse import ensure_unused, holders

DEMO_VALUES: dict[tuple[str, str], str | int | float | bool] = {
    ("workspace", "dev_split"): "demo",
    ("loop", "policy"): "paired",
    ("judge", "provider"): "local",
}


def _head(root: Path) -> str:
    with git.Repo(root) as repo:
        return str(repo.head.commit.hexsha)


# ---------------------------------------------------------------- the judgeloop.toml edit


def test_edit_keeps_every_comment_and_changes_only_the_named_values() -> None:
    new = edited_config(DEFAULT_CONFIG_TOML, DEMO_VALUES)
    old_lines, new_lines = DEFAULT_CONFIG_TOML.splitlines(), new.splitlines()
    assert len(new_lines) == len(old_lines)
    changed = [(a, b) for a, b in zip(old_lines, new_lines, strict=True) if a != b]
    # provider = "local" is already the default: only the split and the policy lines change
    assert [b.split("#")[0].strip() for _, b in changed] == ['dev_split = "demo"', 'policy = "paired"']
    for a, b in changed:  # each changed line keeps its comment, in the same column
        assert a[a.index("#") :] == b[b.index("#") :] and a.index("#") == b.index("#")
    data = tomllib.loads(new)
    assert data["workspace"]["dev_split"] == "demo"
    assert data["loop"]["policy"] == "paired"
    assert data["judge"]["provider"] == "local"
    assert data["loop"]["alpha"] == tomllib.loads(DEFAULT_CONFIG_TOML)["loop"]["alpha"]


def test_edit_adds_a_missing_section_and_key() -> None:
    new = edited_config('# mine\n[judge]\nmodel = "smollm2-135m"  # keep me\n', DEMO_VALUES)
    assert "# mine" in new and "# keep me" in new
    data = tomllib.loads(new)
    assert data == {
        "judge": {"model": "smollm2-135m", "provider": "local"},
        "workspace": {"dev_split": "demo"},
        "loop": {"policy": "paired"},
    }


def test_edit_handles_an_inline_table() -> None:
    new = edited_config('workspace = { dev_split = "sample" }\n', {("workspace", "dev_split"): "demo"})
    assert tomllib.loads(new)["workspace"]["dev_split"] == "demo"


@pytest.mark.parametrize(
    ("text", "values", "message"),
    [
        (DEFAULT_CONFIG_TOML, {("loop", "policy"): "bogus"}, "[loop.policy]"),
        (DEFAULT_CONFIG_TOML, {("loop", "polcy"): "paired"}, "[loop.polcy]"),
        (DEFAULT_CONFIG_TOML, {("judge", "max_concurrency"): 0}, "[judge.max_concurrency]"),
        ('workspace = "demo"\n', {("workspace", "dev_split"): "demo"}, "[workspace] is not a table"),
        ("[workspace]\ndev_split = { a = 1 }\n", {("workspace", "dev_split"): "demo"}, "not a single value"),
        ("[workspace\n", {("workspace", "dev_split"): "demo"}, "not valid TOML"),
    ],
)
def test_edit_refuses_what_judgeloop_would_refuse(
    text: str, values: dict[tuple[str, str], str | int | float | bool], message: str
) -> None:
    with pytest.raises(UserError, match=message.replace("[", r"\[").replace("]", r"\]")):
        edited_config(text, values)


def test_set_config_commits_the_file_alone_and_leaves_the_tree_clean_for_the_loop(tmp_path: Path) -> None:
    ws = init_workspace(tmp_path / "ws")
    before = _head(ws.root)
    # The user's unrelated staged work stays staged and out of the config commit.
    rubric = ws.root / "prompts" / "rubric.md"
    rubric.write_text(rubric.read_text(encoding="utf-8") + "\nmy edit\n", encoding="utf-8")
    with git.Repo(ws.root) as repo:
        repo.git.add("prompts/rubric.md")

    sha = set_config(ws.root, DEMO_VALUES, message="demo: split, policy and judge for the next steps")

    assert sha is not None and sha == _head(ws.root) and sha != before
    with git.Repo(ws.root) as repo:
        commit = repo.commit(sha)
        assert list(commit.stats.files) == [CONFIG_NAME]
        assert commit.message.strip() == "demo: split, policy and judge for the next steps"
        assert commit.parents[0].hexsha == before
        assert repo.git.diff("--cached", "--name-only") == "prompts/rubric.md"
    cfg = load_config(ws.root / CONFIG_NAME)
    assert (cfg.workspace.dev_split, cfg.loop.policy, cfg.judge.provider) == ("demo", "paired", "local")
    # Only the loop's own file is dirty: `judgeloop run` accepts this tree.
    assert gitops.dirty_paths(ws.root) == ["prompts/rubric.md"]


def test_set_config_twice_makes_no_second_commit(tmp_path: Path) -> None:
    ws = init_workspace(tmp_path / "ws")
    assert set_config(ws.root, DEMO_VALUES, message="first") is not None
    head = _head(ws.root)
    assert set_config(ws.root, DEMO_VALUES, message="second") is None
    assert _head(ws.root) == head


def test_set_config_refuses_uncommitted_config_changes_and_writes_nothing(tmp_path: Path) -> None:
    ws = init_workspace(tmp_path / "ws")
    path = ws.root / CONFIG_NAME
    mine = path.read_text(encoding="utf-8") + "# my unsaved note\n"
    path.write_text(mine, encoding="utf-8")
    head = _head(ws.root)
    with pytest.raises(UserError, match="uncommitted changes"):
        set_config(ws.root, DEMO_VALUES, message="demo")
    assert path.read_text(encoding="utf-8") == mine
    assert _head(ws.root) == head


def test_set_config_refuses_an_invalid_value_and_writes_nothing(tmp_path: Path) -> None:
    ws = init_workspace(tmp_path / "ws")
    text = (ws.root / CONFIG_NAME).read_text(encoding="utf-8")
    head = _head(ws.root)
    with pytest.raises(UserError, match="the file was not changed"):
        set_config(ws.root, {("loop", "policy"): "bogus"}, message="demo")
    assert (ws.root / CONFIG_NAME).read_text(encoding="utf-8") == text
    assert _head(ws.root) == head
    assert not gitops.dirty_paths(ws.root)


def test_set_config_refuses_a_symlinked_config(tmp_path: Path) -> None:
    ws = init_workspace(tmp_path / "ws")
    elsewhere = tmp_path / "elsewhere.toml"
    elsewhere.write_text(DEFAULT_CONFIG_TOML, encoding="utf-8")
    (ws.root / CONFIG_NAME).unlink()
    (ws.root / CONFIG_NAME).symlink_to(elsewhere)
    with git.Repo(ws.root) as repo:
        repo.git.add(CONFIG_NAME)
        repo.index.commit("link")
    with pytest.raises(UserError, match="not a regular file"):
        set_config(ws.root, DEMO_VALUES, message="demo")
    assert elsewhere.read_text(encoding="utf-8") == DEFAULT_CONFIG_TOML


# ---------------------------------------------------------------- the in-use check


@contextmanager
def _process(
    cwd: Path, code: str = "import time; print('ready', flush=True); time.sleep(60)"
) -> Iterator[int]:
    """A Python child started in ``cwd`` running ``code`` (which prints "ready"), always killed after."""
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=cwd, env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready"
        yield proc.pid
    finally:
        proc.kill()
        proc.wait(timeout=10)


needs_proc = pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs Linux /proc")


@needs_proc
def test_a_process_working_in_the_folder_is_found_and_refused(tmp_path: Path) -> None:
    folder = tmp_path / "demo"
    (folder / "sub").mkdir(parents=True)
    with _process(folder / "sub") as pid:
        found = holders(folder)
        assert [(h.pid, h.how) for h in found] == [(pid, "has its working folder in it")]
        with pytest.raises(
            UserError, match=rf"process {pid} \(.*python.*\) has its working folder in it; close it"
        ):
            ensure_unused(folder, what="delete the previous demo")
    assert holders(folder) == []
    ensure_unused(folder, what="delete the previous demo")  # nobody left: allowed


@needs_proc
def test_a_process_with_a_file_open_inside_is_found(tmp_path: Path) -> None:
    folder = tmp_path / "demo"
    folder.mkdir()
    data = folder / "ledger.sqlite"
    data.write_text("x", encoding="utf-8")
    code = f"import time; f = open({str(data)!r}); print('ready', flush=True); time.sleep(60)"
    with _process(tmp_path, code) as pid:
        assert [(h.pid, h.how) for h in holders(folder)] == [(pid, f"has {data} open")]


@needs_proc
def test_a_sibling_folder_sharing_the_name_prefix_is_not_the_folder(tmp_path: Path) -> None:
    (tmp_path / "demo").mkdir()
    (tmp_path / "demo-2").mkdir()
    with _process(tmp_path / "demo-2"):
        assert holders(tmp_path / "demo") == []


@needs_proc
def test_a_folder_reached_through_a_link_is_checked_where_it_really_is(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    with _process(tmp_path / "real") as pid:
        assert [h.pid for h in holders(tmp_path / "link")] == [pid]


@needs_proc
def test_a_live_run_lock_is_named(tmp_path: Path) -> None:
    ws = init_workspace(tmp_path / "ws")
    code = (
        "from optimizer.workspace.workspace import Workspace, command_lock\n"
        f"with command_lock(Workspace.open({str(ws.root)!r}), 'run'):\n"
        "    import time; print('ready', flush=True); time.sleep(60)\n"
    )
    with (
        _process(tmp_path, code) as pid,
        pytest.raises(UserError, match=rf"judgeloop run, pid {pid} is working"),
    ):
        ensure_unused(ws.root, what="delete the previous demo")
    ensure_unused(ws.root, what="delete the previous demo")  # the lock died with its process


# ---------------------------------------------------------------- scripts/demo's refusals


def _demo(folder: Path) -> subprocess.CompletedProcess[str]:
    # Ends at the folder check, before any judging; the bound only guards against a regression.
    return subprocess.run(
        ["bash", str(REPO_ROOT / "scripts" / "demo"), str(folder)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


@needs_proc
def test_demo_refuses_to_delete_its_previous_folder_while_a_process_works_in_it(tmp_path: Path) -> None:
    folder = tmp_path / "judgeloop-demo"
    init_workspace(folder)
    (folder / ".judgeloop-demo").touch()  # made by an earlier demo
    with _process(folder / "prompts") as pid:
        result = _demo(folder)
    assert result.returncode == 2, result.stdout + result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith(f"demo: cannot delete the previous demo {folder}: process {pid} (")
    assert "close it (or cd out of the folder)" in last
    assert (folder / ".judgeloop-demo").is_file() and (folder / CONFIG_NAME).is_file()
    assert "judgeloop init" not in result.stdout


def test_demo_refuses_a_folder_it_did_not_make(tmp_path: Path) -> None:
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "notes.txt").write_text("keep", encoding="utf-8")
    result = _demo(folder)
    assert result.returncode == 2
    assert "was not made by this script" in result.stderr
    assert (folder / "notes.txt").read_text(encoding="utf-8") == "keep"
