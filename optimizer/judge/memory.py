"""The judge's memory: ``prompts/memory/principles.md`` and ``prompts/memory/cases.jsonl``.

``principles.md`` holds general judging rules as free Markdown (HTML comments are notes for people,
removed before sending). ``cases.jsonl`` holds one adjudicated case a line, exactly the keys
``{"id": "...", "text": "...", "source_items": ["<trajectory id>", ...]}``: ``id`` a safe id unique
in the file, ``text`` what the instruction required, what to check, the verdict and why, and
``source_items`` the dev trajectories the case was distilled from (at least one: a case without
sources cannot be kept out of its own items' fold, so it is refused). Sizes are bounded (the
``MAX_*`` constants) so a crafted file cannot blow up a request or the parser; every problem is one
`UserError` naming the file and, for a case, its line.

Also here: pair-aware folds (`pair_groups`, `assign_folds`, `split_folds`: items sharing an instruction or a
recording are one group, dealt to folds fixed by the split fingerprint) and cross-fitted retrieval
(`Retriever`: top-k cases by TF-IDF similarity to the instruction, never one sourced in the item's own
fold, nor one whose text is about the item or its fold by content: `optimizer.judge.provenance`, since a case's
``source_items`` are only what it declares; `Selection.block` is the request text). Reading the files is `PromptSet`'s. Judge-input side:
nothing here reads labels (pairs come from ids, instructions and screenshot folders).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from optimizer.devset.ids import ID_RULE, is_safe_id, shown
from optimizer.errors import UserError
from optimizer.models import Trajectory

MEMORY_DIR = "prompts/memory"
PRINCIPLES_MD = "prompts/memory/principles.md"
CASES_JSONL = "prompts/memory/cases.jsonl"
MEMORY_FILES: tuple[str, ...] = (PRINCIPLES_MD, CASES_JSONL)

# Bounds. A request carries the principles and memory_k cases; a file beyond these is a mistake (or an
# attack), refused before it is parsed in full.
MAX_PRINCIPLES_CHARS = 16_000
MAX_CASES_BYTES = 1_000_000
MAX_CASES = 500
MAX_CASE_TEXT_CHARS = 2_000
MAX_SOURCE_ITEMS = 16

CASE_KEYS: tuple[str, ...] = ("id", "text", "source_items")
_COMMENT_RE = re.compile(r"<!--.*?-->", re.DOTALL)


@dataclass(frozen=True)
class Case:
    """One adjudicated case: a stable id, its text, and the trajectory ids it was distilled from."""

    id: str
    text: str
    source_items: tuple[str, ...]

    def as_json(self) -> dict[str, object]:
        """The case as its ``cases.jsonl`` object, keys in file order."""
        return {"id": self.id, "text": self.text, "source_items": list(self.source_items)}


@dataclass(frozen=True)
class Memory:
    """One revision's memory: the principles (comment-free, stripped; "" when none) and the cases in file order."""

    principles: str
    cases: tuple[Case, ...]

    @property
    def empty(self) -> bool:
        return not self.principles and not self.cases

    def case(self, case_id: str) -> Case | None:
        return next((c for c in self.cases if c.id == case_id), None)

    def source_items(self) -> set[str]:
        """Every trajectory id any case names."""
        return {item for case in self.cases for item in case.source_items}


EMPTY_MEMORY = Memory(principles="", cases=())


# --------------------------------------------------------------------------- principles.md


def parse_principles(text: str, source: str = PRINCIPLES_MD) -> str:
    """The principles as sent: HTML comments removed, trailing spaces and outer blank lines stripped.

    Over `MAX_PRINCIPLES_CHARS` (as written, comments included) is a `UserError` naming ``source``.
    """
    if len(text) > MAX_PRINCIPLES_CHARS:
        raise UserError(
            f"{source}: {len(text)} characters, more than the {MAX_PRINCIPLES_CHARS} a memory's principles may "
            "hold; keep the general rules short (move worked examples to cases.jsonl)"
        )
    if "\0" in text:
        raise UserError(f"{source}: holds a NUL character; principles are plain Markdown text")
    body = _COMMENT_RE.sub("", text)
    body = "\n".join(line.rstrip() for line in body.splitlines())
    return re.sub(r"\n{3,}", "\n\n", body).strip()


