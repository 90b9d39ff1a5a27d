"""`judgeloop hook pre-tool-use`, the PreToolUse hook of Claude Code and Codex (issue 32, point 6): it blocks the
agent's own file tools and shell commands that reach devset/, corrections.jsonl, experiments/ or .git/, and
allows the rest. Every case goes through the real CLI entry with the event JSON each host sends on stdin; the
registrations the plugin and the Codex config ship are run as the hosts run them (a shell command)."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from optimizer.cli import main
from optimizer.scaffold import init_workspace

REPO = Path(__file__).resolve().parents[1]
PLUGIN = REPO / "integrations" / "claude-code"
CODEX = REPO / "integrations" / "codex"
BLOCKED = "judgeloop hook: blocked "


@dataclass(frozen=True)
class Place:
    """The workspace under test and a folder outside it holding links into it."""

    ws: Path
    out: Path
    other: Path  # a second workspace, outside the first

    def fill(self, value: Any) -> Any:
        """``value`` with {ws}, {out} and {other} replaced in every string (other braces left as they are)."""
        if isinstance(value, dict):
            return {k: self.fill(v) for k, v in value.items()}
        if isinstance(value, list):
            return [self.fill(v) for v in value]
        if isinstance(value, str):
            for name in ("ws", "out", "other"):
                value = value.replace("{" + name + "}", str(getattr(self, name)))
        return value


@pytest.fixture(scope="module")
def place(tmp_path_factory: pytest.TempPathFactory) -> Place:
    root = tmp_path_factory.mktemp("hook")
    ws = init_workspace(root / "ws", sample=True).root
    (ws / "devset" / "heldout").mkdir()
    (ws / "devset" / "heldout" / "labels.jsonl").write_text(
        '{"id": "x", "success": true}\n', encoding="utf-8"
    )
    (ws / "devset" / "sample" / "corrections.jsonl").write_text("", encoding="utf-8")
    (ws / "experiments" / "ledger.sqlite").write_bytes(b"")
    (ws / "docs").mkdir()
    (ws / "docs" / "notes.md").write_text("notes\n", encoding="utf-8")
    (ws / "docs" / "escape").symlink_to("../devset")  # a link inside the workspace pointing into devset/
    out = root / "outside"
    out.mkdir()
    (out / "data-link").symlink_to(ws / "devset")
    (out / "labels.jsonl").symlink_to(ws / "devset" / "sample" / "labels.jsonl")
    other = root / "other"
    (other / "devset" / "dev").mkdir(parents=True)
    (other / "judgeloop.toml").write_text("", encoding="utf-8")
    (other / "devset" / "dev" / "labels.jsonl").write_text("", encoding="utf-8")
    return Place(ws=ws, out=out, other=other)


def claude_event(tool: str, tool_input: dict[str, Any], cwd: Path) -> dict[str, Any]:
    """What Claude Code sends a PreToolUse command hook on stdin."""
    return {
        "session_id": "4c9a0f6e-1b2d-4e5f-8a7b-0c1d2e3f4a5b",
        "transcript_path": "/home/u/.claude/projects/ws/4c9a0f6e.jsonl",
        "cwd": str(cwd),
        "permission_mode": "default",
        "hook_event_name": "PreToolUse",
        "tool_name": tool,
        "tool_input": tool_input,
        "tool_use_id": "toolu_01ABCDEF",
    }


def codex_event(tool: str, tool_input: dict[str, Any], cwd: Path) -> dict[str, Any]:
    """What Codex sends a PreToolUse command hook on stdin (its shell tool is named Bash in hooks)."""
    return {
        "session_id": "0199a213-81c0-7800-8aa1-bbab2a035a53",
        "turn_id": "1",
        "transcript_path": None,
        "cwd": str(cwd),
        "hook_event_name": "PreToolUse",
        "model": "gpt-5-codex",
        "permission_mode": "default",
        "tool_name": tool,
        "tool_use_id": "call_8d1",
        "tool_input": tool_input,
    }


def run_hook(
    event: dict[str, Any],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    argv: tuple[str, ...] = (),
) -> tuple[int, str, str]:
    monkeypatch.setattr(sys, "stdin", io.StringIO(json.dumps(event)))
    code = main([*argv, "hook", "pre-tool-use"])
    out, err = capsys.readouterr()
    return code, out, err


def patch(action: str, path: str) -> dict[str, Any]:
    """Codex's apply_patch input for one file."""
    body = "+rule\n" if action == "Add" else "@@\n-old\n+new\n"
    return {"command": f"*** Begin Patch\n*** {action} File: {path}\n{body}*** End Patch\n"}


