"""The MCP side of `judgeloop mcp`: the tools of an `McpSession` over stdio, with the official SDK's
low-level server (explicit JSON Schemas: the reading tools take the ``agent`` strategy's own).

Tool calls are served one at a time (a lock): a client that sends two at once gets them in turn, so
two proposals never share the branch. A refused call is a tool result with ``is_error`` set and one
sentence saying what is wrong (the SDK's advice: the model sees it and can correct itself); arguments
outside a tool's input schema are refused so before the tool runs. An unknown tool is a JSON-RPC error.
Every tool has a title and annotations; six answer structured content (`optimizer.mcp.results`). A call's
progress notifications go through `optimizer.mcp.progress` (monotonic, at most two a second, a heartbeat
when a long call is silent). ``propose`` with ``wait: false`` runs its candidate in the server's task group
(`optimizer.mcp.background`); a waiting candidate's keep question goes to the person by elicitation when
the client can (`optimizer.mcp.elicit`), and so does a budget top-up before a propose that would cross
the budget (`optimizer.mcp.topup`). The resources are `optimizer.mcp.resources`'; tool results link them.
"""

from __future__ import annotations

import asyncio
import base64
import threading
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass
from typing import Any

import anyio
from jsonschema import Draft202012Validator
from mcp import types
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server
from mcp.shared.exceptions import MCPError
from mcp.types import INVALID_PARAMS

from optimizer import __version__
from optimizer.errors import UserError
from optimizer.events import ProgressSnapshot
from optimizer.loop.strategies.tools import MEMORY_TOOL_SPECS, ToolOutput, spec
from optimizer.mcp import resources
from optimizer.mcp.background import Candidates
from optimizer.mcp.elicit import ask_keep
from optimizer.mcp.progress import HEARTBEAT_S, CallProgress, Notice
from optimizer.mcp.results import (
    CANDIDATE_STATUS_SCHEMA,
    DECIDE_SCHEMA,
    HISTORY_SCHEMA,
    PROPOSE_SCHEMA,
    REPORT_SCHEMA,
    STATUS_SCHEMA,
    Structured,
)
from optimizer.mcp.session import FLIPS_HELP, McpSession
from optimizer.mcp.topup import ask_top_up

INSTRUCTIONS = """\
judgeloop evaluates edits to an LLM judge's prompt files on a labelled dev split and keeps an edit only \
if agreement with the labels (Cohen's kappa) rises without raising the false-positive rate. You propose; \
judgeloop evaluates, decides, commits or rolls back, inside a budget set by the person who started it. \
Start with status, then disagreements; propose one small, general edit at a time; read the decision. \
Never write rules about single items, ids, instructions or their values: such edits are rejected, and \
they would not transfer to unseen trajectories anyway."""


