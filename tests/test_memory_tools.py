"""The memory tools (add_case, edit_case, retire_case, edit_principles) of the agent, and what they refuse."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from optimizer.judge.memory import CASES_JSONL, MAX_CASE_TEXT_CHARS, PRINCIPLES_MD, parse_cases
from optimizer.loop.strategies import ProposalError
from optimizer.loop.strategies.agent import AgentStrategy
from optimizer.loop.strategies.reflect import ReflectStrategy
from optimizer.loop.strategies.tools import ToolState, run_tool, tool_specs
from optimizer.workspace.config import OptimizerSection, Price
from tests.support.fakeserver import FakeLLMServer, ToolCall, Usage, reply
from tests.support.strategies import ALLOWED, DevFixture, disagreements_for, make_context, make_dev

MEMORY_ALLOWED = [*ALLOWED, PRINCIPLES_MD, CASES_JSONL]
MEMORY_TOOLS = {"add_case", "edit_case", "retire_case", "edit_principles"}


@pytest.fixture(scope="module")
def dev(tmp_path_factory: pytest.TempPathFactory) -> DevFixture:
    """One read-only dev workspace (the tools never write files)."""
    return make_dev(tmp_path_factory.mktemp("memtools"))


def _state(dev: DevFixture, allowed: list[str] | None = None, cases: str | None = None) -> ToolState:
    ctx = make_context(dev, disagreements_for(dev.items, missed=2, rejected=1))
    ctx.allowed_files = list(MEMORY_ALLOWED if allowed is None else allowed)
    if cases is not None:
        ctx.current_files[CASES_JSONL] = cases
    return ToolState(ctx)


def _call(state: ToolState, name: str, **args: Any) -> tuple[bool, str]:
    out = run_tool(state, name, args)
    return out.is_error, out.text


def test_memory_tools_edit_the_memory_in_memory_only(dev: DevFixture) -> None:
    state = _state(dev)
    a, b = dev.items[0].trajectory_id, dev.items[2].trajectory_id
    err, text = _call(
        state, "add_case", text="Saving as PDF was required; a DOCX file is a failure.", source_items=[a, b]
    )
    assert not err, text
    (case,) = parse_cases(state.files[CASES_JSONL])
    assert case.source_items == (a, b) and case.id in text
    assert a not in case.id and b not in case.id  # the id is a digest, not an item's id
    err, text = _call(state, "add_case", id="near-miss", text="A close value is wrong.", source_items=[a])
    assert not err, text
    err, text = _call(state, "edit_case", id="near-miss", text="A close but different value is a failure.")
    assert not err, text
    assert parse_cases(state.files[CASES_JSONL])[1].text == "A close but different value is a failure."
    err, text = _call(state, "retire_case", id=case.id)
    assert not err, text
    assert [c.id for c in parse_cases(state.files[CASES_JSONL])] == ["near-miss"]
    err, text = _call(state, "edit_principles", text="# Principles\n\n- Check each requirement on its own.")
    assert not err, text
    assert state.files[PRINCIPLES_MD] == "# Principles\n\n- Check each requirement on its own.\n"
    assert set(state.changed_files()) == {CASES_JSONL, PRINCIPLES_MD}
    assert state.errors == 0
    assert not (dev.ws.root / "prompts" / "memory").exists()  # never on disk


def test_memory_tools_are_offered_only_when_the_memory_is_allowed() -> None:
    assert {t.name for t in tool_specs(MEMORY_ALLOWED)} >= MEMORY_TOOLS
    assert not MEMORY_TOOLS & {t.name for t in tool_specs(ALLOWED)}


def _heldout_case(dev: DevFixture) -> str:
    return json.dumps({"id": "c1", "text": "x", "source_items": [dev.heldout[0].trajectory_id]}) + "\n"


HOSTILE: list[tuple[str, Any]] = [
    (
        "held-out source item",
        lambda d: (
            "add_case",
            {"text": "t", "source_items": [d.heldout[0].trajectory_id]},
            "is not an item of the dev split",
        ),
    ),
    ("no source items", lambda d: ("add_case", {"text": "t", "source_items": []}, "names no source_items")),
    (
        "source items not a list",
        lambda d: ("add_case", {"text": "t", "source_items": d.items[0].trajectory_id}, "must be a list"),
    ),
    (
        "a path as a source item",
        lambda d: (
            "add_case",
            {"text": "t", "source_items": ["../../devset/dev/labels.jsonl"]},
            "is not a trajectory id",
        ),
    ),
    (
        "a path as a case id",
        lambda d: (
            "add_case",
            {"id": "../../judgeloop.toml", "text": "t", "source_items": [d.items[0].trajectory_id]},
            "not a safe id",
        ),
    ),
    (
        "oversize case",
        lambda d: (
            "add_case",
            {"text": "x" * (MAX_CASE_TEXT_CHARS + 1), "source_items": [d.items[0].trajectory_id]},
            "more than 2000",
        ),
    ),
    (
        "a path trick to the labels",
        lambda _d: (
            "write_file",
            {"path": "prompts/memory/../../devset/dev/labels.jsonl", "text": "{}"},
            "is not an allowed file",
        ),
    ),
    (
        "write_file around add_case",
        lambda d: (
            "write_file",
            {"path": CASES_JSONL, "text": _heldout_case(d)},
            "is not an item of the dev split",
        ),
    ),
    (
        "write_file with a broken line",
        lambda _d: ("write_file", {"path": CASES_JSONL, "text": "{not json\n"}, "not one JSON object"),
    ),
    (
        "an id in the principles",
        lambda d: ("edit_principles", {"text": f"- {d.items[2].trajectory_id} is a failure."}, "dev id"),
    ),
    (
        "an instruction in the principles",
        lambda d: (
            "edit_principles",
            {"text": f"- {d.items[2].instruction} is a failure."},
            "copies 8 words from a dev instruction",
        ),
    ),
    ("retire an unknown case", lambda _d: ("retire_case", {"id": "nope"}, "there is no case 'nope'")),
]


@pytest.mark.parametrize("make", [h[1] for h in HOSTILE], ids=[h[0] for h in HOSTILE])
def test_memory_tools_refuse_and_leave_the_files_untouched(dev: DevFixture, make: Any) -> None:
    name, args, message = make(dev)
    state = _state(dev)
    before = dict(state.files)
    err, text = _call(state, name, **args)
    assert err and message in text, text
    assert state.files == before and state.errors == 1
    assert not (dev.ws.root / "prompts" / "memory").exists()


def test_a_case_copied_into_the_principles_is_refused(dev: DevFixture) -> None:
    """Editing a case to state a dev item's verdict, then copying it into the principles (which reach every
    fold, the case's own included): the copy is refused, the principles stay as they were."""
    neg = dev.items[2]
    verdict = "The recording that saved a DOCX file instead of the requested format was labelled a failure."
    state = _state(
        dev, cases=json.dumps({"id": "k1", "text": "old", "source_items": [neg.trajectory_id]}) + "\n"
    )
    err, text = _call(state, "edit_case", id="k1", text=verdict)
    assert not err, text
    before = dict(state.files)
    err, text = _call(state, "edit_principles", text=f"# Rules\n\n- {verdict}")
    assert err and "would copy" in text and "case k1" in text, text
    assert state.files == before


