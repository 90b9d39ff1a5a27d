"""Structure moves: the ``prompts/judge.toml`` keys an optimiser may change, and within what bounds. Pure.

``MOVABLE_KEYS`` is the one table of movable keys: a dotted judge.toml key (``"screenshots"``,
``"panel.members"`` for ``members`` in the ``[panel]`` table) → its `MovableKey` (allowed values or
bounds). ``[optimizer] structure_moves`` in judgeloop.toml names the keys a run may move (``[]``, the
default, moves none); ``max_members`` caps a panel's size. Adding a key is one `MovableKey` line in
`_KEYS` below.

Not movable, on purpose: ``replicates`` (the run fixes the first pass, `--replicates`; changing it
mid-run would change what the decision compares), ``mode`` (an agentic judge is another program with
another cost, not a move), ``layout``/``cache_ttl`` (they decide what the cache can reuse, not how the
judge decides), sampling and ``token_budget``.

`structure_changes` lists what a judge.toml edit changes key by key; `check_structure` is the guard
every candidate passes whatever strategy made it (`optimizer.loop.guards.check_candidate`);
`set_key` is how a tool writes a move (one line of the file, comments kept).
"""

from __future__ import annotations

import json
import re
import tomllib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

Kind = Literal["choice", "int", "bool", "members", "vote", "escalate"]
# What a cascade's first verdict may be escalated on (judge.toml [cascade] escalate; `optimizer.judge.cascade`).
ESCALATE_ON: tuple[str, ...] = ("success", "failure", "invalid", "low_confidence")
_MISSING = object()
_VOTE_RE = re.compile(r"^at_least:([1-9][0-9]*)$")
_MEMBER_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_-]{0,39}$")


@dataclass(frozen=True)
class MovableKey:
    """One movable judge.toml key: ``name`` (dotted: ``table.key``), what values it may take."""

    name: str
    kind: Kind
    choices: tuple[str, ...] = ()
    low: int | None = None
    high: int | None = None
    help: str = ""

    def allowed(self, max_members: int) -> str:
        """The allowed values in words (for tool descriptions and refusals)."""
        if self.kind == "choice":
            return " | ".join(json.dumps(c) for c in self.choices)
        if self.kind == "bool":
            return "true | false"
        if self.kind == "int":
            return f"an integer {self.low}..{self.high}"
        if self.kind == "members":
            return f"a member count 1..{max_members} or a list of at most {max_members} member names"
        if self.kind == "escalate":
            return "a list of distinct " + " | ".join(json.dumps(c) for c in ESCALATE_ON)
        return '"unanimous" | "majority" | "at_least:K"'

    def check(self, value: object, max_members: int) -> str | None:
        """Why ``value`` is not allowed for this key (None: it is). ``value`` None = the key removed (its default)."""
        if value is None:
            return None
        if self.kind == "choice":
            return (
                None
                if isinstance(value, str) and value in self.choices
                else f"must be {self.allowed(max_members)}"
            )
        if self.kind == "bool":
            return None if isinstance(value, bool) else "must be true or false"
        if self.kind == "int":
            if isinstance(value, bool) or not isinstance(value, int):
                return f"must be {self.allowed(max_members)}"
            assert self.low is not None and self.high is not None
            return None if self.low <= value <= self.high else f"must be {self.allowed(max_members)}"
        if self.kind == "members":
            count = member_count(value)
            if count is None:
                return "must be a member count or a list of member names (lower-case, digits, - or _)"
            if count > max_members:
                return f"names {count} members, over [optimizer] max_members = {max_members}"
            return None
        if self.kind == "escalate":
            items: list[object] = list(value) if isinstance(value, list) else []
            named = all(isinstance(v, str) and v in ESCALATE_ON for v in items)
            fine = bool(items) and named and len({str(v) for v in items}) == len(items)
            return None if fine else f"must be {self.allowed(max_members)}"
        if isinstance(value, str) and (value in ("unanimous", "majority") or _VOTE_RE.match(value)):
            return None
        return f"must be {self.allowed(max_members)}"


