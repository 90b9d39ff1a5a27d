"""`optimizer.fmt`, `optimizer.errors.first_error` and `optimizer.workspace.config.experiment_seed`: the one copy of
each helper prints what every copy it replaced printed (pinned here on the edge cases)."""

from __future__ import annotations

import random

import pytest
from pydantic import BaseModel, ValidationError, field_validator

from optimizer import fmt
from optimizer.errors import first_error
from optimizer.workspace.config import experiment_seed


@pytest.mark.parametrize(
    ("value", "digits", "missing", "signed", "shown"),
    [
        (None, 3, fmt.DASH, False, "—"),
        (None, 3, "-", False, "-"),
        (None, 3, fmt.NA, True, "n/a"),
        (0.12345, 3, fmt.DASH, False, "0.123"),
        (0.12345, 2, fmt.DASH, True, "+0.12"),
        (-0.5, 3, "-", True, "-0.500"),
        (0.0, 3, "-", True, "+0.000"),
    ],
)
def test_num_is_the_number_at_n_decimals_or_the_missing_mark(
    value: float | None, digits: int, missing: str, signed: bool, shown: str
) -> None:
    assert fmt.num(value, digits, missing=missing, signed=signed) == shown
    if signed:
        assert fmt.signed(value, digits, missing=missing) == shown


@pytest.mark.parametrize(
    ("p", "digits", "shown"),
    [
        (0.03125, 3, "0.031"),
        (0.03125, 4, "0.0312"),
        (0.001, 3, "0.001"),
        (0.000999, 4, "1.0e-03"),
        (1.2e-7, 3, "1.2e-07"),
    ],
)
def test_p_value_has_fixed_decimals_down_to_a_thousandth_then_scientific(
    p: float, digits: int, shown: str
) -> None:
    assert fmt.p_value(p, digits) == shown


def test_one_line_flattens_or_takes_the_first_line_and_cuts_with_an_ellipsis() -> None:
    text = "  first   line of a note \n second line"
    assert fmt.one_line(text, 80) == "first line of a note second line"  # the report's: all of it, one line
    assert (
        fmt.one_line(text, 80, first_line=True) == "first   line of a note "
    )  # the TUI's: its first line as written
    assert fmt.one_line("abcde fghij", 7) == "abcde…"  # the report trims the space before the cut
    assert fmt.one_line("abcde fghij", 7, trim=False) == "abcde …"  # the TUI and the loop's notes keep it
    assert fmt.one_line(None, 5) == fmt.one_line("   ", 5, first_line=True) == ""
    assert fmt.one_line("abcde", 5) == "abcde"


class _Row(BaseModel):
    size: int
    name: str

    @field_validator("name")
    @classmethod
    def _short(cls, name: str) -> str:
        if len(name) > 3:
            raise ValueError("name is too long; use at most 3 characters")
        return name


def test_first_error_is_the_first_problem_with_its_location_and_the_count_of_the_others() -> None:
    with pytest.raises(ValidationError) as caught:
        _Row.model_validate({"size": "x", "name": "long"})
    first = first_error(caught.value)
    assert (first.loc, first.more) == ("size", 1)
    assert first.line() == f"size: {first.msg} (and 1 more)"
    with pytest.raises(ValidationError) as caught:
        _Row.model_validate({"size": 1, "name": "long"})
    first = first_error(caught.value)
    assert first.msg == "Value error, name is too long; use at most 3 characters"
    assert (
        first.reason == "name is too long; use at most 3 characters" and first.line() == f"name: {first.msg}"
    )
    with pytest.raises(ValidationError) as caught:
        _Row.model_validate([1])
    assert first_error(caught.value).where("file") == "file" and first_error(caught.value).line().startswith(
        "row: "
    )


@pytest.mark.parametrize("run_seed", [0, 7, 4295, 2**40])
def test_the_seed_rule_is_the_runners_and_the_strategies(run_seed: int) -> None:
    from optimizer.loop.context import RunContext
    from optimizer.loop.strategies.common import rng_for

    class _Settings:  # the run context's rule reads only the settings' seed
        seed = run_seed

    class _Context:
        settings = _Settings()

    for exp in (0, 1, 12):
        assert experiment_seed(run_seed, exp) == RunContext.decision_seed(_Context(), exp)  # type: ignore[arg-type]
        assert experiment_seed(run_seed, exp) < 2**32
        same = random.Random(run_seed * 1_000_003 + exp)  # the strategies' stream, never reduced
        assert rng_for(run_seed, exp).random() == same.random()