def _obj(props: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {"type": "object", "properties": props, "required": required, "additionalProperties": False}


Answer = ToolOutput | Structured
Run = Callable[[McpSession, Mapping[str, Any]], Awaitable[Answer]]

# What a tool does to its environment, as MCP's annotations say it (hints for the host's confirmations).
READS = types.ToolAnnotations(read_only_hint=True, open_world_hint=False)
# Judge calls (an outside provider, paid from the budget); the first evaluates the baseline, once.
JUDGES_ONCE = types.ToolAnnotations(
    read_only_hint=False, destructive_hint=False, idempotent_hint=True, open_world_hint=True
)
# A new candidate each call: a commit, judged and kept or rolled back. Nothing is removed: a rolled-back
# commit stays under refs/judgeloop/rejected/<id>, so the update is additive.
CHANGES = types.ToolAnnotations(
    read_only_hint=False, destructive_hint=False, idempotent_hint=False, open_world_hint=True
)
DECIDES = types.ToolAnnotations(
    read_only_hint=False, destructive_hint=False, idempotent_hint=False, open_world_hint=False
)


@dataclass(frozen=True)
class _Tool:
    name: str
    title: str
    description: str
    schema: dict[str, Any]
    run: Run | None
    annotations: types.ToolAnnotations
    output_schema: dict[str, Any] | None = None

    def listed(self) -> types.Tool:
        """The tool as ``tools/list`` shows it."""
        return types.Tool(
            name=self.name,
            title=self.title,
            description=self.description,
            input_schema=self.schema,
            output_schema=self.output_schema,
            annotations=self.annotations.model_copy(update={"title": self.title}),
        )


def _sync(method: Callable[[McpSession, Mapping[str, Any]], Answer]) -> Run:
    async def run(session: McpSession, args: Mapping[str, Any]) -> Answer:
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
        "Session status",
        "The session at a glance: run, dev split, judge, decision policy, the budget (spent and left), "
        "the baseline's and the incumbent's kappa and FPR, candidates so far, the allowed files, what to do next.",
        _obj({}, []),
        _sync(lambda s, _a: s.status()),
        READS,
        STATUS_SCHEMA,
    ),
    _Tool(
        "history",
        "Experiment history",
        "The experiments of this session so far: decision, reason, kappa, FPR, rationale and diff. "
        "Do not repeat what was rolled back.",
        _obj({}, []),
        _sync(lambda s, _a: s.history()),
        READS,
        HISTORY_SCHEMA,
    ),
    _Tool(
        "disagreements",
        "Disagreements with the labels",
        spec("list_disagreements").description + " The first call evaluates the baseline "
        "(judge calls, counted in the budget).",
        spec("list_disagreements").parameters,
        lambda s, a: s.disagreements(a),
        JUDGES_ONCE,
    ),
    _Tool(
        "read_item",
        "Read a dev item",
        "One dev item: its instruction, step and screenshot counts, and the incumbent's disagreement "
        "with the label on it, if it is one. Dev items only.",
        _obj({"trajectory_id": {"type": "string"}}, ["trajectory_id"]),
        _sync(lambda s, a: s.read_item(a)),
        READS,
    ),
    _Tool(
        "read_steps",
        "Read a trajectory's steps",
        spec("read_trajectory").description + " Dev items only.",
        spec("read_trajectory").parameters,
        _sync(lambda s, a: s.read_steps(a)),
        READS,
    ),
    _Tool(
        "view_screenshot",
        "View a screenshot",
        spec("view_screenshot").description + " Dev items only.",
        spec("view_screenshot").parameters,
        _sync(lambda s, a: s.view_screenshot(a)),
        READS,
    ),
    _Tool(
        "read_file",
        "Read a prompt file",
        "Read an allowed prompt file as the incumbent has it.",
        spec("read_file").parameters,
        _sync(lambda s, a: s.read_file(a)),
        READS,
    ),
    _Tool(
        "propose",
        "Propose a candidate",
        "Propose a candidate: the new full text of one or more allowed prompt files and/or memory edits "
        "(when prompts/memory/ is allowed), and a one-paragraph rationale. It is checked by the guards (allowed "
        "files, diff size, no dev ids, instructions or values), committed, evaluated on the dev split and "
        "decided: the answer is the outcome (kept, rolled_back, guard_rejected, error, or waiting with "
        "propose_only), kappa and FPR before and after, the p-value and "
        f"the flips ({FLIPS_HELP}). Takes minutes: every item may be judged. propose_only: evaluate in full and "
        "wait for decide instead of deciding by the policy (the person is asked to keep or discard when the "
        "host supports elicitation). wait: false answers a candidate handle at once and evaluates in the "
        "background: poll candidate_status with it (one candidate at a time).",
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
                "wait": {
                    "type": "boolean",
                    "description": "true (the default): answer once the candidate is decided; false: answer "
                    "its handle at once, then poll candidate_status",
                },
            },
            ["rationale"],
        ),
        lambda s, a: s.propose(a),
        CHANGES,
        PROPOSE_SCHEMA,
    ),
    _Tool(
        "candidate_status",
        "Candidate status",
        "The progress of a candidate proposed with wait: false (items judged over items planned, as the "
        "progress notifications count it) and, once decided, its outcome as propose answers it.",
        _obj({"handle": {"type": "string"}}, ["handle"]),
        None,  # the server's own: its candidates are the server's (`optimizer.mcp.background`)
        READS,
        CANDIDATE_STATUS_SCHEMA,
    ),
    _Tool(
        "decide",
        "Decide a waiting candidate",
        "Keep or discard the candidate waiting after a propose with propose_only.",
        _obj(
            {"experiment": {"type": "integer"}, "decision": {"type": "string", "enum": ["keep", "discard"]}},
            ["experiment", "decision"],
        ),
        _sync(lambda s, a: s.decide(a)),
        DECIDES,
        DECIDE_SCHEMA,
    ),
    _Tool(
        "attribute",
        "Attribute the kept edits",
        "Measure what each kept edit of this session still contributes at the end (each reverted "
        "from the final prompts and re-judged on the dev split) and the final prompts against the baseline. "
        "Judge calls, counted in the budget; worth it once, near the end of a session with several keeps.",
        _obj({}, []),
        lambda s, _a: s.attribute(),
        CHANGES,
    ),
    _Tool(
        "report",
        "Audit report",
        "The audit report of this session's run: every decision, the kept chain, flips and spend.",
        _obj({}, []),
        _sync(lambda s, _a: s.report()),
        READS,
        REPORT_SCHEMA,
    ),
)
_BY_NAME = {t.name: t for t in TOOLS}
# The tools that judge: their progress goes to the call's progress token (with a heartbeat).
JUDGING = frozenset({"disagreements", "propose", "attribute"})
_VALIDATORS = {t.name: Draft202012Validator(t.schema) for t in TOOLS}


