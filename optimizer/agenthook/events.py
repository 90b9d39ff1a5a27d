"""The PreToolUse event of Claude Code and Codex, tool by tool, to one `Verdict`.

Both hosts send one JSON object on stdin: ``tool_name``, ``tool_input`` and ``cwd`` (plus session fields this
hook does not need). Claude Code's file tools name their paths in ``file_path``, ``notebook_path``, ``path``
and ``pattern``; its ``Bash`` and Codex's ``Bash`` carry a shell command in ``tool_input.command`` (older
Codex: an argument vector), Codex's ``apply_patch`` a patch whose ``*** Update File:`` lines name the files.
A tool this module does not know is checked by the path-like fields of its input; judgeloop's own MCP tools
are the boundary itself and pass.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from optimizer.agenthook.fence import Fence, Reach, workspace_of
from optimizer.agenthook.shell import Blocked, ShellCheck, pieces
from optimizer.errors import UserError
from optimizer.workspace.paths import PROMPTS_DIR

# judgeloop's own MCP server (as a plain server "judgeloop" or a plugin's "plugin_judgeloop_judgeloop").
OWN_MCP_TOOL = re.compile(r"^mcp__(?:plugin_[A-Za-z0-9-]+_)?judgeloop__")
SHELL_TOOLS = frozenset({"Bash", "shell", "local_shell", "exec_command", "shell_command", "container.exec"})
PATCH_TOOLS = frozenset({"apply_patch"})
# The fields that carry a file's new text (Write, Edit, NotebookEdit; MultiEdit's edits hold new_string).
CONTENT_FIELDS = ("content", "new_string", "new_source")
PATCH_FILE = re.compile(r"^\*\*\* (?:(?:Add|Update|Delete) File|Move to): (.+?)\s*$", re.MULTILINE)
# The fields of an unknown tool's input that name files or folders.
PATH_FIELDS = frozenset(
    {"file_path", "notebook_path", "path", "paths", "dir_path", "directory", "dir", "file", "filename",
     "files", "pattern", "glob", "uri", "target", "source", "destination", "workdir", "cwd"}
)  # fmt: skip


@dataclass(frozen=True)
class HookEvent:
    """One PreToolUse event: the tool, its input as the host sent it, and the folder the host runs in."""

    tool_name: str
    tool_input: Mapping[str, Any]
    cwd: Path


@dataclass(frozen=True)
class Verdict:
    """The hook's answer: allowed, or blocked with one line for the agent (it goes to stderr, exit code 2)."""

    allowed: bool
    line: str = ""


def parse_event(text: str) -> HookEvent:
    """The event in ``text`` (the host's stdin); not a JSON object with a ``tool_name`` is a `UserError`
    (the CLI then exits 2, which the hosts read as a block: a fence that cannot read its input stays shut)."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UserError(
            f"hook: stdin is not a JSON event ({exc.msg} at line {exc.lineno}); register "
            "`judgeloop hook pre-tool-use` as a PreToolUse command hook, which gets the event on stdin"
        ) from None
    if not isinstance(data, dict) or not isinstance(data.get("tool_name"), str):
        raise UserError(
            "hook: the event on stdin has no tool_name; register `judgeloop hook pre-tool-use` for "
            "PreToolUse events only"
        )
    tool_input = data.get("tool_input")
    cwd = data.get("cwd")
    return HookEvent(
        tool_name=data["tool_name"],
        tool_input=tool_input if isinstance(tool_input, dict) else {},
        cwd=Path(cwd) if isinstance(cwd, str) and os.path.isabs(cwd) else Path.cwd(),
    )


def decide(event: HookEvent, workspace: Path | None = None) -> Verdict:
    """Allow or block ``event``. ``workspace`` is the judgeloop workspace to protect (default: the nearest one
    at or above the event's folder; none there protects only the workspaces a path itself lies in)."""
    if OWN_MCP_TOOL.match(event.tool_name):
        return Verdict(True)
    fence = Fence(workspace if workspace is not None else workspace_of(event.cwd))
    check = _CHECKS.get(event.tool_name, _check_fields)
    found = check(event, fence)
    if found is None:
        return Verdict(True)
    return Verdict(False, f"judgeloop hook: blocked {event.tool_name}: {found}")


def _why(word: str, reach: Reach | None) -> str | None:
    return None if reach is None else f"{word!r} reaches {reach.why()}"


def _strings(value: object) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, list):
        yield from (v for v in value if isinstance(v, str))


def _check_file(event: HookEvent, fence: Fence) -> str | None:
    """Read, Write, Edit, MultiEdit, NotebookEdit, LS: the path fields, taken literally; and the new text of
    a file written outside ``prompts/`` (a script to run next), by the paths it names."""
    targets = []
    for field in ("file_path", "notebook_path", "path"):
        for text in _strings(event.tool_input.get(field)):
            # A file tool takes its path as written: a '*' in it is a character, not a pattern.
            why = _why(text, fence.path_reach(_literal(text), [event.cwd]))
            if why is not None:
                return why
            targets.append(Path(os.path.join(event.cwd, text)))
    if all(_in_prompts(t) for t in targets):
        return None
    edits = event.tool_input.get("edits")
    values: list[object] = [event.tool_input.get(f) for f in CONTENT_FIELDS]
    values += [e.get("new_string") for e in edits if isinstance(e, dict)] if isinstance(edits, list) else []
    for value in values:
        if isinstance(value, str):
            why = _names_a_protected_path(value, fence, [event.cwd, *(t.parent for t in targets)])
            if why is not None:
                return why
    return None


