"""Guards: pure checks every candidate passes before any judge call is spent on it.

``check_candidate`` takes the candidate's changed files as ``{path: (old_text, new_text)}``
(``None`` = absent; ``gitops.worktree_changes`` builds it) and returns the first failing guard:

1. ``empty`` — the candidate must change something.
2. ``allowed_files`` — only the files ``[optimizer] allowed_files`` names may change, and none may
   be deleted. ``prompts/judge.toml`` is the exception: its edits are *structure moves*
   (`optimizer.structure`), allowed whatever allowed_files says when every key they change is named in
   ``[optimizer] structure_moves`` and takes a value within its bounds (a panel of at most
   ``max_members``); with structure_moves empty any edit of it is refused (guard ``structure``).
3. ``protected`` — every region between ``<!-- judgeloop:protected:begin -->`` and
   ``<!-- judgeloop:protected:end -->`` is byte-identical and in the same order, and no marker
   is added or removed.
4. ``diff_size`` — changed lines (added + removed, counted with difflib over whole lines, the same
   total as ``git diff --numstat``) at most ``max_diff_lines`` over all files.
5. ``overfit_id`` — no dev trajectory id or recording id appears more often in the new text than in
   the old one, compared on *compact* forms: the normalised text (see below) and the id lower-cased
   with everything but letters and digits removed, so hyphens, underscores, dots, spaces and line
   breaks inside an id do not hide it. A *prefix* of an id counts too, by this rule: a run of words
   of the text (words = letters and digits; any punctuation or white space between them is dropped)
   whose concatenation is a prefix of an id's compact form, is at least 5 characters long and
   contains a digit (``3f2b9``, ``3F2B-9C1E``, ``3f2b 9c1e``, ``decade1f``). The digit keeps words
   out: ``decade`` or ``faded cafe`` never match an id that starts ``decade1f`` or ``fadedcafe0``.
6. ``overfit_copy`` — no run of 8+ consecutive words of a dev instruction (normalised, lower-cased,
   punctuation dropped) is *new* in the candidate. Only n-grams absent from the old text count, so a
   phrase that was already in the prompt (e.g. a generic "open the file and save it ...") does not
   block every later edit of that file; the guard stops the optimiser from pasting instructions in,
   not the prompt from ever resembling one.
7. ``overfit_value`` — no distinctive value of a dev instruction or trajectory appears more often in
   the new text than in the old one. An instruction's values: a file name, path, e-mail address,
   date, time or any other token with a digit or an inner ``. @ _ / \\ :`` (at least 4 characters,
   e.g. ``report_q3.xlsx``, ``14:30``, ``2024-05-01``), or a quoted name of 2+ words
   (``"Project Alpha"``). A trajectory's values (``trajectory_values``): what its ``type`` actions
   typed and the string arguments of other actions, by the same token rule, plus the whole text when
   it has 2+ words (``Call the plumber before Friday``, matched as words); and its click, move,
   scroll and drag targets as coordinate pairs of 5+ digits in all (``(243, 58)``, ``243,58`` and
   ``x=243, y=58`` all name ``243 58``). Key names, buttons and directions are never values. Short
   paraphrases slip past the 8-word copy lint; the concrete values an answer key would need do not.
   Plain words are never values (an agent that typed ``Dentist`` blocks no rule about dentists), so
   general rules ("check every file name") always pass.

8. ``overfit_case`` — no case of ``prompts/memory/cases.jsonl`` that the candidate adds or changes is
   *about* a dev item outside its ``source_items`` and their pair groups (items sharing an instruction or
   a recording with a source): its text names no such item's id or recording id, copies no 8 words of
   its instruction and names none of its values, by the rules of guards 5-7
   (`optimizer.judge.provenance`). A case's declared sources are only a claim; a case about item B
   declared as distilled from A (another fold) would hand B its own answer. The reason names the case
   and the item. Cases the incumbent already holds, unchanged, are not re-checked: retrieval withholds
   every case from the items its text is about, whatever it declares.

Before all of them, ``rationale`` (`check_rationale`): the proposal's rationale is at most
`MAX_RATIONALE_CHARS` characters. It is stored with the experiment, written into the candidate's commit
message and shown in every later history, so one oversized rationale would grow the ledger, git and every
optimiser prompt after it; a rejected one is kept clipped (`clipped_rationale`).

Guards 5-7 skip ``prompts/memory/cases.jsonl`` (``LINT_EXEMPT``): a case names its own dev items and
describes them by design, and cross-fitting keeps it out of its own items' fold; guard 8 lints it
against every other item. Whether its ``source_items`` are dev items is checked when the candidate is
validated (`optimizer.loop.validate`). ``prompts/memory/principles.md`` is linted like any prompt.

Guards 5-7 compare *normalised* text, old and new alike: NFKC; format characters (zero-width
spaces and joiners, soft hyphens, BOMs, tags), combining marks, private-use, unassigned and control
characters (but white space) dropped; Cyrillic, Greek and Armenian look-alikes of Latin letters
folded to Latin; every decimal digit to ASCII. Runs that look like base64 (8+ characters of the
standard or URL-safe alphabet) or hex (4+ bytes, plain or as ``\\x..``, ``0x..``, ``%..``, spaced
or colon-separated) are decoded, and the decoded text, when it is printable UTF-8, is linted with
the rest (two levels deep).

Reasons name the file and exactly what tripped, e.g.
``prompts/rubric.md copies 9 words from a dev instruction: 'open the settings page and turn on ...'``.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, cast

from optimizer.errors import UserError
from optimizer.judge.memory import CASES_JSONL, parse_cases
from optimizer.judge.overfit import (
    COPY_NGRAM,
    MIN_ID_LENGTH,
    MIN_ID_PREFIX,
    IdIndex,
    LintText,
    decoded_texts,
    first_new_value,
    instruction_ngrams,
    instruction_values,
    longest_copy,
    longest_new_copy,
    new_value,
    normalise_text,
    normalise_words,
    quote_words,
    trajectory_values,
)
from optimizer.judge.provenance import ItemIndex, foreign_reason
from optimizer.structure import check_structure
from optimizer.workspace.paths import JUDGE_TOML, prompt_file_or_none

# The lint's matching, importable from here as before (it lives in `optimizer.judge.overfit`, shared with the
# memory's provenance check).
__all__ = [
    "COPY_NGRAM",
    "MAX_RATIONALE_CHARS",
    "MIN_ID_LENGTH",
    "MIN_ID_PREFIX",
    "GuardResult",
    "LintText",
    "changed_line_count",
    "check_candidate",
    "check_cases",
    "check_protected",
    "check_rationale",
    "clipped_rationale",
    "decoded_texts",
    "instruction_ngrams",
    "instruction_values",
    "longest_new_copy",
    "new_value",
    "normalise_text",
    "normalise_words",
    "protected_regions",
    "trajectory_values",
]


# Files guards 5-7 do not lint (see check_candidate): guard 8 checks cases.jsonl case by case.
LINT_EXEMPT = frozenset({CASES_JSONL})
PROTECTED_BEGIN = "<!-- judgeloop:protected:begin -->"
PROTECTED_END = "<!-- judgeloop:protected:end -->"
# A rationale is one paragraph; this is several pages (see check_rationale).
MAX_RATIONALE_CHARS = 4_000

GuardName = Literal[
    "ok",
    "rationale",
    "empty",
    "allowed_files",
    "structure",
    "protected",
    "diff_size",
    "overfit_id",
    "overfit_copy",
    "overfit_value",
    "overfit_case",
]
Changes = Mapping[str, tuple[str | None, str | None]]


@dataclass(frozen=True)
class GuardResult:
    """``ok`` or the first guard that failed (``guard``) with a one-line ``reason``."""

    ok: bool
    reason: str = ""
    guard: GuardName = "ok"


_PASS = GuardResult(ok=True)


def _fail(guard: GuardName, reason: str) -> GuardResult:
    return GuardResult(ok=False, reason=reason, guard=guard)


def check_rationale(rationale: str) -> GuardResult:
    """The ``rationale`` guard: ``rationale`` is at most `MAX_RATIONALE_CHARS` characters."""
    if len(rationale) <= MAX_RATIONALE_CHARS:
        return _PASS
    return _fail(
        "rationale",
        f"the rationale is {len(rationale):,} characters, over the cap of "
        f"{MAX_RATIONALE_CHARS:,}; say why in one paragraph",
    )


def clipped_rationale(rationale: str) -> str:
    """``rationale`` as the ledger keeps it: whole within `MAX_RATIONALE_CHARS`, else its first
    `MAX_RATIONALE_CHARS` characters and a note of how many were dropped (the guard rejects it)."""
    if len(rationale) <= MAX_RATIONALE_CHARS:
        return rationale
    dropped = len(rationale) - MAX_RATIONALE_CHARS
    return rationale[:MAX_RATIONALE_CHARS] + f" [... {dropped:,} more characters not kept]"


def protected_regions(text: str) -> list[str]:
    """The protected regions of ``text`` (markers included), in order; an unclosed one runs to the end."""
    regions: list[str] = []
    pos = 0
    while (start := text.find(PROTECTED_BEGIN, pos)) != -1:
        end = text.find(PROTECTED_END, start + len(PROTECTED_BEGIN))
        stop = len(text) if end == -1 else end + len(PROTECTED_END)
        regions.append(text[start:stop])
        pos = stop
    return regions


def changed_line_count(old: str | None, new: str | None) -> int:
    """Lines added plus lines removed between two texts (``None`` = empty file)."""
    a = (old or "").splitlines()
    b = (new or "").splitlines()
    count = 0
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes():
        if tag != "equal":
            count += (i2 - i1) + (j2 - j1)
    return count


def _new_id(path: str, old: LintText, new: LintText, index: IdIndex) -> GuardResult | None:
    for key in index.keys:
        if key in new.compact and new.compact.count(key) > old.compact.count(key):
            return _fail(
                "overfit_id",
                f"{path} contains the dev id {index.by_key[key]!r}; write rules, not item references",
            )
    new_prefixes = index.prefixes(new)
    if new_prefixes:
        old_prefixes = index.prefixes(old)
        for prefix in sorted(new_prefixes):
            if new_prefixes[prefix] > old_prefixes[prefix]:
                return _fail(
                    "overfit_id",
                    f"{path} contains {prefix!r}, a prefix of the dev id "
                    f"{index.owner(prefix)!r}; write rules, not item references",
                )
    return None


def _is_ngram_set(value: object) -> bool:
    return isinstance(value, set | frozenset) and all(isinstance(g, tuple) for g in value) and bool(value)


@dataclass(frozen=True)
class DevMaterial:
    """What guards 5-8 compare a candidate with: the dev split's item ids and recording ids, its
    instructions (the texts, or a prebuilt ``instruction_ngrams`` set), the values in them (a prebuilt
    ``instruction_values`` set; computed from the texts when None, required with a prebuilt n-gram set),
    the values its agents typed and clicked (a prebuilt ``trajectory_values`` set) and its `ItemIndex`
    (required when a candidate changes cases.jsonl). Build it with `of_texts` or `prebuilt`."""

    ids: Iterable[str]
    recording_ids: Iterable[str]
    instructions: Iterable[str] | set[tuple[str, ...]]
    values: Iterable[str] | None = None
    trajectory_values: Iterable[str] = ()
    items: ItemIndex | None = None

    @classmethod
    def of_texts(
        cls,
        ids: Iterable[str],
        recording_ids: Iterable[str],
        instructions: Iterable[str],
        *,
        trajectory_values: Iterable[str] = (),
        items: ItemIndex | None = None,
    ) -> DevMaterial:
        """From the instruction texts (their n-grams and values computed when a candidate is checked)."""
        return cls(ids, recording_ids, instructions, None, trajectory_values, items)

    @classmethod
    def prebuilt(
        cls,
        ids: Iterable[str],
        recording_ids: Iterable[str],
        grams: set[tuple[str, ...]],
        values: Iterable[str],
        *,
        trajectory_values: Iterable[str] = (),
        items: ItemIndex | None = None,
    ) -> DevMaterial:
        """From the instructions' prebuilt n-gram and value sets (what a run builds once)."""
        return cls(ids, recording_ids, grams, values, trajectory_values, items)


