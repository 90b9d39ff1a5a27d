"""A budget top-up by elicitation (form mode), through the MCP SDK client's elicitation callback: a propose
the session's budget cannot pay for asks the person how much to add; an accepted amount raises the budget
(the ledger records it as the person's, status and report show it); a declined form, a bad amount, an
answer with other keys or a tool argument never does, and the propose is refused as without elicitation.

The workspace prices the fake judge at $10 per million tokens: its baseline costs about $0.91 and a
candidate about $1.38, so a $1 session pays its baseline and cannot pay a candidate. Every server is a child
of `stdio_client`; every call is bounded by `anyio.fail_after`.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
from mcp import types

from optimizer.judge.prompts import RUBRIC_MD
from optimizer.ledger import Ledger
from optimizer.mcp.topup import AMOUNT, TOP_UP_FACTOR, accepted_amount, form
from tests.support.loop import GOOD_ENTRY, commit_all
from tests.support.mcp_client import call, conforms, data, drive, judged_session, text
from tests.support.mcp_workspace import ledger_state, library_text, make_mcp_template, rubric_with
from tests.support.scripted import assert_clean

REFUSED = "budget: a new candidate is refused"


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = make_mcp_template(tmp_path_factory.mktemp("template"))
    cfg = root / "judgeloop.toml"
    cfg.write_text(
        cfg.read_text(encoding="utf-8") + '\n[prices."fake-judge"]\ninput = 10.0\noutput = 10.0\n',
        encoding="utf-8",
    )
    commit_all(root, "prices")
    return root


@pytest.mark.slow
def test_an_accepted_top_up_raises_the_budget_as_the_persons_decision_and_the_candidate_runs(
    ws: Path, tmp_path: Path
) -> None:
    good = library_text(ws, GOOD_ENTRY)
    asked: list[types.ElicitRequestFormParams] = []
    # The top-up form, then the keep question, whose answer carries an amount too: it adds nothing.
    answers: list[dict[str, Any]] = [{AMOUNT: 2}, {"decision": "keep", AMOUNT: 50}]
    seen: dict[str, Any] = {}

    async def person(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        assert isinstance(params, types.ElicitRequestFormParams)
        asked.append(params)
        return types.ElicitResult(action="accept", content=answers.pop(0))

    async def body() -> None:
        async with judged_session(ws, tmp_path, budget="1", elicitation=person) as session:
            tools = {t.name: t for t in (await session.list_tools()).tools}
            data(await call(session, "disagreements"))
            seen["before"] = data(await call(session, "status"))["budget"]
            seen["kept"] = conforms(
                tools["propose"],
                await call(
                    session,
                    "propose",
                    files={RUBRIC_MD: rubric_with(ws, good)},
                    rationale="Check that typed text matches the request exactly.",
                    propose_only=True,
                ),
            )
            seen["status"] = conforms(tools["status"], await call(session, "status"))
            seen["report"] = conforms(tools["report"], await call(session, "report"))

    drive(body)
    assert not answers and len(asked) == 2
    before = seen["before"]
    assert before["budget_usd"] == 1 and before["topped_up_usd"] == 0 and 0.5 < before["spent_usd"] < 1
    top_up = asked[0]
    assert f"spent ${before['spent_usd']:.4f} of the session's $1 budget" in top_up.message
    assert "the next candidate is estimated at $" in top_up.message
    assert f"At most ${TOP_UP_FACTOR:g} more" in top_up.message
    assert top_up.requested_schema["properties"][AMOUNT]["maximum"] == TOP_UP_FACTOR
    kept = seen["kept"]
    assert kept["outcome"] == "kept" and "decided by the person" in kept["meaning"]
    assert kept["budget"]["topped_up_usd"] == 2
    budget = seen["status"]["budget"]
    assert budget["budget_usd"] == 3 and budget["topped_up_usd"] == 2 and budget["stopped"] is None
    assert seen["report"]["budget"]["topped_up_usd"] == 2
    assert "budget top-up +$2 (to $3) decided by the person (elicitation)" in seen["report"]["text"]
    runs, exps = ledger_state(ws)
    (run,) = runs
    assert run.budgets["budget_usd"] == 3
    (entry,) = run.budgets["top_ups"]
    assert entry["usd"] == 2 and entry["by"] == "person" and entry["via"] == "elicitation"
    with Ledger(ws / "experiments" / "ledger.sqlite") as led:
        assert led.get_experiment(kept["experiment"]).decided_by == "person"
    # The candidate was paid from the top-up: more than the $1 the session started with, within $3.
    assert 1 < sum(e.cost_usd for e in exps[run.id]) <= 3 + 1e-9
    assert_clean(ws)


@pytest.mark.slow
def test_no_tool_argument_bad_amount_or_declined_form_tops_the_budget_up(ws: Path, tmp_path: Path) -> None:
    good = library_text(ws, GOOD_ENTRY)
    replies: list[types.ElicitResult] = [
        types.ElicitResult(action="accept", content={AMOUNT: -5}),  # the first propose runs as today
        types.ElicitResult(action="accept", content={AMOUNT: 1e9}),  # over the cap
        types.ElicitResult(action="accept", content={AMOUNT: 2, "budget_usd": 1000}),  # another key
        types.ElicitResult(action="accept", content={AMOUNT: "5"}),  # not a number
        types.ElicitResult(action="decline"),
        types.ElicitResult(action="cancel"),  # a non-blocking propose: refused before its handle
    ]
    asked: list[str] = []
    seen: dict[str, Any] = {"refused": []}

    async def person(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        asked.append(params.message)
        return replies.pop(0)

    async def body() -> None:
        async with judged_session(ws, tmp_path, budget="1", elicitation=person) as session:
            data(await call(session, "disagreements"))
            # The agent cannot top itself up: a budget argument is outside propose's schema.
            seen["argument"] = await call(
                session,
                "propose",
                files={RUBRIC_MD: rubric_with(ws, good)},
                rationale="More money.",
                budget_usd=1000,
            )
            seen["asked_after_argument"] = len(asked)
            seen["first"] = data(
                await call(session, "propose", files={RUBRIC_MD: rubric_with(ws, good)}, rationale="x")
            )
            for n in range(5):
                seen["refused"].append(
                    await call(
                        session,
                        "propose",
                        files={RUBRIC_MD: rubric_with(ws, good + f" Rule {n}.")},
                        rationale=f"try {n}",
                        wait=n < 4,
                    )
                )
            seen["status"] = data(await call(session, "status"))

    drive(body)
    assert seen["argument"].is_error and "budget_usd" in text(seen["argument"])
    assert seen["asked_after_argument"] == 0  # refused before anyone was asked
    assert not replies and len(asked) == 6
    # A refused amount leaves the budget as it was: the candidate runs into it, not decided.
    assert seen["first"]["outcome"] == "error" and "budget" in seen["first"]["reason"]
    for out in seen["refused"]:
        assert out.is_error and REFUSED in text(out), text(out)
    budget = seen["status"]["budget"]
    assert budget["budget_usd"] == 1 and budget["topped_up_usd"] == 0 and budget["stopped"] is not None
    runs, _ = ledger_state(ws)
    assert runs[0].budgets["budget_usd"] == 1 and "top_ups" not in runs[0].budgets
    log = (tmp_path / "err.log").read_text(encoding="utf-8")
    assert "the top-up is refused: add_usd must be a positive finite number" in log
    assert "over the cap" in log and "other keys than add_usd (budget_usd)" in log
    assert "the person did not add to it (decline)" in log
    assert_clean(ws)


@pytest.mark.parametrize(
    ("action", "content", "why"),
    [
        ("accept", {AMOUNT: -1}, "positive finite"),
        ("accept", {AMOUNT: 0}, "positive finite"),
        ("accept", {AMOUNT: math.nan}, "positive finite"),
        ("accept", {AMOUNT: math.inf}, "positive finite"),
        ("accept", {AMOUNT: 10.01}, "over the cap"),
        ("accept", {AMOUNT: True}, "must be a number"),
        ("accept", {AMOUNT: None}, "must be a number"),
        ("accept", {}, "must be a number"),
        ("accept", {AMOUNT: 1, "decision": "keep"}, "other keys"),
        ("decline", {AMOUNT: 5}, None),
        ("cancel", None, None),
    ],
)
def test_a_form_answer_adds_only_a_positive_finite_amount_within_the_cap(
    action: str, content: dict[str, Any] | None, why: str | None
) -> None:
    got = accepted_amount(action, content, 10.0)
    if why is None:
        assert got is None
    else:
        assert isinstance(got, str) and why in got, got


def test_a_form_answer_within_the_cap_is_taken_and_the_form_says_the_cap() -> None:
    assert accepted_amount("accept", {AMOUNT: 10}, 10.0) == 10.0
    assert accepted_amount("accept", {AMOUNT: 0.25}, 10.0) == 0.25
    schema = form(7.5)
    assert schema["required"] == [AMOUNT] and schema["properties"][AMOUNT]["maximum"] == 7.5
    assert "at most 7.5" in schema["properties"][AMOUNT]["description"]