def test_a_retired_case_pasted_into_the_principles_or_the_rubric_is_refused(dev: DevFixture) -> None:
    """Retiring a case does not free its words: the principles and the rubric, sent with every item, may not
    copy a case of the incumbent's memory either."""
    verdict = "The recording that saved a DOCX file instead of the requested format was labelled a failure."
    state = _state(
        dev,
        cases=json.dumps({"id": "k1", "text": verdict, "source_items": [dev.items[2].trajectory_id]}) + "\n",
    )
    err, text = _call(state, "retire_case", id="k1")
    assert not err, text
    before = dict(state.files)
    err, text = _call(state, "edit_principles", text=f"- {verdict}")
    assert err and "prompts/memory/principles.md would copy" in text and "case k1" in text, text
    rubric = state.files["prompts/rubric.md"]
    err, text = _call(state, "write_file", path="prompts/rubric.md", text=rubric + f"\n- {verdict}\n")
    assert err and "prompts/rubric.md would copy" in text, text
    assert state.files == before


def test_edit_file_cannot_swap_a_source_for_a_heldout_item(dev: DevFixture) -> None:
    tid = dev.items[0].trajectory_id
    state = _state(dev, cases=json.dumps({"id": "k1", "text": "t", "source_items": [tid]}) + "\n")
    err, text = _call(state, "edit_file", path=CASES_JSONL, old=tid, new=dev.heldout[0].trajectory_id)
    assert err and "is not an item of the dev split" in text, text
    assert state.files[CASES_JSONL] == state.ctx.current_files[CASES_JSONL]


