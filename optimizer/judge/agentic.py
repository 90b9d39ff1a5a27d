"""The agentic judge mode (``mode = "agentic"`` in ``prompts/judge.toml``).

Instead of one request holding the whole trajectory, the judge gets the instruction and a one-line
index of every step's action, and investigates with tools before answering:

- ``read_steps(first, last)`` — the full record of up to `MAX_STEPS_PER_READ` consecutive steps
  (action, thought, description, timestamp where the trajectory has them);
- ``view_screenshots(steps)`` — up to `MAX_SCREENS_PER_VIEW` screenshots per call, resized as
  ``judge.toml`` says, at most ``agent_max_screenshots`` per verdict (not offered when
  ``screenshots = "none"`` or that cap is 0);
- ``submit_verdict(success, reasoning, confidence, mistake_type)`` — the answer, with exactly the
  fields of the output contract, checked as strictly as a direct judge's reply; an invalid one is
  answered with what is wrong while turns remain. A plain-text reply without tool calls is taken
  as the answer too.

Under ``layout = "trajectory-first"`` the system prompt is the fixed `STATIC_AGENTIC_SYSTEM_PROMPT`
and the opening message is the index, a cache breakpoint, then judge.md with the rubric and the
verdict request, so the index stays a cached prefix across candidates.

A verdict is at most ``agent_max_turns`` model calls; the last one offers only ``submit_verdict``.
No verdict by then is a parse failure (a model output, cached, counted wrong).

Everything a tool returns is a pure function of the trajectory and the conversation so far, so a
conversation replays exactly from the judge-call cache: every turn is cached under a key over the
whole conversation up to it (screenshots stand in the key as a digest of the file and the image
settings, so replaying needs no image work), and an evaluation interrupted mid-conversation
re-sends only the turns that were never answered. This module reads trajectories and screenshot
files only — never labels.
"""

from __future__ import annotations

import functools
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from optimizer.devset.markdown import action_string
from optimizer.judge.estimate import chars_tokens, image_tokens
from optimizer.judge.prompts import STATIC_AGENTIC_SYSTEM_PROMPT, PromptSet
from optimizer.judge.render import (
    DECODE_ERRORS,
    FileKey,
    ScreenshotSource,
    file_state,
    frame_jpeg,
    step_text,
)
from optimizer.judge.types import (
    READ_STEPS,
    SUBMIT_VERDICT,
    VERDICT_SCHEMA,
    VIEW_SCREENSHOTS,
    AssistantTurn,
    ConversationMessage,
    ImagePart,
    JudgeToolCall,
    TextPart,
    ToolCall,
    ToolResult,
    ToolResults,
    ToolSpec,
    UserMessage,
    stable_json,
)
from optimizer.judge.verdicts import parse_verdict
from optimizer.models import Trajectory

MAX_STEPS_PER_READ = 25
MAX_SCREENS_PER_VIEW = 4
SUBMIT = SUBMIT_VERDICT
READ = READ_STEPS
VIEW = VIEW_SCREENSHOTS
# Bump when the tools, their answers or the opening message change: part of every turn's cache key.
AGENTIC_VERSION = 1

SYSTEM_ADDENDUM = """

# Working with tools

In this session the user message holds the instruction and one line per step with the step's \
action only. Investigate before you decide: read_steps gives the full record of a range of steps, \
view_screenshots shows the screen just before a step's action (look at the screens that decide each \
checklist item, above all the last steps, which show the final state). Your turns are limited \
({max_turns} model calls in all, the last one only for the answer), so ask for several steps or \
screenshots per call. Give your answer by calling submit_verdict with exactly the four fields of the \
output contract above."""


