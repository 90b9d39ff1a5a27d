"""Memory provenance by content: which items a case's text is about, whatever its ``source_items`` declare.

A case's declared sources are a claim; its text is evidence. A case is *about* item T when its text,
normalised and decoded as the overfit lint reads any prompt text (`optimizer.judge.overfit`), holds

- T's trajectory id or the id of T's recording (its screenshots' folder), whole or as a prefix of 5+
  characters with a digit (the lint's guard 5);
- a run of 8+ consecutive words of T's instruction (guard 6);
- a distinctive value of T's instruction or actions: a file name, date, typed phrase, click target ...
  (guard 7's values: `instruction_values`, `trajectory_values`).

`ItemIndex` holds one split's items' material, built once (each item's n-grams, values and ids go into
inverted indexes), so `ItemIndex.about` costs one pass over a case's words and tokens, not a pass over
every item: 162 items x 500 cases stay well under a second. Retrieval (`optimizer.judge.memory.Retriever`)
withholds a case from every item it is about as from its declared sources; the loop's guard rejects a
case about an item outside its sources' pair groups (`optimizer.loop.guards`). Judge input only: ids,
instructions, actions and screenshot folders; never a label.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from optimizer.judge.memory import Case, FoldSource, pair_groups, recording_of
from optimizer.judge.overfit import (
    COPY_NGRAM,
    IdIndex,
    LintText,
    id_key,
    instruction_ngrams,
    instruction_values,
    longest_copy,
    quote_words,
    trajectory_values,
)
from optimizer.models import Trajectory

# What the value rule's boundaries treat as part of a token (`LintText.value_count`): a value starts after
# none of these, and ends before none of them (nor before a "." that a word character follows).
_TOKEN_CHARS = re.compile(r"[\w.@/\\:-]")
_CHUNK_RE = re.compile(r"\S+")


@dataclass(frozen=True)
class Match:
    """Why a text is about an item: ``kind`` (``id``, ``instruction`` or ``value``) and what matched."""

    item: str
    kind: str
    detail: str

    def describe(self) -> str:
        """One phrase, e.g. ``names 'report_q3.xlsx', a value of item t7's instruction or actions``."""
        if self.kind == "id":
            return f"names {self.detail!r}, the id of item {self.item} (or of its recording)"
        if self.kind == "instruction":
            return f"copies item {self.item}'s instruction ('{self.detail}')"
        return f"names {self.detail!r}, a value of item {self.item}'s instruction or actions"


