"""Pydantic models for AgentHorizon files: trajectories, steps, actions, labels and verdicts.

Unknown extra fields are tolerated everywhere (``extra="allow"``) because the release and the
authors' tooling add fields over time.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, field_validator

from optimizer.vocab import MISTAKE_TYPES as MISTAKE_TYPES  # spelled in optimizer.vocab
from optimizer.vocab import MistakeType as MistakeType

Confidence = Literal["low", "medium", "high"]


def fold_mistake_type(value: Any) -> Any:
    """The release spells one type both "...Instruction" and "...Instructions"; fold to the singular."""
    if isinstance(value, str) and value.strip() == "Misunderstanding of the Instructions":
        return "Misunderstanding of the Instruction"
    return value


class _Lenient(BaseModel):
    model_config = ConfigDict(extra="allow")


class Action(_Lenient):
    type: str = "unknown"  # the official renderer's name for an action without a type
    parameters: dict[str, Any] = Field(default_factory=dict)

    @field_validator("parameters", mode="before")
    @classmethod
    def _none_is_empty(cls, v: Any) -> Any:
        return {} if v is None else v


class Step(_Lenient):
    """One step. Accepts what the official renderer renders, except a step_id that is not an int.

    ``step_id`` is strict: the official renderer prints ``3.0`` or ``"3"`` as given, so coercing
    them to ``3`` would render a different heading. ``timestamp_us`` is kept as stored (any JSON
    value): the Markdown shows ``int()`` of it when that works and leaves the line out otherwise
    (``optimizer.devset.markdown.timestamp_ms_text``).
    """

    step_id: StrictInt = Field(ge=0)
    screenshot: str | None = None
    action: Action = Field(default_factory=Action)
    thought: str | None = None
    action_description: str | None = None
    timestamp_us: Any = None


class Task(_Lenient):
    instruction: str
    category: str | None = None
    subcategory: str | None = None
    task_type: str | None = None
    applications: list[str] = Field(default_factory=list)

    @field_validator("applications", mode="before")
    @classmethod
    def _none_is_empty(cls, v: Any) -> Any:
        return [] if v is None else v


class Environment(_Lenient):
    os: Literal["linux", "windows", "macos"] | None = None
    screen_resolution: list[int] | None = None


class Milestone(_Lenient):
    step_id: int
    description: str


class Trajectory(_Lenient):
    """A recorded desktop task. Holds no label and no pairing data: this is judge input."""

    version: str | None = None
    trajectory_id: str
    task: Task
    environment: Environment | None = None
    steps: list[Step]
    milestones: list[Milestone] | None = None


class Label(_Lenient):
    """One line of ``AgentHorizon.jsonl``. Must never reach a judge."""

    trajectory_id: str
    label: Literal["positive", "negative"]
    original_id: str
    paired_id: str | None = None
    negative_source: (
        Literal["parent_instruction_child_trajectory", "child_instruction_parent_trajectory"] | None
    ) = None
    mistake_type: MistakeType | None = None
    trajectory_scenario: str | None = None
    trajectory_type: str | None = None

    _fold = field_validator("mistake_type", mode="before")(classmethod(lambda _cls, v: fold_mistake_type(v)))

    @property
    def is_positive(self) -> bool:
        return self.label == "positive"


class Verdict(_Lenient):
    """The judge's answer contract."""

    success: StrictBool  # the string "false" is not a boolean: it is a wrong answer, never coerced
    reasoning: str = ""
    confidence: Confidence = "medium"
    mistake_type: MistakeType | None = None

    _fold = field_validator("mistake_type", mode="before")(classmethod(lambda _cls, v: fold_mistake_type(v)))
