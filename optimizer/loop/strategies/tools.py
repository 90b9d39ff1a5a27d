"""The agent's tools: pure functions over a `ProposalContext` and the in-memory edits.

Every tool returns a `ToolOutput`. A refused call (a trajectory not in the dev split, a file not
allowed, bad arguments, an ``old`` text that does not occur exactly once) returns an error output
to the model and is counted in ``ToolState.errors``; it never raises. Edits live in
``ToolState.files`` and never touch the disk. The tool schemas (`TOOL_SPECS`) are plain JSON
Schema, handed to the providers by `tool_specs`. The MCP server (`optimizer.mcp`) runs the same
tools through `run_tool` on the same state, so a coding agent and the ``agent`` strategy meet one
code path; `read_item` is the server's alone (the agent's tool set is unchanged).

The memory tools (`add_case`, `edit_case`, `retire_case`, `edit_principles`) edit ``prompts/memory/``
through `optimizer.loop.strategies.memoryedit` and are offered only when those files are allowed;
`edit_file` and `write_file` on a memory file pass the same checks, so no tool writes a case naming a
held-out item, a case about a dev item it does not name as a source, or principles that copy a case.
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from PIL import Image

from optimizer.devset.markdown import action_string
from optimizer.errors import UserError
from optimizer.judge import types as judge_types
from optimizer.judge.memory import CASES_JSONL, MEMORY_FILES, PRINCIPLES_MD, Memory
from optimizer.judge.provenance import ItemIndex, split_items
from optimizer.loop.strategies import ProposalContext, memoryedit
from optimizer.loop.strategies.common import allowed_path, disagreement_dict, format_history
from optimizer.structure import MOVABLE_KEYS, current_value, set_key
from optimizer.vocab import MISTAKE_TYPES
from optimizer.workspace.paths import JUDGE_TOML, MAX_PROMPT_FILE_CHARS

MAX_STEPS_PER_READ = 150
MAX_LISTED = 40
SCREENSHOT_BOX = (1024, 768)  # an optimiser needs legible text, not the judge's 512×332
SCREENSHOT_QUALITY = 80
MAX_FILE_CHARS = MAX_PROMPT_FILE_CHARS  # what the runner's validation accepts


@dataclass(frozen=True)
class ToolOutput:
    """A tool's answer: ``text`` as the model reads it; a refusal's sentence also as ``problem``
    (without the ``error:`` prefix), so a caller that words it again never parses ``text``."""

    text: str
    image: bytes | None = None  # JPEG, for view_screenshot
    media_type: str = "image/jpeg"
    is_error: bool = False
    problem: str | None = None


@dataclass
class ToolState:
    """One proposal's working state: the files as edited so far, the submission, counters."""

    ctx: ProposalContext
    files: dict[str, str] = field(default_factory=dict)
    submitted: str | None = None
    errors: int = 0
    error_log: list[str] = field(default_factory=list)
    calls: int = 0

    def __post_init__(self) -> None:
        if not self.files:
            self.files = {p: self.ctx.current_files.get(p, "") for p in self.ctx.allowed_files}
            if self.ctx.structure_moves:  # judge.toml, changed only through set_structure
                self.files[JUDGE_TOML] = self.ctx.current_files.get(JUDGE_TOML, "")
        self._dev_ids = frozenset(self.ctx.split.ids)
        self._instructions: list[str] | None = None
        self._items: ItemIndex | None = None

    def dev_items(self) -> ItemIndex:
        """The dev split's items indexed for the memory's provenance check (built once, on the first memory edit)."""
        if self._items is None:
            self._items = split_items(self.ctx.split)
        return self._items

    def dev_instructions(self) -> list[str]:
        """The dev split's instructions (read once, for the principles' copy check)."""
        if self._instructions is None:
            self._instructions = [self.ctx.split.trajectory(t).task.instruction for t in self.ctx.split.ids]
        return self._instructions

    def changed_files(self) -> dict[str, str]:
        """The files whose text differs from the incumbent."""
        return {p: t for p, t in self.files.items() if t != self.ctx.current_files.get(p, "")}

    def fail(self, message: str) -> ToolOutput:
        self.errors += 1
        self.error_log.append(message)
        return ToolOutput(text=f"error: {message}", is_error=True, problem=message)


class _BadArgs(Exception):
    pass


