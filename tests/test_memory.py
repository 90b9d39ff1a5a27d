"""prompts/memory/: the principles and cases file formats (parse, validate, serialise, bounds)."""

from __future__ import annotations

import json

import pytest

from optimizer.errors import UserError
from optimizer.judge.memory import (
    CASES_JSONL,
    MAX_CASE_TEXT_CHARS,
    MAX_CASES,
    MAX_CASES_BYTES,
    MAX_PRINCIPLES_CHARS,
    MAX_SOURCE_ITEMS,
    PRINCIPLES_MD,
    Case,
    Memory,
    memory_files,
    memory_from_files,
    parse_cases,
    parse_principles,
    serialise_cases,
)


def _line(**obj: object) -> str:
    return json.dumps(obj)


GOOD = _line(id="c1", text="Saving needs the file on disk.", source_items=["t1", "t2"])


def test_cases_parse_in_file_order_and_round_trip_through_serialise() -> None:
    text = "\n".join([GOOD, "", _line(id="c2", text="Ünïcode — kept as is", source_items=["t3"])]) + "\n"
    cases = parse_cases(text)
    assert cases == (
        Case("c1", "Saving needs the file on disk.", ("t1", "t2")),
        Case("c2", "Ünïcode — kept as is", ("t3",)),
    )
    out = serialise_cases(cases)
    assert parse_cases(out) == cases
    assert "Ünïcode" in out  # written as UTF-8, not \u escapes
    assert out.count("\n") == 2


@pytest.mark.parametrize(
    ("line", "needle"),
    [
        ("{not json", "not one JSON object"),
        ("[1, 2]", "a case is a JSON object"),
        (_line(id="c9", text="x", source_items=["t1"], verdict=True), "unknown key 'verdict'"),
        (_line(id="c9", text="x"), "has no 'source_items'"),
        (_line(id="../etc", text="x", source_items=["t1"]), "is not a safe id"),
        (_line(id="c9", text="  ", source_items=["t1"]), "has no text"),
        (_line(id="c9", text=7, source_items=["t1"]), "has no text"),
        (_line(id="c9", text="x", source_items=[]), "cannot be kept out of its items' fold"),
        (_line(id="c9", text="x", source_items="t1"), "must be a list"),
        (_line(id="c9", text="x", source_items=["t1", "t1"]), "twice"),
        (_line(id="c9", text="x", source_items=["a/b"]), "not a trajectory id"),
        (_line(id="c9", text="x" * (MAX_CASE_TEXT_CHARS + 1), source_items=["t1"]), "shorten it"),
        (_line(id="c9", text="x", source_items=[f"t{i}" for i in range(MAX_SOURCE_ITEMS + 1)]), "principles.md"),
        ("[" * 100_000, "not one JSON object"),
    ],
)
def test_a_malformed_case_line_is_one_user_error_naming_file_and_line(line: str, needle: str) -> None:
    with pytest.raises(UserError) as err:
        parse_cases(f"{GOOD}\n\n{line}\n", "prompts/memory/cases.jsonl")
    message = str(err.value)
    assert message.startswith("prompts/memory/cases.jsonl:3: ")
    assert needle in message
    assert "\n" not in message and len(message) < 400


def test_a_repeated_case_id_names_both_lines() -> None:
    with pytest.raises(UserError, match=r"cases.jsonl:2: case id c1 repeats line 1"):
        parse_cases(f"{GOOD}\n{GOOD}\n")


def test_a_ten_megabyte_cases_file_is_refused_before_parsing() -> None:
    huge = (GOOD + "\n") * (10_000_000 // len(GOOD))
    assert len(huge) > MAX_CASES_BYTES
    with pytest.raises(UserError, match=rf"cases.jsonl: \d+ bytes, more than the {MAX_CASES_BYTES}"):
        parse_cases(huge)


def test_more_cases_than_the_bound_are_refused() -> None:
    lines = [_line(id=f"c{i}", text="x", source_items=["t1"]) for i in range(MAX_CASES + 1)]
    with pytest.raises(UserError, match=rf":{MAX_CASES + 1}: more than {MAX_CASES} cases"):
        parse_cases("\n".join(lines))


def test_principles_lose_comments_and_are_bounded() -> None:
    assert parse_principles("<!-- a note -->\n# Rules\n\n\n\n- final state counts   \n") == "# Rules\n\n- final state counts"
    with pytest.raises(UserError, match=rf"principles.md: \d+ characters, more than the {MAX_PRINCIPLES_CHARS}"):
        parse_principles("x" * (MAX_PRINCIPLES_CHARS + 1))


def test_memory_from_files_reads_either_file_and_writes_both_back() -> None:
    assert memory_from_files({}).empty
    memory = memory_from_files({PRINCIPLES_MD: "- be strict\n", CASES_JSONL: GOOD + "\n"})
    assert memory == Memory("- be strict", (Case("c1", "Saving needs the file on disk.", ("t1", "t2")),))
    assert memory_from_files(memory_files(memory)) == memory
    with pytest.raises(UserError, match=r"^ws/prompts/memory/cases.jsonl:1: "):
        memory_from_files({CASES_JSONL: "nope\n"}, source="ws/prompts")
