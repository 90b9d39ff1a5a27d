"""prompts/memory/: the principles and cases file formats (parse, validate, serialise, bounds)."""

from __future__ import annotations

import json
from pathlib import Path

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
    Folds,
    Memory,
    Retriever,
    assign_folds,
    memory_files,
    memory_from_files,
    pair_groups,
    parse_cases,
    parse_principles,
    serialise_cases,
)
from optimizer.judge.provenance import ItemIndex


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
        (
            _line(id="c9", text="x", source_items=[f"t{i}" for i in range(MAX_SOURCE_ITEMS + 1)]),
            "principles.md",
        ),
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
    assert (
        parse_principles("<!-- a note -->\n# Rules\n\n\n\n- final state counts   \n")
        == "# Rules\n\n- final state counts"
    )
    with pytest.raises(
        UserError, match=rf"principles.md: \d+ characters, more than the {MAX_PRINCIPLES_CHARS}"
    ):
        parse_principles("x" * (MAX_PRINCIPLES_CHARS + 1))


def test_memory_from_files_reads_either_file_and_writes_both_back() -> None:
    assert memory_from_files({}).empty
    memory = memory_from_files({PRINCIPLES_MD: "- be strict\n", CASES_JSONL: GOOD + "\n"})
    assert memory == Memory("- be strict", (Case("c1", "Saving needs the file on disk.", ("t1", "t2")),))
    assert memory_from_files(memory_files(memory)) == memory
    with pytest.raises(UserError, match=r"^ws/prompts/memory/cases.jsonl:1: "):
        memory_from_files({CASES_JSONL: "nope\n"}, source="ws/prompts")


# --------------------------------------------------------------------------- folds and retrieval


def _pairs(n: int) -> list[tuple[str, str, str | None]]:
    """``n`` AgentHorizon pairs: positives (IA on A), (IB on B); negatives (IB on A), (IA on B)."""
    items: list[tuple[str, str, str | None]] = []
    for p in range(n):
        a, b = f"Open file {p} in the editor", f"Delete file {p} from the disk"
        items += [
            (f"p{p}-pa", a, f"rec{p}A"),
            (f"p{p}-pb", b, f"rec{p}B"),
            (f"p{p}-na", b, f"rec{p}A"),
            (f"p{p}-nb", a, f"rec{p}B"),
        ]
    return items


def test_pair_groups_join_an_instruction_pair_by_shared_instructions_and_recordings() -> None:
    groups = pair_groups(_pairs(3))
    assert groups == [sorted(f"p{p}-{s}" for s in ("pa", "pb", "na", "nb")) for p in range(3)]
    # Instructions compare case- and space-insensitively; an item without screenshots joins by instruction.
    assert pair_groups(
        [("x", "Open  THE file", None), ("y", "open the file", "r1"), ("z", "other", "r1")]
    ) == [["x", "y", "z"]]


def test_folds_are_balanced_pair_aware_and_fixed_by_the_fingerprint() -> None:
    groups = pair_groups(_pairs(10))
    folds = assign_folds(groups, "fp-1", 5)
    assert sorted(folds.of) == sorted(t for g in groups for t in g)
    assert all(len({folds.of[t] for t in g}) == 1 for g in groups)
    assert [len(folds.members(f)) for f in range(5)] == [8] * 5
    assert assign_folds(list(reversed(groups)), "fp-1", 5) == folds  # order of discovery does not matter
    other = assign_folds(groups, "fp-2", 5)
    assert other.digest != folds.digest and other.of != folds.of  # another split: another deal
    assert assign_folds(groups, "fp-1", 4).digest != folds.digest


NO_ITEMS = ItemIndex(())  # these retrieval tests judge no split's items: no case is about one


def _memory(*cases: tuple[str, str, list[str]]) -> Memory:
    return Memory("be strict", tuple(Case(i, t, tuple(s)) for i, t, s in cases))


def test_retrieval_ranks_by_similarity_breaks_ties_by_file_order_and_skips_unrelated_cases() -> None:
    memory = _memory(
        ("c-a", "spreadsheet cell formula", ["s1"]),
        ("c-b", "email attachment sent", ["s2"]),
        ("c-c", "email attachment sent", ["s3"]),
        ("c-d", "spreadsheet chart", ["s4"]),
    )
    retriever = Retriever(memory, 2, None, NO_ITEMS)
    chosen = retriever.select("q", "Send the email with the attachment")
    assert [c.id for c in chosen.cases] == ["c-b", "c-c"]  # equal scores: file order
    assert [c.id for c in retriever.select("q", "Fix the spreadsheet formula").cases] == ["c-a", "c-d"]
    assert retriever.select("q", "Reboot the router").cases == ()  # no shared term: nothing sent
    assert (
        retriever.select("q", "Reboot the router").block().startswith("## Memory")
    )  # the principles still go