class ItemIndex:
    """The material of one split's items, indexed once: ids, instruction 8-grams, distinctive values, pair groups."""

    def __init__(self, items: Iterable[tuple[str, Trajectory]]) -> None:
        self._grams: dict[tuple[str, ...], set[str]] = {}
        self._item_grams: dict[str, set[tuple[str, ...]]] = {}
        self._tokens: dict[str, set[str]] = {}  # a value without a space -> its items
        self._phrases: dict[str, dict[str, set[str]]] = {}  # first word -> phrase value -> its items
        id_owners: dict[str, set[str]] = {}
        group_input = []
        for tid, traj in items:
            instruction = traj.task.instruction
            recording = recording_of(traj)
            group_input.append((tid, instruction, recording))
            grams = instruction_ngrams([instruction])
            self._item_grams[tid] = grams
            for gram in grams:
                self._grams.setdefault(gram, set()).add(tid)
            for value in instruction_values([instruction]) | trajectory_values([traj]):
                if " " in value:
                    self._phrases.setdefault(value.split(" ", 1)[0], {}).setdefault(value, set()).add(tid)
                else:
                    self._tokens.setdefault(value, set()).add(tid)
            for ident in (tid, recording):
                if ident:
                    id_owners.setdefault(id_key(ident), set()).add(tid)
        self._ids = IdIndex(ident for tid, _, rec in group_input for ident in (tid, rec) if ident)
        self._id_owners = id_owners
        self._max_token = max((len(v) for v in self._tokens), default=0)
        self.kin: dict[str, frozenset[str]] = {}
        for group in pair_groups(group_input):
            for tid in group:
                self.kin[tid] = frozenset(group)

    @property
    def ids(self) -> frozenset[str]:
        return frozenset(self.kin)

    def about(self, text: str) -> dict[str, Match]:
        """The items ``text`` is about, each with the first reason found (ids, then instruction, then values)."""
        lint = LintText(text)
        found: dict[str, Match] = {}

        def add(items: Iterable[str], kind: str, detail: str) -> None:
            for item in sorted(items):
                found.setdefault(item, Match(item, kind, detail))

        for key in self._ids.keys:
            if key in lint.compact:
                add(self._id_owners[key], "id", self._ids.by_key[key])
        for prefix in sorted(self._ids.prefixes(lint)):
            owner = self._ids.owner(prefix)
            if owner is not None:
                add(self._id_owners[id_key(owner)], "id", prefix)
        words = lint.words
        copied: set[str] = set()
        for i in range(len(words) - COPY_NGRAM + 1):
            copied |= self._grams.get(tuple(words[i:i + COPY_NGRAM]), set())
        for item in sorted(copied - set(found)):
            run = longest_copy(LintText(None), lint, self._item_grams[item])
            add([item], "instruction", quote_words(run))
        for value, items in self._values_in(lint):
            add(items, "value", value)
        return found

    def _values_in(self, lint: LintText) -> list[tuple[str, set[str]]]:
        """The indexed values ``lint`` holds (by the lint's own `LintText.value_count`), sorted."""
        hits: dict[str, set[str]] = {}
        for first in lint.word_set & self._phrases.keys():
            for value, items in self._phrases[first].items():
                if lint.value_count(value):
                    hits[value] = items
        for candidate in self._token_candidates(lint.lower):
            items = self._tokens.get(candidate)
            if items is not None and lint.value_count(candidate):
                hits[candidate] = items
        return sorted(hits.items())

    def _token_candidates(self, lower: str) -> set[str]:
        """Every substring of a white-space-free chunk of ``lower`` that the value rule's boundaries allow
        (see ``_TOKEN_CHARS``) and no longer than the longest indexed token: what a token value can be."""
        out: set[str] = set()
        for chunk_match in _CHUNK_RE.finditer(lower):
            chunk = chunk_match.group(0)
            n = len(chunk)
            starts = [s for s in range(n) if s == 0 or not _TOKEN_CHARS.match(chunk[s - 1])]
            ends = [e for e in range(1, n + 1) if e == n or _ends_token(chunk, e)]
            for s in starts:
                for e in ends:
                    if e - s > self._max_token:
                        break
                    if e > s:
                        out.add(chunk[s:e])
        return out


def _ends_token(chunk: str, e: int) -> bool:
    """A value may end before ``chunk[e]``: not a token character, or a "." no word character follows."""
    ch = chunk[e]
    if ch == ".":
        return e + 1 == len(chunk) or not re.match(r"\w", chunk[e + 1])
    return not _TOKEN_CHARS.match(ch)


_KIND_ORDER = ("id", "instruction", "value")  # the plainest evidence first, for the reason


def foreign_matches(index: ItemIndex, text: str, source_items: Iterable[str]) -> list[Match]:
    """What ``text`` is about beyond the pair groups of ``source_items`` (items the case does not declare and
    that share no instruction or recording with one it does): ids first, then instruction copies, then values."""
    own: set[str] = set()
    for source in source_items:
        own |= index.kin.get(source, frozenset({source}))
    found = [m for m in index.about(text).values() if m.item not in own]
    return sorted(found, key=lambda m: (_KIND_ORDER.index(m.kind), m.item))


def foreign_reason(case: Case, index: ItemIndex) -> str | None:
    """Why ``case`` may not be kept (one sentence naming the case and the item), or None: its text is about an
    item of ``index`` outside its sources' pair groups, so the item's own answer could travel under another
    item's name (the guard and the memory tools give this reason alike)."""
    matches = foreign_matches(index, case.text, case.source_items)
    if not matches:
        return None
    first = matches[0]
    more = f" (and {len(matches) - 1} more item{'s' if len(matches) > 2 else ''})" if len(matches) > 1 else ""
    return (f"case {case.id} {first.describe()}{more}, which is not one of its source_items nor paired with one: "
            f"a case about an item carries that item's own answer; name {first.item} in source_items if the case "
            "was distilled from it, or write the lesson without its id, instruction and values")


def split_items(split: FoldSource) -> ItemIndex:
    """The `ItemIndex` of every item of ``split`` (reads each trajectory once)."""
    return ItemIndex((tid, split.trajectory(tid)) for tid in split.ids)