def _str_arg(args: dict[str, Any], name: str, *, required: bool = True) -> str | None:
    value = args.get(name)
    if value is None:
        if required:
            raise _BadArgs(f"missing argument {name!r}")
        return None
    if not isinstance(value, str):
        raise _BadArgs(f"argument {name!r} must be a string")
    return value


def _int_arg(args: dict[str, Any], name: str, *, required: bool = True) -> int | None:
    value = args.get(name)
    if value is None:
        if required:
            raise _BadArgs(f"missing argument {name!r}")
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or int(value) != value:
        raise _BadArgs(f"argument {name!r} must be an integer")
    return int(value)


def _dev_trajectory(state: ToolState, tid: str) -> Any:
    """The dev item's trajectory; None when not a dev item; UserError when the split refuses it."""
    if tid not in state._dev_ids:
        return None
    return state.ctx.split.trajectory(tid)


def list_disagreements(
    state: ToolState, direction: str | None = None, mistake_type: str | None = None
) -> ToolOutput:
    """Disagreements of the incumbent on the dev split, optionally filtered by direction / mistake type."""
    if direction not in (None, "missed_failure", "rejected_success"):
        return state.fail("direction must be 'missed_failure' or 'rejected_success'")
    items = [
        d
        for d in state.ctx.disagreements
        if (direction is None or d.direction == direction)
        and (mistake_type is None or (d.mistake_type or "").casefold() == mistake_type.casefold())
    ]
    total = len(items)
    shown = [disagreement_dict(d) for d in items[:MAX_LISTED]]
    summary = {
        "total_disagreements": len(state.ctx.disagreements),
        "matching": total,
        "shown": len(shown),
        "missed_failure": sum(1 for d in state.ctx.disagreements if d.direction == "missed_failure"),
        "rejected_success": sum(1 for d in state.ctx.disagreements if d.direction == "rejected_success"),
    }
    return ToolOutput(text=json.dumps({"summary": summary, "items": shown}, indent=1, ensure_ascii=False))


def read_trajectory(
    state: ToolState, trajectory_id: str, start: int | None = None, end: int | None = None
) -> ToolOutput:
    """The instruction and steps ``start``..``end`` (inclusive, step ids) as action lines."""
    try:
        traj = _dev_trajectory(state, trajectory_id)
    except UserError as exc:  # a damaged split (a link outside it, a missing file): said, never raised
        return state.fail(str(exc))
    if traj is None:
        return state.fail(f"trajectory {trajectory_id!r} is not in the dev split")
    steps = traj.steps
    lo = 0 if start is None else max(0, start)
    hi = (steps[-1].step_id if steps else 0) if end is None else end
    if hi < lo:
        return state.fail(f"end ({hi}) is before start ({lo})")
    chosen = [s for s in steps if lo <= s.step_id <= hi]
    more = len(chosen) > MAX_STEPS_PER_READ
    chosen = chosen[:MAX_STEPS_PER_READ]
    lines = [
        f"trajectory {traj.trajectory_id}",
        f"instruction: {traj.task.instruction.strip()}",
        f"total steps: {len(steps)}",
        "",
    ]
    for s in chosen:
        line = f"step {s.step_id}: {action_string(s.action)}"
        if s.screenshot is None:
            line += "  (no screenshot)"
        lines.append(line)
    if more:
        lines.append(f"... (more steps; read from step {chosen[-1].step_id + 1})")
    return ToolOutput(text="\n".join(lines))


def view_screenshot(state: ToolState, trajectory_id: str, step: int) -> ToolOutput:
    """The screenshot taken before step ``step`` (a step id), as a JPEG at most 1024×768."""
    try:
        traj = _dev_trajectory(state, trajectory_id)
        if traj is None:
            return state.fail(f"trajectory {trajectory_id!r} is not in the dev split")
        match = next((s for s in traj.steps if s.step_id == step), None)
        if match is None:
            return state.fail(
                f"trajectory {trajectory_id} has no step {step} (steps 0..{len(traj.steps) - 1})"
            )
        # Resolved and checked inside the split: a file outside it is never opened.
        path = state.ctx.split.screenshot_file(match)
    except UserError as exc:
        return state.fail(str(exc))
    if path is None or not path.is_file():
        return state.fail(f"step {step} of {trajectory_id} has no screenshot file")
    try:
        with Image.open(path) as img:
            rgb = img.convert("RGB")
            original = rgb.size
            rgb.thumbnail(SCREENSHOT_BOX)
            buf = io.BytesIO()
            rgb.save(buf, format="JPEG", quality=SCREENSHOT_QUALITY)
    except OSError as exc:
        return state.fail(f"cannot read the screenshot of step {step}: {exc}")
    caption = (
        f"screenshot before step {step} of {trajectory_id} (action: {action_string(match.action)}); "
        f"original {original[0]}x{original[1]}, shown {rgb.size[0]}x{rgb.size[1]}"
    )
    return ToolOutput(text=caption, image=buf.getvalue())


