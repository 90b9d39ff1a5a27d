"""The keep question by elicitation (form mode), through the MCP SDK client's elicitation callback: a
``propose_only`` candidate is decided by the person's answer; a keep against the policy is not taken from a
form (it still waits); a client without the capability is never asked (tests/test_mcp.py: it waits).

Every server is a child of `stdio_client`, which closes its stdin and kills it at the end of the
``async with``; every call is bounded by `anyio.fail_after`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from mcp import types

from optimizer.judge.prompts import RUBRIC_MD
from optimizer.ledger import Ledger
from tests.support.loop import BAD_ENTRY, GOOD_ENTRY
from tests.support.mcp_client import call, conforms, data, drive, judged_session
from tests.support.mcp_workspace import ledger_state, library_text, make_mcp_template, rubric_with
from tests.support.scripted import assert_clean


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_mcp_template(tmp_path_factory.mktemp("template"))


@pytest.mark.slow
def test_the_keep_question_goes_to_the_person_by_elicitation_and_a_form_never_overrules_the_policy(
    ws: Path, tmp_path: Path
) -> None:
    good, bad = library_text(ws, GOOD_ENTRY), library_text(ws, BAD_ENTRY)
    asked: list[types.ElicitRequestParams] = []
    answers = ["keep", "keep"]
    seen: dict[str, Any] = {}

    async def person(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        asked.append(params)
        return types.ElicitResult(action="accept", content={"decision": answers.pop(0)})

    async def body() -> None:
        async with judged_session(ws, tmp_path, elicitation=person) as session:
            tools = {t.name: t for t in (await session.list_tools()).tools}
            data(await call(session, "disagreements"))
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
            seen["against"] = conforms(
                tools["propose"],
                await call(
                    session,
                    "propose",
                    files={RUBRIC_MD: rubric_with(ws, bad)},
                    rationale="Accept saved work when it was confirmed.",
                    propose_only=True,
                ),
            )
            seen["discarded"] = data(
                await call(session, "decide", experiment=seen["against"]["experiment"], decision="discard")
            )

    drive(body)
    assert len(asked) == 2 and not answers
    first = asked[0]
    assert isinstance(first, types.ElicitRequestFormParams)
    assert f"experiment {seen['kept']['experiment']}" in first.message and "kappa" in first.message
    assert first.requested_schema["properties"]["decision"]["enum"] == ["keep", "discard"]
    kept, against = seen["kept"], seen["against"]
    assert kept["outcome"] == "kept" and "decided by the person" in kept["meaning"]
    # The policy rolls the second back: a form's keep is not a person's overrule; it waited for decide.
    assert against["outcome"] == "waiting" and "only a person overrules" in against["meaning"]
    assert seen["discarded"]["outcome"] == "rolled_back"
    runs, _ = ledger_state(ws)
    with Ledger(ws / "experiments" / "ledger.sqlite") as led:
        decided = led.get_experiment(kept["experiment"])
        discarded = led.get_experiment(against["experiment"])
    assert decided.status == "kept" and decided.decided_by == "person" and decided.overrule is None
    assert discarded.decided_by == "mcp" and runs[0].status == "finished"
    assert good in (ws / RUBRIC_MD).read_text(encoding="utf-8")
    assert bad not in (ws / RUBRIC_MD).read_text(encoding="utf-8")
    assert_clean(ws)
