"""The judge's memory: ``prompts/memory/principles.md`` and ``prompts/memory/cases.jsonl``.

``principles.md`` holds general judging rules as free Markdown (HTML comments are notes for people,
removed before sending). ``cases.jsonl`` holds one adjudicated case a line, exactly the keys
``{"id": "...", "text": "...", "source_items": ["<trajectory id>", ...]}``: ``id`` a safe id unique
in the file, ``text`` what the instruction required, what to check, the verdict and why, and
``source_items`` the dev trajectories the case was distilled from (at least one: a case without
sources cannot be kept out of its own items' fold, so it is refused). Sizes are bounded (the
``MAX_*`` constants) so a crafted file cannot blow up a request or the parser; every problem is one
`UserError` naming the file and, for a case, its line.

Pure: parsing, validation and serialisation of text. Reading the files is `PromptSet`'s; retrieval and
folds build on `Memory`. Judge-input side: nothing here reads labels.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from optimizer.devset.ids import ID_RULE, is_safe_id, shown
from optimizer.errors import UserError

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
        raise UserError(f"{where}: a case is a JSON object {{\"id\", \"text\", \"source_items\"}}, not {shown(obj, 80)}")
    unknown = sorted(str(k) for k in obj if k not in CASE_KEYS)
    if unknown:
        raise UserError(
            f"{where}: unknown key {shown(unknown[0], 80)} in a case; a case has exactly the keys id, text, source_items"
        )
    missing = [k for k in CASE_KEYS if k not in obj]
    if missing:
        raise UserError(f"{where}: the case has no {missing[0]!r}; a case has exactly the keys id, text, source_items")
    case_id = obj["id"]
    if not is_safe_id(case_id):
        raise UserError(f"{where}: case id {shown(case_id, 80)} is not a safe id ({ID_RULE}); rename it")
    text = obj["text"]
    if not isinstance(text, str) or not text.strip():
        raise UserError(f"{where}: case {case_id} has no text; write what was required, what to check and the verdict")
    if len(text) > MAX_CASE_TEXT_CHARS:
        raise UserError(
            f"{where}: case {case_id} text is {len(text)} characters, more than {MAX_CASE_TEXT_CHARS}; shorten it "
            "or split it into cases"
        )
    if "\0" in text:
        raise UserError(f"{where}: case {case_id} text holds a NUL character; cases are plain text")
    sources = obj["source_items"]
    if not isinstance(sources, list):
        raise UserError(f"{where}: case {case_id} source_items must be a list of trajectory ids, not {shown(sources, 80)}")
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
            raise UserError(f"{where}: case {case_id} source item {shown(item, 80)} is not a trajectory id ({ID_RULE})")
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
            raise UserError(f"{where}: not one JSON object ({detail}); each line of cases.jsonl is one case") from None
        case = check_case(obj, where)
        if case.id in first_line:
            raise UserError(f"{where}: case id {case.id} repeats line {first_line[case.id]}; case ids are unique")
        first_line[case.id] = lineno
        cases.append(case)
        if len(cases) > MAX_CASES:
            raise UserError(f"{where}: more than {MAX_CASES} cases; retire or merge cases until at most {MAX_CASES} remain")
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
    return {PRINCIPLES_MD: serialise_principles(memory.principles), CASES_JSONL: serialise_cases(memory.cases)}