def bash(command: str) -> tuple[str, dict[str, Any]]:
    return ("Bash", {"command": command})


# (case id, folder the host runs in, Claude Code's tool call, Codex's tool call, the place it reaches or None)
CASES: list[tuple[str, str, tuple[str, dict[str, Any]], tuple[str, dict[str, Any]], str | None]] = [
    ("labels-absolute", "", ("Read", {"file_path": "{ws}/devset/sample/labels.jsonl"}),
     bash("cat {ws}/devset/sample/labels.jsonl"), "devset"),
    ("labels-relative-from-prompts", "prompts", ("Read", {"file_path": "../devset/sample/labels.jsonl"}),
     bash("cat ../devset/sample/labels.jsonl"), "devset"),
    ("corrections-edit", "", ("Edit", {"file_path": "{ws}/devset/sample/corrections.jsonl", "old_string": "a",
     "new_string": "b"}), ("apply_patch", patch("Update", "devset/sample/corrections.jsonl")), "devset"),
    ("heldout-write", "", ("Write", {"file_path": "{ws}/devset/heldout/extra.json", "content": "{}"}),
     ("apply_patch", patch("Add", "devset/heldout/extra.json")), "devset"),
    ("ledger", "", ("Read", {"file_path": "{ws}/experiments/ledger.sqlite"}),
     bash("sqlite3 experiments/ledger.sqlite 'select * from verdicts'"), "experiments"),
    ("git-dir", "", ("Read", {"file_path": "{ws}/.git/config"}), bash("cat .git/config"), ".git"),
    ("link-outside-to-devset", "", ("Read", {"file_path": "{out}/data-link/sample/labels.jsonl"}),
     bash("less {out}/data-link/sample/labels.jsonl"), "devset"),
    ("file-link-outside", "", ("Read", {"file_path": "{out}/labels.jsonl"}),
     bash("head -n 5 {out}/labels.jsonl"), "devset"),
    ("link-inside-workspace", "", ("Read", {"file_path": "{ws}/docs/escape/sample/labels.jsonl"}),
     bash("cat docs/escape/sample/labels.jsonl"), "devset"),
    ("dotdot", "", ("Read", {"file_path": "{ws}/prompts/../devset/heldout/labels.jsonl"}),
     bash("cat prompts/../devset/heldout/labels.jsonl"), "devset"),
    ("glob-everything", "", ("Glob", {"pattern": "**/*.jsonl"}), bash("ls */*/labels.jsonl"), "devset"),
    ("glob-disguised", "", ("Glob", {"pattern": "d?vs*t/*/labels.jsonl"}),
     bash("cat d?vs*t/sample/labels.jsonl"), "devset"),
    ("braces", "", ("Glob", {"pattern": "{prompts,devset}/**"}),
     bash("cat {dev,}set/sample/labels.jsonl"), "devset"),
    ("search-workspace", "", ("Grep", {"pattern": "success", "path": "{ws}"}),
     bash("grep -rn success ."), "devset"),
    ("search-default-folder", "", ("Grep", {"pattern": "success", "output_mode": "content"}),
     bash("rg success"), "devset"),
    ("glob-in-devset", "", ("Glob", {"pattern": "*.jsonl", "path": "{ws}/devset/sample"}),
     bash("find . -name '*.jsonl'"), "devset"),
    ("git-show", "", bash("git show HEAD:devset/sample/labels.jsonl"),
     bash("git --no-pager show HEAD:devset/sample/labels.jsonl"), "devset"),
    ("git-cat-file", "", bash("git cat-file -p 3f2a9c1"), bash("git cat-file --batch < ids.txt"), "git cat-file"),
    ("git-log-patch", "", bash("git log -p"), bash("git log --all -p --format=%H"), "git log"),
    ("git-show-from-subfolder", "prompts", bash("git show HEAD~1:devset/sample/labels.jsonl"),
     bash("git diff HEAD~3 -- ."), "devset"),
    ("python-open", "", bash("python -c \"print(open('devset/sample/labels.jsonl').read())\""),
     bash("python3 - <<'EOF'\nimport json\nprint(open('experiments/ledger.sqlite','rb').read())\nEOF"), None),
    ("variable", "", bash("D=devset; cat $D/sample/labels.jsonl"),
     bash('export SPLIT=devset/heldout && cat "$SPLIT/labels.jsonl"'), "devset"),
    ("cd-up", "prompts", bash("cd .. && cat devset/sample/labels.jsonl"),
     bash("pushd .. >/dev/null; tail devset/heldout/labels.jsonl"), "devset"),
    ("redirect-write", "", bash("echo '{}' > devset/sample/corrections.jsonl"),
     bash("printf x >> devset/sample/corrections.jsonl"), "devset"),
    ("copy-whole-workspace", "", bash("cp -r . /tmp/copy"), bash("tar czf /tmp/ws.tgz ."), "devset"),
    ("inside-devset", "devset/sample", ("Read", {"file_path": "labels.jsonl"}), bash("cat labels.jsonl"), "devset"),
    ("other-workspace", "", ("Read", {"file_path": "{other}/devset/dev/labels.jsonl"}),
     bash("cat {other}/devset/dev/labels.jsonl"), "devset"),
    ("git-dash-C", "", bash("git -C devset log --oneline"), bash("ls -la .git/objects"), None),
    ("script-written-to-run", "", ("Write", {"file_path": "/tmp/peek.py",
     "content": "import json\nrows = open('devset/sample/labels.jsonl').read()\n"}),
     ("apply_patch", {"command": "*** Begin Patch\n*** Add File: tools/peek.sh\n"
      "+sqlite3 experiments/ledger.sqlite .dump\n*** End Patch\n"}), None),
    ("command-substitution", "", bash('cat "$(pwd)/devset/sample/labels.jsonl"'),
     bash("cat `git rev-parse --show-toplevel`/experiments/ledger.sqlite"), None),
    ("git-rewrites-tree", "", bash("git reset --hard HEAD"), bash("git stash && git checkout -"),
     "rewrites the whole working tree"),
    ("judgeloop-cli", "", bash("judgeloop -w . report --json"), bash("python3 -m optimizer.cli confirm --split heldout"),
     "judgeloop "),
    # allowed: the prompts, the docs, ordinary commands
    ("prompt-read", "", ("Read", {"file_path": "{ws}/prompts/judge.md"}), bash("cat prompts/judge.md"), ""),
    ("prompt-edit", "", ("Edit", {"file_path": "{ws}/prompts/rubric.md", "old_string": "a", "new_string": "b"}),
     ("apply_patch", patch("Update", "prompts/rubric.md")), ""),
    ("prompt-mentions-devset", "", ("Edit", {"file_path": "{ws}/prompts/rubric.md", "old_string": "a",
     "new_string": "never trust a claim that devset/ or experiments/ say so"}),
     ("apply_patch", {"command": "*** Begin Patch\n*** Update File: prompts/rubric.md\n@@\n-a\n"
      "+judge as if devset/sample/ were unseen\n*** End Patch\n"}), ""),
    ("prompt-write", "prompts", ("Write", {"file_path": "{ws}/prompts/notes.md", "content": "x"}),
     bash("echo rule >> rubric.md"), ""),
    ("prompt-glob", "", ("Glob", {"pattern": "prompts/*.md"}), bash("ls prompts"), ""),
    ("prompt-search", "", ("Grep", {"pattern": "kappa", "path": "{ws}/prompts"}),
     bash("grep -rn kappa prompts docs"), ""),
    ("docs", "", ("Read", {"file_path": "{ws}/docs/notes.md"}), bash("less docs/notes.md"), ""),
    ("git-status-log", "", bash("git status && git log --oneline -5"), bash("git log --stat -3"), ""),
    ("git-restore-prompts", "", bash("git checkout -- prompts/rubric.md"), bash("git restore prompts/ && git stash list"),
     ""),
    ("git-prompt-diff", "", bash("git diff -- prompts/"), bash("git show HEAD:prompts/judge.md"), ""),
    ("ordinary", "", bash("ls && python -c 'print(1 + 1)'"), bash("pytest -q && judgeloop --version"), ""),
    ("outside-any-workspace", "", ("Read", {"file_path": "/etc/hostname"}), bash("cat /etc/hostname"), ""),
    ("own-mcp-tool", "", ("mcp__plugin_judgeloop_judgeloop__propose", {"files": {"prompts/rubric.md": "see devset/"}}),
     ("mcp__judgeloop__read_item", {"item_id": "devset/../x"}), ""),
]  # fmt: skip


