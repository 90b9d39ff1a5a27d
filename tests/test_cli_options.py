"""The command line's surface: every option explained, `--version`, `-w` anywhere, `tui --screen` names.

The help test walks the real parser (`build_parser`, every subparser recursively), so an option
added later without help, or without its default, fails here.
"""

from __future__ import annotations

import argparse
import importlib.metadata
from collections.abc import Iterator
from pathlib import Path

import pytest

from optimizer.cli import build_parser, main
from optimizer.workspace.workspace import Workspace

# The actions argparse adds itself; their help is argparse's.
_OWN = (argparse._HelpAction,)


def _walk(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                yield from _walk(child, (*path, name))


def _leaves() -> list[tuple[str, ...]]:
    """Every command a user can run, as its words (`("devset", "list")`)."""
    return [
        path
        for path, p in _walk(build_parser())
        if path and not any(isinstance(a, argparse._SubParsersAction) for a in p._actions)
    ]


def _in_required_group(parser: argparse.ArgumentParser, action: argparse.Action) -> bool:
    return any(g.required and action in g._group_actions for g in parser._mutually_exclusive_groups)


def test_every_option_of_every_command_says_what_it_does_and_its_default() -> None:
    missing: list[str] = []
    no_default: list[str] = []
    walked = list(_walk(build_parser()))
    for path, parser in walked:
        where = " ".join(("judgeloop", *path))
        for action in parser._actions:
            if isinstance(action, _OWN):
                continue
            name = "/".join(action.option_strings) or action.metavar or action.dest
            text = action.help
            if not text or text == argparse.SUPPRESS or not text.strip():
                missing.append(f"{where} {name}")
                continue
            if not action.option_strings or isinstance(action, argparse._VersionAction):
                continue  # a positional is required or says its default itself (`verify [NAME]`)
            if _in_required_group(parser, action):
                continue  # one of --manifest/--all/--rebuild-ahd must be given: there is no default
            if "default" not in text and "(required)" not in text:
                no_default.append(f"{where} {name}")
            elif (
                action.default not in (None, False, argparse.SUPPRESS)
                and "%(default)s" not in text
                and str(action.default) not in text
            ):
                no_default.append(f"{where} {name} (default {action.default!r} not shown)")
    assert len(walked) > 15  # the walk really went into every (sub)command
    assert missing == []
    assert no_default == []


def test_a_helpless_option_added_later_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    # The check above must see options deep in nested subcommands: add one there and it fails.
    import optimizer.cli as cli

    real = cli.build_parser

    def with_a_bare_flag() -> argparse.ArgumentParser:
        parser = real()
        devset = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[
            "devset"
        ]
        show = next(a for a in devset._actions if isinstance(a, argparse._SubParsersAction)).choices["show"]
        show.add_argument("--bare")
        return parser

    monkeypatch.setattr(cli, "build_parser", with_a_bare_flag)
    monkeypatch.setitem(globals(), "build_parser", with_a_bare_flag)
    with pytest.raises(AssertionError, match="judgeloop devset show --bare"):
        test_every_option_of_every_command_says_what_it_does_and_its_default()


def test_help_of_every_command_renders(capsys: pytest.CaptureFixture[str]) -> None:
    for path in [(), *_leaves(), ("devset",)]:
        with pytest.raises(SystemExit) as exit_:
            main([*path, "-h"])
        assert exit_.value.code == 0
        out = capsys.readouterr().out
        assert out.startswith("usage: judgeloop")
        assert "-w DIR, --workspace DIR" in out, path  # every level accepts -w, `devset` included


def test_version_is_the_installed_package_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out == f"judgeloop {importlib.metadata.version('judgeloop')}\n"


# -- -w before or after any (sub)command -----------------------------------------------------------

# The smallest valid command line of each command (init takes its folder, not a workspace).
ARGS: dict[tuple[str, ...], list[str]] = {
    ("devset", "import"): ["{tmp}/no-such-source", "--name", "x", "--all"],
    ("devset", "verify"): [],
    ("devset", "show"): ["sample", "abc"],
    ("devset", "list"): [],
    ("score",): ["{tmp}/results", "--split", "dev"],
    ("eval",): [],
    ("run",): [],
    ("decide",): ["1", "keep"],
    ("report",): [],
    ("attribute",): [],
    ("history",): [],
    ("confirm",): ["--split", "held"],
    ("reviews",): [],
    ("label-fix",): ["abc", "--label", "success", "--reason", "seen on the last screen"],
    ("label-adopt",): [],
    ("bias",): ["--split", "held"],
    ("mcp",): ["--budget-usd", "1"],
    ("selftest",): [],
    ("certify",): ["--no-bias"],
    ("plan",): ["--budget-usd", "1"],
    ("tui",): ["--screenshot", "{tmp}/shot.svg", "--size", "80x24"],
    ("runs", "prune"): [],
    ("hook", "pre-tool-use"): [],
    ("completion",): [],
    ("cascade", "calibrate"): [],
}


def test_the_table_below_covers_every_command() -> None:
    assert set(ARGS) | {("init",)} == set(_leaves())


def _positions(words: tuple[str, ...], rest: list[str], ws: str) -> list[list[str]]:
    """-w before the command, after each of its words (`devset -w DIR list`), and at the end."""
    lines = [["-w", ws, *words, *rest]]
    lines += [[*words[:i], "-w", ws, *words[i:], *rest] for i in range(1, len(words) + 1)]
    lines.append([*words, *rest, "--workspace", ws])
    return lines


@pytest.mark.parametrize("words", list(ARGS), ids=" ".join)
def test_workspace_option_in_every_position_reaches_the_workspace(words: tuple[str, ...]) -> None:
    for argv in _positions(words, ARGS[words], "/some/ws"):
        assert build_parser().parse_args(argv).workspace == "/some/ws", argv


@pytest.mark.slow
@pytest.mark.parametrize("words", list(ARGS), ids=" ".join)
def test_every_position_of_w_and_a_subfolder_give_the_same_outcome(
    words: tuple[str, ...],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from optimizer.scaffold import init_workspace

    ws = init_workspace(tmp_path / "ws", sample=False).root
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    rest = [a.replace("{tmp}", str(tmp_path)) for a in ARGS[words]]
    outcomes: dict[str, tuple[int, str, str]] = {}
    monkeypatch.chdir(outside)  # not a workspace: only -w can find it
    for argv in _positions(words, rest, str(ws)):
        code = main(argv)
        out, err = capsys.readouterr()
        outcomes[" ".join(argv)] = (code, out, err)
    monkeypatch.chdir(ws / "prompts")  # no -w: found from the subfolder
    code = main([*words, *rest])
    outcomes["(in ws/prompts) " + " ".join(words)] = (code, *capsys.readouterr())
    first = next(iter(outcomes.values()))
    assert all(o == first for o in outcomes.values()), outcomes
    assert "not a judgeloop workspace" not in first[2] and "no judgeloop workspace" not in first[2]
    assert "Traceback" not in first[2]


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["devset", "list"], None),  # not given: found from the current folder
        (["-w", "A", "devset", "list"], "A"),
        (["devset", "-w", "A", "list"], "A"),
        (["devset", "list", "-w", "B"], "B"),
        (["-w", "A", "devset", "-w", "B", "list"], "B"),  # the nearer one wins, as for any repeated option
        (["devset", "-w", "A", "list", "-w", "B"], "B"),
        (["-w", "A", "eval", "-w", "B"], "B"),
    ],
)
def test_workspace_value_wherever_it_is_given(argv: list[str], expected: str | None) -> None:
    assert build_parser().parse_args(argv).workspace == expected