def read_item(state: ToolState, trajectory_id: str) -> ToolOutput:
    """A dev item at a glance: instruction, step and screenshot counts, and the incumbent's disagreement
    with the label on it when it is one (the label is shown only there, as `list_disagreements` shows it)."""
    try:
        traj = _dev_trajectory(state, trajectory_id)
    except UserError as exc:
        return state.fail(str(exc))
    if traj is None:
        return state.fail(f"trajectory {trajectory_id!r} is not in the dev split")
    found = next((d for d in state.ctx.disagreements if d.trajectory_id == trajectory_id), None)
    item: dict[str, object] = {
        "trajectory_id": traj.trajectory_id,
        "instruction": traj.task.instruction.strip(),
        "steps": len(traj.steps),
        "screenshots": sum(1 for s in traj.steps if s.screenshot is not None),
        "disagreement": disagreement_dict(found) if found is not None else None,
    }
    return ToolOutput(text=json.dumps(item, indent=1, ensure_ascii=False))


def read_history(state: ToolState) -> ToolOutput:
    """Past experiments of this run: decision, reason, metrics, rationale, diff."""
    return ToolOutput(text=format_history(state.ctx.history))


def read_guidance(state: ToolState) -> ToolOutput:
    """The human guidance (experiments/guidance.md and reviews)."""
    text = state.ctx.guidance.strip()
    return ToolOutput(text=text if text else "(no human guidance yet)")


def read_file(state: ToolState, path: str) -> ToolOutput:
    """An allowed prompt file as currently edited."""
    name = allowed_path(path, state.ctx.allowed_files)
    if name is None:
        return state.fail(f"{path!r} is not an allowed file; allowed: {', '.join(state.ctx.allowed_files)}")
    return ToolOutput(text=state.files[name])


def edit_file(state: ToolState, path: str, old: str, new: str) -> ToolOutput:
    """Replace the one occurrence of ``old`` with ``new`` in an allowed file (in memory)."""
    name = allowed_path(path, state.ctx.allowed_files)
    if name is None:
        return state.fail(f"{path!r} is not an allowed file; allowed: {', '.join(state.ctx.allowed_files)}")
    text = state.files[name]
    if not old:
        return state.fail("old must be a non-empty text copied from the file")
    if len(old) > MAX_FILE_CHARS or len(new) > MAX_FILE_CHARS:
        return state.fail(
            f"old and new may be at most {MAX_FILE_CHARS} characters each (got {len(old)} and "
            f"{len(new)}); edit a passage, not the whole file"
        )
    count = text.count(old)
    if count != 1:
        where = "does not occur" if count == 0 else f"occurs {count} times"
        return state.fail(f"old {where} in {name}; copy an exact, unique passage (read_file shows the text)")
    edited = text.replace(old, new, 1)
    if len(edited) > MAX_FILE_CHARS:
        return state.fail(
            f"the edit would make {name} {len(edited)} characters; the limit is {MAX_FILE_CHARS}"
        )
    refused = _memory_refusal(state, {name: edited})
    if refused is not None:
        return refused
    state.files[name] = edited
    return ToolOutput(text=f"edited {name}: replaced {len(old)} characters with {len(new)}")


def write_file(state: ToolState, path: str, text: str) -> ToolOutput:
    """Replace the whole text of an allowed file (in memory)."""
    name = allowed_path(path, state.ctx.allowed_files)
    if name is None:
        return state.fail(f"{path!r} is not an allowed file; allowed: {', '.join(state.ctx.allowed_files)}")
    if len(text) > MAX_FILE_CHARS:
        return state.fail(f"text is {len(text)} characters; the limit is {MAX_FILE_CHARS}")
    refused = _memory_refusal(state, {name: text})
    if refused is not None:
        return refused
    state.files[name] = text
    return ToolOutput(text=f"wrote {name} ({len(text)} characters)")