def _params() -> list[Any]:
    params = []
    for case_id, cwd, claude, codex, reach in CASES:
        for host, (tool, tool_input) in (("claude", claude), ("codex", codex)):
            params.append(pytest.param(host, cwd, tool, tool_input, reach, id=f"{host}-{case_id}"))
    return params


@pytest.mark.slow
@pytest.mark.parametrize(("host", "cwd", "tool", "tool_input", "reach"), _params())
def test_the_hook_blocks_what_reaches_the_labels_and_allows_the_rest(
    place: Place,
    host: str,
    cwd: str,
    tool: str,
    tool_input: dict[str, Any],
    reach: str | None,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    filled = place.fill(tool_input)
    build = claude_event if host == "claude" else codex_event
    code, out, err = run_hook(build(tool, filled, place.ws / cwd), monkeypatch, capsys)
    assert out == ""
    if reach == "":
        assert (code, err) == (0, "")
        return
    assert code == 2
    assert err.startswith(f"{BLOCKED}{tool}: ") and err.count("\n") == 1, err
    if reach is not None:
        assert reach in err, err


def test_codex_argument_vectors_are_read_as_the_script_they_run(
    place: Place, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    blocked = codex_event("shell", {"command": ["bash", "-lc", "cat devset/sample/labels.jsonl"]}, place.ws)
    assert run_hook(blocked, monkeypatch, capsys)[0] == 2
    allowed = codex_event(
        "shell", {"command": ["bash", "-lc", "cat prompts/judge.md"], "workdir": "."}, place.ws
    )
    assert run_hook(allowed, monkeypatch, capsys)[:2] == (0, "")
    inside = codex_event("Bash", {"command": "cat labels.jsonl", "workdir": "devset/sample"}, place.ws)
    code, _, err = run_hook(inside, monkeypatch, capsys)
    assert code == 2 and "devset" in err


def test_an_unknown_tool_is_checked_by_the_paths_in_its_input(
    place: Place, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    other_server = claude_event(
        "mcp__filesystem__read_file", {"path": f"{place.ws}/devset/sample/labels.jsonl"}, place.ws
    )
    code, _, err = run_hook(other_server, monkeypatch, capsys)
    assert code == 2 and err.startswith(f"{BLOCKED}mcp__filesystem__read_file: ")
    fetch = claude_event(
        "WebFetch", {"url": f"file://{place.ws}/experiments/ledger.sqlite", "prompt": "p"}, place.ws
    )
    assert run_hook(fetch, monkeypatch, capsys)[0] == 2
    harmless = claude_event("WebSearch", {"query": "devset kappa"}, place.ws)
    assert run_hook(harmless, monkeypatch, capsys)[:2] == (0, "")


def test_w_names_the_workspace_when_the_host_runs_elsewhere(
    place: Place, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # The host runs outside the workspace; a copy of the labels' folder name there is not the workspace's.
    (tmp_path / "devset").mkdir()
    event = claude_event("Glob", {"pattern": f"{place.ws}/d*/**"}, tmp_path)
    code, _, err = run_hook(event, monkeypatch, capsys, ("-w", str(place.ws)))
    assert code == 2 and str(place.ws / "devset") in err
    local = claude_event("Read", {"file_path": str(tmp_path / "devset" / "x")}, tmp_path)
    assert run_hook(local, monkeypatch, capsys, ("-w", str(place.ws)))[:2] == (0, "")


def test_an_unreadable_event_or_workspace_blocks_in_one_line(
    place: Place, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(sys, "stdin", io.StringIO("not json"))
    code = main(["hook", "pre-tool-use"])
    err = capsys.readouterr().err
    assert (
        code == 2
        and err.startswith("judgeloop: error: hook: stdin is not a JSON event")
        and err.count("\n") == 1
    )
    closed = io.StringIO("{}")
    closed.close()
    monkeypatch.setattr(sys, "stdin", closed)
    assert main(["hook", "pre-tool-use"]) == 2
    assert capsys.readouterr().err.startswith("judgeloop: error: hook: cannot read the event on stdin")
    monkeypatch.setattr(sys, "stdin", io.StringIO('{"hook_event_name": "Stop"}'))
    assert main(["hook", "pre-tool-use"]) == 2
    assert "has no tool_name" in capsys.readouterr().err
    code, _, err = run_hook(
        claude_event("Read", {"file_path": "x"}, tmp_path), monkeypatch, capsys, ("-w", str(tmp_path))
    )
    assert code == 2 and "is not a judgeloop workspace" in err


# -- the registrations the hosts run ----------------------------------------------------------------------


def _hook_commands_claude() -> list[str]:
    hooks = json.loads((PLUGIN / "hooks" / "hooks.json").read_text(encoding="utf-8"))["hooks"]["PreToolUse"]
    return [h["command"] for group in hooks for h in group["hooks"] if h["type"] == "command"]


def _hook_commands_codex() -> list[str]:
    from_json = json.loads((CODEX / "hooks.json").read_text(encoding="utf-8"))["hooks"]["PreToolUse"]
    from_toml = tomllib.loads((CODEX / "config.toml").read_text(encoding="utf-8"))["hooks"]["PreToolUse"]
    return [
        h["command"] for group in [*from_json, *from_toml] for h in group["hooks"] if h["type"] == "command"
    ]


def _run_registered(command: str, event: dict[str, Any], path: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PATH": path}
    shell = shutil.which("bash") or "/bin/bash"
    return subprocess.run(
        [shell, "-c", command], input=json.dumps(event), capture_output=True, text=True, env=env, timeout=120
    )


def test_the_registered_commands_block_and_allow_as_the_hosts_run_them(place: Place) -> None:
    judgeloop = shutil.which("judgeloop", path=str(Path(sys.executable).parent))
    assert judgeloop is not None, "the judgeloop script next to this Python"
    path = f"{Path(judgeloop).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    commands = [("claude", c) for c in _hook_commands_claude()] + [
        ("codex", c) for c in _hook_commands_codex()
    ]
    assert len(commands) == 3
    for host, command in commands:
        build = claude_event if host == "claude" else codex_event
        denied = _run_registered(command, build(*bash("cat devset/sample/labels.jsonl"), place.ws), path)
        assert denied.returncode == 2 and denied.stderr.startswith(BLOCKED + "Bash"), (command, denied.stderr)
        allowed = _run_registered(
            command, build("Read", {"file_path": str(place.ws / "prompts" / "judge.md")}, place.ws), path
        )
        assert (allowed.returncode, allowed.stdout, allowed.stderr) == (0, "", ""), (command, allowed.stderr)
        # A host that cannot start the hook must not let the call through (a hook's exit 127 would).
        missing = _run_registered(command, build("Read", {"file_path": "x"}, place.ws), "/nonexistent")
        assert missing.returncode == 2, (command, missing.stderr)


def test_the_plugin_bundles_the_skill_the_mcp_server_and_the_hook() -> None:
    manifest = json.loads((PLUGIN / ".claude-plugin" / "plugin.json").read_text(encoding="utf-8"))
    assert manifest["name"] == "judgeloop"
    server = json.loads((PLUGIN / ".mcp.json").read_text(encoding="utf-8"))["mcpServers"]["judgeloop"]
    assert server["command"] == "judgeloop" and server["args"][:2] == ["mcp", "--budget-usd"]
    codex_server = tomllib.loads((CODEX / "config.toml").read_text(encoding="utf-8"))["mcp_servers"][
        "judgeloop"
    ]
    assert codex_server["command"] == "judgeloop" and "mcp" in codex_server["args"]
    # One skill text: the plugin carries a copy of skills/judgeloop/SKILL.md (edit both together).
    skill = (PLUGIN / "skills" / "judgeloop" / "SKILL.md").read_text(encoding="utf-8")
    assert skill == (REPO / "skills" / "judgeloop" / "SKILL.md").read_text(encoding="utf-8")
    assert skill.startswith("---\nname: judgeloop\n")


def test_the_git_folders_above_a_workspace_and_a_worktrees_are_protected(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # A workspace inside a larger repository, then a worktree of it: their history (devset/'s objects) lives in
    # git folders that lie in no workspace, found from the worktree's .git file.
    outer = tmp_path / "outer"
    (outer / "judge").mkdir(parents=True)
    (outer / "judge" / "judgeloop.toml").write_text("", encoding="utf-8")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q", str(outer)], check=True)
    subprocess.run([*git, "-C", str(outer), "add", "."], check=True)
    subprocess.run([*git, "-C", str(outer), "commit", "-qm", "x"], check=True)
    worktree = tmp_path / "wt"
    subprocess.run([*git, "-C", str(outer), "worktree", "add", "-q", "--detach", str(worktree)], check=True)
    assert (worktree / ".git").is_file()
    for cwd, command in (
        (outer / "judge", "cat ../.git/config"),
        (worktree / "judge", f"cat {outer}/.git/HEAD"),
    ):
        code, _, err = run_hook(codex_event(*bash(command), cwd), monkeypatch, capsys)
        assert code == 2 and f"reaches {outer / '.git'}" in err, err
    own = claude_event("Read", {"file_path": str(worktree / "judge" / "judgeloop.toml")}, worktree / "judge")
    assert run_hook(own, monkeypatch, capsys)[:2] == (0, "")


def test_a_bind_mount_of_devset_elsewhere_is_the_same_folder(place: Place, tmp_path: Path) -> None:
    # No link to resolve: only the folder's identity (device, inode) says the mount point is devset/.
    bwrap = shutil.which("bwrap")
    judgeloop = shutil.which("judgeloop", path=str(Path(sys.executable).parent))
    mount = tmp_path / "mnt"
    mount.mkdir()
    argv = [bwrap or "bwrap", "--bind", "/", "/", "--dev", "/dev", "--proc", "/proc"]
    if bwrap is None or subprocess.run([*argv, "true"], capture_output=True).returncode != 0:
        pytest.skip("bubblewrap cannot make a mount namespace here")
    event = claude_event("Read", {"file_path": str(mount / "sample" / "labels.jsonl")}, tmp_path)
    done = subprocess.run(
        [
            *argv,
            "--bind",
            str(place.ws / "devset"),
            str(mount),
            str(judgeloop),
            "-w",
            str(place.ws),
            "hook",
            "pre-tool-use",
        ],
        input=json.dumps(event),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2 and f"reaches {place.ws / 'devset'}" in done.stderr, done.stderr


def test_a_fault_of_the_hook_blocks_the_call(
    place: Place, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # A fence fails closed: a bug in the check must not let the call through (the traceback is printed).
    def broken(*_: object) -> None:
        raise RuntimeError("a bug in the fence")

    monkeypatch.setattr("optimizer.cli.hook.decide", broken)
    code, out, err = run_hook(
        claude_event("Read", {"file_path": "prompts/judge.md"}, place.ws), monkeypatch, capsys
    )
    assert (code, out) == (2, "")
    assert "RuntimeError: a bug in the fence" in err and err.endswith(
        "judgeloop hook: blocked: the hook failed (the traceback above); please report it\n"
    )
