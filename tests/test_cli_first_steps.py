"""First steps through the real command line (issue 36 point 8): `init` without --sample, a config value
of the wrong type, "did you mean" on typos, an example in every command's -h, shell completion."""

from __future__ import annotations

import argparse
import tomllib
from pathlib import Path

import pytest

from optimizer.cli import build_parser, main


def _one_line(err: str) -> str:
    assert "Traceback" not in err and err.strip().count("\n") == 0, err
    return err.strip()


def test_init_without_sample_names_no_missing_split_and_suggests_the_import(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["init", str(tmp_path / "ws")]) == 0
    out = capsys.readouterr().out
    assert "devset import" in out and "devset verify" not in out
    config = tomllib.loads((tmp_path / "ws" / "judgeloop.toml").read_text(encoding="utf-8"))
    assert "dev_split" not in config["workspace"]  # no split named that does not exist
    assert main(["-w", str(tmp_path / "ws"), "devset", "list"]) == 0  # and the config is valid


def test_init_with_sample_still_names_its_split(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["init", str(tmp_path / "ws"), "--sample"]) == 0
    assert "devset verify" in capsys.readouterr().out
    config = tomllib.loads((tmp_path / "ws" / "judgeloop.toml").read_text(encoding="utf-8"))
    assert config["workspace"]["dev_split"] == "sample"


@pytest.mark.parametrize(
    ("section", "line", "named"),
    [
        ("loop", 'alpha = "0.1"', "alpha must be a number"),
        ("judge", 'max_concurrency = "4"', "max_concurrency must be a whole number"),
        ("judge", "max_concurrency = 2.5", "max_concurrency must be a whole number"),
        ("judge", "max_concurrency = true", "max_concurrency must be a whole number"),
        ("judge", 'batch_cold = "yes"', "batch_cold must be true or false"),
    ],
)
@pytest.mark.slow
def test_a_config_value_of_the_wrong_type_is_refused_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], section: str, line: str, named: str
) -> None:
    assert main(["init", str(tmp_path / "ws"), "--sample"]) == 0
    cfg = tmp_path / "ws" / "judgeloop.toml"
    text = cfg.read_text(encoding="utf-8")
    key = line.split(" = ")[0]
    # The key's default line (if any) out, the wrong-typed one in.
    text = "\n".join(x for x in text.splitlines() if not x.startswith(f"{key} = ")) + "\n"
    cfg.write_text(text.replace(f"[{section}]\n", f"[{section}]\n{line}\n", 1), encoding="utf-8")
    capsys.readouterr()
    assert main(["-w", str(tmp_path / "ws"), "devset", "list"]) == 2
    err = _one_line(capsys.readouterr().err)
    assert named in err and "judgeloop.toml" in err


@pytest.mark.parametrize(
    ("argv", "suggested"),
    [
        (["rnu"], "`run`"),
        (["histroy"], "`history`"),
        (["devset", "lst"], "`list`"),
        (["run", "--max-experimnts", "2"], "`--max-experiments`"),
        (["devset", "import", "x", "--name", "d", "--all", "--lnk"], "`--link`"),
        (["plan", "--budget-usd", "1", "--replicate", "2"], "`--replicates`"),
    ],
)
def test_a_typo_gets_a_did_you_mean(
    argv: list[str], suggested: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    err = _one_line(capsys.readouterr().err)
    assert f"(did you mean {suggested}?)" in err


def test_nothing_close_gets_no_guess(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["zzzzqqq"]) == 2
    assert "did you mean" not in _one_line(capsys.readouterr().err)


def _parsers(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> list[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    found = [(path, parser)]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                found += _parsers(child, (*path, name))
    return found


def test_every_commands_help_ends_with_an_example(capsys: pytest.CaptureFixture[str]) -> None:
    commands = [path for path, _ in _parsers(build_parser()) if path]
    assert len(commands) > 20
    for path in commands:
        with pytest.raises(SystemExit):
            main([*path, "-h"])
        out = capsys.readouterr().out
        assert "examples:\n  judgeloop " in out, path
        examples = out.split("examples:\n", 1)[1]
        assert f"judgeloop {' '.join(path)}" in examples, path


def test_completion_prints_bash_code_that_completes_judgeloop(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["completion", "bash"]) == 0
    out = capsys.readouterr().out
    assert "complete " in out and "judgeloop" in out and "_ARGCOMPLETE" in out
