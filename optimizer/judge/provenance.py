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
every item (about 12 ms for a case of 2,000 characters against 162 items of 120 steps, measured on a
shared two-core machine under a load of 8), and remembers its answer per text; `split_items` keeps a
split's index per process, so a run pays for each case text once, not once per candidate. Retrieval
(`optimizer.judge.memory.Retriever`) withholds a case from every item it is about as from its declared
sources; the loop's guard rejects a case about an item outside its sources' pair groups
(`optimizer.loop.guards`). Judge input only: ids, instructions, actions and screenshot folders; never
a label.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Iterable
from dataclasses import dataclass

from optimizer.judge.memory import MAX_CASES, Case, FoldSource, pair_groups, recording_of
from optimizer.judge.overfit import (
    COORDINATE_RE,
    COPY_NGRAM,
    MIN_VALUE_LENGTH,
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

# The value rule's boundaries (`LintText.value_count`): where a token value may start and end in a chunk.
_START_RE = re.compile(r"(?<![\w.@/\\:-])")
_END_RE = re.compile(r"(?![\w@/\\:-]|\.\w)")
# A chunk of word characters with single inner dots ("report_q3.xlsx", "saved."): it starts only at 0.
_PLAIN_RE = re.compile(r"\w+(?:\.\w+)*\.*")


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
        # (a coordinate pair?, words) -> phrase value -> its items; a coordinate pair reads the axis-free words.
        self._phrases: dict[tuple[bool, int], dict[str, set[str]]] = {}
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
                    shape = (bool(COORDINATE_RE.fullmatch(value)), value.count(" ") + 1)
                    self._phrases.setdefault(shape, {}).setdefault(value, set()).add(tid)
                else:
                    self._tokens.setdefault(value, set()).add(tid)
            for ident in (tid, recording):
                if ident:
                    id_owners.setdefault(id_key(ident), set()).add(tid)
        self._ids = IdIndex(ident for tid, _, rec in group_input for ident in (tid, rec) if ident)
        self._id_owners = id_owners
        self._max_token = max((len(v) for v in self._tokens), default=0)
        self._about: dict[str, dict[str, Match]] = {}
        self.kin: dict[str, frozenset[str]] = {}
        for group in pair_groups(group_input):
            for tid in group:
                self.kin[tid] = frozenset(group)

    @property
    def ids(self) -> frozenset[str]:
        return frozenset(self.kin)

    def about(self, text: str) -> dict[str, Match]:
        """The items ``text`` is about, each with the first reason found (ids, then instruction, then values);
        remembered per text (a run re-reads the same cases for every candidate)."""
        known = self._about.get(text)
        if known is None:
            if len(self._about) >= MAX_REMEMBERED_TEXTS:
                self._about.clear()
            known = self._about[text] = self._find(text)
        return dict(known)

    def _find(self, text: str) -> dict[str, Match]:
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
            copied |= self._grams.get(tuple(words[i : i + COPY_NGRAM]), set())
        for item in sorted(copied - set(found)):
            run = longest_copy(LintText(None), lint, self._item_grams[item])
            add([item], "instruction", quote_words(run))
        for value, items in self._values_in(lint):
            add(items, "value", value)
        return found

    def _values_in(self, lint: LintText) -> list[tuple[str, set[str]]]:
        """The indexed values ``lint`` holds (by the lint's own `LintText.value_count`), sorted. Candidates come
        from the text (its word runs of each phrase length, its tokens), so the cost is the text's, not the index's."""
        hits: dict[str, set[str]] = {}
        lines = {False: lint.word_line.split(), True: lint.coordinate_line.split()}
        for (coordinate, length), phrases in self._phrases.items():
            words = lines[coordinate]
            for i in range(len(words) - length + 1):
                value = " ".join(words[i : i + length])
                items = phrases.get(value)
                if items is not None and lint.value_count(value):
                    hits[value] = items
        for candidate in self._token_candidates(lint.lower):
            items = self._tokens.get(candidate)
            if items is not None and lint.value_count(candidate):
                hits[candidate] = items
        return sorted(hits.items())

    def _token_candidates(self, lower: str) -> set[str]:
        """Every substring of a white-space-free chunk of ``lower`` that the value rule's boundaries allow
        (`LintText.value_count`) and no longer than the longest indexed token: what a token value can be."""
        out: set[str] = set()
        for chunk in lower.split():
            if len(chunk) < MIN_VALUE_LENGTH:
                continue
            if _PLAIN_RE.fullmatch(chunk):  # the common case: letters, digits and inner dots only
                ends = [m.start() for m in _END_RE.finditer(chunk)]
                out.update(chunk[:e] for e in ends if MIN_VALUE_LENGTH <= e <= self._max_token)
                continue
            starts = [m.start() for m in _START_RE.finditer(chunk)]
            ends = [m.start() for m in _END_RE.finditer(chunk)]
            for s in starts:
                for e in ends[bisect.bisect_right(ends, s + MIN_VALUE_LENGTH - 1) :]:
                    if e - s > self._max_token:
                        break
                    out.add(chunk[s:e])
        return out


MAX_REMEMBERED_TEXTS = 4 * MAX_CASES  # a bound on what `ItemIndex.about` remembers

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
    return (
        f"case {case.id} {first.describe()}{more}, which is not one of its source_items nor paired with one: "
        f"a case about an item carries that item's own answer; name {first.item} in source_items if the case "
        "was distilled from it, or write the lesson without its id, instruction and values"
    )


# A run judges one split many times: its index (and what each case text is about) is kept per split content.
_SPLIT_INDEXES: dict[tuple[str, tuple[str, ...]], ItemIndex] = {}
MAX_CACHED_SPLITS = 2


def split_items(split: FoldSource) -> ItemIndex:
    """The `ItemIndex` of every item of ``split`` (reads each trajectory once per process and split fingerprint)."""
    key = (split.fingerprint, tuple(split.ids))
    index = _SPLIT_INDEXES.get(key)
    if index is None:
        index = ItemIndex((tid, split.trajectory(tid)) for tid in split.ids)
        if len(_SPLIT_INDEXES) >= MAX_CACHED_SPLITS:
            _SPLIT_INDEXES.pop(next(iter(_SPLIT_INDEXES)))
        _SPLIT_INDEXES[key] = index
    return index
