"""Edits of the judge's memory (``prompts/memory/``) and the checks every edit passes, shared by the
memory tools (`optimizer.loop.strategies.tools`: the agent, the MCP server), the reflect strategy and
the ``memory`` strategy.

An edit is refused (`MemoryEditError`, one sentence saying what is wrong) unless the files it leaves
parse (`optimizer.judge.memory`: ids, sizes, at least one source item) and

- every case's ``source_items`` are dev items (an id of a held-out item or of no item is refused: a
  case is kept out of its own items' fold, which only dev items have, and the optimiser never sees
  another split);
- the principles, which reach *every* item whatever its fold, copy no case: no run of 8+ words of a
  case's text (a case states a dev item's verdict; in the principles it would reach that item's own
  fold) and, like the other prompt files, no dev trajectory id and no 8+ words of a dev instruction.

- a case that is new or changed is about no dev item outside its ``source_items`` and their pair
  groups: its text names no other item's id, copies no 8 words of its instruction and names none of its
  values (`optimizer.judge.provenance.foreign_reason`, the loop's guard 8 alike). A case names and
  describes its own items by design: keeping it away from them is what the folds are for.

Pure functions over texts; nothing here reads a file or a label.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace

from optimizer.errors import UserError
from optimizer.judge.memory import (
    CASES_JSONL,
    MEMORY_FILES,
    PRINCIPLES_MD,
    Case,
    Memory,
    check_case,
    memory_files,
    memory_from_files,
    parse_principles,
    serialise_principles,
)
from optimizer.judge.provenance import ItemIndex, foreign_reason
from optimizer.loop.guards import (
    COPY_NGRAM,
    DevMaterial,
    check_candidate,
    instruction_ngrams,
    longest_new_copy,
)


class MemoryEditError(Exception):
    """An edit of the memory that is refused; ``str()`` is the reason, one sentence."""


def read_memory(files: Mapping[str, str]) -> Memory:
    """The memory held in ``files`` (prompt path -> text); a file that does not parse is a `MemoryEditError`."""
    try:
        return memory_from_files({k: v for k, v in files.items() if k in MEMORY_FILES})
    except UserError as exc:
        raise MemoryEditError(str(exc)) from None


def case_id_for(source_items: Iterable[str], taken: Iterable[str] = ()) -> str:
    """A stable case id from its source items (a digest, so no trajectory id appears in it), unique in ``taken``."""
    digest = hashlib.sha256("\n".join(sorted(source_items)).encode()).hexdigest()
    used = set(taken)
    base = f"case-{digest[:10]}"
    out, n = base, 1
    while out in used:
        n += 1
        out = f"{base}-{n}"
    return out


def _checked_case(case_id: str, text: str, source_items: object, dev_ids: frozenset[str], where: str) -> Case:
    try:
        case = check_case({"id": case_id, "text": text, "source_items": source_items}, where)
    except UserError as exc:
        raise MemoryEditError(str(exc)) from None
    outside = [s for s in case.source_items if s not in dev_ids]
    if outside:
        raise MemoryEditError(
            f"case {case.id} names {outside[0]!r}, which is not an item of the dev split; a case's source_items "
            "are the dev trajectories it was distilled from (nothing of another split may be named)"
        )
    return case


def add_case(
    memory: Memory, text: str, source_items: object, dev_ids: frozenset[str], case_id: str | None = None
) -> Memory:
    """``memory`` with one more case (its id made from its sources when None)."""
    taken = [c.id for c in memory.cases]
    if case_id is None:
        items = source_items if isinstance(source_items, list) else []
        case_id = case_id_for([str(s) for s in items], taken)
    elif case_id in taken:
        raise MemoryEditError(f"case {case_id} exists already; edit_case changes it, or choose another id")
    case = _checked_case(case_id, text, source_items, dev_ids, f"{CASES_JSONL} (new case)")
    return replace(memory, cases=(*memory.cases, case))


def edit_case(
    memory: Memory,
    case_id: str,
    dev_ids: frozenset[str],
    text: str | None = None,
    source_items: object = None,
) -> Memory:
    """``memory`` with case ``case_id``'s text and/or source items replaced."""
    old = memory.case(case_id)
    if old is None:
        raise MemoryEditError(f"there is no case {case_id!r}; {_ids_line(memory)}")
    if text is None and source_items is None:
        raise MemoryEditError("edit_case needs a new text, new source_items or both")
    new = _checked_case(
        case_id,
        old.text if text is None else text,
        list(old.source_items) if source_items is None else source_items,
        dev_ids,
        f"{CASES_JSONL} (case {case_id})",
    )
    return replace(memory, cases=tuple(new if c.id == case_id else c for c in memory.cases))


