"""The MCP side of `judgeloop mcp`: the tools of an `McpSession` over stdio, with the official SDK's
low-level server (explicit JSON Schemas: the reading tools take the ``agent`` strategy's own).

Tool calls are served one at a time (a lock): a client that sends two at once gets them in turn, so
two proposals never share the branch. A refused call is a tool result with ``is_error`` set and one
sentence saying what is wrong (the SDK's advice: the model sees it and can correct itself).
"""

from __future__ import annotations

import asyncio
import base64
import threading
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import anyio
from mcp import types
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server

from optimizer import __version__
from optimizer.errors import UserError
from optimizer.events import ProgressSnapshot
from optimizer.loop.strategies.tools import MEMORY_TOOL_SPECS, ToolOutput, spec
from optimizer.mcp.session import FLIPS_HELP, McpSession

INSTRUCTIONS = """\
judgeloop evaluates edits to an LLM judge's prompt files on a labelled dev split and keeps an edit only \
if agreement with the labels (Cohen's kappa) rises without raising the false-positive rate. You propose; \
judgeloop evaluates, decides, commits or rolls back, inside a budget set by the person who started it. \
Start with status, then disagreements; propose one small, general edit at a time; read the decision. \
Never write rules about single items, ids, instructions or their values: such edits are rejected, and \
they would not transfer to unseen trajectories anyway."""


