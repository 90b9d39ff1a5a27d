"""`judgeloop mcp`'s resources (issue 32, point 3): what a person can @-mention in a host and a tool result
links to (``resource_link`` content): the incumbent's disagreements, one dev item (its steps and links to
its screenshots), the session's history and the latest certificate.

Reading a resource never starts the run, takes the lock or calls the judge (before the baseline the
disagreements are an empty list saying so). Items are the dev split's only, read through the ``agent``
strategy's own reading tools (`McpSession.read_item`, ``read_steps``, ``view_screenshot``): a held-out id,
an id of no split or a path is refused as those tools refuse it, with the specification's "resource not
found" error. The certificate is shown without its held-out confirmations (the optimiser never sees a
held-out figure).
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote, unquote

from mcp import types
from mcp.shared.exceptions import MCPError

from optimizer.loop.strategies.tools import ToolOutput, run_tool
from optimizer.mcp.results import Structured
from optimizer.mcp.session import McpSession
from optimizer.trust.certify import CERTIFICATE_DIR

RESOURCE_NOT_FOUND = -32002  # the MCP specification's code for a resource that does not exist
SCHEME = "judgeloop://"
DISAGREEMENTS = f"{SCHEME}disagreements"
HISTORY = f"{SCHEME}history"
CERTIFICATE = f"{SCHEME}certificate/latest"
ITEM_TEMPLATE = f"{SCHEME}items/{{trajectory_id}}"
SCREENSHOT_TEMPLATE = f"{SCHEME}items/{{trajectory_id}}/screenshots/{{step}}"
_ITEM = re.compile(r"^judgeloop://items/([^/]+)$")
_SCREENSHOT = re.compile(r"^judgeloop://items/([^/]+)/screenshots/(\d{1,6})$")
JSON = "application/json"

RESOURCES: tuple[types.Resource, ...] = (
    types.Resource(
        uri=DISAGREEMENTS,
        name="disagreements",
        title="Disagreements with the labels",
        description="The dev items where the incumbent judge disagrees with the label (empty before the "
        "baseline is evaluated; reading never evaluates it).",
        mime_type=JSON,
    ),
    types.Resource(
        uri=HISTORY,
        name="history",
        title="Experiment history",
        description="This session's candidates: outcome, kappa and FPR before and after, rationale, diff.",
        mime_type=JSON,
    ),
    types.Resource(
        uri=CERTIFICATE,
        name="certificate",
        title="Latest certificate",
        description="The newest `judgeloop certify` certificate of this workspace (held-out confirmations "
        "withheld).",
        mime_type=JSON,
    ),
)
TEMPLATES: tuple[types.ResourceTemplate, ...] = (
    types.ResourceTemplate(
        uri_template=ITEM_TEMPLATE,
        name="item",
        title="A dev item",
        description="One dev item: instruction, the incumbent's disagreement on it, its steps and links to "
        "its screenshots. Dev items only.",
        mime_type=JSON,
    ),
    types.ResourceTemplate(
        uri_template=SCREENSHOT_TEMPLATE,
        name="screenshot",
        title="A dev item's screenshot",
        description="The screenshot taken before a step (0-based) of a dev item. Dev items only.",
    ),
)


def item_uri(trajectory_id: str) -> str:
    return f"{SCHEME}items/{quote(trajectory_id, safe='')}"


def screenshot_uri(trajectory_id: str, step: int) -> str:
    return f"{item_uri(trajectory_id)}/screenshots/{step}"


def link(uri: str, name: str, description: str, mime_type: str | None = JSON) -> types.ResourceLink:
    return types.ResourceLink(uri=uri, name=name, description=description, mime_type=mime_type)


def links_for(tool: str, args: Mapping[str, Any]) -> list[types.ResourceLink]:
    """The resources a successful ``tool`` result links to (``resource_link`` content)."""
    tid = args.get("trajectory_id")
    if tool in ("read_item", "read_steps", "view_screenshot") and isinstance(tid, str):
        return [link(item_uri(tid), "item", f"dev item {tid}: steps and screenshot links")]
    by_tool = {
        "disagreements": [link(DISAGREEMENTS, "disagreements", "the incumbent's disagreements")],
        "history": [link(HISTORY, "history", "this session's candidates")],
        "propose": [link(HISTORY, "history", "this session's candidates")],
        "decide": [link(HISTORY, "history", "this session's candidates")],
        "candidate_status": [link(HISTORY, "history", "this session's candidates")],
        "status": [
            link(DISAGREEMENTS, "disagreements", "the incumbent's disagreements"),
            link(CERTIFICATE, "certificate", "the latest certificate"),
        ],
    }
    return by_tool.get(tool, [])


def _missing(uri: str, why: str) -> MCPError:
    return MCPError(code=RESOURCE_NOT_FOUND, message=f"resource {uri!r} not found: {why}")


def _text(uri: str, out: ToolOutput | Structured) -> types.ReadResourceResult:
    if isinstance(out, ToolOutput) and out.is_error:
        raise _missing(uri, out.problem or out.text.removeprefix("error: "))
    return types.ReadResourceResult(
        contents=[types.TextResourceContents(uri=uri, text=out.text, mime_type=JSON)]
    )


def read(session: McpSession, uri: str) -> types.ReadResourceResult:
    """Resource ``uri``'s contents; a `MCPError` (resource not found) for anything else, held-out and
    unknown items included."""
    if uri == DISAGREEMENTS:
        return _text(uri, _disagreements(session))
    if uri == HISTORY:
        return _text(uri, session.history())
    if uri == CERTIFICATE:
        return _text(uri, _certificate(session, uri))
    shot = _SCREENSHOT.match(uri)
    if shot is not None:
        tid, step = unquote(shot.group(1)), int(shot.group(2))
        out = session.view_screenshot({"trajectory_id": tid, "step": step})
        if out.is_error or out.image is None:
            raise _missing(uri, out.problem or out.text.removeprefix("error: "))
        blob = base64.b64encode(out.image).decode("ascii")
        return types.ReadResourceResult(
            contents=[types.BlobResourceContents(uri=uri, blob=blob, mime_type=out.media_type)]
        )
    item = _ITEM.match(uri)
    if item is not None:
        return _text(uri, _item(session, unquote(item.group(1)), uri))
    raise _missing(
        uri, f"judgeloop's resources are {', '.join(r.uri for r in RESOURCES)} and {ITEM_TEMPLATE}"
    )


def _disagreements(session: McpSession) -> ToolOutput:
    """The incumbent's disagreements, or none before the baseline (reading never evaluates it)."""
    if not session.has_baseline():
        return ToolOutput(
            text=json.dumps({"items": [], "note": "the baseline is not evaluated yet: call disagreements"})
        )
    return run_tool(session.reading_state(), "list_disagreements", {})


