"""A cascade judge (judge.toml ``structure = "cascade"``): the workspace's judge first, a second judge
only on the items its escalation rule sends on. Judge-input side: never reads labels.

``[cascade]`` holds the rule: ``escalate`` lists which first verdicts go on (``"success"``,
``"failure"``, ``"invalid"``, ``"low_confidence"``; the last below ``confidence_below``).
``[cascade.second]`` takes the keys of judgeloop.toml's ``[judge]`` (provider, model, base_url, harness,
...) plus ``mode``, ``prices`` and ``prompts``: the folder under ``prompts/`` holding the second judge's own
``judge.md`` and ``rubric.md`` (a name, never a path: the files stay inside prompts/, where the optimiser's
``allowed_files`` may reach them). The second verdict is final where it is called; the first is kept
beside it (`CASCADE_KEY` in the verdict). Running the stages (and their prompt sets) is `optimizer.evaluation.cascade`'s.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from optimizer.errors import UserError
from optimizer.structure import ESCALATE_ON
from optimizer.workspace.config import JudgeSection, Price
from optimizer.workspace.paths import JUDGE_TOML

EscalateOn = Literal["success", "failure", "invalid", "low_confidence"]
CONFIDENCE_RANK = {"low": 0, "medium": 1, "high": 2}
# The key of the final verdict (and of the ledger's verdict detail) holding the cascade's record.
CASCADE_KEY = "cascade"
_FOLDER_RE = re.compile(r"^[a-z0-9][a-z0-9_-]{0,39}$")
# The first verdict's fields kept beside the second's.
FIRST_FIELDS = ("success", "reasoning", "confidence", "mistake_type")
# The first judge's files the second's judge.md and rubric.md are written like (optimizer.judge.prompts's names).
LIKE = ("prompts/judge.md", "prompts/rubric.md")


class SecondJudge(JudgeSection):
    """``[cascade.second]``: the second judge. The keys of judgeloop.toml's ``[judge]``, plus the judge.toml
    ``mode`` it judges in, its own ``prices`` (model → `Price`, over the workspace's) and ``prompts``."""

    mode: Literal["direct", "agentic"] = Field(
        default="direct", description="the second judge's mode: direct or agentic (anthropic, openai)"
    )
    prices: dict[str, Price] = Field(
        default_factory=dict,
        description="prices per model for the second judge, over judgeloop.toml's [prices]",
    )
    prompts: str = Field(
        default="second",
        description="the folder under prompts/ holding the second judge's judge.md and rubric.md (a name, not a path)",
    )

    @field_validator("prompts")
    @classmethod
    def _a_name(cls, value: str) -> str:
        if not _FOLDER_RE.match(value):
            raise ValueError(
                f"prompts = {value[:60]!r} is not a folder name under prompts/; use lower-case letters, digits, "
                "'-' and '_' (e.g. \"second\")"
            )
        return value

    def section(self) -> JudgeSection:
        """The ``[judge]`` section a provider for the second judge is made from."""
        return JudgeSection.model_validate(self.model_dump(exclude={"mode", "prices", "prompts"}))


@dataclass(frozen=True)
class EscalationRule:
    """Which first verdicts go on to the second judge: answers in ``on``, and (with ``low_confidence``)
    confidences below ``confidence_below``."""

    on: frozenset[str]
    confidence_below: str = "medium"

    def escalates(self, success: bool | None, confidence: str | None, *, split: bool = False) -> bool:
        """Whether a first verdict (``success`` None: invalid) goes on. ``split``: the first judge is a panel
        whose members did not all give the same answer (``low_confidence`` sends it on, whatever its
        confidence says)."""
        if success is None:
            return "invalid" in self.on
        if ("success" if success else "failure") in self.on:
            return True
        low = split or (
            confidence is not None
            and CONFIDENCE_RANK.get(confidence, 1) < CONFIDENCE_RANK[self.confidence_below]
        )
        return "low_confidence" in self.on and low

    def estimated_share(self, success_share: float) -> float:
        """The share of items expected to go on, before any call: the successes at ``success_share`` (the
        split's positive share, as the review's estimate), the failures at the rest; invalid and low
        confidence count nothing (an estimate: calibrate measures it)."""
        share = (success_share if "success" in self.on else 0.0) + (
            1 - success_share if "failure" in self.on else 0.0
        )
        return min(1.0, share)

    def describe(self) -> str:
        """The rule as people read it: ``success+low_confidence<medium``."""
        names = [n for n in ESCALATE_ON if n in self.on]
        return "+".join(f"{n}<{self.confidence_below}" if n == "low_confidence" else n for n in names)


class CascadeSettings(BaseModel):
    """``[cascade]`` of judge.toml: which first verdicts go on to the second judge, and the second judge."""

    model_config = ConfigDict(extra="forbid")

    escalate: list[EscalateOn] = Field(
        default=["success"],
        min_length=1,
        description='which first verdicts go on to the second judge: some of "success", "failure", "invalid", '
        '"low_confidence" (a confidence below confidence_below, or a first judge\'s [panel] whose members did '
        "not all agree: a panel's split)",
    )
    confidence_below: Literal["medium", "high"] = Field(
        default="medium",
        description='"low_confidence" escalates a first verdict whose confidence is below this ("medium": low only)',
    )
    second: SecondJudge = Field(description="the second judge: [judge]'s keys plus mode, prices and prompts")

    @field_validator("escalate")
    @classmethod
    def _distinct(cls, value: list[str]) -> list[str]:
        if len(set(value)) != len(value):
            raise ValueError("escalate names a verdict twice; each once")
        return value

    def rule(self) -> EscalationRule:
        return EscalationRule(frozenset(self.escalate), self.confidence_below)

    def files(self) -> tuple[str, str]:
        """The second judge's judge.md and rubric.md, workspace paths."""
        folder = f"prompts/{self.second.prompts}"
        return f"{folder}/judge.md", f"{folder}/rubric.md"


def cascade_files(files: Mapping[str, str]) -> list[str]:
    """The second judge's prompt files judge.toml's [cascade] names ([] without one, or when judge.toml
    does not parse: `check_cascade` or the settings' parser then reports it). Read before validation,
    so only a valid folder name ever becomes a path."""
    try:
        table = tomllib.loads(files.get("prompts/judge.toml", "")).get("cascade")
        return list(CascadeSettings.model_validate(table).files()) if isinstance(table, dict) else []
    except (tomllib.TOMLDecodeError, ValueError):
        return []


def cascade_templates(
    structure: str, cascade: CascadeSettings | None, files: Mapping[str, str], where: Callable[[str], str]
) -> list[tuple[str, str]]:
    """The second judge's files, each with the first judge's file it is written like (whose placeholders it
    may use): ``structure = "cascade"`` needs a [cascade] table, and a [cascade] table its files (a
    `UserError` naming the file otherwise)."""
    if structure == "cascade" and cascade is None:
        raise UserError(
            f'{where(JUDGE_TOML)}: structure = "cascade" needs a [cascade] table with a [cascade.second] judge; '
            'add them (see the cascade guide) or set structure = "single"'
        )
    if cascade is None:
        return []
    pairs = list(zip(cascade.files(), LIKE, strict=True))
    for path, like in pairs:
        if path not in files:
            raise UserError(
                f"{where(path)} is missing: judge.toml's [cascade.second] judges with it; write it (like "
                f"{like.removeprefix('prompts/')}) or change [cascade.second] prompts"
            )
    return pairs


def cascade_record(
    rule: EscalationRule, first: Mapping[str, Any] | None, *, escalated: bool, first_status: str
) -> dict[str, Any]:
    """What a final verdict keeps of the cascade under `CASCADE_KEY`: the rule, whether the item went on
    (then the second verdict is final), and the first verdict (``first``: its `FIRST_FIELDS`; None when
    the first reply did not parse)."""
    return {
        "rule": rule.describe(),
        "escalated": escalated,
        "final": "second" if escalated else "first",
        "first_status": first_status,
        "first": None if first is None else {k: first.get(k) for k in FIRST_FIELDS},
    }