def _tool_specs(with_screens: bool, max_screens: int) -> list[ToolSpec]:
    read = ToolSpec(
        name=READ,
        description=(
            f"The full record of steps first..last (inclusive, at most {MAX_STEPS_PER_READ} steps): action, "
            "and thought, description and timestamp where recorded."
        ),
        parameters={
            "type": "object",
            "properties": {
                "first": {"type": "integer", "minimum": 0, "description": "first step number"},
                "last": {"type": "integer", "minimum": 0, "description": "last step number (inclusive)"},
            },
            "required": ["first", "last"],
            "additionalProperties": False,
        },
    )
    view = ToolSpec(
        name=VIEW,
        description=(
            f"Screenshots of up to {MAX_SCREENS_PER_VIEW} steps, each the screen just before that step's action "
            f"({max_screens} screenshots at most for this trajectory)."
        ),
        parameters={
            "type": "object",
            "properties": {
                "steps": {
                    "type": "array",
                    "items": {"type": "integer", "minimum": 0},
                    "minItems": 1,
                    "maxItems": MAX_SCREENS_PER_VIEW,
                    "description": "step numbers",
                }
            },
            "required": ["steps"],
            "additionalProperties": False,
        },
    )
    submit = ToolSpec(
        name=SUBMIT,
        description="Submit the verdict (the output contract's four fields). Ends the session.",
        parameters=VERDICT_SCHEMA,
    )
    return [read, view, submit] if with_screens else [read, submit]


