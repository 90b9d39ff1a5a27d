"""Parsing the judge's reply strictly, and combining replicate verdicts.

A reply is accepted only as (a) a bare JSON object and nothing else, or (b) exactly one fenced code
block (tagged ``json`` or untagged) holding one JSON object, with any text around it that holds no
other JSON object. The object must carry the four contract keys: ``success`` a JSON boolean,
``reasoning`` a string, ``confidence`` one of low/medium/high, ``mistake_type`` null or one of the
three types ("...Instructions" is folded to the singular). Extra keys are kept. Anything else is a
parse failure: ``verdict`` None, a short ``error``, and the raw text kept — scored as a wrong answer.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from optimizer.judge.criteria import Criterion, valid_steps
from optimizer.judge.replies import decode_object, json_type
from optimizer.models import MISTAKE_TYPES, Verdict, fold_mistake_type

_CONFIDENCES = ("low", "medium", "high")
_REQUIRED = ("success", "reasoning", "confidence", "mistake_type")


@dataclass(frozen=True)
class ParsedVerdict:
    """The outcome of parsing one reply: exactly one of ``verdict`` / ``error`` is set."""

    verdict: Verdict | None
    error: str | None
    raw: str

    @property
    def ok(self) -> bool:
        return self.verdict is not None


def _validate(obj: Any) -> tuple[Verdict | None, str | None]:
    if not isinstance(obj, dict):
        return None, f"the JSON is {json_type(obj)}, not an object"
    missing = [k for k in _REQUIRED if k not in obj]
    if missing:
        return None, "missing key" + ("s " if len(missing) > 1 else " ") + ", ".join(repr(k) for k in missing)
    if not isinstance(obj["success"], bool):
        return None, f"'success' is not a JSON boolean (got {json_type(obj['success'])})"
    if not isinstance(obj["reasoning"], str):
        return None, f"'reasoning' is not a string (got {json_type(obj['reasoning'])})"
    if obj["confidence"] not in _CONFIDENCES:
        return None, f"unknown confidence {obj['confidence']!r}; expected low, medium or high"
    mistake = fold_mistake_type(obj["mistake_type"])
    if mistake is not None and mistake not in MISTAKE_TYPES:
        return None, f"unknown mistake_type {obj['mistake_type']!r}"
    return Verdict.model_validate({**obj, "mistake_type": mistake}), None


def _structured(obj: dict[str, Any], n_steps: int | None, criteria: Sequence[Criterion] | None) -> str | None:
    """Check ``evidence_steps`` (any verdict) and ``criteria`` (a criteria check) in place: steps become
    tuples of valid step numbers, criteria the derived ones with ``met`` and ``steps``, ``success``
    whether every required one is met (the model's own answer kept as ``stated_success``)."""

    if "evidence_steps" in obj:
        steps = valid_steps(obj["evidence_steps"], n_steps)
        if isinstance(steps, str):
            return f"'evidence_steps': {steps}"
        obj["evidence_steps"] = list(steps)
    if criteria is None:
        return None
    answered = obj.get("criteria")
    if not isinstance(answered, list):
        return f"'criteria' is {json_type(answered) if 'criteria' in obj else 'missing'}, not a list"
    if not answered:
        return "'criteria' is empty"
    if len(answered) != len(criteria):
        return f"{len(answered)} criteria answered for the {len(criteria)} derived"
    checked: list[dict[str, Any]] = []
    for i, (entry, derived) in enumerate(zip(answered, criteria, strict=True)):
        if not isinstance(entry, dict):
            return f"criterion {i} is {json_type(entry)}, not an object"
        if not isinstance(entry.get("met"), bool):
            return f"criterion {i}: 'met' is not a JSON boolean"
        steps = valid_steps(entry.get("steps"), n_steps)
        if isinstance(steps, str):
            return f"criterion {i}: {steps}"
        checked.append(
            {"text": derived.text, "required": derived.required, "met": entry["met"], "steps": list(steps)}
        )
    obj["criteria"] = checked
    obj["stated_success"] = obj["success"]
    obj["success"] = all(c["met"] for c in checked if c["required"])
    if obj["success"]:
        obj["mistake_type"] = None
    return None


def parse_verdict(
    text: str, *, n_steps: int | None = None, criteria: Sequence[Criterion] | None = None
) -> ParsedVerdict:
    """Parse one judge reply strictly (see the module docstring). Never raises on bad input.

    ``evidence_steps``, when present, must be distinct step numbers (below ``n_steps`` when given);
    with ``criteria`` (the derived ones) the reply must check each of them (see `_structured`).
    """
    obj, error = decode_object(text)
    if error is not None:
        return ParsedVerdict(None, error, text)
    verdict, error = _validate(obj)
    if verdict is not None and isinstance(obj, dict) and ("evidence_steps" in obj or criteria is not None):
        data = {**obj, "mistake_type": verdict.mistake_type}
        error = _structured(data, n_steps, criteria)
        verdict = None if error is not None else Verdict.model_validate(data)
    return ParsedVerdict(verdict, error, text)


def majority(verdicts: Sequence[Verdict | None]) -> tuple[Verdict | None, bool]:
    """Combine replicate verdicts (None = a replicate whose reply failed to parse).

    Rule: if parse failures outnumber the parsed verdicts, the item has no verdict (None, scored
    wrong). Otherwise success is the majority of the parsed verdicts, and a tie is ``False`` — the
    conservative answer, which can never raise the false-positive rate. The returned verdict is the
    first replicate holding the winning value; for a failure, with the most common mistake type among
    the winners (ties: the one seen first).
    ``unstable`` is True when the replicates do not all give the same outcome (True/False/failure).
    """
    if not verdicts:
        raise ValueError("majority() needs at least one replicate")
    outcomes = [None if v is None else v.success for v in verdicts]
    unstable = len(set(outcomes)) > 1
    parsed = [v for v in verdicts if v is not None]
    failures = len(verdicts) - len(parsed)
    if failures > len(parsed):
        return None, unstable
    yes = sum(1 for v in parsed if v.success)
    winner = yes > len(parsed) - yes
    winners = [v for v in parsed if v.success is winner]
    chosen = winners[0]
    if not winner:
        counts = Counter(v.mistake_type for v in winners)
        best = max(counts.values())
        mistake = next(v.mistake_type for v in winners if counts[v.mistake_type] == best)
        if chosen.mistake_type != mistake:
            chosen = chosen.model_copy(update={"mistake_type": mistake})
    return chosen, unstable


def panel_vote(
    labels: Sequence[str], verdicts: Sequence[Verdict | None], required: int, vote: str
) -> Verdict | None:
    """The verdict of a panel (judge.toml [panel]): success iff at least ``required`` members say
    success. A member whose reply did not parse counts as a vote against; None only when no member's
    reply parsed. The reasoning names every member's answer; a failure's mistake type is the most
    common among the members that named one (the first of them on a tie)."""
    if all(v is None for v in verdicts):
        return None
    yes = sum(1 for v in verdicts if v is not None and v.success)
    success = yes >= required
    answers = "; ".join(
        f"{label}: {'invalid' if v is None else ('success' if v.success else 'failure')}"
        for label, v in zip(labels, verdicts, strict=True)
    )
    reasoning = f"panel vote ({vote}, {required} of {len(verdicts)} needed): {yes} say success — {answers}"
    against = [
        (label, v) for label, v in zip(labels, verdicts, strict=True) if v is not None and not v.success
    ]
    if not success and against:
        reasoning += f". {against[0][0]}: {against[0][1].reasoning}"
    mistake: str | None = None
    if not success:
        named = [v.mistake_type for _, v in against if v.mistake_type is not None]
        if named:
            counts = Counter(named)
            top = max(counts.values())
            mistake = next(m for m in named if counts[m] == top)
    parsed = [v for v in verdicts if v is not None]
    agree = len(parsed) == len(verdicts) and len({v.success for v in parsed}) == 1
    return Verdict.model_validate(
        {
            "success": success,
            "reasoning": reasoning,
            "confidence": "high" if agree else "low",
            "mistake_type": mistake,
        }
    )