def argument_problem(tool: str, args: Mapping[str, Any]) -> str | None:
    """What is wrong with ``args`` for ``tool`` by its input schema (an unknown argument, a missing one, a
    value of the wrong type), in one sentence naming the argument; None when they conform."""
    errors = sorted(_VALIDATORS[tool].iter_errors(args), key=_where)
    if not errors:
        return None
    error = _chosen(errors[0])
    props = _BY_NAME[tool].schema.get("properties", {})
    takes = f"it takes {', '.join(props)}" if props else "it takes none"
    if error.validator == "additionalProperties" and not error.absolute_path:
        unknown = sorted(set(args) - set(props))
        return f"{tool}: unknown argument {', '.join(map(repr, unknown))}; {takes}"
    if error.validator == "required" and not error.absolute_path:
        missing = [name for name in error.validator_value if name not in args]
        return f"{tool}: missing argument {', '.join(map(repr, missing))}; {takes}"
    where = ".".join(str(p) for p in error.absolute_path)
    return f"{tool}: argument {where!r}: {error.message}" if where else f"{tool}: {error.message}"


def _where(error: Any) -> tuple[int, list[str]]:
    """A validation error's place, shallowest first (its path's depth, then its path)."""
    return len(error.absolute_path), [str(p) for p in error.absolute_path]


def _chosen(error: Any) -> Any:
    """For a ``oneOf`` whose branches are told apart by a constant (a memory edit's ``tool``), the first
    error inside the branch the value chose, or the constant's own when it chose none (naming the values
    allowed); any other error as it is. ``error``: a jsonschema ``ValidationError``."""
    if error.validator != "oneOf" or not error.context:
        return error
    branches: dict[Any, list[Any]] = {}
    for sub in error.context:
        branches.setdefault(sub.relative_schema_path[0], []).append(sub)
    chosen = [subs for subs in branches.values() if not any(e.validator == "const" for e in subs)]
    if len(chosen) == 1:
        return sorted(chosen[0], key=_where)[0]
    consts = [e for subs in branches.values() for e in subs if e.validator == "const"]
    if len(consts) == len(branches):  # the constant matched no branch
        first = consts[0]
        first.message = (
            f"{first.instance!r} is not one of {', '.join(str(e.validator_value) for e in consts)}"
        )
        return first
    return error


def _error_out(text: str) -> ToolOutput:
    return ToolOutput(text=f"error: {text}", is_error=True, problem=text)


def _result(out: Answer, links: list[types.ResourceLink] | None = None) -> types.CallToolResult:
    """``out`` as a tool result; ``links``: the resources a successful one links to."""
    if isinstance(out, Structured):
        blocks: list[types.ContentBlock] = [types.TextContent(text=out.text), *(links or [])]
        return types.CallToolResult(content=blocks, structured_content=out.data)
    content: list[types.ContentBlock] = [types.TextContent(text=out.text)]
    if out.image is not None:
        content.append(
            types.ImageContent(data=base64.b64encode(out.image).decode("ascii"), mime_type=out.media_type)
        )
    if not out.is_error:
        content.extend(links or [])
    return types.CallToolResult(content=content, is_error=out.is_error)


@dataclass
class _Pace:
    """When the server last sent a progress notification (`time.monotonic` seconds): the next call's first
    one waits its turn too, so no two calls together send more than two a second."""

    sent_at: float | None = None