@functools.lru_cache(maxsize=4096)
def _file_digest(key: FileKey) -> str:
    h = hashlib.sha256()
    with open(key[0], "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


@dataclass(frozen=True)
class ScreenRef:
    """A screenshot a tool answer shows: the step and its file; encoded only when actually sent."""

    step: int
    file: FileKey

    def key_material(self, width: int, height: int, quality: int) -> str:
        return f"screen:{self.step}:{_file_digest(self.file)}:{width}x{height}@{quality}"


ToolPart = TextPart | ScreenRef


@dataclass(frozen=True)
class _Answer:
    call_id: str
    parts: tuple[ToolPart, ...]
    is_error: bool = False


class AgenticTask:
    """One trajectory prepared for the agentic judge: system prompt, opening message, tools, and the
    tools' implementation. Built from the trajectory and its screenshot files only."""

    def __init__(
        self,
        traj: Trajectory,
        split: ScreenshotSource,
        prompts: PromptSet,
        *,
        image_cache_dir: Path | None = None,
    ) -> None:
        settings = prompts.settings
        self.settings = settings
        self.traj = traj
        self.max_turns = settings.agent_max_turns
        self.max_screens = 0 if settings.screenshots == "none" else settings.agent_max_screenshots
        self.image_cache_dir = None if image_cache_dir is None else str(image_cache_dir)
        addendum = SYSTEM_ADDENDUM.format(max_turns=self.max_turns)
        self.trajectory_first = prompts.trajectory_first
        self.cache_ttl = settings.cache_ttl
        if self.trajectory_first:
            # The fixed system prompt; the instructions follow the trajectory index in the opening message.
            self.system = STATIC_AGENTIC_SYSTEM_PROMPT
            self.instructions = prompts.instructions() + addendum.replace(
                "the user message holds", "the index above holds"
            )
        else:
            self.system = prompts.system_prompt() + addendum
            self.instructions = ""
        self.tools = _tool_specs(self.max_screens > 0, self.max_screens)
        self.final_tools = [t for t in self.tools if t.name == SUBMIT]
        self.notes: tuple[str, ...] = ()
        self._screens: dict[int, FileKey | None] = {}
        for i, step in enumerate(traj.steps):
            path = split.screenshot_file(step)
            self._screens[i] = None if path is None else file_state(path)
        self.opening = self._opening()
        self.opening_message = self._opening_message()
        self.fingerprint = self._fingerprint()

    # -- the opening message -----------------------------------------------------------------------
    def _opening(self) -> str:
        steps = self.traj.steps
        goal = self.traj.task.instruction.strip()
        lines = [
            f"## Goal\n\n{goal}\n\n## Steps\n\nTotal steps: **{len(steps)}** (numbered from 0). "
            "Each line is one step's action; use the tools for the full records"
            + (" and the screenshots" if self.max_screens else "")
            + ".\n"
        ]
        for i, step in enumerate(steps):
            lines.append(f"- Step {i}: `{action_string(step.action)}`")
        verdict = (
            "\n## Your verdict\n\nJudge whether the steps accomplish exactly this instruction:\n\n"
            f"{goal}\n\nInvestigate with the tools, then call {SUBMIT}."
        )
        if self.trajectory_first:  # the verdict request goes after the instructions (`_opening_message`)
            return "\n".join(lines) + "\n"
        lines.append(verdict)
        return "\n".join(lines)

    def _opening_message(self) -> UserMessage:
        """The first user message: the index alone (rubric-first), or the index, a cache breakpoint,
        then the instructions and the verdict request (trajectory-first)."""
        if not self.trajectory_first:
            return UserMessage((TextPart(self.opening),))
        goal = self.traj.task.instruction.strip()
        verdict = (
            "\n\n## Your verdict\n\nJudge whether the steps accomplish exactly this instruction:\n\n"
            f"{goal}\n\nInvestigate with the tools, then call {SUBMIT}."
        )
        return UserMessage(
            (TextPart(self.opening), TextPart(self.instructions.rstrip("\n") + verdict)),
            cache_prefix=1,
            cache_ttl=self.cache_ttl,
        )

    def _fingerprint(self) -> str:
        s = self.settings
        # Screenshots enter the keys only when viewed (`ScreenRef.key_material`: a content digest).
        steps = [step_text(i, st).full for i, st in enumerate(self.traj.steps)]
        payload = {
            "v": AGENTIC_VERSION,
            "system": self.system,
            "opening": self.opening
            if not self.trajectory_first
            else [p.text for p in self.opening_message.parts if isinstance(p, TextPart)],
            "tools": [[t.name, t.description, t.parameters] for t in self.tools],
            "max_turns": self.max_turns,
            "image": [s.image_width, s.image_height, s.jpeg_quality],
            "steps": steps,
        }
        return hashlib.sha256(stable_json(payload).encode()).hexdigest()

    # -- tools -------------------------------------------------------------------------------------
    def answer(self, call: ToolCall, state: ConversationState) -> _Answer:
        """What the tool ``call`` returns (a refusal is an error answer the model can read)."""
        try:
            args = json.loads(call.arguments) if call.arguments.strip() else {}
        except json.JSONDecodeError:
            args = None
        if not isinstance(args, dict):
            return _Answer(call.id, (TextPart("error: the arguments are not a JSON object"),), True)
        if call.name == READ and any(t.name == READ for t in state.offered):
            return self._read(call.id, args)
        if call.name == VIEW and any(t.name == VIEW for t in state.offered):
            return self._view(call.id, args, state)
        offered = ", ".join(t.name for t in state.offered)
        return _Answer(
            call.id, (TextPart(f"error: no tool named {call.name!r} now; available: {offered}"),), True
        )

    def _read(self, call_id: str, args: dict[str, Any]) -> _Answer:
        n = len(self.traj.steps)
        first, last = args.get("first"), args.get("last")
        if (
            not isinstance(first, int)
            or not isinstance(last, int)
            or isinstance(first, bool)
            or isinstance(last, bool)
        ):
            return _Answer(call_id, (TextPart("error: first and last must be integers"),), True)
        if not 0 <= first < n or last < first:
            return _Answer(
                call_id, (TextPart(f"error: steps are numbered 0..{n - 1} and last >= first"),), True
            )
        last = min(last, n - 1, first + MAX_STEPS_PER_READ - 1)
        text = "".join(step_text(i, self.traj.steps[i]).full for i in range(first, last + 1))
        if last < args["last"]:
            text += f"(stopped at step {last}: at most {MAX_STEPS_PER_READ} steps per call, {n} in all)\n"
        return _Answer(call_id, (TextPart(text),))

    def _view(self, call_id: str, args: dict[str, Any], state: ConversationState) -> _Answer:
        n = len(self.traj.steps)
        steps = args.get("steps")
        if (
            not isinstance(steps, list)
            or not steps
            or not all(isinstance(s, int) and not isinstance(s, bool) for s in steps)
        ):
            return _Answer(
                call_id, (TextPart("error: steps must be a non-empty list of step numbers"),), True
            )
        parts: list[ToolPart] = []
        for s in steps[:MAX_SCREENS_PER_VIEW]:
            if not 0 <= s < n:
                parts.append(TextPart(f"step {s}: no such step (0..{n - 1})"))
                continue
            if state.screens_shown >= self.max_screens:
                parts.append(
                    TextPart(f"step {s}: not shown, the limit of {self.max_screens} screenshots is reached")
                )
                continue
            key = self._screens.get(s)
            if key is None:
                parts.append(TextPart(f"step {s}: no screenshot was recorded for this step"))
                continue
            state.screens_shown += 1
            parts.append(TextPart(f"Step {s}, the screen just before its action:"))
            parts.append(ScreenRef(step=s, file=key))
        if len(steps) > MAX_SCREENS_PER_VIEW:
            parts.append(TextPart(f"(only the first {MAX_SCREENS_PER_VIEW} steps of a call are shown)"))
        return _Answer(call_id, tuple(parts))

    # -- sending -------------------------------------------------------------------------------------
    def materialise(self, parts: tuple[ToolPart, ...]) -> tuple[TextPart | ImagePart, ...]:
        """Tool answer parts as provider parts: each `ScreenRef` encoded as the judge.toml JPEG."""
        s = self.settings
        out: list[TextPart | ImagePart] = []
        for part in parts:
            if isinstance(part, TextPart):
                out.append(part)
                continue
            try:
                data = frame_jpeg(
                    part.file, s.image_width, s.image_height, s.jpeg_quality, self.image_cache_dir
                )
            except DECODE_ERRORS as exc:
                out.append(
                    TextPart(
                        f"(the screenshot of step {part.step} could not be decoded: {type(exc).__name__})"
                    )
                )
                continue
            out.append(ImagePart(data=data, step_ids=(part.step,)))
        return tuple(out)

    def estimate_input_tokens(self, state: ConversationState) -> int:
        """Input tokens of the next turn as the budget estimates them (`optimizer.judge.estimate`: the
        conversation's text as one text, plus each screenshot at the configured size)."""
        chars = len(self.system) + len(
            stable_json([[t.name, t.description, t.parameters] for t in state.offered])
        )
        images = 0
        for message in state.messages:
            if isinstance(message, UserMessage):
                chars += sum(len(p.text) for p in message.parts if isinstance(p, TextPart))
            elif isinstance(message, AssistantTurn):
                chars += len(message.text) + sum(len(c.arguments) + len(c.name) for c in message.tool_calls)
            else:
                for a in message:
                    chars += sum(len(p.text) for p in a.parts if isinstance(p, TextPart))
                    images += sum(1 for p in a.parts if isinstance(p, ScreenRef))
        s = self.settings
        return chars_tokens(chars) + images * image_tokens(s.image_width, s.image_height)


@dataclass
class ConversationState:
    """One verdict's conversation: the messages so far (screenshots as `ScreenRef`) and a running
    hash of them, which keys each turn in the judge-call cache."""

    task: AgenticTask
    # The opening `UserMessage`, then `AssistantTurn`s each followed by its tool answers.
    messages: list[UserMessage | AssistantTurn | tuple[_Answer, ...]] = field(default_factory=list)
    screens_shown: int = 0
    turns: int = 0
    trace: list[JudgeToolCall] = field(default_factory=list)  # the tool calls so far, in order
    _hash: Any = field(default=None, init=False, repr=False, compare=False)  # hashlib sha256, running

    def __post_init__(self) -> None:
        self._hash = hashlib.sha256(self.task.fingerprint.encode())
        self.messages.append(self.task.opening_message)

    @property
    def last_turn(self) -> bool:
        """Whether the next model call is the last one allowed (it may only submit)."""
        return self.turns >= self.task.max_turns - 1

    @property
    def offered(self) -> list[ToolSpec]:
        return self.task.final_tools if self.last_turn else self.task.tools

    def key_material(self) -> str:
        """A digest of the conversation so far and of what the next turn offers."""
        h = self._hash.copy()
        h.update(b"\0offered\0" + ",".join(t.name for t in self.offered).encode())
        return h.hexdigest()

    def add_turn(self, turn: AssistantTurn) -> None:
        self.turns += 1
        self.messages.append(turn)
        self._hash.update(b"\0assistant\0" + turn.to_json().encode())

    def add_answers(self, answers: list[_Answer]) -> None:
        s = self.task.settings
        self.messages.append(tuple(answers))
        for a in answers:
            self._hash.update(b"\0result\0" + a.call_id.encode() + (b"\0error" if a.is_error else b""))
            for p in a.parts:
                material = (
                    p.text
                    if isinstance(p, TextPart)
                    else p.key_material(s.image_width, s.image_height, s.jpeg_quality)
                )
                self._hash.update(b"\0" + material.encode())

    def wire_messages(self) -> list[ConversationMessage]:
        """The conversation as provider messages (screenshots encoded now)."""
        out: list[ConversationMessage] = []
        for m in self.messages:
            if isinstance(m, tuple):
                out.append(
                    ToolResults(
                        tuple(ToolResult(a.call_id, self.task.materialise(a.parts), a.is_error) for a in m)
                    )
                )
            else:
                out.append(m)
        return out

    def step(self, turn: AssistantTurn) -> str | None:
        """Record the model's ``turn``; run its tool calls. Returns the final answer text when the
        turn ends the conversation (a submit_verdict call, or a reply without tool calls)."""
        self.add_turn(turn)
        submit = next((c for c in turn.tool_calls if c.name == SUBMIT), None)
        if submit is not None:
            problem = parse_verdict(submit.arguments).error
            if problem is None or self.turns >= self.task.max_turns:  # valid, or no turn left to fix it
                self.trace.append(JudgeToolCall(SUBMIT, outcome="ok" if problem is None else "invalid"))
                return submit.arguments
        if not turn.tool_calls:
            self.trace.append(JudgeToolCall(None))
            return turn.text
        answers = []
        for call in turn.tool_calls:
            if call is submit:  # an invalid verdict with turns to spare: say what is wrong, let it retry
                answer = _Answer(
                    call.id,
                    (
                        TextPart(
                            f"error: the verdict is not valid ({problem}); call "
                            f"{SUBMIT} again with the four fields"
                        ),
                    ),
                    True,
                )
                self.trace.append(JudgeToolCall(SUBMIT, outcome="invalid"))
            else:
                answer = self.task.answer(call, self)
                self.trace.append(_traced(call, refused=answer.is_error))
            answers.append(answer)
        if self.last_turn:
            last = answers[-1]
            note = TextPart(f"This is your last turn: call {SUBMIT} now.")
            answers[-1] = _Answer(last.call_id, (*last.parts, note), last.is_error)
        self.add_answers(answers)
        return None


def _traced(call: ToolCall, *, refused: bool) -> JudgeToolCall:
    """The trace entry of a tool call: its name and, when they are a JSON object, its arguments."""
    try:
        args = json.loads(call.arguments)
    except json.JSONDecodeError:
        args = None
    keep = isinstance(args, dict) and call.name != SUBMIT  # a verdict's fields are stored as the verdict
    return JudgeToolCall(call.name, args if keep else None, "refused" if refused else "ok")