def test_an_item_never_gets_a_case_sourced_in_its_own_fold() -> None:
    folds = Folds(k=2, fingerprint="f", of={"s1": 0, "s2": 1, "s3": 0, "x": 0, "y": 1}, digest="d")
    memory = _memory(
        ("c1", "email attachment", ["s1"]),
        ("c2", "email attachment", ["s2"]),
        ("c3", "email attachment", ["s2", "s3"]),
        ("c4", "email attachment", ["elsewhere"]),
    )
    retriever = Retriever(memory, 4, folds, NO_ITEMS)
    x = retriever.select("x", "email attachment")
    assert [c.id for c in x.cases] == ["c2", "c4"] and x.held_back == 2 and x.fold == 0
    assert [c.id for c in retriever.select("y", "email attachment").cases] == ["c1", "c4"]
    assert "fold 0; 2 case(s) of this fold kept out" in x.note()


def test_cases_of_stop_words_only_retrieve_nothing() -> None:
    retriever = Retriever(_memory(("c1", "...", ["s1"])), 4, None, NO_ITEMS)
    assert retriever.select("q", "anything at all").cases == ()


def test_the_memory_block_follows_the_cached_trajectory_in_both_layouts(tmp_path: Path) -> None:
    from optimizer.judge.render import RenderOptions, build_request
    from optimizer.judge.types import TextPart
    from tests.support.evaluation import make_data

    data = make_data(tmp_path)
    traj = data.split.trajectory(data.split.ids[0])
    block = (
        Retriever(_memory(("c1", "save the report", ["s1"])), 4, None, NO_ITEMS)
        .select("q", "Save the report")
        .block()
    )
    plain = build_request(traj, data.split, data.prompts, options=RenderOptions(layout="trajectory-first"))
    with_memory = build_request(
        traj,
        data.split,
        data.prompts,
        options=RenderOptions(layout="trajectory-first", memory=block),
    )
    # The cached prefix is byte for byte the same; the memory is its own part right after the breakpoint.
    prefix = plain.cache_prefix
    assert prefix is not None and with_memory.cache_prefix == prefix
    assert with_memory.parts[:prefix] == plain.parts[:prefix]
    assert with_memory.parts[prefix] == TextPart(block)
    assert with_memory.parts[prefix + 1 :] == plain.parts[prefix:]
    # Rubric-first (the local judge's layout): before the closing reminder, after the steps.
    rubric_first = build_request(
        traj,
        data.split,
        data.prompts,
        options=RenderOptions(layout="rubric-first", memory=block),
    )
    last = rubric_first.parts[-1]
    assert isinstance(last, TextPart) and block + "## Your verdict" in last.text


def test_a_linked_memory_folder_or_file_is_refused(tmp_path: Path) -> None:
    from optimizer.judge.prompts import PromptSet
    from optimizer.scaffold import init_workspace

    ws = init_workspace(tmp_path / "ws")
    secret = tmp_path / "secret"
    secret.mkdir()
    (secret / "cases.jsonl").write_text(GOOD + "\n", encoding="utf-8")
    (ws.prompts_dir / "memory").symlink_to(secret)
    with pytest.raises(UserError, match=r"memory is a symbolic link"):
        PromptSet.from_dir(ws.prompts_dir)
    (ws.prompts_dir / "memory").unlink()
    (ws.prompts_dir / "memory").mkdir()
    (ws.prompts_dir / "memory" / "cases.jsonl").symlink_to(secret / "cases.jsonl")
    with pytest.raises(UserError, match=r"cases.jsonl is a symbolic link"):
        PromptSet.from_dir(ws.prompts_dir)
    (ws.prompts_dir / "memory" / "cases.jsonl").unlink()
    (ws.prompts_dir / "memory" / "cases.jsonl").write_text(GOOD + "\n", encoding="utf-8")
    assert PromptSet.from_dir(ws.prompts_dir).memory.cases[0].id == "c1"