def serialise_principles(text: str) -> str:
    """File text for ``principles.md``: ``text`` with one trailing newline (checked like a file)."""
    body = text.strip("\n")
    out = body + "\n" if body else ""
    parse_principles(out)
    return out


# --------------------------------------------------------------------------- cases.jsonl


def check_case(obj: object, where: str) -> Case:
    """One case object, validated; a problem is a `UserError` beginning ``where`` (``file:line``)."""
    if not isinstance(obj, dict):
        raise UserError(
            f'{where}: a case is a JSON object {{"id", "text", "source_items"}}, not {shown(obj, 80)}'
        )
    unknown = sorted(str(k) for k in obj if k not in CASE_KEYS)
    if unknown:
        raise UserError(
            f"{where}: unknown key {shown(unknown[0], 80)} in a case; a case has exactly the keys id, text, source_items"
        )
    missing = [k for k in CASE_KEYS if k not in obj]
    if missing:
        raise UserError(
            f"{where}: the case has no {missing[0]!r}; a case has exactly the keys id, text, source_items"
        )
    case_id = obj["id"]
    if not is_safe_id(case_id):
        raise UserError(f"{where}: case id {shown(case_id, 80)} is not a safe id ({ID_RULE}); rename it")
    text = obj["text"]
    if not isinstance(text, str) or not text.strip():
        raise UserError(
            f"{where}: case {case_id} has no text; write what was required, what to check and the verdict"
        )
    if len(text) > MAX_CASE_TEXT_CHARS:
        raise UserError(
            f"{where}: case {case_id} text is {len(text)} characters, more than {MAX_CASE_TEXT_CHARS}; shorten it "
            "or split it into cases"
        )
    if "\0" in text:
        raise UserError(f"{where}: case {case_id} text holds a NUL character; cases are plain text")
    sources = obj["source_items"]
    if not isinstance(sources, list):
        raise UserError(
            f"{where}: case {case_id} source_items must be a list of trajectory ids, not {shown(sources, 80)}"
        )
    if not sources:
        raise UserError(
            f"{where}: case {case_id} names no source_items; a case without sources cannot be kept out of its "
            "items' fold, so name the trajectory ids it was distilled from"
        )
    if len(sources) > MAX_SOURCE_ITEMS:
        raise UserError(
            f"{where}: case {case_id} names {len(sources)} source_items, more than {MAX_SOURCE_ITEMS}; a case that "
            "general belongs in principles.md"
        )
    seen: set[str] = set()
    for item in sources:
        if not is_safe_id(item):
            raise UserError(
                f"{where}: case {case_id} source item {shown(item, 80)} is not a trajectory id ({ID_RULE})"
            )
        if item in seen:
            raise UserError(f"{where}: case {case_id} names source item {item} twice; list each once")
        seen.add(item)
    return Case(id=case_id, text=text, source_items=tuple(sources))


def parse_cases(text: str, source: str = CASES_JSONL) -> tuple[Case, ...]:
    """The cases of a ``cases.jsonl`` text, in file order. Blank lines are skipped; anything else that is
    not one valid case is a `UserError` ``"<source>:<line>: ..."``; a repeated id names both lines."""
    size = len(text.encode("utf-8", errors="replace"))
    if size > MAX_CASES_BYTES:
        raise UserError(
            f"{source}: {size} bytes, more than the {MAX_CASES_BYTES} a memory's cases may hold; retire cases "
            "(or merge them) until it fits"
        )
    cases: list[Case] = []
    first_line: dict[str, int] = {}
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{source}:{lineno}"
        try:
            obj = json.loads(line)
        except (json.JSONDecodeError, RecursionError) as exc:
            detail = exc.msg if isinstance(exc, json.JSONDecodeError) else "nested too deeply"
            raise UserError(
                f"{where}: not one JSON object ({detail}); each line of cases.jsonl is one case"
            ) from None
        case = check_case(obj, where)
        if case.id in first_line:
            raise UserError(
                f"{where}: case id {case.id} repeats line {first_line[case.id]}; case ids are unique"
            )
        first_line[case.id] = lineno
        cases.append(case)
        if len(cases) > MAX_CASES:
            raise UserError(
                f"{where}: more than {MAX_CASES} cases; retire or merge cases until at most {MAX_CASES} remain"
            )
    return tuple(cases)