def retire_case(memory: Memory, case_id: str) -> Memory:
    """``memory`` without case ``case_id``."""
    if memory.case(case_id) is None:
        raise MemoryEditError(f"there is no case {case_id!r}; {_ids_line(memory)}")
    return replace(memory, cases=tuple(c for c in memory.cases if c.id != case_id))


def set_principles(memory: Memory, text: str) -> Memory:
    """``memory`` with new principles (checked by `check_memory`, with the rest)."""
    try:
        return replace(memory, principles=parse_principles(text))
    except UserError as exc:
        raise MemoryEditError(str(exc)) from None


def _ids_line(memory: Memory) -> str:
    if not memory.cases:
        return "the memory has no cases yet"
    ids = [c.id for c in memory.cases]
    return "cases: " + ", ".join(ids[:20]) + (f" and {len(ids) - 20} more" if len(ids) > 20 else "")


def check_memory(
    old: Memory, new: Memory, dev_ids: frozenset[str], dev_instructions: Sequence[str], dev_items: ItemIndex
) -> None:
    """Refuse (`MemoryEditError`) a memory ``new`` (edited from ``old``) that breaks a rule of the module docstring."""
    for case in new.cases:
        prior = old.case(case.id)
        if prior == case:
            continue  # the incumbent's case as it is: only what changes is checked
        # A case already in the incumbent's memory keeps its sources as they are: they are not re-checked.
        if prior is None or prior.source_items != case.source_items:
            _checked_case(
                case.id, case.text, list(case.source_items), dev_ids, f"{CASES_JSONL} (case {case.id})"
            )
        foreign = foreign_reason(case, dev_items)
        if foreign is not None:
            raise MemoryEditError(foreign)
    if new.principles == old.principles:
        return
    # Against the incumbent's cases too: retiring a case and pasting it into the principles is still a copy.
    check_no_case_copy(PRINCIPLES_MD, old.principles, new.principles, (*old.cases, *new.cases))
    guard = check_candidate(
        {PRINCIPLES_MD: (old.principles, new.principles)},
        [PRINCIPLES_MD],
        10**9,
        DevMaterial.of_texts(dev_ids, (), list(dev_instructions)),
    )
    if not guard.ok:
        raise MemoryEditError(f"{guard.reason}; principles are general rules, not notes about dev items")


def check_no_case_copy(path: str, old_text: str | None, new_text: str, cases: Iterable[Case]) -> None:
    """Refuse (`MemoryEditError`) a text of prompt file ``path`` (anything but cases.jsonl: the principles, the
    rubric, judge.md, all sent with every item) that newly copies 8+ words of one of ``cases``."""
    cases = list(cases)
    grams = instruction_ngrams([c.text for c in cases], COPY_NGRAM)
    copied = longest_new_copy(old_text, new_text, grams)
    if not copied:
        return
    owner = next(
        (
            c.id
            for c in cases
            if longest_new_copy(None, " ".join(copied), instruction_ngrams([c.text], COPY_NGRAM))
        ),
        "?",
    )
    raise MemoryEditError(
        f"{path} would copy {len(copied)} words of case {owner} ('{_quote(copied)}'); {path} reaches every item, so "
        "a case's verdict there would reach its own items' fold: write a general rule instead"
    )


def _quote(words: list[str], limit: int = 80) -> str:
    text = " ".join(words)
    return text if len(text) <= limit else text[: limit - 3].rstrip() + "..."


def check_files(
    before: Mapping[str, str],
    after: Mapping[str, str],
    dev_ids: frozenset[str],
    dev_instructions: Sequence[str],
    dev_items: ItemIndex,
) -> None:
    """Refuse (`MemoryEditError`) the prompt files ``after`` when their memory, edited from the memory of
    ``before`` (the incumbent's), does not parse or breaks a rule, or when another changed prompt file
    (the rubric, judge.md) copies a case of either memory."""
    old, new = read_memory(before), read_memory(after)
    check_memory(old, new, dev_ids, dev_instructions, dev_items)
    cases = (*old.cases, *new.cases)
    if not cases:
        return
    for path, text in sorted(after.items()):
        if path not in MEMORY_FILES and text != before.get(path):
            check_no_case_copy(path, before.get(path), text, cases)


def cases_text(memory: Memory) -> str:
    """``cases.jsonl``'s text for ``memory``'s cases."""
    return memory_files(memory)[CASES_JSONL]


def principles_text(text: str) -> str:
    """``principles.md``'s text for new principles ``text`` as written (comments kept), or `MemoryEditError`."""
    try:
        return serialise_principles(text)
    except UserError as exc:
        raise MemoryEditError(str(exc)) from None
