"""`judgeloop hook pre-tool-use`: the PreToolUse hook of Claude Code and Codex. Engine: `optimizer.agenthook`.

Reads the host's event on stdin; exit 0 (nothing printed) allows the tool call, exit 2 with one line on
stderr blocks it (both hosts show that line to the agent). It fails closed: an event it cannot read, a
workspace that is not one (a `UserError`, exit 2) and a fault of the hook itself all block the call.
"""

from __future__ import annotations

import argparse
import sys
import traceback
from pathlib import Path

from optimizer.agenthook.events import decide, parse_event
from optimizer.errors import UserError
from optimizer.workspace.paths import CONFIG_NAME


def cmd_hook_pre_tool_use(args: argparse.Namespace) -> int:
    """Allow (0) or block (2, the reason on stderr) the tool call described on stdin."""
    workspace = _workspace(getattr(args, "workspace", None))
    try:
        text = sys.stdin.read()
    except (OSError, ValueError) as exc:  # stdin closed or not readable: no event, so no call is allowed
        raise UserError(f"hook: cannot read the event on stdin ({exc}); the host passes it there") from None
    event = parse_event(text)
    try:
        verdict = decide(event, workspace)
    except Exception:  # noqa: BLE001 -- a fence fails closed: a fault here must block the call, not let it run
        traceback.print_exc(file=sys.stderr)
        print(
            "judgeloop hook: blocked: the hook failed (the traceback above); please report it",
            file=sys.stderr,
        )
        return 2
    if verdict.allowed:
        return 0
    print(verdict.line, file=sys.stderr)
    return 2


def _workspace(given: str | None) -> Path | None:
    """``-w DIR`` as given (it must hold judgeloop.toml), or None: the event's folder decides."""
    if given is None:
        return None
    root = Path(given).expanduser().absolute()
    if not (root / CONFIG_NAME).is_file():
        raise UserError(
            f"hook: {root} is not a judgeloop workspace (no {CONFIG_NAME}); pass -w the workspace folder"
        )
    return root
