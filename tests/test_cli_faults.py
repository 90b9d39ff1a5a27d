"""Bad values, slips of the hand and storage faults through the real command line: each is refused
in one line on stderr with a non-zero exit, no traceback, and nothing started or lost."""

from __future__ import annotations

from pathlib import Path

import pytest

from optimizer.cli import main
from tests.support.loop import make_workspace

# Connection refused at once: a command that got as far as judging fails fast (after creating its run).
DEAD_URL = "http://127.0.0.1:9/v1"
JUDGE = ["--provider", "openai", "--base-url", DEAD_URL, "--model", "fake-judge"]


@pytest.fixture(scope="module")
def sample_ws(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_workspace(tmp_path_factory.mktemp("faults"))


def runs_in(root: Path) -> int:
    from optimizer.ledger import Ledger

    path = root / "experiments" / "ledger.sqlite"
    if not path.is_file():
        return 0
    with Ledger.open_readonly(path) as led:
        return len(led.runs())


def one_line_error(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert err.strip().count("\n") == 0, err
    return err.strip()


@pytest.mark.parametrize(
    ("argv", "allowed"),
    [
        (["run", "--max-experiments", "0", *JUDGE], "at least 1"),
        (["run", "--max-experiments", "-3", *JUDGE], "at least 1"),
        (["run", "--max-experiments", "two", *JUDGE], "at least 1"),
        (["run", "--budget-usd", "-5", *JUDGE], "greater than 0"),
        (["run", "--budget-usd", "0", *JUDGE], "greater than 0"),
        (["run", "--budget-usd", "nan", *JUDGE], "greater than 0"),
        (["run", "--hours", "0", *JUDGE], "greater than 0"),
        (["run", "--hours", "-1", *JUDGE], "greater than 0"),
        (["run", "--patience", "0", *JUDGE], "at least 1"),
        (["run", "--replicates", "0", *JUDGE], "from 1 to 15"),
        (["run", "--replicates", "16", *JUDGE], "from 1 to 15"),
        (["run", "--concurrency", "0", *JUDGE], "from 1 to 256"),
        (["run", "--concurrency", "100000", *JUDGE], "from 1 to 256"),
        (["eval", "--concurrency", "100000", *JUDGE], "from 1 to 256"),
        (["eval", "--replicates", "0", *JUDGE], "from 1 to 15"),
        (["eval", "--limit", "0", *JUDGE], "at least 1"),
        (["attribute", "--budget-usd", "-1", *JUDGE], "greater than 0"),
        (["confirm", "--split", "sample", "--concurrency", "100000", *JUDGE], "from 1 to 256"),
    ],
)
def test_a_bad_value_is_refused_in_one_line_naming_the_allowed_range(
    sample_ws: Path, capsys: pytest.CaptureFixture[str], argv: list[str], allowed: str
) -> None:
    before = runs_in(sample_ws)
    capsys.readouterr()
    assert main(["-w", str(sample_ws), *argv]) == 2
    err = one_line_error(capsys)
    flag = next(a for a in argv[1:] if a.startswith("--") and a != "--split")
    assert f"argument {flag}:" in err and allowed in err
    assert runs_in(sample_ws) == before  # nothing started


@pytest.mark.parametrize(
    "argv",
    [
        ["run", "--max-experiment", "1", *JUDGE],  # started a real run before
        ["run", "--budget", "1", *JUDGE],
        ["eval", "--rep", "2", *JUDGE],
        ["devset", "list", "--work", "."],
    ],
)
def test_an_abbreviated_flag_is_refused(
    sample_ws: Path, capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    before = runs_in(sample_ws)
    capsys.readouterr()
    assert main(["-w", str(sample_ws), *argv]) == 2
    err = one_line_error(capsys)
    abbreviated = next(a for a in argv if a.startswith("--"))
    assert f"unrecognized arguments: {abbreviated}" in err
    assert runs_in(sample_ws) == before


def test_every_parser_refuses_abbreviations() -> None:
    import argparse

    from optimizer.cli import build_parser

    seen: list[argparse.ArgumentParser] = []

    def walk(parser: argparse.ArgumentParser) -> None:
        seen.append(parser)
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for child in action.choices.values():
                    walk(child)

    walk(build_parser())
    assert len(seen) > 15
    assert [p.prog for p in seen if p.allow_abbrev] == []


def test_replicates_bound_is_judge_toml_s() -> None:
    from optimizer.judge.prompts import JudgeSettings
    from optimizer.workspace.config import MAX_REPLICATES

    bounds = [getattr(m, "le", None) for m in JudgeSettings.model_fields["replicates"].metadata]
    assert MAX_REPLICATES in bounds


# -- judgeloop.toml ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "line", "expected"),
    [
        ("model", 'model = "caf\xe9"', "not UTF-8 text (byte 0xe9"),  # the file is written as Latin-1
        ("max_concurrency", "max_concurrency = 100000", "[judge.max_concurrency]"),
        ("patience", "patience = 0", "[loop.patience]"),
        (None, '[prices."fake-judge"]\ninput = -3.0', "[prices.fake-judge.input]"),
    ],
)
def test_a_bad_judgeloop_toml_is_one_line_naming_the_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], key: str | None, line: str, expected: str
) -> None:
    import re

    from optimizer.scaffold import init_workspace

    root = init_workspace(tmp_path / "ws", sample=False).root
    cfg = root / "judgeloop.toml"
    text = cfg.read_text(encoding="utf-8")
    if key is None:
        text += "\n" + line + "\n"
    else:
        text, n = re.subn(rf"(?m)^{key} = .*$", line, text, count=1)
        assert n == 1
    cfg.write_bytes(text.encode("latin-1"))
    capsys.readouterr()
    assert main(["-w", str(root), "devset", "list"]) == 2
    err = one_line_error(capsys)
    assert str(cfg) in err and expected in err


