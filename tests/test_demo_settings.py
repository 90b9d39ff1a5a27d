"""What scripts/demo sets before it judges (tools/demo.py) and where its closing lines lead.

The whole demo is not run here (minutes of CPU judging): the settings are applied to a fresh
workspace exactly as the script applies them, and every judgeloop command the closing lines print is
parsed by judgeloop's own parser, so a renamed flag or command fails here, not in a user's shell."""

from __future__ import annotations

import shlex
from pathlib import Path

import git
import pytest

from optimizer.cli import build_parser
from optimizer.errors import UserError
from optimizer.judge.prompts import parse_settings
from optimizer.scaffold import init_workspace
from optimizer.workspace import gitops
from optimizer.workspace.config import load_config
from optimizer.workspace.paths import JUDGE_TOML
from optimizer.workspace.workspace import CONFIG_NAME
from tests.support.paths import REPO_ROOT
from tools.configedit import edited_judge_settings, set_judge_settings
from tools.demo import DEMO_CONFIG, DEMO_JUDGE_SETTINGS, configure_demo_workspace

DEMO_SCRIPT = REPO_ROOT / "scripts" / "demo"


def _judge_toml(root: Path) -> str:
    return (root / JUDGE_TOML).read_text(encoding="utf-8")


def test_the_demo_script_applies_the_settings_tested_here() -> None:
    text = DEMO_SCRIPT.read_text(encoding="utf-8")
    assert "from tools.demo import configure_demo_workspace" in text
    assert 'configure_demo_workspace(Path("."))' in text
    # Applied before the first judgement: the baseline is judged with the pinned settings too.
    assert text.index("configure_demo_workspace(") < text.index("\njudgeloop eval\n")


@pytest.mark.slow
def test_demo_workspace_sets_the_demo_judge_and_short_verdicts(tmp_path: Path) -> None:
    ws = init_workspace(tmp_path / "ws", sample=True)
    configure_demo_workspace(ws.root)

    cfg = load_config(ws.root / CONFIG_NAME)
    assert cfg.judge.local_threads is None  # sampling, not arithmetic, varies a run's verdicts
    assert (cfg.judge.provider, cfg.loop.policy, cfg.workspace.dev_split) == ("local", "paired", "demo")
    settings = parse_settings(_judge_toml(ws.root), JUDGE_TOML)
    assert settings.max_tokens == DEMO_JUDGE_SETTINGS["max_tokens"]
    assert settings.sampling().max_tokens == DEMO_JUDGE_SETTINGS["max_tokens"]  # what the provider is sent
    # Two commits, one file each, and a clean tree the loop accepts.
    with git.Repo(ws.root) as repo:
        last, before = repo.head.commit, repo.head.commit.parents[0]
        assert list(last.stats.files) == [JUDGE_TOML]
        assert list(before.stats.files) == [CONFIG_NAME]
    assert gitops.dirty_paths(ws.root) == []
    assert ("judge", "local_threads") not in DEMO_CONFIG


def test_demo_settings_are_idempotent(tmp_path: Path) -> None:
    ws = init_workspace(tmp_path / "ws")
    configure_demo_workspace(ws.root)
    with git.Repo(ws.root) as repo:
        head = repo.head.commit.hexsha
    configure_demo_workspace(ws.root)
    with git.Repo(ws.root) as repo:
        assert repo.head.commit.hexsha == head


def test_judge_setting_edit_writes_the_commented_key_in_place_and_keeps_the_rest() -> None:
    text = (REPO_ROOT / "prompts" / "judge.toml").read_text(encoding="utf-8")
    new = edited_judge_settings(text, {"temperature": 0.0, "max_tokens": 160})
    old_lines, new_lines = text.splitlines(), new.splitlines()
    assert len(old_lines) == len(new_lines)
    changed = [(a, b) for a, b in zip(old_lines, new_lines, strict=True) if a != b]
    assert [b for _, b in changed] == ["max_tokens = 160", "temperature = 0.0"]


@pytest.mark.parametrize(
    ("values", "message"),
    [({"max_tokens": 3}, r"\[max_tokens\]"), ({"temprature": 0.0}, r"\[temprature\]")],
)
def test_judge_setting_edit_refuses_what_judgeloop_would_refuse_and_writes_nothing(
    tmp_path: Path, values: dict[str, float], message: str
) -> None:
    ws = init_workspace(tmp_path / "ws")
    before = _judge_toml(ws.root)
    with pytest.raises(UserError, match=message):
        set_judge_settings(ws.root, values, message="x")
    assert _judge_toml(ws.root) == before
    assert gitops.dirty_paths(ws.root) == []


def test_judge_setting_edit_refuses_uncommitted_changes(tmp_path: Path) -> None:
    ws = init_workspace(tmp_path / "ws")
    mine = _judge_toml(ws.root) + "# my unsaved note\n"
    (ws.root / JUDGE_TOML).write_text(mine, encoding="utf-8")
    with pytest.raises(UserError, match="uncommitted changes"):
        set_judge_settings(ws.root, DEMO_JUDGE_SETTINGS, message="x")
    assert _judge_toml(ws.root) == mine


# ---------------------------------------------------------------- the closing lines


def _real_run_commands() -> list[list[str]]:
    """The judgeloop commands of the demo's closing "A real run" block, as argv lists."""
    text = DEMO_SCRIPT.read_text(encoding="utf-8")
    block = text[text.index("A real run needs three things") :]
    block = block[: block.index("\nTXT\n")]
    commands = []
    for line in block.splitlines():
        for part in line.split("#")[0].split("&&"):
            if part.strip().startswith("judgeloop "):
                commands.append(shlex.split(part)[1:])
    return commands


def test_demo_closing_lines_lead_through_import_and_plan_to_a_run() -> None:
    commands = _real_run_commands()
    names = [argv[0] for argv in commands]
    assert names.index("init") < names.index("devset") < names.index("plan") < names.index("run")
    assert commands[names.index("devset")][:2] == ["devset", "import"]
    text = DEMO_SCRIPT.read_text(encoding="utf-8")
    block = text[text.index("A real run needs three things") :]
    assert "ANTHROPIC_API_KEY" in block and "OPENAI_API_KEY" in block
    for argv in (commands[names.index("plan")], commands[names.index("run")]):
        assert "--provider" in argv and "--model" in argv and "--budget-usd" in argv


def test_every_command_the_closing_lines_print_parses() -> None:
    parser = build_parser()
    commands = _real_run_commands()
    assert len(commands) >= 5
    for argv in commands:
        args = parser.parse_args(argv)  # an unknown command or flag exits 2 here
        assert args.command == argv[0]