def _obj(props: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {"type": "object", "properties": props, "required": required, "additionalProperties": False}


@dataclass(frozen=True)
class _Tool:
    name: str
    description: str
    schema: dict[str, Any]
    run: Callable[[McpSession, Mapping[str, Any]], Awaitable[ToolOutput]]


def _sync(
    method: Callable[[McpSession, Mapping[str, Any]], ToolOutput],
) -> Callable[[McpSession, Mapping[str, Any]], Awaitable[ToolOutput]]:
    async def run(session: McpSession, args: Mapping[str, Any]) -> ToolOutput:
        return method(session, args)

    return run


# `propose`'s memory edits: the agent strategy's memory tools (their own schemas), applied in order.
_MEMORY_EDITS: dict[str, Any] = {
    "type": "array",
    "description": "edits of the judge's memory (prompts/memory/), applied in order after files, with the agent "
    "strategy's memory tools: " + " ".join(f"{t.name}: {t.description}" for t in MEMORY_TOOL_SPECS),
    "items": {
        "oneOf": [
            _obj({"tool": {"const": t.name}, "arguments": t.parameters}, ["tool", "arguments"])
            for t in MEMORY_TOOL_SPECS
        ]
    },
}

TOOLS: tuple[_Tool, ...] = (
    _Tool(
        "status",
        "The session at a glance: run, dev split, judge, decision policy, the budget (spent and left), "
        "the baseline's and the incumbent's kappa and FPR, candidates so far, the allowed files, what to do next.",
        _obj({}, []),
        _sync(lambda s, _a: s.status()),
    ),
    _Tool(
        "history",
        "The experiments of this session so far: decision, reason, kappa, FPR, rationale and diff. "
        "Do not repeat what was rolled back.",
        _obj({}, []),
        _sync(lambda s, _a: s.history()),
    ),
    _Tool(
        "disagreements",
        spec("list_disagreements").description + " The first call evaluates the baseline "
        "(judge calls, counted in the budget).",
        spec("list_disagreements").parameters,
        lambda s, a: s.disagreements(a),
    ),
    _Tool(
        "read_item",
        "One dev item: its instruction, step and screenshot counts, and the incumbent's disagreement "
        "with the label on it, if it is one. Dev items only.",
        _obj({"trajectory_id": {"type": "string"}}, ["trajectory_id"]),
        _sync(lambda s, a: s.read_item(a)),
    ),
    _Tool(
        "read_steps",
        spec("read_trajectory").description + " Dev items only.",
        spec("read_trajectory").parameters,
        _sync(lambda s, a: s.read_steps(a)),
    ),
    _Tool(
        "view_screenshot",
        spec("view_screenshot").description + " Dev items only.",
        spec("view_screenshot").parameters,
        _sync(lambda s, a: s.view_screenshot(a)),
    ),
    _Tool(
        "read_file",
        "Read an allowed prompt file as the incumbent has it.",
        spec("read_file").parameters,
        _sync(lambda s, a: s.read_file(a)),
    ),
    _Tool(
        "propose",
        "Propose a candidate: the new full text of one or more allowed prompt files and/or memory edits "
        "(when prompts/memory/ is allowed), and a one-paragraph rationale. It is checked by the guards (allowed "
        "files, diff size, no dev ids, instructions or values), committed, evaluated on the dev split and "
        "decided: the answer is the outcome (kept, rolled_back, guard_rejected, error, or waiting with "
        "propose_only), kappa and FPR before and after, the p-value and "
        f"the flips ({FLIPS_HELP}). Takes minutes: every item may be judged. propose_only: evaluate in full and "
        "wait for decide instead of deciding by the policy.",
        _obj(
            {
                "files": {
                    "type": "object",
                    "additionalProperties": {"type": "string"},
                    "description": "allowed prompt file path -> its new full text",
                },
                "memory": _MEMORY_EDITS,
                "rationale": {"type": "string"},
                "propose_only": {"type": "boolean"},
            },
            ["rationale"],
        ),
        lambda s, a: s.propose(a),
    ),
    _Tool(
        "decide",
        "Keep or discard the candidate waiting after a propose with propose_only.",
        _obj(
            {"experiment": {"type": "integer"}, "decision": {"type": "string", "enum": ["keep", "discard"]}},
            ["experiment", "decision"],
        ),
        _sync(lambda s, a: s.decide(a)),
    ),
    _Tool(
        "attribute",
        "Measure what each kept edit of this session still contributes at the end (each reverted "
        "from the final prompts and re-judged on the dev split) and the final prompts against the baseline. "
        "Judge calls, counted in the budget; worth it once, near the end of a session with several keeps.",
        _obj({}, []),
        lambda s, _a: s.attribute(),
    ),
    _Tool(
        "report",
        "The audit report of this session's run: every decision, the kept chain, flips and spend.",
        _obj({}, []),
        _sync(lambda s, _a: s.report()),
    ),
)
_BY_NAME = {t.name: t for t in TOOLS}


def _result(out: ToolOutput) -> types.CallToolResult:
    content: list[types.ContentBlock] = [types.TextContent(text=out.text)]
    if out.image is not None:
        content.append(
            types.ImageContent(data=base64.b64encode(out.image).decode("ascii"), mime_type=out.media_type)
        )
    return types.CallToolResult(content=content, is_error=out.is_error)


class _Sent:
    """Progress notifications in flight, awaited before the call's result goes out."""

    def __init__(self) -> None:
        self.tasks: list[asyncio.Task[None]] = []

    async def drain(self) -> None:
        await asyncio.sleep(0)  # what a worker thread scheduled runs first
        if self.tasks:
            # A client that left mid-call cannot be told; the result is what matters.
            await asyncio.gather(*self.tasks, return_exceptions=True)


def _forward_progress(ctx: ServerRequestContext[Any, Any], session: McpSession) -> _Sent:
    """Send the call's judging progress (items judged of the pass) as MCP progress notifications when
    the client asked for them with a progress token; from the event loop's thread or another."""
    sent = _Sent()
    token = ctx.meta.get("progress_token") if ctx.meta else None
    if token is None:
        return sent
    loop = asyncio.get_running_loop()

    owner = threading.get_ident()

    def send(snap: ProgressSnapshot) -> None:
        def schedule() -> None:
            sent.tasks.append(
                loop.create_task(
                    ctx.session.send_progress_notification(
                        token, float(snap.done), float(snap.total), snap.line()
                    )
                )
            )

        if threading.get_ident() == owner:
            schedule()
        else:  # attribute judges in a worker thread
            loop.call_soon_threadsafe(schedule)

    session.on_progress = send
    return sent


def build_server(session: McpSession) -> Server[Any]:
    """The MCP server of ``session``: its tools, served one call at a time."""
    lock = anyio.Lock()

    async def list_tools(
        ctx: ServerRequestContext[Any, Any],  # noqa: ARG001 - the SDK's handler signature
        params: types.PaginatedRequestParams | None,  # noqa: ARG001
    ) -> types.ListToolsResult:
        return types.ListToolsResult(
            tools=[types.Tool(name=t.name, description=t.description, input_schema=t.schema) for t in TOOLS]
        )

    async def call_tool(
        ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        tool = _BY_NAME.get(params.name)
        if tool is None:
            return _result(
                ToolOutput(
                    text=f"error: unknown tool {params.name!r}; tools: {', '.join(_BY_NAME)}", is_error=True
                )
            )
        async with lock:
            sent = _forward_progress(ctx, session)
            try:
                out = await tool.run(session, params.arguments or {})
            except UserError as exc:
                out = ToolOutput(text=f"error: {exc}", is_error=True)
            finally:
                session.on_progress = None
                await sent.drain()
        return _result(out)

    return Server(
        "judgeloop",
        version=__version__,
        instructions=INSTRUCTIONS,
        on_list_tools=list_tools,
        on_call_tool=call_tool,
    )


async def serve(session: McpSession) -> None:
    """Serve ``session`` over stdin/stdout until the client closes the connection."""
    server = build_server(session)
    try:
        async with stdio_server() as (read_stream, write_stream):
            await server.run(read_stream, write_stream, server.create_initialization_options())
    finally:
        await session.aclose()
