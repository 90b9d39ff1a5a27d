"""Memory provenance by content (`optimizer.judge.provenance`): a case is withheld from every item its text is
about (id, recording, instruction, values), whatever its ``source_items`` declare; retrieval, the guard and the
memory tools all read it. Over the real memory code and the sample devset's real trajectories."""

from __future__ import annotations

import base64
import random

import pytest

from optimizer.devset.split import Split, open_split
from optimizer.judge.memory import MEMORY_INTRO, Case, Folds, Memory, Retriever, recording_of, split_folds
from optimizer.judge.overfit import LintText, instruction_values, trajectory_values
from optimizer.judge.provenance import ItemIndex, foreign_reason, split_items
from optimizer.loop.guards import check_cases
from optimizer.models import Action, Step, Task, Trajectory
from optimizer.workspace.workspace import Workspace
from tests.support.loop import add_small_dev_split, make_workspace

FOLDS = 4
LESSON = (
    "When the instruction asks to save a note, check that the file exists on the Desktop under the "
    "requested name; a note left unsaved is a failure."
)


@pytest.fixture(scope="module")
def split(tmp_path_factory: pytest.TempPathFactory) -> Split:
    root = make_workspace(tmp_path_factory.mktemp("prov"))
    add_small_dev_split(root)
    return open_split(Workspace.open(root), "small")


def _distinct(split: Split, index: ItemIndex) -> str:
    """An item whose instruction and actions only its own pair group shares (most are: the sample set also has
    templated tasks whose values, such as 'Q3 numbers', recur across groups, which a case about one names too)."""
    return next(
        t for t in split.ids if set(index.about(split.trajectory(t).task.instruction)) <= index.kin[t]
    )


def _other_fold(folds: Folds, tid: str) -> str:
    return next(t for t in sorted(folds.of) if folds.of[t] != folds.of[tid])


def _value(split: Split, tid: str, index: ItemIndex) -> str:
    """A value of item ``tid``'s actions that only its own pair group holds (what a crafted case would name)."""
    traj = split.trajectory(tid)
    for value in sorted(trajectory_values([traj]), key=lambda v: (-len(v), v)):
        if set(index.about(value)) <= index.kin[tid]:
            return value
    raise AssertionError(f"{tid} has no value of its own")


def _crafted(split: Split, b: str, index: ItemIndex, kind: str) -> str:
    """A case text carrying item ``b``'s answer through ``kind``, then its label."""
    traj = split.trajectory(b)
    carrier = {
        "instruction": f"Task: {traj.task.instruction}",
        "id": f"Trajectory {b}",
        "prefix": f"Trajectory {b[:8]}",
        "recording": f"Recording {recording_of(traj)}",
        "value": f"The agent typed or clicked {_value(split, b, index)!r}",
        "hidden": "Look up " + base64.b64encode(b.encode()).decode(),
    }[kind]
    return f"{carrier}. The correct verdict is success: false (Critical Mistake)."


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["instruction", "id", "prefix", "recording", "value", "hidden"])
def test_a_case_about_item_b_declared_from_another_fold_is_withheld_from_b_and_its_fold(
    split: Split, kind: str
) -> None:
    """The red team's case: its text names item B's instruction, id or values and its label, its source_items
    an item of another fold. Cross-fitting by the declared source alone handed it to B; by content it never
    reaches B (nor B's fold), and still reaches the folds it is about nothing in."""
    folds = split_folds(split, FOLDS)
    index = split_items(split)
    b = _distinct(split, index)
    a = _other_fold(folds, b)
    crafted = Case("c-evil", _crafted(split, b, index, kind), (a,))
    lesson = Case("c-lesson", LESSON, (a,))
    retriever = Retriever(Memory("", (crafted, lesson)), 4, folds, index)
    assert b in retriever.about["c-evil"] and retriever.about["c-lesson"] == frozenset()

    instruction = split.trajectory(b).task.instruction
    to_b = retriever.select(b, instruction)
    assert "c-evil" not in [c.id for c in to_b.cases]
    assert to_b.held_back >= 1
    for tid in split.ids:
        chosen = [
            c.id for c in retriever.select(tid, split.trajectory(tid).task.instruction + " " + LESSON).cases
        ]
        own = folds.of[tid] in {folds.of[a], folds.of[b]}
        assert ("c-evil" in chosen) == (not own), (
            tid
        )  # withheld exactly from the folds of its source and of B
        assert ("c-lesson" in chosen) == (folds.of[tid] != folds.of[a]), tid  # a general lesson still travels


def test_without_folds_a_case_is_withheld_from_the_items_it_is_about(split: Split) -> None:
    """A split judged without folds (a held-out split at confirm) still never gets a case about its own item."""
    index = split_items(split)
    b = _distinct(split, index)
    crafted = Case("c-evil", _crafted(split, b, index, "instruction"), ("elsewhere",))
    retriever = Retriever(Memory("", (crafted,)), 4, None, index)
    instruction = split.trajectory(b).task.instruction
    chosen = retriever.select(b, instruction)
    assert (
        chosen.cases == () and chosen.held_back == 1 and "1 case(s) about this item kept out" in chosen.note()
    )
    stranger = next(t for t in split.ids if t not in index.kin[b])
    assert [c.id for c in retriever.select(stranger, instruction).cases] == ["c-evil"]


def test_the_memory_intro_claims_only_what_retrieval_checks() -> None:
    assert "No case is about this trajectory" not in MEMORY_INTRO
    for checked in (
        "distilled from this trajectory",
        "names its id",
        "copies its instruction",
        "value it typed",
    ):
        assert checked in MEMORY_INTRO
    assert "may still resemble it" in MEMORY_INTRO