class _Sent:
    """A call's progress notifications: throttled and counted over the whole call (`CallProgress`), each
    sent as a task of the event loop, with a heartbeat when the call is silent ``heartbeat_s`` seconds;
    `drain` sends the held last one and awaits them all before the call's result goes out."""

    def __init__(
        self, ctx: ServerRequestContext[Any, Any], token: Any, pace: _Pace, heartbeat_s: float = HEARTBEAT_S
    ) -> None:
        self.ctx, self.token, self.pace = ctx, token, pace
        self.meter = CallProgress(sent_at=pace.sent_at)
        self.tasks: list[asyncio.Task[None]] = []
        self.timer: asyncio.TimerHandle | None = None
        self.heartbeat_s = heartbeat_s
        self.beating: asyncio.TimerHandle | None = None

    def start_heartbeat(self) -> None:
        """Look for silence every quarter of ``heartbeat_s`` (on the event loop's thread)."""
        self.beating = asyncio.get_running_loop().call_later(self.heartbeat_s / 4, self._beat)

    def _beat(self) -> None:
        notice = self.meter.beat(self.heartbeat_s)
        if notice is not None:
            self._send(notice)
        self.start_heartbeat()

    def offer(self, snap: ProgressSnapshot) -> None:
        """On the event loop's thread: send ``snap``'s notice now, or release it when its time comes."""
        notice = self.meter.offer(snap)
        if notice is not None:
            self._send(notice)
        wait = self.meter.wait_s()
        if wait is not None and self.timer is None:
            self.timer = asyncio.get_running_loop().call_later(wait, self._release)

    def _release(self) -> None:
        self.timer = None
        notice = self.meter.release()
        if notice is not None:
            self._send(notice)

    def _send(self, notice: Notice) -> None:
        self.tasks.append(
            asyncio.get_running_loop().create_task(
                self.ctx.session.send_progress_notification(
                    self.token, notice.progress, notice.total, notice.message
                )
            )
        )

    async def drain(self) -> None:
        if self.beating is not None:
            self.beating.cancel()
            self.beating = None
        await asyncio.sleep(0)  # what a worker thread scheduled runs first
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        wait = self.meter.wait_s()
        if wait is not None:  # the last notice is always sent, in its turn
            await asyncio.sleep(wait)
            self._release()
        self.pace.sent_at = self.meter.sent_at
        if self.tasks:
            # A client that left mid-call cannot be told; the result is what matters.
            await asyncio.gather(*self.tasks, return_exceptions=True)


def _forward_progress(ctx: ServerRequestContext[Any, Any], session: McpSession, pace: _Pace) -> _Sent:
    """Send the call's judging progress as MCP progress notifications when the client asked for them
    with a progress token (`_Sent`); from the event loop's thread or another."""
    token = ctx.meta.get("progress_token") if ctx.meta else None
    sent = _Sent(ctx, token, pace)
    if token is None:
        return sent
    sent.start_heartbeat()
    loop = asyncio.get_running_loop()
    owner = threading.get_ident()

    def send(snap: ProgressSnapshot) -> None:
        if threading.get_ident() == owner:
            sent.offer(snap)
        else:  # attribute judges in a worker thread
            loop.call_soon_threadsafe(sent.offer, snap)

    session.on_progress = send
    return sent


ANSWER_FIRST_S = 0.2  # a non-blocking propose's candidate starts this long after its handle is answered
Spawn = Callable[[Callable[[], Coroutine[Any, Any, None]]], object]