def serialise_cases(cases: Iterable[Case]) -> str:
    """File text for ``cases.jsonl``: one compact JSON object a line, keys in file order, UTF-8 as is.

    The result parses back to the same cases (checked: an invalid or repeated case is a `UserError`).
    """
    out = "".join(json.dumps(case.as_json(), ensure_ascii=False) + "\n" for case in cases)
    parse_cases(out)
    return out


# --------------------------------------------------------------------------- both files


def memory_from_files(files: Mapping[str, str], source: str = "prompts") -> Memory:
    """The memory held in a mapping of ``prompts/...`` paths to text (either file may be absent)."""

    def where(name: str) -> str:
        return f"{source}/{name.removeprefix('prompts/')}"

    principles = files.get(PRINCIPLES_MD)
    cases = files.get(CASES_JSONL)
    return Memory(
        principles="" if principles is None else parse_principles(principles, where(PRINCIPLES_MD)),
        cases=() if cases is None else parse_cases(cases, where(CASES_JSONL)),
    )


def memory_files(memory: Memory) -> dict[str, str]:
    """The two files' text for ``memory`` (what a strategy writes to ``prompts/memory/``)."""
    return {
        PRINCIPLES_MD: serialise_principles(memory.principles),
        CASES_JSONL: serialise_cases(memory.cases),
    }


# --------------------------------------------------------------------------- pair-aware folds

# Bump when the fold rule changes: it is part of the recorded fold hash.
FOLD_VERSION = 1
_RECORDING_RE = re.compile(r"(?:^|/)images/([^/]+)/[^/]+$")


def recording_of(traj: Trajectory) -> str | None:
    """The recording a trajectory shows: the folder of its screenshots (``.../images/<recording>/step_N.png``
    in the release layout), or None when no screenshot link names one. Judge input only, never a label."""
    for step in traj.steps:
        m = _RECORDING_RE.search((step.screenshot or "").replace("\\", "/"))
        if m is not None:
            return m.group(1)
    return None


def instruction_key(instruction: str) -> str:
    """An instruction as pairing compares it: lower-cased, white space collapsed."""
    return " ".join(instruction.lower().split())


def pair_groups(items: Iterable[tuple[str, str, str | None]]) -> list[list[str]]:
    """Items ``(trajectory id, instruction, recording or None)`` joined into pair groups: two items are in one
    group when they share an instruction or a recording, transitively. An AgentHorizon pair (two
    recordings, two instructions, each negative borrowing the other's instruction) is one group of four.
    Groups come sorted by their smallest id, each sorted."""
    parent: dict[str, str] = {}

    def find(x: str) -> str:
        parent.setdefault(x, x)
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    def union(a: str, b: str) -> None:
        ra, rb = find(a), find(b)
        if ra != rb:
            parent[max(ra, rb)] = min(ra, rb)

    ids: list[str] = []
    for tid, instruction, recording in items:
        ids.append(tid)
        node = "t:" + tid
        find(node)
        union(node, "i:" + instruction_key(instruction))
        if recording:
            union(node, "r:" + recording)
    groups: dict[str, list[str]] = {}
    for tid in ids:
        groups.setdefault(find("t:" + tid), []).append(tid)
    return sorted((sorted(g) for g in groups.values()), key=lambda g: g[0])


@dataclass(frozen=True)
class Folds:
    """The pair-aware fold of every item of a split: ``of[trajectory id]`` in ``0 .. k-1``.

    Fixed by the split fingerprint and ``k``: groups are ordered by a hash of (fingerprint, group) and
    dealt to the currently smallest fold (ties to the lowest index), so folds are balanced in items and
    no group is split. ``digest`` (sha256 of the rule version, k, fingerprint and assignment) is what
    results record.
    """

    k: int
    fingerprint: str
    of: Mapping[str, int]
    digest: str

    def members(self, fold: int) -> list[str]:
        return sorted(t for t, f in self.of.items() if f == fold)

    def as_record(self) -> dict[str, object]:
        """What eval results record (``meta.memory.folds``)."""
        return {
            "k": self.k,
            "version": FOLD_VERSION,
            "split_fingerprint": self.fingerprint,
            "digest": self.digest,
            "of": dict(sorted(self.of.items())),
        }


