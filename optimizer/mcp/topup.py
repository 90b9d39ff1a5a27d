"""A person tops up the budget, not the agent (issue 32, point 4): when a ``propose`` would cross the
session's budget (it is spent out, a judge call was refused, or the next candidate's estimate is more than
what is left) and the client declared the elicitation capability, the person is asked by a form (form
mode) how much to add, with the spend so far, the estimate and the cap in its message, before the
candidate starts.

An accepted amount raises the session's budget through the one seam (`RunContext.raise_budget`: the
ledger's ``runs.budgets`` records it as the person's decision, with the amount; ``status`` and ``report``
show ``topped_up_usd``). Everything else changes nothing and ``propose`` goes on as without elicitation
(refused, naming what is left, when the budget is spent): a declined or dismissed form, a client that
cannot elicit or fails to answer, an amount that is not a positive finite number within the cap, or an
answer with any other key. The top-ups of a session are capped at `TOP_UP_FACTOR` times its
``--budget-usd`` in all. No tool argument tops a budget up: only the form's answer does.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from mcp.server.session import ServerSession

from optimizer.mcp.elicit import can_elicit
from optimizer.mcp.results import money
from optimizer.mcp.session import McpSession

TOP_UP_FACTOR = 10  # every top-up of a session together: at most this many times its --budget-usd
AMOUNT = "add_usd"


def cap_usd(session: McpSession) -> float:
    """What people may still add to ``session``'s budget (US dollars)."""
    return money(max(0.0, TOP_UP_FACTOR * session.options.budget_usd - session.topped_up_usd))


def form(cap: float) -> dict[str, Any]:
    """The form's schema: one amount in US dollars, at most ``cap``."""
    return {
        "type": "object",
        "properties": {
            AMOUNT: {
                "type": "number",
                "title": "US dollars to add to the session's budget",
                "description": f"more than 0 and at most {cap:g} (decline to add nothing)",
                "minimum": 0,  # the specification's number schema has no exclusive bound: 0 is refused here
                "maximum": cap,
            }
        },
        "required": [AMOUNT],
    }


def question(session: McpSession, estimate: float | None, cap: float) -> str:
    """The form's message: the spend so far, what is left, the next candidate's estimate, the cap."""
    guess = f"${estimate:.4f}" if estimate is not None else "unknown"
    return (
        f"judgeloop: the agent proposed a candidate the session's budget cannot pay for. {session.budget_line()}"
        f"; the next candidate is estimated at {guess} (every dev item judged once: re-judging disagreements "
        f"costs more, cached calls and an early stop less). Add to the budget? At most ${cap:g} more in this "
        f"session ({TOP_UP_FACTOR}x its --budget-usd ${session.options.budget_usd:g}, in all). Decline to add "
        "nothing: the candidate is refused when the budget is spent, else it runs until the budget stops it."
    )


def accepted_amount(action: str, content: Mapping[str, Any] | None, cap: float) -> float | str | None:
    """The amount a form's answer adds, a line saying why it adds nothing (a bad answer), or None (not
    accepted). Only a positive finite number within ``cap`` under `AMOUNT`, and no other key, is taken."""
    if action != "accept":
        return None
    content = content or {}
    extra = sorted(set(content) - {AMOUNT})
    if extra:
        return f"the answer has other keys than {AMOUNT} ({', '.join(extra)})"
    amount = content.get(AMOUNT)
    if isinstance(amount, bool) or not isinstance(amount, int | float):
        return f"{AMOUNT} must be a number of US dollars, not {amount!r}"
    if not math.isfinite(amount) or amount <= 0:
        return f"{AMOUNT} must be a positive finite number, not {amount!r}"
    if amount > cap:
        return f"{AMOUNT} {amount:g} is over the cap: at most ${cap:g} more in this session"
    return float(amount)


def crossing(session: McpSession) -> tuple[bool, float | None]:
    """Whether a new candidate would cross the budget (it is spent out or stopped, or the estimate is more
    than what is left), and the next candidate's estimate (None: unknown)."""
    estimate = session.next_candidate_usd()
    spent_out = session.budget_refusal("a new candidate") is not None
    return spent_out or (estimate is not None and estimate > session.left_usd), estimate


async def ask_top_up(
    server: ServerSession, session: McpSession, args: Mapping[str, Any], related: Any = None
) -> None:
    """Before ``propose`` with ``args``: ask the person to add to the budget when the candidate would cross
    it, the client can elicit and nothing else refuses it; add what they accept. ``related``: the request
    the question belongs to (None: none)."""
    if (
        not session.started
        or not can_elicit(server)
        or session.propose_refusal(args, budget=False) is not None
    ):
        return
    crosses, estimate = crossing(session)
    if not crosses:
        return
    cap = cap_usd(session)
    if cap <= 0:
        session.say(
            f"budget: the session's top-ups reached their cap ({TOP_UP_FACTOR}x --budget-usd); not asked"
        )
        return
    message = question(session, estimate, cap)
    try:
        answer = await server.elicit_form(message, form(cap), related_request_id=related)
    except Exception as exc:  # noqa: BLE001 - a client that cannot answer: the budget stays as it is
        session.say(f"budget: elicitation failed ({type(exc).__name__}: {exc}); the budget is unchanged")
        return
    amount = accepted_amount(answer.action, answer.content, cap)
    if amount is None:
        session.say(f"budget: the person did not add to it ({answer.action}); {session.budget_line()}")
        return
    if isinstance(amount, str):
        session.say(f"budget: the top-up is refused: {amount}; {session.budget_line()}")
        return
    session.ctx.raise_budget(amount, by="person", via="elicitation")
    session.say(f"budget: the person added ${amount:g}; {session.budget_line()}")