def _item(session: McpSession, tid: str, uri: str) -> ToolOutput:
    head = session.read_item({"trajectory_id": tid})
    if head.is_error:
        return head
    item = json.loads(head.text.split("\n(the baseline", 1)[0])
    steps = session.read_steps({"trajectory_id": tid})
    if steps.is_error:
        return steps
    traj = session.split.trajectory(tid)  # a dev item: read_item found it in the dev split
    shots = [screenshot_uri(tid, n) for n, step in enumerate(traj.steps) if step.screenshot is not None]
    item |= {"uri": uri, "steps_text": steps.text, "screenshot_links": shots}
    return ToolOutput(text=json.dumps(item, indent=1, ensure_ascii=False))


def _certificate(session: McpSession, uri: str) -> ToolOutput:
    folder = session.ws.experiments_dir / CERTIFICATE_DIR
    found = (
        sorted(folder.glob("*.json"), key=lambda p: (p.stat().st_mtime_ns, p.name)) if folder.is_dir() else []
    )
    if not found:
        raise _missing(uri, "no certificate yet (`judgeloop certify` writes one)")
    data = json.loads(found[-1].read_text(encoding="utf-8"))
    if not isinstance(data, dict):
        raise _missing(uri, f"{found[-1].name} is not a certificate")
    # Held-out figures never reach the optimiser, not even as a summary.
    data["confirm"] = {"status": "withheld", "note": "held-out confirmations are not shown to the optimiser"}
    data.pop("files", None)
    return ToolOutput(text=json.dumps(data, indent=1, ensure_ascii=False))