def assign_folds(groups: Iterable[Iterable[str]], fingerprint: str, k: int) -> Folds:
    """Deal pair ``groups`` to ``k`` folds, deterministically from ``fingerprint`` (see `Folds`)."""
    if k < 2:
        raise ValueError("folds need k >= 2")
    keyed = []
    for group in groups:
        members = sorted(group)
        digest = hashlib.sha256(f"{FOLD_VERSION}\0{fingerprint}\0{chr(0).join(members)}".encode()).hexdigest()
        keyed.append((digest, members))
    keyed.sort()
    sizes = [0] * k
    of: dict[str, int] = {}
    for _, members in keyed:
        fold = min(range(k), key=lambda f: (sizes[f], f))
        sizes[fold] += len(members)
        for tid in members:
            of[tid] = fold
    material = json.dumps([FOLD_VERSION, k, fingerprint, sorted(of.items())])
    return Folds(k=k, fingerprint=fingerprint, of=of, digest=hashlib.sha256(material.encode()).hexdigest())


def split_folds(split: FoldSource, k: int) -> Folds:
    """The pair-aware folds of every item of ``split`` (reads each trajectory's instruction and screenshots'
    folder: ids and pairs only)."""
    items = []
    for tid in split.ids:
        traj = split.trajectory(tid)
        items.append((tid, traj.task.instruction, recording_of(traj)))
    return assign_folds(pair_groups(items), split.fingerprint, k)


class FoldSource(Protocol):
    """What folds need from a split (`optimizer.devset.split.Split` satisfies it)."""

    @property
    def ids(self) -> list[str]: ...
    @property
    def fingerprint(self) -> str: ...
    def trajectory(self, tid: str) -> Trajectory: ...


# --------------------------------------------------------------------------- checking sources


def check_sources(
    memory: Memory,
    source_ids: Iterable[str],
    source_split: str,
    *,
    heldout_ids: Iterable[str] = (),
    heldout_split: str | None = None,
    source: str = CASES_JSONL,
) -> None:
    """Every case's ``source_items`` are items of the split the memory is built from (``source_ids``, the dev
    split); a case naming an item of the held-out split being confirmed, or any id outside the dev split, is a
    `UserError` naming the case. What case *text* is about is checked by content (`optimizer.judge.provenance`):
    retrieval withholds a case from those items too, and the loop's guards refuse a case about foreign items."""
    known = set(source_ids)
    held = set(heldout_ids)
    for case in memory.cases:
        for item in case.source_items:
            if item in held:
                raise UserError(
                    f"{source}: case {case.id} names {item}, an item of held-out split {heldout_split!r}; a held-out "
                    "item must never feed the memory: remove it from the case's source_items"
                )
            if item not in known:
                raise UserError(
                    f"{source}: case {case.id} names source item {item}, not an item of split {source_split!r}; "
                    "cases are distilled from that split's items: fix or remove the id"
                )


# --------------------------------------------------------------------------- retrieval


MEMORY_HEADING = "## Memory"
# Says only what retrieval checks: no case declaring this trajectory (or, judging the dev split, an item of its
# fold) as a source, and none whose text names its id, copies its instruction or names a value from it.
MEMORY_INTRO = (
    "Principles and adjudicated cases from earlier reviews. A case distilled from this trajectory, or whose "
    "text names its id, copies its instruction or names a value it typed, was left out; the cases sent may "
    "still resemble it. Apply a case only where its situation matches, and judge this trajectory on its own "
    "steps."
)