def _memory_refusal(state: ToolState, texts: dict[str, str]) -> ToolOutput | None:
    """An error output when writing ``texts`` would leave a memory that `memoryedit` refuses, or a prompt file
    that copies a case, else None."""
    if not any(name in MEMORY_FILES for name in texts) and not any(f in MEMORY_FILES for f in state.files):
        return None
    for name, text in texts.items():
        if len(text) > MAX_FILE_CHARS:
            return state.fail(f"{name} would be {len(text)} characters; the limit is {MAX_FILE_CHARS}")
    try:
        memoryedit.check_files(
            state.ctx.current_files,
            {**state.files, **texts},
            state._dev_ids,
            state.dev_instructions(),
            state.dev_items(),
        )
    except memoryedit.MemoryEditError as exc:
        return state.fail(f"{exc} (nothing was changed)")
    return None


def _memory_file(state: ToolState, name: str) -> ToolOutput | None:
    """An error output when memory file ``name`` is not an allowed file, else None."""
    if name in state.ctx.allowed_files:
        return None
    return state.fail(
        f"{name} is not an allowed file, so the memory cannot be edited; allowed: "
        f"{', '.join(state.ctx.allowed_files)} (a person adds it to [optimizer] allowed_files)"
    )


def _edit_memory(
    state: ToolState,
    name: str,
    edit: Callable[[Memory], Memory],
    done: Callable[[Memory], str],
    render: Callable[[Memory], str] | None = None,
) -> ToolOutput:
    """Apply ``edit`` to the memory as edited so far and write file ``name`` (``render``'s text of the edited
    memory; by default its cases) when every check passes; an error output, nothing changed, otherwise."""
    refused = _memory_file(state, name)
    if refused is not None:
        return refused
    try:
        memory = memoryedit.read_memory(state.files)
        edited = edit(memory)
        text = (render or memoryedit.cases_text)(edited)
    except memoryedit.MemoryEditError as exc:
        return state.fail(f"{exc} (nothing was changed)")
    refused = _memory_refusal(state, {name: text})
    if refused is not None:
        return refused
    state.files[name] = text
    return ToolOutput(text=done(edited))


def add_case(state: ToolState, text: str, source_items: Any, case_id: str | None = None) -> ToolOutput:
    """Add an adjudicated case to prompts/memory/cases.jsonl (in memory)."""

    def done(m: Memory) -> str:
        return f"added case {m.cases[-1].id} ({len(m.cases)} cases)"

    return _edit_memory(
        state,
        CASES_JSONL,
        lambda m: memoryedit.add_case(m, text, source_items, state._dev_ids, case_id),
        done,
    )


def edit_case(state: ToolState, case_id: str, text: str | None, source_items: Any) -> ToolOutput:
    """Replace a case's text and/or source items."""
    return _edit_memory(
        state,
        CASES_JSONL,
        lambda m: memoryedit.edit_case(m, case_id, state._dev_ids, text, source_items),
        lambda _m: f"edited case {case_id}",
    )


def retire_case(state: ToolState, case_id: str) -> ToolOutput:
    """Remove a case from the memory."""
    return _edit_memory(
        state,
        CASES_JSONL,
        lambda m: memoryedit.retire_case(m, case_id),
        lambda m: f"retired case {case_id} ({len(m.cases)} cases left)",
    )


def edit_principles(state: ToolState, text: str) -> ToolOutput:
    """Replace the whole text of prompts/memory/principles.md."""
    return _edit_memory(
        state,
        PRINCIPLES_MD,
        lambda m: memoryedit.set_principles(m, text),
        lambda _m: f"wrote {PRINCIPLES_MD} ({len(text)} characters)",
        lambda _m: memoryedit.principles_text(text),
    )


def set_structure(state: ToolState, key: str, value: Any) -> ToolOutput:
    """Move one judge.toml key (``[optimizer] structure_moves``) to ``value`` within its bounds (in
    memory; JSON null puts the key back to its default). The guards check the result again."""
    moves = state.ctx.structure_moves
    if not moves:
        return state.fail(
            "structure moves are off ([optimizer] structure_moves is empty); edit the prompt files"
        )
    spec = MOVABLE_KEYS.get(key)
    if spec is None or key not in moves:
        return state.fail(f"{key!r} is not a key you may move; movable: {', '.join(moves)}")
    bad = spec.check(value, state.ctx.max_members)
    if bad is not None:
        return state.fail(f"{key} {bad}")
    try:
        state.files[JUDGE_TOML] = set_key(state.files[JUDGE_TOML], key, value)
    except ValueError as exc:
        return state.fail(f"cannot set {key}: {exc}")
    return ToolOutput(text=f"set {key} = {json.dumps(value)} in {JUDGE_TOML}")