def test_memory_tools_refused_when_the_memory_is_not_allowed(dev: DevFixture) -> None:
    state = _state(dev, allowed=ALLOWED)
    err, text = _call(state, "add_case", text="t", source_items=[dev.items[0].trajectory_id])
    assert err and f"{CASES_JSONL} is not an allowed file" in text, text
    assert CASES_JSONL not in state.files


def test_agent_adds_a_case_through_the_sdk(dev: DevFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    """A real tool-using conversation (Anthropic wire): a refused held-out case, then a dev case and submit."""
    monkeypatch.setenv("ANTHROPIC_API_KEY", "test-key")
    ctx = make_context(dev, disagreements_for(dev.items, missed=2, rejected=1))
    ctx.allowed_files = list(MEMORY_ALLOWED)
    neg = dev.items[2].trajectory_id
    with FakeLLMServer() as server:
        server.script(
            reply(
                tool_calls=[
                    ToolCall(
                        "add_case", {"text": "t", "source_items": [dev.heldout[0].trajectory_id]}, id="t1"
                    )
                ],
                usage=Usage(100, 10),
            ),
            reply(
                tool_calls=[
                    ToolCall(
                        "add_case",
                        {"text": "Requested PDF; a DOCX is a failure.", "source_items": [neg]},
                        id="t2",
                    )
                ],
                usage=Usage(100, 10),
            ),
            reply(
                tool_calls=[ToolCall("submit", {"rationale": "A case for format mix-ups."}, id="t3")],
                usage=Usage(100, 10),
            ),
        )
        cfg = OptimizerSection(
            strategy="agent", provider="anthropic", model="m", base_url=server.anthropic_base_url
        )
        proposal = asyncio.run(AgentStrategy(cfg, {"m": Price(input=1.0, output=1.0)}).propose(ctx))
        first = server.inference_requests()[0].body
        offered = {t["name"] for t in first["tools"]}
    assert "source_items are the one place dev trajectory ids belong" in json.dumps(first["messages"][0])
    assert offered >= MEMORY_TOOLS
    assert set(proposal.files) == {CASES_JSONL} and proposal.tool_errors == 1
    (case,) = parse_cases(proposal.files[CASES_JSONL])
    assert case.source_items == (neg,)


def _reflect(dev: DevFixture, reply_text: str, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, str]:
    """One reflect call answered with ``reply_text``: (the proposal or the ProposalError, the request's text)."""
    monkeypatch.setenv("ANTHROPIC_API_KEY", "test-key")
    ctx = make_context(dev, disagreements_for(dev.items, missed=2, rejected=1))
    ctx.allowed_files = list(MEMORY_ALLOWED)
    with FakeLLMServer() as server:
        server.script(reply(reply_text))
        cfg = OptimizerSection(provider="anthropic", model="m", base_url=server.anthropic_base_url)
        try:
            outcome: Any = asyncio.run(ReflectStrategy(cfg, {}).propose(ctx))
        except ProposalError as exc:
            outcome = exc
        (request,) = server.inference_requests()
    return outcome, request.body["system"][0]["text"] + request.body["messages"][0]["content"][0]["text"]


def test_reflect_writes_a_case_through_the_memory_tools(
    dev: DevFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    neg = dev.items[2].trajectory_id
    answer = json.dumps(
        {
            "memory": [
                {
                    "tool": "add_case",
                    "arguments": {
                        "text": "PDF was required; a DOCX export is a failure.",
                        "source_items": [neg],
                    },
                }
            ],
            "rationale": "Remember format mix-ups.",
        }
    )
    proposal, request = _reflect(dev, answer, monkeypatch)
    assert '"memory"' in request and f"trajectory id (for source_items): {neg}" in request
    assert set(proposal.files) == {CASES_JSONL}
    assert parse_cases(proposal.files[CASES_JSONL])[0].source_items == (neg,)


def test_reflect_memory_edit_naming_a_heldout_item_is_refused(
    dev: DevFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    answer = json.dumps(
        {
            "memory": [
                {
                    "tool": "add_case",
                    "arguments": {"text": "t", "source_items": [dev.heldout[0].trajectory_id]},
                }
            ],
            "rationale": "r",
        }
    )
    error, _ = _reflect(dev, answer, monkeypatch)
    assert isinstance(error, ProposalError)
    assert (
        "memory edit 1 (add_case) was refused" in error.reason
        and "not an item of the dev split" in error.reason
    )
    other, _ = _reflect(
        dev, json.dumps({"memory": [{"tool": "write_file", "arguments": {}}], "rationale": "r"}), monkeypatch
    )
    assert isinstance(other, ProposalError) and "names tool 'write_file'" in other.reason
