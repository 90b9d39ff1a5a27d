"""A person approves, not the agent (issue 32, point 4): when a ``propose_only`` candidate ends waiting and
the client declared the elicitation capability, the keep question goes to the person by elicitation
(form mode) before ``propose`` answers (or, for a non-blocking one, before its status says decided).

The form asks one thing, keep or discard, with the candidate's figures in its message. An accepted answer
decides the candidate (`McpSession.decide_asked`, recorded as decided by a person); a declined or
dismissed form, a client that cannot elicit or one that fails to answer leaves it waiting, for
``decide``, `judgeloop decide` or the TUI, as without elicitation. A keep against the policy still needs
`judgeloop decide N keep` or the TUI: the server cannot tell a person's form answer from a client's own.
"""

from __future__ import annotations

from typing import Any

from mcp import types
from mcp.server.session import ServerSession

from optimizer.loop.strategies.tools import ToolOutput
from optimizer.mcp.results import Structured
from optimizer.mcp.session import McpSession

KEEP_FORM: dict[str, Any] = {
    "type": "object",
    "properties": {
        "decision": {
            "type": "string",
            "title": "Keep or discard this candidate?",
            "enum": ["keep", "discard"],
            "description": "keep: it becomes the incumbent; discard: rolled back (its commit kept under "
            "refs/judgeloop/rejected/<id>)",
        }
    },
    "required": ["decision"],
}
_ELICITATION = types.ClientCapabilities(elicitation=types.ElicitationCapability())


def can_elicit(server: ServerSession) -> bool:
    """Whether the client declared the elicitation capability."""
    return server.check_client_capability(_ELICITATION)


def _fig(x: Any) -> str:
    return f"{x:.3f}" if isinstance(x, int | float) else "n/a"


def question(outcome: dict[str, Any]) -> str:
    """The keep question for waiting candidate ``outcome`` (a `propose` record), with its figures."""
    kappa, fpr = outcome.get("kappa") or {}, outcome.get("fpr") or {}
    return (
        f"judgeloop: candidate experiment {outcome.get('experiment')} was evaluated on the dev split and waits "
        f"for your decision. kappa {_fig(kappa.get('incumbent'))} -> {_fig(kappa.get('candidate'))}, "
        f"FPR {_fig(fpr.get('incumbent'))} -> {_fig(fpr.get('candidate'))}, p = {_fig(outcome.get('p_value'))}; "
        f"the policy says: {outcome.get('reason') or 'no reason recorded'}."
    )


async def ask_keep(
    server: ServerSession, session: McpSession, out: ToolOutput | Structured, related: Any = None
) -> ToolOutput | Structured:
    """``out`` (a ``propose`` answer) as it stands after asking the person, when it is a waiting candidate
    and the client can elicit: the decided candidate, or ``out`` itself (still waiting) when the person
    did not answer keep or discard. ``related``: the request the question belongs to (None: none)."""
    if not isinstance(out, Structured) or out.data.get("outcome") != "waiting" or not can_elicit(server):
        return out
    try:
        answer = await server.elicit_form(question(out.data), KEEP_FORM, related_request_id=related)
    except Exception as exc:  # noqa: BLE001 - a client that cannot answer: the candidate waits, as without
        session.say(f"elicitation failed ({type(exc).__name__}: {exc}); the candidate still waits")
        return out
    decision = (answer.content or {}).get("decision") if answer.action == "accept" else None
    if decision not in ("keep", "discard"):
        return out
    decided = session.decide_asked(int(out.data["experiment"]), decision == "keep")
    if isinstance(decided, ToolOutput):  # refused (a keep against the policy): it still waits
        return Structured(out.data | {"meaning": out.data.get("meaning", "") + f" ({decided.text})"})
    data = dict(decided.data)
    said = " ".join(data.pop("said", []))  # propose's record has no `said`: the lines join the meaning
    data["meaning"] = (
        f"decided by the person ({decision}, asked by elicitation): {data.get('meaning', '')} {said}".strip()
    )
    return Structured(data)
