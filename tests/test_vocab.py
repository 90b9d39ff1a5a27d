"""Every list of names a user or the ledger sees is `optimizer.vocab`'s: the CLI's choices, the config's
validation, the ledger's CHECK constraints, the strategy registry and the TUI's lists."""

from __future__ import annotations

import argparse
import re
import sqlite3
from pathlib import Path
from typing import get_args

import pytest

from optimizer import vocab
from optimizer.cli import build_parser
from optimizer.config import LoopSection, OptimizerSection
from optimizer.ledger import Ledger
from optimizer.loop.strategies import FACTORIES


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
        run = led.create_run(strategy="library", policy="adaptive", split="dev", split_fingerprint="f",
                             start_rev="r")
        for kind in vocab.EVENT_KINDS:
            led.add_event(run.id, kind, {})
        for review in vocab.REVIEW_KINDS:
            led.add_review("t1", review)
        assert {e.kind for e in led.events_since(0)} == set(vocab.EVENT_KINDS)
        with pytest.raises(ValueError, match="unknown event kind 'item'"):
            led.add_event(run.id, "item", {})  # type: ignore[arg-type]


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
        return Event(id=n, run_id="r1", experiment_id=3, created=datetime.now(UTC), kind="stage", payload=payload)

    batch = apply_events(LiveState(), [stage(1, {"stage": vocab.StageKind.BATCH, "text": "batch b1: in_progress"})])
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