def member_count(value: object) -> int | None:
    """How many members a ``[panel] members`` value names (an int, or a list of distinct names); None: malformed."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if value >= 1 else None
    if (
        isinstance(value, list)
        and value
        and all(isinstance(v, str) and _MEMBER_NAME_RE.match(v) for v in value)
    ):
        return len(value) if len(set(value)) == len(value) else None
    return None


# The movable keys, one entry each (a new judge.toml key becomes movable by adding it here).
_KEYS: tuple[MovableKey, ...] = (
    MovableKey(
        "screenshots", "choice", ("all", "every_k", "spaced", "none"), help="which steps carry a screenshot"
    ),
    MovableKey("every_k", "int", low=1, high=20, help='screenshots = "every_k": every k-th step'),
    MovableKey("max_images", "int", low=2, high=100, help="at most this many screenshots per request"),
    MovableKey("tiling", "bool", help="four screenshots per 2x2 image"),
    MovableKey("image_width", "int", low=128, high=1024, help="screenshot width in pixels"),
    MovableKey("image_height", "int", low=96, high=1024, help="screenshot height in pixels"),
    MovableKey(
        "panel.members", "members", help="a panel: a member count or member names (prompts/members/<name>.md)"
    ),
    MovableKey("panel.vote", "vote", help="how the panel's verdicts combine"),
    MovableKey(
        "structure",
        "choice",
        ("single", "criteria", "cascade"),
        help="criteria: derive the instruction's requirements, then check each against the trajectory; cascade: "
        "a second judge ([cascade.second]) on the escalated verdicts",
    ),
    MovableKey(
        "cascade.escalate", "escalate", help="cascade: which first verdicts go on to the second judge"
    ),
    MovableKey(
        "cascade.confidence_below",
        "choice",
        ("medium", "high"),
        help='cascade "low_confidence": escalate a first verdict whose confidence is below this',
    ),
    MovableKey(
        "review", "choice", ("off", "success"), help="success: re-examine every success verdict, cite steps"
    ),
    MovableKey(
        "memory",
        "choice",
        ("off", "retrieve"),
        help="retrieve: send principles and similar cases (cross-fitted)",
    ),
    MovableKey("memory_k", "int", low=1, high=16, help='memory = "retrieve": cases per request'),
)
MOVABLE_KEYS: dict[str, MovableKey] = {key.name: key for key in _KEYS}


def _get(data: Mapping[str, object], dotted: str) -> object:
    node: object = data
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return _MISSING
        node = node[part]
    return node


def _flatten(data: Mapping[str, object], prefix: str = "") -> dict[str, object]:
    """Every leaf of a parsed TOML document by dotted name (a table is walked, an array is a leaf)."""
    out: dict[str, object] = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out |= _flatten(value, name + ".")
            if not value:
                out[name] = {}
        else:
            out[name] = value
    return out


def structure_changes(old_text: str | None, new_text: str | None) -> dict[str, tuple[object, object]] | str:
    """Key → (old value, new value) for every judge.toml key an edit changes (None: absent), or why
    the texts cannot be compared (not TOML)."""
    try:
        old = _flatten(tomllib.loads(old_text or ""))
        new = _flatten(tomllib.loads(new_text or ""))
    except tomllib.TOMLDecodeError as exc:
        return f"not valid TOML ({exc})"
    return {k: (old.get(k), new.get(k)) for k in sorted(old.keys() | new.keys()) if old.get(k) != new.get(k)}


def check_structure(
    path: str, old_text: str | None, new_text: str | None, moves: Sequence[str], max_members: int
) -> str | None:
    """Why a candidate's edit of judge.toml (``path``) is refused, or None: every changed key must be
    named in ``moves`` (``[optimizer] structure_moves``) and take an allowed value; at least one key
    must change (a judge.toml edit is a move, never free text)."""
    if not moves:
        return (
            f"the candidate edits {path}, but [optimizer] structure_moves is empty (structure moves are off); "
            "list the keys the optimiser may move to allow it"
        )
    changes = structure_changes(old_text, new_text)
    if isinstance(changes, str):
        return f"{path} is {changes}"
    if not changes:
        return f"the candidate edits {path} but changes none of its keys; only structure moves may edit it"
    for key, (_old, new) in changes.items():
        spec = MOVABLE_KEYS.get(key)
        if spec is None or key not in moves:
            what = "is not a movable key" if spec is None else "is not in [optimizer] structure_moves"
            return f"{path}: {key} {what} (movable here: {', '.join(moves)})"
        bad = spec.check(new, max_members)
        if bad is not None:
            return f"{path}: {key} = {_toml_value(new)} {bad}"
    return None


def check_moves(names: Iterable[str]) -> list[str]:
    """``structure_moves`` validated: each a key of `MOVABLE_KEYS` (ValueError naming the first that is not)."""
    out: list[str] = []
    for name in names:
        if name not in MOVABLE_KEYS:
            raise ValueError(
                f"structure_moves: {name!r} is not a movable judge.toml key; use some of "
                + ", ".join(MOVABLE_KEYS)
            )
        if name not in out:
            out.append(name)
    return out


def _toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    return json.dumps(str(value))


_HEADER_RE = re.compile(r"^\s*\[\[?\s*([A-Za-z0-9_.\-\" ]+?)\s*\]\]?\s*(#.*)?$")


def set_key(text: str, dotted: str, value: object) -> str:
    """``text`` (a judge.toml) with ``dotted`` set to ``value`` (None: the line removed, the key back to
    its default). The key's own line is rewritten, its comment kept; a new key goes at the end of its
    table (a new table at the end of the file). ValueError when the result does not read back."""
    table, _, key = dotted.rpartition(".")
    lines = text.splitlines()
    current: str = ""
    start = 0 if not table else None  # first line of the table's body
    end = len(lines)  # one past its last line
    found: int | None = None
    key_re = re.compile(rf"^\s*{re.escape(key)}\s*=")
    for i, line in enumerate(lines):
        header = _HEADER_RE.match(line)
        if header:
            if current == table and start is not None and i >= start:
                end = i
                break
            current = header.group(1).strip()
            if current == table:
                start = i + 1
            continue
        if current == table and key_re.match(line):
            found = i
    new_line = None if value is None else f"{key} = {_toml_value(value)}"
    if found is not None:
        comment = _trailing_comment(lines[found])
        if new_line is None:
            del lines[found]
        else:
            lines[found] = new_line + (f"  {comment}" if comment else "")
    elif new_line is not None:
        if start is None:
            lines += ["", f"[{table}]", new_line]
        else:
            at = end
            while at > start and not lines[at - 1].strip():
                at -= 1
            lines.insert(at, new_line)
    out = "\n".join(lines) + "\n"
    read = _get(tomllib.loads(out), dotted)
    if (None if read is _MISSING else read) != value:
        raise ValueError(f"setting {dotted} did not read back")
    return out


def _trailing_comment(line: str) -> str:
    """The ``# ...`` comment at the end of a ``key = value`` line ('' if none; a # inside a string is not one)."""
    in_string: str | None = None
    for i, ch in enumerate(line):
        if in_string:
            if ch == in_string:
                in_string = None
        elif ch in "\"'":
            in_string = ch
        elif ch == "#":
            return line[i:].strip()
    return ""


def current_value(text: str, dotted: str) -> object:
    """The value of ``dotted`` in a judge.toml text (None when absent or the text is not TOML)."""
    try:
        value = _get(tomllib.loads(text), dotted)
    except tomllib.TOMLDecodeError:
        return None
    return None if value is _MISSING else value
