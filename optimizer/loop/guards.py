"""Guards: pure checks every candidate passes before any judge call is spent on it.

``check_candidate`` takes the candidate's changed files as ``{path: (old_text, new_text)}``
(``None`` = absent; ``gitops.worktree_changes`` builds it) and returns the first failing guard:

1. ``empty`` — the candidate must change something.
2. ``allowed_files`` — only the files ``[optimizer] allowed_files`` names may change, and none may
   be deleted.
3. ``protected`` — every region between ``<!-- judgeloop:protected:begin -->`` and
   ``<!-- judgeloop:protected:end -->`` is byte-identical and in the same order, and no marker
   is added or removed.
4. ``diff_size`` — changed lines (added + removed, counted with difflib over whole lines, the same
   total as ``git diff --numstat``) at most ``max_diff_lines`` over all files.
5. ``overfit_id`` — no dev trajectory id or recording id appears (case-insensitive) more often in
   the new text than in the old one.
6. ``overfit_copy`` — no run of 8+ consecutive words of a dev instruction (lower-cased, punctuation
   dropped) is *new* in the candidate. Only n-grams absent from the old text count, so a phrase that
   was already in the prompt (e.g. a generic "open the file and save it ...") does not block every
   later edit of that file; the guard stops the optimiser from pasting instructions in, not the
   prompt from ever resembling one.
7. ``overfit_value`` — no distinctive value of a dev instruction appears more often in the new text
   than in the old one: a file name, path, e-mail address, date, time or any other token with a
   digit or an inner ``. @ _ / \\ :`` (at least 4 characters, e.g. ``report_q3.xlsx``,
   ``14:30``, ``2024-05-01``), or a quoted name of 2+ words (``"Project Alpha"``). Short
   paraphrases slip past the 8-word copy lint; the concrete values an answer key would need do not.
   Plain words are never values, so general rules ("check every file name") always pass.

Reasons name the file and exactly what tripped, e.g.
``prompts/rubric.md copies 9 words from a dev instruction: 'open the settings page and turn on ...'``.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

from optimizer.paths import prompt_file_or_none

PROTECTED_BEGIN = "<!-- judgeloop:protected:begin -->"
PROTECTED_END = "<!-- judgeloop:protected:end -->"
COPY_NGRAM = 8
# Ids shorter than this are not searched for: they would match ordinary words (real ids are UUIDs).
MIN_ID_LENGTH = 6

GuardName = Literal[
    "ok", "empty", "allowed_files", "protected", "diff_size", "overfit_id", "overfit_copy", "overfit_value"
]
Changes = Mapping[str, tuple[str | None, str | None]]

_WORD_RE = re.compile(r"[^\W_]+", re.UNICODE)
MIN_VALUE_LENGTH = 4
_VALUE_STRIP = " \t\"'`()[]{}<>,;:!?.\u201c\u201d\u2018\u2019"
_INNER_SEPARATOR_RE = re.compile(r"[^\W_][.@_/\\:][^\W_]", re.UNICODE)
_QUOTED_RE = re.compile(r'"([^"\n]{3,80})"|\u201c([^\u201d\n]{3,80})\u201d|(?:(?<=\s)|^)\'([^\'\n]{3,80})\'(?=[\s.,;:!?)]|$)')


@dataclass(frozen=True)
class GuardResult:
    """``ok`` or the first guard that failed (``guard``) with a one-line ``reason``."""

    ok: bool
    reason: str = ""
    guard: GuardName = "ok"


_PASS = GuardResult(ok=True)


def _fail(guard: GuardName, reason: str) -> GuardResult:
    return GuardResult(ok=False, reason=reason, guard=guard)


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


def normalise_words(text: str) -> list[str]:
    """Lower-cased words with punctuation dropped (what the copy lint compares)."""
    return _WORD_RE.findall(text.lower())


def _ngrams(words: list[str], n: int) -> set[tuple[str, ...]]:
    return {tuple(words[i:i + n]) for i in range(len(words) - n + 1)}


def instruction_ngrams(instructions: Iterable[str], n: int = COPY_NGRAM) -> set[tuple[str, ...]]:
    """Every word n-gram of the dev instructions (build once per run and pass to ``check_candidate``)."""
    grams: set[tuple[str, ...]] = set()
    for instruction in instructions:
        grams |= _ngrams(normalise_words(instruction), n)
    return grams


def instruction_values(instructions: Iterable[str]) -> set[str]:
    """The distinctive values of the dev instructions, lower-cased (see guard 7): tokens of 4+
    characters with a digit or an inner ``. @ _ / \\ :``, and quoted names of 2+ words (as words)."""
    values: set[str] = set()
    for instruction in instructions:
        for token in instruction.split():
            value = token.strip(_VALUE_STRIP).lower()
            if len(value) >= MIN_VALUE_LENGTH and (
                any(c.isdigit() for c in value) or _INNER_SEPARATOR_RE.search(value)
            ):
                values.add(value)
        for match in _QUOTED_RE.finditer(instruction):
            words = normalise_words(next(g for g in match.groups() if g))
            if len(words) >= 2:
                values.add(" ".join(words))
    return values


def _value_count(text: str, value: str) -> int:
    """Occurrences of ``value`` in lower-cased ``text`` as a whole token (a quoted name: as words)."""
    if " " in value:  # a quoted name: compare word sequences
        return f" {' '.join(normalise_words(text))} ".count(f" {value} ")
    return len(re.findall(rf"(?<![\w.@/\\:-]){re.escape(value)}(?![\w@/\\:-]|\.\w)", text.lower()))


def new_value(old: str | None, new: str, values: Iterable[str]) -> str | None:
    """The first (sorted) dev-instruction value that occurs more often in ``new`` than in ``old``."""
    new_l, old_l = new.lower(), (old or "").lower()
    for value in sorted(values):
        if value in new_l or " " in value:
            if _value_count(new_l, value) > _value_count(old_l, value):
                return value
    return None


def longest_new_copy(
    old: str | None, new: str, instruction_grams: set[tuple[str, ...]], n: int = COPY_NGRAM
) -> list[str]:
    """The longest run of words in ``new`` covered by instruction n-grams that ``old`` lacks ([] if none)."""
    words = normalise_words(new)
    if len(words) < n or not instruction_grams:
        return []
    old_grams = _ngrams(normalise_words(old or ""), n)
    best: tuple[int, int] = (0, -1)  # (first ngram index, last ngram index) of the longest run
    run_start: int | None = None
    for i in range(len(words) - n + 1):
        gram = tuple(words[i:i + n])
        if gram in instruction_grams and gram not in old_grams:
            run_start = i if run_start is None else run_start
            if i - run_start > best[1] - best[0]:
                best = (run_start, i)
        else:
            run_start = None
    if best[1] < best[0]:
        return []
    return words[best[0]:best[1] + n]


def _quote(words: list[str], limit: int = 80) -> str:
    text = " ".join(words)
    return text if len(text) <= limit else text[: limit - 3].rstrip() + "..."


def check_candidate(
    changed: Changes,
    allowed_files: Iterable[str],
    max_diff_lines: int,
    dev_ids: Iterable[str],
    dev_recording_ids: Iterable[str],
    dev_instructions: Iterable[str] | set[tuple[str, ...]],
    dev_values: Iterable[str] | None = None,
) -> GuardResult:
    """Run every guard on a candidate; the first failure wins (see the module docstring).

    ``dev_instructions`` is either the instruction texts or a prebuilt ``instruction_ngrams`` set;
    ``dev_values`` a prebuilt ``instruction_values`` set (when None, computed from
    ``dev_instructions``, which must then be the texts).
    """
    if not isinstance(dev_instructions, set):
        dev_instructions = list(dev_instructions)
        if dev_values is None:
            dev_values = instruction_values(dev_instructions)
    changes = {path: pair for path, pair in changed.items() if pair[0] != pair[1]}
    if not changes:
        return _fail("empty", "the candidate changes nothing")

    # One path rule (`optimizer.paths`): a spelling that is not the canonical name of an allowed file is outside.
    allowed = {name for a in allowed_files if (name := prompt_file_or_none(a)) is not None}
    outside = sorted(p for p in changes if prompt_file_or_none(p) not in allowed or prompt_file_or_none(p) != p)
    if outside:
        return _fail(
            "allowed_files",
            f"the candidate changes {', '.join(outside)}, outside the allowed files ({', '.join(sorted(allowed))})",
        )
    for path, (_old, new) in sorted(changes.items()):
        if new is None:
            return _fail("allowed_files", f"the candidate deletes {path}; allowed files may be edited, not deleted")

    for path, (old, new) in sorted(changes.items()):
        result = _check_protected(path, old or "", new or "")
        if not result.ok:
            return result

    total = sum(changed_line_count(old, new) for old, new in changes.values())
    if total > max_diff_lines:
        per_file = ", ".join(f"{p} {changed_line_count(o, n)}" for p, (o, n) in sorted(changes.items()))
        return _fail("diff_size", f"the candidate changes {total} lines ({per_file}), over the cap of {max_diff_lines}")

    ids = sorted({i.strip() for i in (*dev_ids, *dev_recording_ids) if len(i.strip()) >= MIN_ID_LENGTH})
    for path, (old, new) in sorted(changes.items()):
        new_l, old_l = (new or "").lower(), (old or "").lower()
        for ident in ids:
            needle = ident.lower()
            if new_l.count(needle) > old_l.count(needle):
                return _fail("overfit_id", f"{path} contains the dev id {ident!r}; write rules, not item references")

    grams = (
        dev_instructions if isinstance(dev_instructions, set) else instruction_ngrams(dev_instructions)
    )
    for path, (old, new) in sorted(changes.items()):
        copied = longest_new_copy(old, new or "", grams)
        if copied:
            return _fail(
                "overfit_copy",
                f"{path} copies {len(copied)} words from a dev instruction: '{_quote(copied)}'",
            )
    for path, (old, new) in sorted(changes.items()):
        value = new_value(old, new or "", dev_values or ())
        if value is not None:
            return _fail(
                "overfit_value",
                f"{path} names {value!r}, a value from a dev instruction; write rules that hold for any value",
            )
    return _PASS


def _check_protected(path: str, old: str, new: str) -> GuardResult:
    for marker in (PROTECTED_BEGIN, PROTECTED_END):
        before, after = old.count(marker), new.count(marker)
        if after < before:
            return _fail("protected", f"{path} removes a protection marker {marker}")
        if after > before:
            return _fail("protected", f"{path} adds a protection marker {marker}; protected regions are set by humans")
    old_regions, new_regions = protected_regions(old), protected_regions(new)
    for index, (a, b) in enumerate(zip(old_regions, new_regions, strict=True), start=1):
        if a != b:
            line = old[: old.find(a)].count("\n") + 1
            return _fail("protected", f"{path} edits protected region {index} (starting at line {line})")
    return _PASS
