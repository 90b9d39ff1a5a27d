"""A real MCP client (the `mcp` SDK's `ClientSession` over stdio) driving a `judgeloop mcp` child against
the fake judge server: what the MCP tests share."""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TextIO

import anyio
from jsonschema import Draft202012Validator
from mcp import ClientSession, types
from mcp.client.session import ElicitationFnT
from mcp.client.stdio import StdioServerParameters, stdio_client

from tests.support.fakeserver import FakeLLMServer
from tests.support.loop import FakeJudge
from tests.support.paths import REPO_ROOT

KEY = "sk-test-not-a-real-key"
CALL_LIMIT_S = 240  # one call (a baseline or a candidate on 32 items) on a loaded two-core machine


def server_args(root: Path, url: str, budget: str) -> list[str]:
    return [
        "-m",
        "optimizer.cli",
        "-w",
        str(root),
        "mcp",
        "--budget-usd",
        budget,
        "--provider",
        "openai",
        "--base-url",
        url,
        "--model",
        "fake-judge",
        "--concurrency",
        "8",
    ]


def server_env() -> dict[str, str]:
    return {"OPENAI_API_KEY": KEY, "PYTHONPATH": str(REPO_ROOT)}


@asynccontextmanager
async def client(
    root: Path, url: str, errlog: TextIO, budget: str = "100", elicitation: ElicitationFnT | None = None
) -> AsyncIterator[ClientSession]:
    """A `ClientSession` over a `judgeloop mcp` child, initialised; the child ends with the block.
    ``elicitation``: the client's elicitation callback (it then declares the capability)."""
    params = StdioServerParameters(
        command=sys.executable, args=server_args(root, url, budget), env=server_env(), cwd=str(REPO_ROOT)
    )
    async with (
        stdio_client(params, errlog=errlog) as (read, write),
        ClientSession(read, write, elicitation_callback=elicitation) as session,
    ):
        with anyio.fail_after(60):
            await session.initialize()
        yield session


@asynccontextmanager
async def judged_session(
    root: Path, logs: Path, budget: str = "100", elicitation: ElicitationFnT | None = None
) -> AsyncIterator[ClientSession]:
    """`client` over a `judgeloop mcp` child for workspace ``root``, judged by a fake server answering as
    the loop tests' `FakeJudge`; the child's stderr goes to ``logs``/err.log. Server and child end with the
    block."""
    with FakeLLMServer(default=FakeJudge(root)) as server, (logs / "err.log").open("w") as errlog:
        async with client(root, server.openai_base_url, errlog, budget, elicitation) as session:
            yield session


Progress = list[tuple[float, float | None, str | None]]


async def call(
    session: ClientSession, name: str, collect: Progress | None = None, **arguments: Any
) -> types.CallToolResult:
    """Call tool ``name``; with ``collect``, gather the call's progress notifications in it."""

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        assert collect is not None
        collect.append((progress, total, message))

    with anyio.fail_after(CALL_LIMIT_S):
        return await session.call_tool(
            name, arguments, progress_callback=on_progress if collect is not None else None
        )


def text(result: types.CallToolResult) -> str:
    return "".join(c.text for c in result.content if isinstance(c, types.TextContent))


def data(result: types.CallToolResult) -> dict[str, Any]:
    assert not result.is_error, text(result)
    parsed: dict[str, Any] = json.loads(text(result))
    return parsed


def conforms(tool: types.Tool, result: types.CallToolResult) -> dict[str, Any]:
    """``result``'s structured content, checked against ``tool``'s output schema (itself a valid JSON Schema)
    and mirrored exactly in its text content."""
    assert not result.is_error, text(result)
    assert tool.output_schema is not None and result.structured_content is not None, tool.name
    Draft202012Validator.check_schema(tool.output_schema)
    errors = [
        e.message for e in Draft202012Validator(tool.output_schema).iter_errors(result.structured_content)
    ]
    assert not errors, (tool.name, errors)
    assert json.loads(text(result)) == result.structured_content
    return result.structured_content


async def settled(session: ClientSession, handle: str, polls: int = 2400) -> dict[str, Any]:
    """Poll ``candidate_status`` for ``handle`` until its state is no longer running (bounded by
    `CALL_LIMIT_S` and ``polls``); its last structured content."""
    with anyio.fail_after(CALL_LIMIT_S):
        for _ in range(polls):
            result = await session.call_tool("candidate_status", {"handle": handle})
            status = data(result)
            if status["state"] != "running":
                return status
            await anyio.sleep(0.1)  # between two polls: the candidate's evaluation is the event waited on
    raise AssertionError(f"candidate {handle} still running after {polls} polls")


def drive(body: Callable[[], Awaitable[None]]) -> None:
    anyio.run(body)