def read_structure(state: ToolState) -> ToolOutput:
    """The movable judge.toml keys: current value (null = default), allowed values, what each does."""
    if not state.ctx.structure_moves:
        return state.fail("structure moves are off ([optimizer] structure_moves is empty)")
    text = state.files.get(JUDGE_TOML, "")
    rows = {
        key: {
            "value": current_value(text, key),
            "allowed": MOVABLE_KEYS[key].allowed(state.ctx.max_members),
            "what": MOVABLE_KEYS[key].help,
        }
        for key in state.ctx.structure_moves
    }
    return ToolOutput(text=json.dumps(rows, indent=1))


def submit(state: ToolState, rationale: str) -> ToolOutput:
    """End the conversation and submit the edited files with a one-paragraph rationale."""
    if not rationale.strip():
        return state.fail("rationale must not be empty")
    if not state.changed_files():
        return state.fail("no allowed file differs from the incumbent; edit a file before submitting")
    state.submitted = rationale.strip()
    return ToolOutput(text="submitted")


@dataclass(frozen=True)
class ToolSpec:
    name: str
    description: str
    parameters: dict[str, Any]
    run: Callable[[ToolState, dict[str, Any]], ToolOutput]


def _obj(props: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {"type": "object", "properties": props, "required": required, "additionalProperties": False}


_S = {"type": "string"}
_I = {"type": "integer"}

TOOL_SPECS: tuple[ToolSpec, ...] = (
    ToolSpec(
        "list_disagreements",
        "List the dev items where the incumbent judge disagrees with the human label: instruction, label, "
        "labelled mistake type, the judge's verdict, confidence and reasoning. direction 'missed_failure' = "
        "label negative but judge said success (too lenient); 'rejected_success' = label positive but judge "
        "said failure (too strict).",
        _obj(
            {
                "direction": {"type": "string", "enum": ["missed_failure", "rejected_success"]},
                "mistake_type": {"type": "string", "enum": list(MISTAKE_TYPES)},
            },
            [],
        ),
        lambda st, a: list_disagreements(
            st, _str_arg(a, "direction", required=False), _str_arg(a, "mistake_type", required=False)
        ),
    ),
    ToolSpec(
        "read_trajectory",
        "Read a dev trajectory's instruction and its steps as action lines (step ids are 0-based; "
        "start and end are inclusive step ids; at most 150 steps per call).",
        _obj({"trajectory_id": _S, "start": _I, "end": _I}, ["trajectory_id"]),
        lambda st, a: read_trajectory(
            st,
            _str_arg(a, "trajectory_id") or "",
            _int_arg(a, "start", required=False),
            _int_arg(a, "end", required=False),
        ),
    ),
    ToolSpec(
        "view_screenshot",
        "View the screenshot taken before a step of a dev trajectory (step id, 0-based).",
        _obj({"trajectory_id": _S, "step": _I}, ["trajectory_id", "step"]),
        lambda st, a: view_screenshot(st, _str_arg(a, "trajectory_id") or "", _int_arg(a, "step") or 0),
    ),
    ToolSpec(
        "read_history",
        "Read the past experiments of this run: decision (kept / rolled back / rejected), reason, kappa, "
        "FPR, rationale and diff. Do not repeat what failed.",
        _obj({}, []),
        lambda st, _a: read_history(st),
    ),
    ToolSpec(
        "read_guidance",
        "Read the human guidance notes and reviews for this run. Follow them.",
        _obj({}, []),
        lambda st, _a: read_guidance(st),
    ),
    ToolSpec(
        "read_file",
        "Read an allowed prompt file as currently edited.",
        _obj({"path": _S}, ["path"]),
        lambda st, a: read_file(st, _str_arg(a, "path") or ""),
    ),
    ToolSpec(
        "edit_file",
        "Replace one exact, unique passage 'old' of an allowed prompt file with 'new'.",
        _obj({"path": _S, "old": _S, "new": _S}, ["path", "old", "new"]),
        lambda st, a: edit_file(
            st, _str_arg(a, "path") or "", _str_arg(a, "old") or "", _str_arg(a, "new") or ""
        ),
    ),
    ToolSpec(
        "write_file",
        "Replace the whole text of an allowed prompt file.",
        _obj({"path": _S, "text": _S}, ["path", "text"]),
        lambda st, a: write_file(st, _str_arg(a, "path") or "", _str_arg(a, "text") or ""),
    ),
    ToolSpec(
        "read_structure",
        "List the judge.toml keys you may move (how the judge is run: screenshots, tiling, panel...), their "
        "current values and allowed values. Only when structure moves are on.",
        _obj({}, []),
        lambda st, _a: read_structure(st),
    ),
    ToolSpec(
        "set_structure",
        "Set one movable judge.toml key (see read_structure) to a value within its bounds; null restores "
        "its default. A structural move changes what each verdict costs as well as how it is reached.",
        _obj({"key": _S, "value": {}}, ["key", "value"]),
        lambda st, a: set_structure(st, _str_arg(a, "key") or "", a.get("value")),
    ),
    ToolSpec(
        "submit",
        "Submit the edited prompt files as the candidate, with a one-paragraph rationale. Ends the session.",
        _obj({"rationale": _S}, ["rationale"]),
        lambda st, a: submit(st, _str_arg(a, "rationale") or ""),
    ),
)

_SOURCES = {
    "type": "array",
    "items": {"type": "string"},
    "description": "the dev trajectory ids the case was distilled from (at least one)",
}

# Offered when a memory file is allowed (`tool_specs`); names and shapes documented in the README.
MEMORY_TOOL_SPECS: tuple[ToolSpec, ...] = (
    ToolSpec(
        "add_case",
        "Add an adjudicated case to the judge's memory (prompts/memory/cases.jsonl): text says what the instruction "
        "required, what to check, the verdict and why; source_items names the dev trajectories it comes from. "
        "A case is never shown when judging its own items' fold, so write it to help other, similar items. "
        "id is optional (made from the sources when left out).",
        _obj({"text": _S, "source_items": _SOURCES, "id": _S}, ["text", "source_items"]),
        lambda st, a: add_case(
            st, _str_arg(a, "text") or "", a.get("source_items"), _str_arg(a, "id", required=False)
        ),
    ),
    ToolSpec(
        "edit_case",
        "Replace the text and/or the source_items of a case of the memory (by id).",
        _obj({"id": _S, "text": _S, "source_items": _SOURCES}, ["id"]),
        lambda st, a: edit_case(
            st, _str_arg(a, "id") or "", _str_arg(a, "text", required=False), a.get("source_items")
        ),
    ),
    ToolSpec(
        "retire_case",
        "Remove a case from the memory (by id): one that misleads the judge or that a better case replaces.",
        _obj({"id": _S}, ["id"]),
        lambda st, a: retire_case(st, _str_arg(a, "id") or ""),
    ),
    ToolSpec(
        "edit_principles",
        "Replace the whole text of prompts/memory/principles.md: general judging rules sent with every item. "
        "Never copy a case or a dev item into them (refused): principles reach every fold.",
        _obj({"text": _S}, ["text"]),
        lambda st, a: edit_principles(st, _str_arg(a, "text") or ""),
    ),
)

_BY_NAME = {spec.name: spec for spec in (*TOOL_SPECS, *MEMORY_TOOL_SPECS)}


def spec(name: str) -> ToolSpec:
    """The tool called ``name`` (its JSON Schema serves the MCP server's tools of the same shape)."""
    return _BY_NAME[name]


def run_tool(state: ToolState, name: str, args: Any) -> ToolOutput:
    """Run the tool ``name`` with ``args``; unknown tools and bad arguments are error outputs."""
    state.calls += 1
    spec = _BY_NAME.get(name)
    if spec is None:
        return state.fail(f"unknown tool {name!r}; tools: {', '.join(_BY_NAME)}")
    if not isinstance(args, dict):
        return state.fail("arguments must be a JSON object")
    try:
        return spec.run(state, args)
    except _BadArgs as exc:
        return state.fail(f"{name}: {exc}")


STRUCTURE_TOOLS = frozenset({"read_structure", "set_structure"})


def tool_specs(allowed_files: Sequence[str] = (), structure: bool = False) -> list[judge_types.ToolSpec]:
    """The tools as the providers offer them to the model (name, description, JSON Schema of the
    arguments); each SDK's shape is the provider's business. The memory tools come too when
    ``allowed_files`` names a memory file; ``structure``: with the structure-move tools
    (``[optimizer] structure_moves`` set)."""
    specs = TOOL_SPECS + (MEMORY_TOOL_SPECS if any(f in MEMORY_FILES for f in allowed_files) else ())
    return [
        judge_types.ToolSpec(s.name, s.description, s.parameters)
        for s in specs
        if structure or s.name not in STRUCTURE_TOOLS
    ]