# -- judgeloop init ------------------------------------------------------------------------------


def test_init_onto_an_existing_file_is_refused_and_leaves_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "notes.txt"
    target.write_text("mine\n", encoding="utf-8")
    for path in (target, target / "ws"):
        capsys.readouterr()
        assert main(["init", str(path)]) == 2
        err = one_line_error(capsys)
        assert str(target) in err and "not a folder" in err
    assert target.read_text(encoding="utf-8") == "mine\n"


@pytest.mark.parametrize(
    ("provider", "env"), [("openai", "OPENAI_API_KEY"), ("anthropic", "ANTHROPIC_API_KEY")]
)
def test_a_run_without_the_judges_key_is_refused_before_it_creates_a_run_or_a_branch(
    sample_ws: Path,
    provider: str,
    env: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    import git

    monkeypatch.delenv(env, raising=False)
    repo = git.Repo(sample_ws)
    branches, head, runs = {b.name for b in repo.branches}, repo.head.commit.hexsha, runs_in(sample_ws)
    assert main(["-w", str(sample_ws), "run", "--provider", provider, "--max-experiments", "1"]) == 2
    assert env in one_line_error(capsys)
    assert {b.name for b in repo.branches} == branches and repo.head.commit.hexsha == head
    assert runs_in(sample_ws) == runs  # no empty run left in the ledger


def test_a_message_with_a_strategy_that_writes_its_own_is_refused_before_anything_starts(
    sample_ws: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # -m was silently dropped: the user's rationale went nowhere and a library run started.
    runs = runs_in(sample_ws)
    assert main(["-w", str(sample_ws), "run", "--strategy", "library", "-m", "my reason", *JUDGE]) == 2
    err = one_line_error(capsys)
    assert "-m/--message" in err and "--strategy manual" in err
    assert runs_in(sample_ws) == runs


# -- revisions git cannot resolve ----------------------------------------------------------------


@pytest.mark.parametrize("rev", ["HEAD@{1000}", "main@{yesterday}", "--all", "no-such-branch"])
@pytest.mark.parametrize("command", ["eval", "bias", "certify"])
def test_a_revision_git_cannot_resolve_is_one_line_naming_it(
    sample_ws: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    command: str,
    rev: str,
) -> None:
    """The workspace's reflog holds one entry made today, so git resolves neither the 1000th entry nor
    main as it was yesterday (it would only say how far the log goes back); each is refused in one line
    naming the revision, before anything is judged."""
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-not-a-real-key")
    # (`--` and `--rev=`: a revision spelled like an option stays the revision.)
    argv = ["eval", *JUDGE, f"--rev={rev}"] if command == "eval" else [command, *JUDGE, "--", rev]
    runs = runs_in(sample_ws)
    capsys.readouterr()
    assert main(["-w", str(sample_ws), *argv]) == 2
    err = one_line_error(capsys)
    assert f"unknown git revision {rev!r}" in err, err
    assert runs_in(sample_ws) == runs


def _git_state(root: Path) -> tuple[set[str], str, str]:
    import git

    repo = git.Repo(root)
    return {b.name for b in repo.branches}, repo.head.commit.hexsha, repo.active_branch.name


@pytest.mark.parametrize("strategy", ["agent", "reflect"])
def test_a_run_without_the_optimisers_key_leaves_no_ghost_run(
    sample_ws: Path, strategy: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 36 point 2: the optimiser's key was checked after the run's row, branch and checkout existed,
    so the refusal left a `running` run as the latest. Now nothing is made: branches, HEAD and the ledger's
    runs are as they were."""
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-not-a-real-key")  # the judge's key is there
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)  # the optimiser's (anthropic) is not
    before, runs = _git_state(sample_ws), runs_in(sample_ws)
    capsys.readouterr()
    assert main(["-w", str(sample_ws), "run", "--strategy", strategy, "--max-experiments", "1", *JUDGE]) == 2
    assert "ANTHROPIC_API_KEY" in one_line_error(capsys)
    assert _git_state(sample_ws) == before
    assert runs_in(sample_ws) == runs  # no run row, `running` or otherwise