def test_the_guard_rejects_a_case_about_a_foreign_item_naming_both_and_exempts_its_own_pairs(
    split: Split,
) -> None:
    index = split_items(split)
    folds = split_folds(split, FOLDS)
    b = _distinct(split, index)
    a = _other_fold(folds, b)
    crafted = Case("c-evil", _crafted(split, b, index, "instruction"), (a,))
    result = check_cases("", _jsonl(crafted), index)
    assert not result.ok and result.guard == "overfit_case"
    assert "case c-evil" in result.reason and f"item {b}" in result.reason and "source_items" in result.reason
    # Declaring B (or a pair-mate of B, which shares its instruction or recording) as the source is honest.
    mate = sorted(index.kin[b] - {b})[0]
    for source in (b, mate):
        assert check_cases("", _jsonl(Case("c-own", crafted.text, (source,))), index).ok
    assert check_cases("", _jsonl(Case("c-lesson", LESSON, (a,))), index).ok
    # An incumbent's case left as it is: not re-checked (retrieval withholds it by content anyway).
    assert check_cases(_jsonl(crafted), _jsonl(crafted) + _jsonl(Case("c-lesson", LESSON, (a,))), index).ok
    assert foreign_reason(crafted, index) == result.reason.removeprefix("prompts/memory/cases.jsonl: ")


def test_values_are_found_exactly_as_the_overfit_lint_counts_them(split: Split) -> None:
    """The index's token shortcut finds a value exactly when `LintText.value_count` does (a brute-force check
    over every value of every item, in texts that put values at every boundary the lint's rule knows)."""
    index = split_items(split)
    values_of = {
        t: instruction_values([split.trajectory(t).task.instruction])
        | trajectory_values([split.trajectory(t)])
        for t in split.ids
    }
    every = sorted({v for vs in values_of.values() for v in vs})
    rng = random.Random(7)
    glue = [" ", "(", ")", ".", ". ", ",", "-", "_", "/", ":", "'", '"', "x", "=", "\n", "..", "a.", "@"]
    for _ in range(300):
        parts = [
            rng.choice(every) if rng.random() < 0.5 else rng.choice(["note", "saved", "Desktop"])
            for _ in range(rng.randint(1, 4))
        ]
        text = "".join(p + rng.choice(glue) for p in parts)
        lint = LintText(text)
        expected = {t for t, vs in values_of.items() if any(lint.value_count(v) for v in vs)}
        found = {t for t, m in index.about(text).items() if m.kind == "value"}
        assert found <= expected, text
        # An item found first by another kind (an instruction copy, an id) is not reported as a value.
        assert expected - found <= {t for t, m in index.about(text).items() if m.kind != "value"}, text


def test_an_item_index_over_hand_made_trajectories_finds_each_kind() -> None:
    def traj(tid: str, instruction: str, actions: list[Action]) -> Trajectory:
        steps = [
            Step(step_id=i, action=a, screenshot=f"images/rec-{tid}/step_{i}.png")
            for i, a in enumerate(actions)
        ]
        return Trajectory(trajectory_id=tid, task=Task(instruction=instruction), steps=steps)

    items = ItemIndex(
        [
            (
                "9f8e7d6c-aaaa",
                traj(
                    "9f8e7d6c-aaaa",
                    "Rename the folder Reports to Archive 2024 and empty the trash bin now",
                    [
                        Action(type="type", parameters={"text": "Archive 2024"}),
                        Action(type="click", parameters={"x": 812, "y": 455}),
                    ],
                ),
            ),
            (
                "1a2b3c4d-bbbb",
                traj(
                    "1a2b3c4d-bbbb",
                    "Send the invoice.pdf to anna@example.com",
                    [Action(type="type", parameters={"text": "Dear Anna, see attached"})],
                ),
            ),
        ]
    )
    about = items.about
    assert set(about("rename the folder reports to archive 2024 and empty")) == {"9f8e7d6c-aaaa"}
    assert about("clicked (812, 455)")["9f8e7d6c-aaaa"].kind == "value"
    assert about("clicked x=812, y=455")["9f8e7d6c-aaaa"].kind == "value"
    assert about("sent INVOICE.PDF")["1a2b3c4d-bbbb"].detail == "invoice.pdf"
    assert about("typed 'Dear Anna, see attached'")["1a2b3c4d-bbbb"].kind == "value"
    assert about("item 1A2B-3C4D")["1a2b3c4d-bbbb"].kind == "id"  # a prefix of 5+ with a digit
    assert about("rec-9f8e7d6c-aaaa")["9f8e7d6c-aaaa"].kind == "id"  # its recording (screenshot folder)
    assert about("inv\u200boice.pdf") != {}  # normalised as the lint normalises
    assert about(LESSON) == {} and about("a general rule about archives and invoices") == {}


def _jsonl(*cases: Case) -> str:
    import json

    return "".join(json.dumps(c.as_json()) + "\n" for c in cases)


def test_the_sample_split_indexes_once(split: Split) -> None:
    """Every item's pair group is known (the guard's exemption) and is the folds' pair grouping."""
    index = split_items(split)
    folds = split_folds(split, FOLDS)
    assert index.ids == frozenset(split.ids)
    for tid in split.ids:
        assert tid in index.kin[tid] and {folds.of[t] for t in index.kin[tid]} == {folds.of[tid]}
