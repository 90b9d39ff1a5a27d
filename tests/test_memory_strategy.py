"""The offline ``memory`` strategy: reviews and disagreements distilled into prompts/memory/, one move a candidate."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import replace

import pytest

from optimizer.errors import UserError
from optimizer.judge.memory import CASES_JSONL, PRINCIPLES_MD, parse_cases
from optimizer.loop.strategies import PastExperiment, ProposalContext, ProposalError, ReviewNote
from optimizer.loop.strategies.memory import PRINCIPLES, MemoryStrategy
from tests.support.strategies import ALLOWED, DevFixture, disagreements_for, make_context, make_dev

MEMORY_ALLOWED = [*ALLOWED, PRINCIPLES_MD, CASES_JSONL]


@pytest.fixture(scope="module")
def dev(tmp_path_factory: pytest.TempPathFactory) -> DevFixture:
    return make_dev(tmp_path_factory.mktemp("memstrat"), n_pairs=3)


def _ctx(
    dev: DevFixture,
    *,
    reviews: Sequence[ReviewNote] = (),
    missed: int = 0,
    rejected: int = 0,
    history: list[PastExperiment] | None = None,
    cases: str | None = None,
) -> ProposalContext:
    ctx = make_context(dev, disagreements_for(dev.items, missed=missed, rejected=rejected), history=history)
    ctx.allowed_files = list(MEMORY_ALLOWED)
    ctx.judge_memory = "retrieve"
    if cases is not None:
        ctx.current_files[CASES_JSONL] = cases
    ctx.reviews = list(reviews)
    return ctx


def _review(dev: DevFixture, i: int, note: str, kind: str = "judge_wrong") -> ReviewNote:
    item = dev.items[i]
    return ReviewNote(item.trajectory_id, kind, note, item.instruction)


def test_memory_strategy_needs_the_memory_files_allowed_and_judging_with_memory(dev: DevFixture) -> None:
    with pytest.raises(UserError, match=r"allowed_files does not include it"):
        MemoryStrategy(ALLOWED)
    ctx = make_context(dev, [])
    with pytest.raises(UserError, match=r"prompts/memory/cases.jsonl"):
        MemoryStrategy().propose_sync(ctx)
    ctx = _ctx(dev, reviews=[_review(dev, 0, "Wrong format.")])
    ctx.judge_memory = "off"  # the cases would never reach the judge: every candidate a paid no-op
    with pytest.raises(UserError, match=r'memory = "retrieve" in prompts/judge.toml'):
        MemoryStrategy().propose_sync(ctx)


def test_reviews_become_one_case_per_item_group(dev: DevFixture) -> None:
    """Two reviewed items sharing an instruction are one group (one case naming both); a third is another."""
    by_instruction: dict[str, list[int]] = {}
    for i, item in enumerate(dev.items):
        by_instruction.setdefault(item.instruction, []).append(i)
    same = next(ix for ix in by_instruction.values() if len(ix) == 2)
    other = next(ix for ix in by_instruction.values() if ix != same)[0]
    reviews = [
        _review(dev, same[0], "It had to be a PDF, it saved DOCX."),
        _review(dev, same[1], "Also check the name."),
        _review(dev, other, "The file was saved in the wrong folder."),
    ]
    proposal = MemoryStrategy().propose_sync(_ctx(dev, reviews=reviews))
    assert set(proposal.files) == {CASES_JSONL}
    cases = parse_cases(proposal.files[CASES_JSONL])
    assert sorted(c.source_items for c in cases) == sorted(
        [tuple(sorted(dev.items[i].trajectory_id for i in same)), (dev.items[other].trajectory_id,)]
    )
    both = next(c for c in cases if len(c.source_items) == 2)
    assert "It had to be a PDF, it saved DOCX." in both.text and "Also check the name." in both.text
    assert dev.items[same[0]].instruction in both.text
    assert proposal.meta["memory_move"].startswith("add:")
    # Deterministic: the same inputs make the same proposal.
    assert MemoryStrategy().propose_sync(_ctx(dev, reviews=reviews)).files == proposal.files


def test_a_case_states_the_verdict_a_disagreement_shows(dev: DevFixture) -> None:
    ctx = _ctx(dev, missed=2, rejected=1)
    proposal = MemoryStrategy().propose_sync(ctx)
    cases = parse_cases(proposal.files[CASES_JSONL])
    named = {s for c in cases for s in c.source_items}
    assert named == {d.trajectory_id for d in ctx.disagreements}
    texts = "\n".join(c.text for c in cases)
    assert "was a failure (" in texts and "was a success" in texts


def test_a_decided_move_is_never_proposed_again(dev: DevFixture) -> None:
    reviews = [_review(dev, 0, "Wrong format."), _review(dev, 4, "Wrong folder.")]
    first = MemoryStrategy().propose_sync(_ctx(dev, reviews=reviews))
    rolled = PastExperiment(1, "rolled_back", "", "", None, None, "", meta=dict(first.meta))
    second = MemoryStrategy().propose_sync(_ctx(dev, reviews=reviews, history=[rolled]))
    assert second.meta != first.meta
    assert len(parse_cases(second.files[CASES_JSONL])) == 1  # after the batch, each group alone
    interrupted = PastExperiment(1, "error", "", "", None, None, "", meta=dict(first.meta))
    assert MemoryStrategy().propose_sync(_ctx(dev, reviews=reviews, history=[interrupted])).meta == first.meta


def test_a_case_whose_label_is_doubted_is_retired(dev: DevFixture) -> None:
    tid = dev.items[2].trajectory_id
    cases = json.dumps({"id": "k1", "text": "t", "source_items": [tid]}) + "\n"
    reviews = [_review(dev, 2, "This label looks wrong to me.", kind="label_suspect")]
    proposal = MemoryStrategy().propose_sync(_ctx(dev, reviews=reviews, cases=cases, missed=2))
    assert parse_cases(proposal.files[CASES_JSONL]) == ()
    assert proposal.meta["memory_move"] == "retire:k1"


def test_principles_are_fixed_general_rules_never_an_item(dev: DevFixture) -> None:
    """Three stable missed failures of one type add that type's fixed rule; no id, instruction or label."""
    ctx = _ctx(dev, missed=6)
    ctx.disagreements = [replace(d, mistake_type="Bad Side Effect") for d in ctx.disagreements]
    covered = [d.trajectory_id for d in ctx.disagreements]
    # Every disagreement already has a case, so the next move is a principle.
    ctx.current_files[CASES_JSONL] = "".join(
        json.dumps({"id": f"k{i}", "text": "t", "source_items": [t]}) + "\n" for i, t in enumerate(covered)
    )
    proposal = MemoryStrategy().propose_sync(ctx)
    assert set(proposal.files) == {PRINCIPLES_MD}
    text = proposal.files[PRINCIPLES_MD]
    assert text.strip() == PRINCIPLES["Bad Side Effect"]
    assert not any(item.trajectory_id in text or item.instruction in text for item in dev.items)


def test_nothing_left_is_a_proposal_error(dev: DevFixture) -> None:
    with pytest.raises(ProposalError, match="nothing new to distil"):
        MemoryStrategy().propose_sync(_ctx(dev))


def test_a_newer_review_note_is_added_to_its_case(dev: DevFixture) -> None:
    tid = dev.items[2].trajectory_id
    cases = json.dumps({"id": "k1", "text": "Instruction: save as PDF.", "source_items": [tid]}) + "\n"
    proposal = MemoryStrategy().propose_sync(
        _ctx(dev, reviews=[_review(dev, 2, "The name was wrong too.")], cases=cases)
    )
    (case,) = parse_cases(proposal.files[CASES_JSONL])
    assert case.id == "k1" and case.source_items == (tid,)
    assert case.text == "Instruction: save as PDF.\n- A reviewer noted: The name was wrong too."
    assert proposal.meta["memory_move"].startswith("edit:k1:")