def _in_prompts(path: Path) -> bool:
    """Whether ``path`` (links resolved) is a file in a workspace's ``prompts/``: the judge's text, which the
    guards check and which may well mention devset/ in words."""
    resolved = Path(os.path.realpath(path))
    workspace = workspace_of(resolved.parent)
    return workspace is not None and resolved.relative_to(workspace).parts[:1] == (PROMPTS_DIR,)


def _names_a_protected_path(text: str, fence: Fence, bases: list[Path]) -> str | None:
    """The first path-like piece of ``text`` (one holding a ``/``) that reaches a protected place, as a reason."""
    for word in text.split():
        for piece in pieces(word):
            if "/" in piece:
                why = _why(piece, fence.path_reach(piece, bases))
                if why is not None:
                    return f"the new text names {why}"
    return None


def _literal(text: str) -> str:
    """``text`` with its glob and brace characters escaped for `Fence.path_reach`."""
    return re.sub(r"([*?\[{])", r"[\1]", text) if re.search(r"[*?\[{]", text) else text


def _check_glob(event: HookEvent, fence: Fence) -> str | None:
    """Glob: the pattern read from its ``path`` (default: the host's folder)."""
    base = _search_base(event)
    why = _why(str(base), fence.path_reach(_literal(str(base)), [event.cwd]))
    if why is not None:
        return why
    for pattern in _strings(event.tool_input.get("pattern")):
        why = _why(pattern, fence.glob_reach(pattern, [base]))
        if why is not None:
            return why
    return None


def _check_grep(event: HookEvent, fence: Fence) -> str | None:
    """Grep: it searches its ``path`` (default: the host's folder) as a whole, so that folder must hold no
    protected place below it."""
    base = _search_base(event)
    return _why(str(base), fence.tree_reach(_literal(str(base)), [event.cwd]))


def _search_base(event: HookEvent) -> Path:
    path = event.tool_input.get("path")
    return Path(os.path.join(event.cwd, path)) if isinstance(path, str) and path else event.cwd


def _check_shell(event: HookEvent, fence: Fence) -> str | None:
    """Bash (both hosts) and Codex's shell tools: the command, from its ``workdir`` when it names one."""
    command = event.tool_input.get("command", event.tool_input.get("cmd"))
    if not isinstance(command, str | list):
        return None
    cwd = event.cwd
    for field in ("workdir", "cwd"):
        value = event.tool_input.get(field)
        if isinstance(value, str) and value:
            cwd = Path(os.path.join(event.cwd, value))
            why = _why(value, fence.path_reach(_literal(value), [event.cwd]))
            if why is not None:
                return why
    blocked: Blocked | None = ShellCheck(fence, cwd).check(command)
    return None if blocked is None else blocked.why()


def _check_patch(event: HookEvent, fence: Fence) -> str | None:
    """Codex's apply_patch: every file its patch adds, updates, deletes or moves to."""
    for field in ("command", "input", "patch"):
        for text in _strings(event.tool_input.get(field)):
            names = PATCH_FILE.findall(text)
            for name in names:
                why = _why(name, fence.path_reach(_literal(name), [event.cwd]))
                if why is not None:
                    return why
            if not all(_in_prompts(Path(os.path.join(event.cwd, name))) for name in names):
                added = "\n".join(line[1:] for line in text.splitlines() if line.startswith("+"))
                why = _names_a_protected_path(added, fence, [event.cwd])
                if why is not None:
                    return why
    return None


def _check_fields(event: HookEvent, fence: Fence) -> str | None:
    """A tool this module does not know: every path-like field of its input, at any depth."""
    for text in _path_values(event.tool_input):
        why = _why(text, fence.path_reach(text.removeprefix("file://"), [event.cwd]))
        if why is not None:
            return why
    return None


def _path_values(value: object, key: str = "") -> Iterator[str]:
    if isinstance(value, Mapping):
        for k, v in value.items():
            yield from _path_values(v, str(k))
    elif isinstance(value, list):
        for item in value:
            yield from _path_values(item, key)
    elif isinstance(value, str) and (key in PATH_FIELDS or value.startswith("file://")):
        yield value


_CHECKS: dict[str, Callable[[HookEvent, Fence], str | None]] = {
    **dict.fromkeys(
        ("Read", "Write", "Edit", "MultiEdit", "NotebookEdit", "NotebookRead", "LS"), _check_file
    ),
    "Glob": _check_glob,
    "Grep": _check_grep,
    **dict.fromkeys(SHELL_TOOLS, _check_shell),
    **dict.fromkeys(PATCH_TOOLS, _check_patch),
}