def build_server(session: McpSession, spawn: Spawn) -> Server[Any]:
    """The MCP server of ``session``: its tools, served one call at a time, and its resources; ``spawn``
    starts a non-blocking candidate in the server's task group (cancelled when the client leaves)."""
    lock = anyio.Lock()
    pace = _Pace()
    candidates = Candidates()

    async def list_tools(
        ctx: ServerRequestContext[Any, Any],  # noqa: ARG001 - the SDK's handler signature
        params: types.PaginatedRequestParams | None,  # noqa: ARG001
    ) -> types.ListToolsResult:
        return types.ListToolsResult(tools=[t.listed() for t in TOOLS])  # always in TOOLS' order

    def status_of(args: Mapping[str, Any]) -> Answer:
        handle = str(args.get("handle"))
        found = candidates.get(handle)
        if found is None:
            known = ", ".join(candidates.known()) or "none yet"
            return _error_out(f"no candidate has handle {handle!r} in this session (handles: {known})")
        return Structured(found.record())

    def start(ctx: ServerRequestContext[Any, Any], args: Mapping[str, Any]) -> Answer:
        """A non-blocking propose: its quick refusals now, else its handle, the candidate evaluated in a
        background task (its progress to the candidate, its keep question by elicitation)."""
        refused = session.propose_refusal(args)
        if refused is not None:
            return refused
        candidate = candidates.start()
        session.on_progress = candidate.offer

        async def evaluate() -> Answer:
            try:
                out = await session.propose(args)
            finally:
                session.on_progress = None
            return await ask_keep(ctx.session, session, out)

        async def background() -> None:
            # The handle's answer goes out first: the candidate's guards and git work run on this event
            # loop and would hold it back (a host waits for it, not for them).
            await anyio.sleep(ANSWER_FIRST_S)
            await candidates.run(candidate, evaluate)

        spawn(background)
        return Structured(candidate.record())

    async def judged(ctx: ServerRequestContext[Any, Any], tool: _Tool, args: Mapping[str, Any]) -> Answer:
        """A blocking call of a tool that judges: its progress to the call's progress token."""
        sent = _forward_progress(ctx, session, pace)
        try:
            assert tool.run is not None
            if tool.name == "propose":  # a person may add to the budget first (`optimizer.mcp.topup`)
                await ask_top_up(ctx.session, session, args, ctx.request_id)
            out = await tool.run(session, args)
            if tool.name == "propose":
                out = await ask_keep(ctx.session, session, out, ctx.request_id)
            return out
        finally:
            session.on_progress = None
            await sent.drain()

    async def call_tool(
        ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        tool = _BY_NAME.get(params.name)
        if tool is None:
            # The specification's answer to an unknown tool: a protocol error, not a tool result.
            raise MCPError(
                code=INVALID_PARAMS, message=f"unknown tool {params.name!r}; tools: {', '.join(_BY_NAME)}"
            )
        args = params.arguments or {}
        problem = argument_problem(tool.name, args)
        if problem is not None:
            # A tool execution error (as the specification asks of invalid arguments): the model reads it and
            # corrects its call.
            return _result(ToolOutput(text=f"error: {problem}", is_error=True, problem=problem))
        async with lock:
            busy = candidates.busy(tool.name)
            try:
                if busy is not None:
                    out: Answer = _error_out(busy)
                elif tool.name == "candidate_status":
                    out = status_of(args)
                elif tool.name == "propose" and args.get("wait") is False:
                    await ask_top_up(ctx.session, session, args, ctx.request_id)
                    out = start(ctx, args)
                elif tool.name in JUDGING:
                    out = await judged(ctx, tool, args)
                else:
                    assert tool.run is not None  # every tool but candidate_status runs on the session
                    out = await tool.run(session, args)
            except UserError as exc:
                out = ToolOutput(text=f"error: {exc}", is_error=True)
        return _result(out, resources.links_for(tool.name, args))

    async def list_resources(
        ctx: ServerRequestContext[Any, Any],  # noqa: ARG001 - the SDK's handler signature
        params: types.PaginatedRequestParams | None,  # noqa: ARG001
    ) -> types.ListResourcesResult:
        return types.ListResourcesResult(resources=list(resources.RESOURCES))

    async def list_templates(
        ctx: ServerRequestContext[Any, Any],  # noqa: ARG001 - the SDK's handler signature
        params: types.PaginatedRequestParams | None,  # noqa: ARG001
    ) -> types.ListResourceTemplatesResult:
        return types.ListResourceTemplatesResult(resource_templates=list(resources.TEMPLATES))

    async def read_resource(
        ctx: ServerRequestContext[Any, Any],  # noqa: ARG001 - the SDK's handler signature
        params: types.ReadResourceRequestParams,
    ) -> types.ReadResourceResult:
        async with lock:
            try:
                return resources.read(session, str(params.uri))
            except UserError as exc:
                raise MCPError(code=resources.RESOURCE_NOT_FOUND, message=str(exc)) from None

    return Server(
        "judgeloop",
        version=__version__,
        instructions=INSTRUCTIONS,
        on_list_tools=list_tools,
        on_call_tool=call_tool,
        on_list_resources=list_resources,
        on_list_resource_templates=list_templates,
        on_read_resource=read_resource,
    )


async def serve(session: McpSession) -> None:
    """Serve ``session`` over stdin/stdout until the client closes the connection; a candidate still
    running in the background then is stopped (cancelled: rolled back, or left waiting, as a blocking
    propose's candidate is when its client leaves)."""
    try:
        async with anyio.create_task_group() as tasks:
            server = build_server(session, lambda work: tasks.start_soon(work))
            async with stdio_server() as (read_stream, write_stream):
                await server.run(read_stream, write_stream, server.create_initialization_options())
            tasks.cancel_scope.cancel()
    finally:
        await session.aclose()