# -- tui --screen -----------------------------------------------------------------------------------


def test_tui_screen_lists_the_tuis_views_in_its_help(capsys: pytest.CaptureFixture[str]) -> None:
    from tui.app import VIEWS

    tui = dict(_walk(build_parser()))[("tui",)]
    screen = next(a for a in tui._actions if "--screen" in a.option_strings)
    assert list(screen.choices or ()) == list(VIEWS)
    with pytest.raises(SystemExit):
        main(["tui", "-h"])
    out = " ".join(capsys.readouterr().out.split())  # argparse wraps the help
    assert f"the view to open: {', '.join(VIEWS)} (default: history)" in out


def test_an_unknown_tui_screen_is_one_line_naming_the_valid_ones(
    empty_workspace: Workspace, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tui.app import VIEWS

    shot = tmp_path / "shot.svg"
    assert (
        main(["tui", "-w", str(empty_workspace.root), "--screen", "histroy", "--screenshot", str(shot)]) == 2
    )
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and "Traceback" not in err
    assert "invalid choice: 'histroy'" in err
    assert all(f"'{name}'" in err for name in VIEWS)
    assert not shot.exists()


def test_the_parser_reads_the_screen_names_only_for_tui() -> None:
    # --screen's names come from tui.app, but building the parser (every command pays for it) must
    # not import Textual; `tui --screen NAME` checks the name against the TUI's own list.
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from optimizer.cli import build_parser\n"
        "build_parser().parse_args(['devset', 'list'])\n"
        "loaded = sorted(m for m in sys.modules if m.split('.')[0] in ('textual', 'tui'))\n"
        "assert not loaded, loaded\n"
        "assert build_parser().parse_args(['tui', '--screen', 'item']).screen == 'item'\n"
        "assert 'tui.app' in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