@dataclass(frozen=True)
class Selection:
    """The memory one request carries: the principles, the chosen cases (best first), and for notes the
    item's fold and how many cases its fold kept out."""

    principles: str
    cases: tuple[Case, ...]
    fold: int | None
    held_back: int

    def block(self) -> str:
        """The request text: a heading, the principles, then the cases ("" when there is nothing to send)."""
        if not self.principles and not self.cases:
            return ""
        out = [MEMORY_HEADING, "", MEMORY_INTRO, ""]
        if self.principles:
            out += ["### Principles", "", self.principles, ""]
        if self.cases:
            out += ["### Similar adjudicated cases", ""]
            for case in self.cases:
                out += [f"Case {case.id}:", "", case.text.strip(), ""]
        return "\n".join(out).rstrip("\n") + "\n\n"

    def note(self) -> str:
        ids = ", ".join(c.id for c in self.cases) or "none"
        where = (
            f" (fold {self.fold}; {self.held_back} case(s) of this fold kept out)"
            if self.fold is not None
            else f" ({self.held_back} case(s) about this item kept out)"
            if self.held_back
            else ""
        )
        return f"memory: principles {'sent' if self.principles else 'none'}, cases {ids}{where}"


class AboutIndex(Protocol):
    """What retrieval asks of the judged split's items (`optimizer.judge.provenance.ItemIndex`): which
    items a text is about (ids as keys). A protocol here, so the index may import this module."""

    def about(self, text: str) -> Mapping[str, object]: ...


class Retriever:
    """Top-``k`` cases for an instruction by TF-IDF cosine similarity (scikit-learn, fitted on the case texts),
    cross-fitted by ``folds`` and by content: an item never gets a case whose ``source_items`` fall in its own
    fold, nor one whose text is about it or an item of its fold (``items``: the judged split's `ItemIndex`;
    an item a case's text is about counts as one of the case's sources, whatever the case declares). Without
    folds (a held-out split at `confirm`, whose items no case names) every case is eligible but for the items
    its text is about. Ties go to the case earlier in the file; a case sharing no term with the instruction
    is not sent."""

    def __init__(self, memory: Memory, k: int, folds: Folds | None, items: AboutIndex) -> None:
        self.memory = memory
        self.k = k
        self.folds = folds
        # Each case's effective sources: the items it declares and the judged split's items its text is about.
        self.about: dict[str, frozenset[str]] = {c.id: frozenset(items.about(c.text)) for c in memory.cases}
        self._case_items: list[frozenset[str]] = [
            frozenset(c.source_items) | self.about[c.id] for c in memory.cases
        ]
        # A case's folds: those of its effective sources in the judged split (items outside it are in no fold).
        self._case_folds: list[frozenset[int]] = [
            frozenset(folds.of[s] for s in sources if s in folds.of) if folds is not None else frozenset()
            for sources in self._case_items
        ]
        self._vectorizer: Any = None
        self._matrix: Any = None
        if memory.cases:
            from sklearn.feature_extraction.text import TfidfVectorizer

            vectorizer = TfidfVectorizer(lowercase=True, sublinear_tf=True)
            try:
                self._matrix = vectorizer.fit_transform([c.text for c in memory.cases])
                self._vectorizer = vectorizer
            except ValueError:  # no case has a single term (all stop words or punctuation)
                self._vectorizer = None

    def scores(self, instruction: str) -> list[float]:
        """The cosine similarity of ``instruction`` to each case, in file order."""
        if self._vectorizer is None:
            return [0.0] * len(self.memory.cases)
        query = self._vectorizer.transform([instruction])
        return [float(v) for v in (self._matrix @ query.T).toarray().ravel()]

    def withheld(self, index: int, trajectory_id: str, fold: int | None) -> bool:
        """Case ``index`` is kept from the item: sourced in or about it, or (with folds) an item of its fold."""
        return trajectory_id in self._case_items[index] or (
            fold is not None and fold in self._case_folds[index]
        )

    def select(self, trajectory_id: str, instruction: str) -> Selection:
        fold = self.folds.of.get(trajectory_id) if self.folds is not None else None
        scores = self.scores(instruction)
        eligible = []
        held_back = 0
        for index, case in enumerate(self.memory.cases):
            if self.withheld(index, trajectory_id, fold):
                held_back += 1
                continue
            if scores[index] > 0.0:
                eligible.append((-round(scores[index], 12), index, case))
        eligible.sort(key=lambda e: (e[0], e[1]))
        chosen = tuple(case for _, _, case in eligible[: self.k])
        return Selection(principles=self.memory.principles, cases=chosen, fold=fold, held_back=held_back)