def check_candidate(
    changed: Changes,
    allowed_files: Iterable[str],
    max_diff_lines: int,
    dev: DevMaterial,
    *,
    structure_moves: Sequence[str] = (),
    max_members: int = 1,
) -> GuardResult:
    """Run every guard on a candidate; the first failure wins (see the module docstring).

    ``dev``: what the overfitting guards compare with (`DevMaterial`); with a prebuilt n-gram set its
    ``values`` are required (a ValueError otherwise): the value guard is never skipped. ``structure_moves``
    and ``max_members``: ``[optimizer]``'s, for an edit of prompts/judge.toml (guard 2). ``dev.items`` is
    required when the candidate changes cases.jsonl (guard 8; a ValueError otherwise).
    """
    dev_ids, dev_recording_ids, dev_instructions = dev.ids, dev.recording_ids, dev.instructions
    dev_values, dev_trajectory_values, dev_items = dev.values, dev.trajectory_values, dev.items
    grams: set[tuple[str, ...]]
    if _is_ngram_set(dev_instructions):
        if dev_values is None:
            raise ValueError(
                "check_candidate needs dev_values (DevMaterial.values) with a prebuilt n-gram set "
                "(pass instruction_values)"
            )
        grams = cast(set[tuple[str, ...]], dev_instructions)
    else:
        texts = [str(i) for i in dev_instructions]
        grams = instruction_ngrams(texts)
        if dev_values is None:
            dev_values = instruction_values(texts)
    changes = {path: pair for path, pair in changed.items() if pair[0] != pair[1]}
    if not changes:
        return _fail("empty", "the candidate changes nothing")
    if CASES_JSONL in changes and dev_items is None:
        raise ValueError(
            "check_candidate needs dev_items (an ItemIndex) for a candidate that changes cases.jsonl"
        )

    # One path rule (`optimizer.workspace.paths`): a spelling that is not the canonical name of an allowed file is outside.
    allowed = {name for a in allowed_files if (name := prompt_file_or_none(a)) is not None} - {JUDGE_TOML}
    if JUDGE_TOML in changes:
        old_toml, new_toml = changes[JUDGE_TOML]
        if new_toml is None:
            return _fail(
                "structure", f"the candidate deletes {JUDGE_TOML}; structure moves edit keys, never the file"
            )
        refused = check_structure(JUDGE_TOML, old_toml, new_toml, structure_moves, max_members)
        if refused is not None:
            return _fail("structure", refused)
        allowed.add(JUDGE_TOML)
    outside = sorted(
        p for p in changes if prompt_file_or_none(p) not in allowed or prompt_file_or_none(p) != p
    )
    if outside:
        return _fail(
            "allowed_files",
            f"the candidate changes {', '.join(outside)}, outside the allowed files ({', '.join(sorted(allowed))})",
        )
    for path, (_old, new) in sorted(changes.items()):
        if new is None:
            return _fail(
                "allowed_files", f"the candidate deletes {path}; allowed files may be edited, not deleted"
            )

    for path, (old, new) in sorted(changes.items()):
        result = check_protected(path, old or "", new or "")
        if not result.ok:
            return result

    total = sum(changed_line_count(old, new) for old, new in changes.values())
    if total > max_diff_lines:
        per_file = ", ".join(f"{p} {changed_line_count(o, n)}" for p, (o, n) in sorted(changes.items()))
        return _fail(
            "diff_size", f"the candidate changes {total} lines ({per_file}), over the cap of {max_diff_lines}"
        )

    # Every text is normalised and decoded once; guards 5-7 all read these. Not the memory's cases: a case
    # names its own dev items and quotes their instructions by design; guard 8 lints it against the others.
    texts_of = {
        path: (LintText(old), LintText(new))
        for path, (old, new) in sorted(changes.items())
        if path not in LINT_EXEMPT
    }
    index = IdIndex([*dev_ids, *dev_recording_ids])
    for path, (old_t, new_t) in texts_of.items():
        failed = _new_id(path, old_t, new_t, index)
        if failed is not None:
            return failed
    for path, (old_t, new_t) in texts_of.items():
        copied = longest_copy(old_t, new_t, grams)
        if copied:
            return _fail(
                "overfit_copy",
                f"{path} copies {len(copied)} words from a dev instruction: '{quote_words(copied)}'",
            )
    value_sets = ((sorted(dev_values), "instruction"), (sorted(set(dev_trajectory_values)), "trajectory"))
    for path, (old_t, new_t) in texts_of.items():
        for values, source in value_sets:
            value = first_new_value(old_t, new_t, values)
            if value is not None:
                return _fail(
                    "overfit_value",
                    f"{path} names {value!r}, a value from a dev {source}; write rules that hold for any value",
                )
    if CASES_JSONL in changes and dev_items is not None:
        return check_cases(*changes[CASES_JSONL], dev_items)
    return _PASS


