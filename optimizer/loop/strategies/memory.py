"""The ``memory`` strategy: distil human reviews and the incumbent's disagreements into the judge's
memory (``prompts/memory/cases.jsonl`` and ``principles.md``), one change per candidate.

No LLM and no network. What it may read is what every strategy may (`ProposalContext`): the human
reviews of dev items (`ReviewNote`) and the incumbent's dev disagreements, whose labels it sees as
`Disagreement` shows them; never another split, never the label of an item the judge gets right. A
proposal is the first move of this list whose key was not decided already (in this run, or in an
earlier run on this split from the same prompts, as `library` does):

1. **retire** a case whose source item a person marked ``label_suspect`` (the verdict it teaches may be
   wrong), or that names an item no longer in the dev split;
2. **add** one case per *item group* (dev items sharing an instruction: a pair's two recordings of it)
   that people reviewed (``judge_wrong``, ``rubric_ambiguous``) and no case covers yet, all in one
   candidate, then, if that was rolled back, each group alone;
3. **edit** a case whose source items got a review note since it was written (the note is added);
4. **add** cases for up to `DISAGREEMENT_BATCH` groups of stable disagreements no case covers (in an
   order fixed by the run's seed);
5. **principles**: a fixed, general rule for a mistake type the judge keeps missing (at least
   `PRINCIPLE_MIN` stable missed failures of that type) or for rejected successes; never a case's
   words, an item's id or its label.

A case's text is the instruction, what to check (from the labelled mistake type, as the disagreement
shows it) and the verdict where a disagreement gives it, with the reviewers' notes; its
``source_items`` are the group's items. Every proposal passes `memoryedit.check_files` (sources in the
dev split, no case about an item outside its sources' pairs, principles copying no case) before it is
returned, then the loop's guards like any other.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, replace

from optimizer.errors import UserError
from optimizer.judge.memory import (
    CASES_JSONL,
    MAX_CASE_TEXT_CHARS,
    MAX_SOURCE_ITEMS,
    PRINCIPLES_MD,
    Case,
    Memory,
)
from optimizer.judge.provenance import ItemIndex, split_items
from optimizer.loop.strategies import (
    Disagreement,
    PastExperiment,
    Proposal,
    ProposalContext,
    ProposalError,
    ReviewNote,
)
from optimizer.loop.strategies.common import rng_for
from optimizer.loop.strategies.library import DECIDED
from optimizer.loop.strategies.memoryedit import (
    MemoryEditError,
    case_id_for,
    cases_text,
    check_files,
    principles_text,
    read_memory,
)

META_KEY = "memory_move"
DISAGREEMENT_BATCH = 4
PRINCIPLE_MIN = 3
CASE_REVIEW_KINDS = ("judge_wrong", "rubric_ambiguous")
_INSTRUCTION_CHARS = 600
_NOTE_CHARS = 400

# What to check for each labelled mistake type, in general words (the label's type, never its item).
CHECKS: dict[str, str] = {
    "Critical Mistake": "check that every requirement of the instruction (each value, target and step) was met "
    "exactly; a close but wrong value is a failure",
    "Bad Side Effect": "check for changes the instruction did not ask for; an unrequested change is a failure even "
    "when the request itself was done",
    "Misunderstanding of the Instruction": "check that the goal pursued is this instruction's and not a "
    "neighbouring one; a clean execution of another request is a failure",
}
UNTYPED_CHECK = "check the trajectory against the exact request, requirement by requirement"
SUCCESS_CHECK = (
    "every requirement was met; do not fail it for detours, retries or steps the instruction does not forbid"
)

# The principles the strategy may add: fixed general rules, one per pattern of disagreements.
PRINCIPLES: dict[str, str] = {
    "Critical Mistake": "- Verify each requirement of the instruction separately; a near-miss value or target is "
    "a failure (Critical Mistake).",
    "Bad Side Effect": "- Look for changes nobody asked for: an unrequested change makes the task a failure (Bad "
    "Side Effect), even when the request was done.",
    "Misunderstanding of the Instruction": "- Compare the goal the agent pursued with the instruction's own; a "
    "clean execution of a close but different request is a failure.",
    "rejected_success": "- Judge the outcome against the requirements: detours, retries and extra navigation are "
    "not failures when every requirement is met.",
}


@dataclass(frozen=True)
class Move:
    key: str  # what the history records (`Proposal.meta["memory_move"]`), never proposed twice once decided
    memory: Memory
    principles: str | None  # the new principles.md text, None: unchanged
    rationale: str


def decided_keys(history: Sequence[PastExperiment]) -> set[str]:
    """The memory moves of decided experiments (``meta["memory_move"]``)."""
    return {str(e.meta[META_KEY]) for e in history if e.decision in DECIDED and META_KEY in e.meta}


def _norm(instruction: str) -> str:
    return " ".join(instruction.split()).casefold()


def _clip(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3].rstrip() + "..."


@dataclass
class _Group:
    """Dev items sharing an instruction, with what is known of each."""

    instruction: str
    items: list[str]
    reviews: list[ReviewNote]
    disagreements: list[Disagreement]

    def case_text(self) -> str:
        lines = [f"Instruction: {_clip(self.instruction, _INSTRUCTION_CHARS)}"]
        for d in sorted(self.disagreements, key=lambda d: d.trajectory_id):
            if d.judge_success is None:
                seen = "A recording the judge gave no valid answer on"
            else:
                seen = "A recording the judge failed" if d.label_positive else "A recording the judge passed"
            if d.label_positive:
                lines.append(f"- {seen} was a success: {SUCCESS_CHECK}.")
            else:
                check = CHECKS.get(d.mistake_type or "", UNTYPED_CHECK)
                kind = f" ({d.mistake_type})" if d.mistake_type else ""
                lines.append(f"- {seen} was a failure{kind}: {check}.")
        for r in self.reviews:
            what = (
                "found the judge's verdict wrong" if r.kind == "judge_wrong" else "found the rubric ambiguous"
            )
            lines.append(f"- A reviewer {what}: {_clip(r.note, _NOTE_CHARS) or '(no note)'}")
        text = "\n".join(lines)
        return text if len(text) <= MAX_CASE_TEXT_CHARS else text[: MAX_CASE_TEXT_CHARS - 3] + "..."

    def case(self, taken: Sequence[str]) -> Case:
        items = sorted(self.items)[:MAX_SOURCE_ITEMS]
        return Case(case_id_for(items, taken), self.case_text(), tuple(items))


def _groups(
    reviews: Sequence[ReviewNote], disagreements: Sequence[Disagreement], covered: set[str]
) -> list[_Group]:
    """Item groups (by instruction) of the reviews and disagreements given, leaving out covered items."""
    groups: dict[str, _Group] = {}
    for r in reviews:
        if r.trajectory_id not in covered:
            g = groups.setdefault(_norm(r.instruction), _Group(r.instruction, [], [], []))
            g.reviews.append(r)
            if r.trajectory_id not in g.items:
                g.items.append(r.trajectory_id)
    for d in disagreements:
        if d.trajectory_id not in covered:
            g = groups.setdefault(_norm(d.instruction), _Group(d.instruction, [], [], []))
            g.disagreements.append(d)
            if d.trajectory_id not in g.items:
                g.items.append(d.trajectory_id)
    return sorted(groups.values(), key=lambda g: sorted(g.items))


def _add(memory: Memory, groups: Sequence[_Group], why: str) -> Move:
    cases = list(memory.cases)
    added = []
    for g in groups:
        case = g.case([c.id for c in cases])
        cases.append(case)
        added.append(case)
    ids = [c.id for c in added]
    items = sum(len(c.source_items) for c in added)
    rationale = (
        f"Added {len(added)} case{'s' if len(added) != 1 else ''} to {CASES_JSONL} ({', '.join(ids)}) "
        f"distilled from {why} on {items} dev item{'s' if items != 1 else ''}; a case is never shown for "
        "its own items' fold, so any gain is on other items of the same kind."
    )
    return Move("add:" + ",".join(sorted(ids)), replace(memory, cases=tuple(cases)), None, rationale)


class MemoryStrategy:
    """Distil reviews and disagreements into ``prompts/memory/``; deterministic, offline, never repeats a move."""

    name = "memory"

    def __init__(self, allowed_files: Sequence[str] | None = None) -> None:
        if allowed_files is not None:
            _check_allowed(allowed_files)

    async def propose(self, ctx: ProposalContext) -> Proposal:
        """One memory change as new texts of the memory files."""
        return self.propose_sync(ctx)

    def propose_sync(self, ctx: ProposalContext) -> Proposal:
        """The same as `propose`, without an event loop."""
        _check_allowed(ctx.allowed_files)
        if ctx.judge_memory == "off":
            raise UserError(
                "the memory strategy writes prompts/memory/, which the judge reads only with memory = "
                '"retrieve" in prompts/judge.toml; set it there and commit, or choose another strategy'
            )
        try:
            memory = read_memory(ctx.current_files)
        except MemoryEditError as exc:
            raise UserError(f"the incumbent's memory cannot be read: {exc}") from None
        avoid = decided_keys(ctx.history) | decided_keys(ctx.earlier)
        dev_ids = frozenset(ctx.split.ids)
        instructions: list[str] | None = None
        items: ItemIndex | None = None
        for move in self.moves(ctx, memory):
            if move.key in avoid:
                continue
            files = {}
            if move.memory.cases != memory.cases:
                files[CASES_JSONL] = cases_text(move.memory)
            if move.principles is not None:
                files[PRINCIPLES_MD] = move.principles
            if instructions is None or items is None:
                instructions = [ctx.split.trajectory(t).task.instruction for t in ctx.split.ids]
                items = split_items(ctx.split)
            try:
                check_files(ctx.current_files, {**ctx.current_files, **files}, dev_ids, instructions, items)
            except MemoryEditError:
                continue  # a move its own checks refuse is never proposed (e.g. an edited case over the size cap)
            return Proposal(files=files, rationale=move.rationale, meta={META_KEY: move.key})
        raise ProposalError(
            "the memory has nothing new to distil: every review and stable disagreement of the incumbent is covered "
            "by a case or was tried (review more items in the TUI, or choose another strategy)"
        )

    def moves(self, ctx: ProposalContext, memory: Memory) -> list[Move]:
        """Every move worth proposing from this incumbent, in order (see the module docstring)."""
        dev_ids = set(ctx.split.ids)
        moves: list[Move] = []
        suspect = {r.trajectory_id for r in ctx.reviews if r.kind == "label_suspect"}
        for case in memory.cases:
            doubtful = sorted(set(case.source_items) & suspect)
            gone = sorted(s for s in case.source_items if s not in dev_ids)
            if doubtful or gone:
                why = (
                    "a reviewer doubts the label of its source item"
                    if doubtful
                    else "its source items are no longer in the dev split"
                )
                moves.append(
                    Move(
                        f"retire:{case.id}",
                        replace(memory, cases=tuple(c for c in memory.cases if c.id != case.id)),
                        None,
                        f"Retired case {case.id} of {CASES_JSONL}: {why}.",
                    )
                )
        covered = memory.source_items()
        reviewed = [r for r in ctx.reviews if r.kind in CASE_REVIEW_KINDS and r.trajectory_id not in suspect]
        by_item = {d.trajectory_id: d for d in ctx.disagreements}
        review_groups = _groups(
            reviewed, [by_item[r.trajectory_id] for r in reviewed if r.trajectory_id in by_item], covered
        )
        if review_groups:
            moves.append(_add(memory, review_groups, "human reviews"))
            if len(review_groups) > 1:
                moves.extend(_add(memory, [g], "a human review") for g in review_groups)
        for case in memory.cases:
            fresh = [
                r
                for r in reviewed
                if r.trajectory_id in case.source_items
                and r.note.strip()
                and _clip(r.note, _NOTE_CHARS) not in case.text
            ]
            if not fresh:
                continue
            extra = "\n".join(f"- A reviewer noted: {_clip(r.note, _NOTE_CHARS)}" for r in fresh)
            text = case.text + "\n" + extra
            if len(text) > MAX_CASE_TEXT_CHARS:
                continue
            digest = hashlib.sha256(text.encode()).hexdigest()[:8]
            edited = replace(case, text=text)
            moves.append(
                Move(
                    f"edit:{case.id}:{digest}",
                    replace(memory, cases=tuple(edited if c.id == case.id else c for c in memory.cases)),
                    None,
                    f"Edited case {case.id} of {CASES_JSONL}: added {len(fresh)} newer review "
                    "note(s) of its source items.",
                )
            )
        stable = [d for d in ctx.disagreements if not d.unstable and d.trajectory_id not in suspect]
        groups = _groups([], stable, covered | {r.trajectory_id for r in reviewed})
        # One order per run (not per experiment), so the batches stay the same until one is kept.
        rng = rng_for(ctx.rng_seed, 0)
        rng.shuffle(groups)
        for start in range(0, len(groups), DISAGREEMENT_BATCH):
            moves.append(
                _add(
                    memory, groups[start : start + DISAGREEMENT_BATCH], "the incumbent's stable disagreements"
                )
            )
        moves.extend(self._principle_moves(ctx, memory, stable))
        return moves

    def _principle_moves(
        self, ctx: ProposalContext, memory: Memory, stable: Sequence[Disagreement]
    ) -> list[Move]:
        if PRINCIPLES_MD not in ctx.allowed_files:
            return []
        text = ctx.current_files.get(PRINCIPLES_MD, "")
        out: list[Move] = []
        patterns = [
            (t, sum(1 for d in stable if d.direction == "missed_failure" and d.mistake_type == t))
            for t in CHECKS
        ]
        patterns.append(("rejected_success", sum(1 for d in stable if d.direction == "rejected_success")))
        for pattern, count in sorted(patterns, key=lambda p: -p[1]):
            rule = PRINCIPLES[pattern]
            if count < PRINCIPLE_MIN or rule in text:
                continue
            try:
                new = principles_text((text.rstrip("\n") + "\n" if text.strip() else "") + rule)
            except MemoryEditError:
                continue
            what = (
                "rejected successes"
                if pattern == "rejected_success"
                else f"missed failures of type {pattern}"
            )
            out.append(
                Move(
                    f"principle:{pattern}",
                    memory,
                    new,
                    f"Added a general rule to {PRINCIPLES_MD}: the incumbent has {count} stable {what}.",
                )
            )
        return out


def _check_allowed(allowed_files: Sequence[str]) -> None:
    if CASES_JSONL not in allowed_files:
        raise UserError(
            f"the memory strategy edits {CASES_JSONL} (and {PRINCIPLES_MD}) but [optimizer] allowed_files does not "
            "include it; add both files there, or choose another strategy"
        )
