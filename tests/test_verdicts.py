from __future__ import annotations

import json

import pytest

from optimizer.judge.verdicts import majority, parse_verdict
from optimizer.models import Verdict
from optimizer.vocab import MistakeType

GOOD = {"success": False, "reasoning": "wrong file", "confidence": "high", "mistake_type": "Critical Mistake"}


def test_bare_json_object_is_accepted() -> None:
    parsed = parse_verdict("  " + json.dumps(GOOD) + "\n")
    assert parsed.ok and parsed.error is None
    assert parsed.verdict is not None
    assert parsed.verdict.success is False and parsed.verdict.mistake_type == "Critical Mistake"


def test_single_fenced_json_block_with_text_around_is_accepted() -> None:
    text = (
        "Let me check.\n\n```json\n"
        + json.dumps({**GOOD, "success": True, "mistake_type": None})
        + "\n```\nDone."
    )
    parsed = parse_verdict(text)
    assert parsed.verdict is not None and parsed.verdict.success is True
    assert parsed.raw == text


def test_untagged_fence_is_accepted_but_other_languages_are_not() -> None:
    assert parse_verdict("```\n" + json.dumps(GOOD) + "\n```").ok
    bad = parse_verdict("```python\n" + json.dumps(GOOD) + "\n```")
    assert not bad.ok and "python" in (bad.error or "")


def test_plural_mistake_type_is_folded() -> None:
    parsed = parse_verdict(json.dumps({**GOOD, "mistake_type": "Misunderstanding of the Instructions"}))
    assert parsed.verdict is not None
    assert parsed.verdict.mistake_type == "Misunderstanding of the Instruction"


@pytest.mark.parametrize(
    ("text", "error_part"),
    [
        ("The agent succeeded.", "no JSON object"),
        ("", "no JSON object"),
        ('Verdict: {"success": true, "reasoning": "", "confidence": "low", "mistake_type": null}', "outside"),
        (json.dumps(GOOD) + json.dumps(GOOD), "two candidate"),
        (json.dumps(GOOD) + " I am sure.", "text after"),
        ("```json\n" + json.dumps(GOOD) + "\n```\n```json\n" + json.dumps(GOOD) + "\n```", "2 fenced"),
        (json.dumps(GOOD) + "\n```json\n" + json.dumps(GOOD) + "\n```", "text after"),
        ("Draft " + json.dumps(GOOD) + "\n```json\n" + json.dumps(GOOD) + "\n```", "two candidate"),
        ('{"success": true, "reasoning": "x", ', "invalid JSON"),
        (json.dumps({**GOOD, "success": "false"}), "not a JSON boolean (got string)"),
        (json.dumps({**GOOD, "success": 0}), "not a JSON boolean (got number)"),
        (json.dumps({**GOOD, "confidence": "very high"}), "unknown confidence"),
        (json.dumps({**GOOD, "mistake_type": "Typo"}), "unknown mistake_type"),
        (json.dumps({"success": True}), "missing keys 'reasoning', 'confidence', 'mistake_type'"),
        (json.dumps({**GOOD, "reasoning": 3}), "'reasoning' is not a string"),
        ("```json\n[true]\n```", "array, not an object"),
    ],
)
def test_anything_else_is_a_parse_failure_that_keeps_the_raw_text(text: str, error_part: str) -> None:
    parsed = parse_verdict(text)
    assert parsed.verdict is None
    assert parsed.error is not None and error_part in parsed.error
    assert parsed.raw == text


def test_extra_keys_are_kept() -> None:
    parsed = parse_verdict(json.dumps({**GOOD, "checklist": ["a"]}))
    assert parsed.verdict is not None
    assert parsed.verdict.model_dump()["checklist"] == ["a"]


def _v(success: bool, mistake: MistakeType | None = None, reasoning: str = "") -> Verdict:
    return Verdict(success=success, reasoning=reasoning, confidence="medium", mistake_type=mistake)


def test_majority_of_agreeing_replicates_is_stable() -> None:
    verdict, unstable = majority([_v(True), _v(True), _v(True)])
    assert verdict is not None and verdict.success is True and unstable is False


def test_majority_picks_the_larger_side_and_flags_instability() -> None:
    verdict, unstable = majority([_v(False, "Bad Side Effect", "r1"), _v(True), _v(True, reasoning="r3")])
    assert verdict is not None and verdict.success is True and unstable is True
    assert verdict.reasoning == ""  # the first replicate holding the winning value


def test_a_tie_is_false_the_conservative_answer() -> None:
    verdict, unstable = majority([_v(True), _v(False, "Critical Mistake")])
    assert verdict is not None and verdict.success is False and unstable is True
    assert verdict.mistake_type == "Critical Mistake"


def test_failures_outnumbering_answers_give_no_verdict() -> None:
    assert majority([None, None, _v(True)]) == (None, True)
    assert majority([None]) == (None, False)


def test_a_minority_of_failures_does_not_decide_but_counts_as_instability() -> None:
    verdict, unstable = majority([None, _v(True), _v(True)])
    assert verdict is not None and verdict.success is True and unstable is True


def test_majority_mistake_type_is_the_most_common_among_failing_replicates() -> None:
    verdict, _ = majority(
        [
            _v(False, "Critical Mistake", "first"),
            _v(False, "Misunderstanding of the Instruction"),
            _v(False, "Misunderstanding of the Instruction"),
        ]
    )
    assert verdict is not None and verdict.mistake_type == "Misunderstanding of the Instruction"
    assert verdict.reasoning == "first"


def test_majority_of_nothing_is_a_bug() -> None:
    with pytest.raises(ValueError):
        majority([])
