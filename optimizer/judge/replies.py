"""The acceptance rule for a judge's reply, as JSON: a bare JSON value, or exactly one ``json``/untagged
fenced block holding it, with no competing JSON object around it (`decode_object`). Shared by the
verdict parser (`optimizer.judge.verdicts`) and the criteria checks (`optimizer.judge.criteria`), so
both read a reply by one rule. Pure, never raises.
"""

from __future__ import annotations

import json
import re
from typing import Any

_FENCE_RE = re.compile(r"```[ \t]*([A-Za-z0-9_-]*)[ \t]*\n(.*?)\n?[ \t]*```", re.DOTALL)
_decoder = json.JSONDecoder()


def json_type(value: Any) -> str:
    if value is None:
        return "null"
    return {
        bool: "boolean",
        int: "number",
        float: "number",
        str: "string",
        list: "array",
        dict: "object",
    }.get(type(value), type(value).__name__)


def _single_object(text: str) -> tuple[Any, str | None]:
    """Decode ``text`` as exactly one JSON value; (value, None) or (None, error)."""
    body = text.strip()
    if not body:
        return None, "empty JSON block"
    try:
        value, end = _decoder.raw_decode(body)
    except json.JSONDecodeError as exc:
        return None, f"invalid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})"
    rest = body[end:].strip()
    if rest:
        if rest.startswith("{"):
            return None, "two candidate JSON objects; expected exactly one"
        return None, "text after the JSON object; send the object alone or in one ```json block"
    return value, None


def _contains_object(text: str) -> bool:
    """Whether some ``{`` in ``text`` starts a decodable JSON object (a competing candidate)."""
    for m in re.finditer(r"\{", text):
        try:
            value, _ = _decoder.raw_decode(text, m.start())
        except json.JSONDecodeError:
            continue
        if isinstance(value, dict):
            return True
    return False


def decode_object(text: str) -> tuple[Any, str | None]:
    """The one JSON value of a reply under the acceptance rule of the module docstring (a bare JSON
    value, or exactly one ``json``/untagged fenced block), or (None, why not). Never raises."""
    stripped = text.strip()
    if stripped.startswith("{"):
        return _single_object(stripped)
    fences = list(_FENCE_RE.finditer(text))
    if not fences:
        return None, (
            "no JSON object: the reply must be a bare JSON object or one ```json block"
            if not _contains_object(text)
            else "JSON object mixed with text outside a ```json block"
        )
    if len(fences) > 1:
        return None, f"{len(fences)} fenced code blocks; expected exactly one"
    fence = fences[0]
    if fence.group(1).lower() not in ("", "json"):
        return None, f"the fenced block is tagged {fence.group(1)!r}, not json"
    if _contains_object(text[: fence.start()] + "\n" + text[fence.end() :]):
        return None, "two candidate JSON objects (one outside the fenced block)"
    return _single_object(fence.group(2))