def check_cases(old: str | None, new: str | None, dev_items: ItemIndex) -> GuardResult:
    """Guard 8 alone: no case of ``new`` (cases.jsonl's text) that is new or changed since ``old`` is about a dev
    item outside its sources' pair groups (`optimizer.judge.provenance.foreign_reason`). A file that does not
    parse passes here: the candidate's validation refuses it in its own words."""
    try:
        after = parse_cases(new or "")
    except UserError:
        return _PASS
    try:
        before = {c.id: c for c in parse_cases(old or "")}
    except UserError:  # an incumbent file that no longer parses: every case is checked
        before = {}
    for case in after:
        if before.get(case.id) == case:
            continue  # the incumbent's case as it was: retrieval withholds it from what it is about anyway
        reason = foreign_reason(case, dev_items)
        if reason is not None:
            return _fail("overfit_case", f"{CASES_JSONL}: {reason}")
    return _PASS


def check_protected(path: str, old: str, new: str) -> GuardResult:
    """Guard 3 alone: ``new`` keeps every protected region and marker of ``old`` (also checked up front
    for a manual edit, `optimizer.loop.strategies.manual.capture_edits`)."""
    for marker in (PROTECTED_BEGIN, PROTECTED_END):
        before, after = old.count(marker), new.count(marker)
        if after < before:
            return _fail("protected", f"{path} removes a protection marker {marker}")
        if after > before:
            return _fail(
                "protected", f"{path} adds a protection marker {marker}; protected regions are set by humans"
            )
    old_regions, new_regions = protected_regions(old), protected_regions(new)
    for index, (a, b) in enumerate(zip(old_regions, new_regions, strict=True), start=1):
        if a != b:
            line = old[: old.find(a)].count("\n") + 1
            return _fail("protected", f"{path} edits protected region {index} (starting at line {line})")
    return _PASS
