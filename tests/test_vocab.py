"""Every list of names a user or the ledger sees is `optimizer.vocab`'s: the CLI's choices, the config's
validation, the ledger's CHECK constraints, the strategy registry and the TUI's lists."""

from __future__ import annotations

import argparse
import re
import sqlite3
import sys
from pathlib import Path
from typing import get_args

import pytest

from optimizer import vocab
from optimizer.cli import build_parser
from optimizer.events import DecisionRecorded, PassProgress, RunStatusChanged, StageChanged
from optimizer.ledger import Ledger, RunSpec
from optimizer.loop.strategies import FACTORIES
from optimizer.workspace.config import LoopSection, OptimizerSection


def _option(parser: argparse.ArgumentParser, command: str, flag: str) -> argparse.Action:
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return next(a for a in sub.choices[command]._actions if flag in a.option_strings)


def test_the_clis_choices_are_the_vocabulary() -> None:
    parser = build_parser()
    assert tuple(_option(parser, "run", "--strategy").choices or ()) == vocab.RUN_STRATEGIES
    assert tuple(_option(parser, "run", "--policy").choices or ()) == vocab.POLICIES


def test_the_configs_validation_is_the_vocabulary() -> None:
    assert get_args(OptimizerSection.model_fields["strategy"].annotation) == vocab.STRATEGIES
    assert get_args(LoopSection.model_fields["policy"].annotation) == vocab.POLICIES


@pytest.mark.parametrize("name", vocab.STRATEGIES)
def test_the_config_accepts_each_strategy_and_the_registry_builds_it(name: vocab.StrategyName) -> None:
    assert OptimizerSection(strategy=name).strategy == name
    assert tuple(FACTORIES) == vocab.STRATEGIES


def test_the_config_refuses_a_name_outside_the_vocabulary() -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="'agent', 'reflect', 'library' or 'memory'"):
        OptimizerSection(strategy="manual")  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match="'adaptive', 'paired' or 'literal'"):
        LoopSection(policy="bogus")  # type: ignore[arg-type]


def _check_sets(path: Path) -> dict[tuple[str, str], tuple[str, ...]]:
    """(table, column) -> the values its CHECK (column IN (...)) allows, read from the schema."""
    conn = sqlite3.connect(path)
    try:
        rows = conn.execute("SELECT name, sql FROM sqlite_master WHERE type = 'table'").fetchall()
    finally:
        conn.close()
    out = {}
    for table, sql in rows:
        for column, values in re.findall(r"(\w+) TEXT NOT NULL CHECK \(\1 IN \(([^)]*)\)\)", sql or ""):
            out[(table, column)] = tuple(v.strip().strip("'") for v in values.split(","))
    return out


def test_the_ledgers_checks_are_the_vocabulary(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite"
    Ledger(path).close()
    assert _check_sets(path) == {
        ("runs", "status"): vocab.RUN_STATUSES,
        ("experiments", "status"): vocab.EXPERIMENT_STATUSES,
        ("reviews", "kind"): vocab.REVIEW_KINDS,
        ("events", "kind"): vocab.EVENT_KINDS,
    }


def test_the_ledger_takes_every_event_kind_and_review_kind_of_the_vocabulary(tmp_path: Path) -> None:
    with Ledger(tmp_path / "ledger.sqlite") as led:
        run = led.create_run(
            RunSpec(strategy="library", policy="adaptive", split="dev", split_fingerprint="f", start_rev="r")
        )
        for event in (StageChanged("evaluating"), PassProgress(), DecisionRecorded(), RunStatusChanged()):
            led.add_event(run.id, event)
        for review in vocab.REVIEW_KINDS:
            led.add_review("t1", review)
        assert {e.kind for e in led.events_since(0)} == set(vocab.EVENT_KINDS)
        with pytest.raises(ValueError, match="unknown event kind 'item'"):
            led.add_event(run.id, "item")  # type: ignore[arg-type]


def test_the_tuis_lists_are_the_vocabulary() -> None:
    from tui.data import REVIEW_LABELS, STATUS_STYLES, STATUS_TEXT
    from tui.runs import STRATEGIES

    # The start-run form has its own order (offline first), over the same names.
    assert sorted(STRATEGIES) == sorted(vocab.RUN_STRATEGIES)
    assert tuple(REVIEW_LABELS) == vocab.REVIEW_KINDS
    assert set(STATUS_STYLES) == set(STATUS_TEXT) == set(vocab.EXPERIMENT_STATUSES)


def test_the_mistake_types_are_one_tuple() -> None:
    from optimizer import models

    assert models.MISTAKE_TYPES is vocab.MISTAKE_TYPES
    assert get_args(models.MistakeType) == vocab.MISTAKE_TYPES


def test_a_stage_event_shows_its_text_on_the_live_strip_and_its_kind_without() -> None:
    from datetime import UTC, datetime

    from optimizer.ledger import Event
    from tui.watch import LiveState, apply_events

    def stage(n: int, payload: dict[str, object]) -> Event:
        return Event(
            id=n, run_id="r1", experiment_id=3, created=datetime.now(UTC), kind="stage", payload=payload
        )

    batch = apply_events(
        LiveState(), [stage(1, {"stage": vocab.StageKind.BATCH, "text": "batch b1: in_progress"})]
    )
    assert "stage batch b1: in_progress (exp 3)" in batch.line()
    plain = apply_events(LiveState(), [stage(1, {"stage": vocab.StageKind.EVALUATING})])
    assert "stage evaluating (exp 3)" in plain.line()
    # A ledger written before stages had a text: the line was the stage itself.
    old = apply_events(LiveState(), [stage(1, {"stage": "batch b1: ended"})])
    assert "stage batch b1: ended (exp 3)" in old.line()


def test_the_vocabulary_imports_nothing_of_the_project() -> None:
    """Every layer may import it, so it may import none (a cycle would break the lowest floor)."""
    import ast

    tree = ast.parse(Path(vocab.__file__).read_text(encoding="utf-8"))
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {(n.module or "").split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert imported <= {"__future__", "enum", "typing"}


def test_the_provider_names_are_the_vocabulary() -> None:
    """[judge] provider takes every provider; every --provider flag and the TUI's start-run form take the
    same names, all but the harness judge, which only judgeloop.toml names (it needs [judge] command)."""
    from optimizer.workspace.config import DEFAULT_JUDGE_MODELS, JudgeSection
    from tui.runs import PROVIDERS, RunChoices

    assert get_args(JudgeSection.model_fields["provider"].annotation) == vocab.PROVIDERS
    assert set(DEFAULT_JUDGE_MODELS) == set(vocab.PROVIDERS)
    assert get_args(OptimizerSection.model_fields["provider"].annotation) == vocab.OPTIMIZER_PROVIDERS
    assert set(vocab.FLAG_PROVIDERS) == set(vocab.PROVIDERS) - {vocab.COMMAND}
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    flags = [
        (name, a.choices)
        for name, command in sub.choices.items()
        for a in command._actions
        if "--provider" in a.option_strings
    ]
    assert {name for name, _ in flags} >= {"run", "eval", "attribute"}
    assert all(tuple(choices or ()) == vocab.FLAG_PROVIDERS for _, choices in flags), flags
    # The form offers what `run --provider` takes, nothing it refuses.
    assert (
        PROVIDERS == RunChoices(splits=(), split="", policy="", provider="").providers == vocab.FLAG_PROVIDERS
    )


def test_every_list_of_the_mistake_types_is_the_vocabulary() -> None:
    """The verdict's JSON schema, the optimiser's tool schema and the strategies' per-type tables list
    the three mistake types of `optimizer.vocab`, in its order where a schema lists them."""
    from optimizer.devset.importer import AHD_COUNTS
    from optimizer.judge.types import VERDICT_SCHEMA
    from optimizer.loop.strategies import library, memory
    from optimizer.loop.strategies.tools import TOOL_SPECS

    verdict_enum = next(
        s["enum"] for s in VERDICT_SCHEMA["properties"]["mistake_type"]["anyOf"] if "enum" in s
    )
    assert verdict_enum == list(vocab.MISTAKE_TYPES)
    tool = next(t for t in TOOL_SPECS if t.name == "list_disagreements")
    assert tool.parameters["properties"]["mistake_type"]["enum"] == list(vocab.MISTAKE_TYPES)
    assert set(library._TYPE_WORDS) == set(memory.CHECKS) == set(vocab.MISTAKE_TYPES)
    assert set(memory.PRINCIPLES) >= set(vocab.MISTAKE_TYPES)  # and the principles of a too strict judge
    assert set(AHD_COUNTS.mistake_types) == {*vocab.MISTAKE_TYPES, vocab.UNTYPED}


@pytest.mark.slow
def test_the_start_run_form_never_hands_run_a_provider_it_refuses(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A workspace whose judge is a harness CLI ([judge] provider = "command", which `run --provider`
    refuses): the form offers only the names the flag takes, starts at "the config's", and the command
    line it builds goes through the real `judgeloop run` past its options (to the missing split)."""
    from typing import Any, cast

    from textual.widgets import Select

    from optimizer.cli import main
    from tests.support.tui_driving import drive
    from tools.configedit import set_config
    from tui.app import JudgeloopApp, settle
    from tui.modals import StartRunModal

    ws = tmp_path / "ws"
    assert main(["init", str(ws)]) == 0
    set_config(
        ws, {("judge", "provider"): "command", ("judge", "harness"): "codex"}, message="test: a harness judge"
    )
    app = JudgeloopApp(ws, image_mode="halfcell", watch=False)
    seen: dict[str, Any] = {}

    async def scenario(pilot: Any) -> None:
        await pilot.press("r")
        await settle(app, pilot)
        assert isinstance(app.screen, StartRunModal)
        provider = cast(Select[str], app.screen.query_one("#run-provider"))
        seen["offered"] = [
            str(v) for _, v in provider._options if isinstance(v, str)
        ]  # Textual keeps them there
        seen["argv"] = app.screen.options().argv(ws)

    drive(app, scenario, (80, 24))
    assert vocab.COMMAND not in seen["offered"]
    argv = seen["argv"]
    assert argv[:4] == [sys.executable, "-m", "optimizer.cli", "run"] and "--provider" not in argv
    capsys.readouterr()
    assert main(argv[3:]) == 2  # the workspace has no split yet: refused after its options were taken
    err = capsys.readouterr().err
    assert "invalid choice" not in err and "no split named 'sample'" in err, err
