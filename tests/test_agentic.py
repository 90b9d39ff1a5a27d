"""The agentic judge mode: a tool-using conversation per verdict, through the real SDKs.

A fake judge on the fake server reads the conversation it is sent (either wire format), asks for
steps and screenshots, then submits the verdict the item's label calls for. The tests check what
goes over the wire (tools, tool results, screenshots inside them), the turn-level cache (a second
evaluation sends nothing; an evaluation cut mid-conversation re-sends only the unanswered turn),
the turn limit, refused tool calls, the budget, and the one-line refusal of a provider without tools.
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from optimizer.cli import main
from optimizer.devset.labels import load_labels
from optimizer.errors import UserError
from optimizer.evaluation.budget import Budget
from optimizer.evaluation.evaluator import PassOptions, evaluate_items
from optimizer.evaluation.files import write_results
from optimizer.evaluation.results import EvalRun
from optimizer.judge.prompts import PromptSet, parse_settings
from optimizer.judge.types import JudgeToolCall
from optimizer.stats.metrics import score
from tests.support.evaluation import MODEL, SECRET, Data, InTestProvider, judge, make_data, write_config
from tests.support.fakeserver import FakeLLMServer, RecordedRequest, ToolCall, Usage, reply, server_error


def set_agentic(data: Data, *, turns: int = 6, screens: int = 24) -> None:
    path = data.ws.prompts_dir / "judge.toml"
    text = path.read_text()
    for old, new in [
        ('mode = "direct"', 'mode = "agentic"'),
        ("agent_max_turns = 12", f"agent_max_turns = {turns}"),
        ("agent_max_screenshots = 24", f"agent_max_screenshots = {screens}"),
    ]:
        assert f"\n{old}\n" in text
        text = text.replace(f"\n{old}\n", f"\n{new}\n")
    path.write_text(text)
    data.prompts = PromptSet.from_dir(data.ws.prompts_dir)
    assert data.prompts.settings.mode == "agentic"


@pytest.fixture
def data(tmp_path: Path) -> Data:
    d = make_data(tmp_path)
    set_agentic(d)
    return d


@pytest.fixture
def server() -> Any:
    with FakeLLMServer() as srv:
        yield srv


# --------------------------------------------------------------------------- reading a conversation


class Seen:
    """What one recorded request holds, in either wire format."""

    def __init__(self, recorded: RecordedRequest) -> None:
        body = recorded.body
        self.wire = recorded.wire
        self.messages: list[dict[str, Any]] = body["messages"]
        if self.wire == "openai":
            self.tools = [t["function"]["name"] for t in body.get("tools", [])]
        else:
            self.tools = [t["name"] for t in body.get("tools", [])]
        self.turns = sum(1 for m in self.messages if m["role"] == "assistant")

    def tool_texts(self) -> list[str]:
        """The text of every tool answer in the conversation, in order."""
        out: list[str] = []
        for m in self.messages:
            if self.wire == "openai" and m["role"] == "tool":
                out.append(m["content"])
            if self.wire == "anthropic" and m["role"] == "user" and isinstance(m["content"], list):
                for block in m["content"]:
                    if block.get("type") == "tool_result":
                        out.append("\n".join(b["text"] for b in block["content"] if b["type"] == "text"))
        return out

    def images(self) -> list[bytes]:
        """Every image sent in the conversation (decoded bytes)."""
        out: list[bytes] = []
        for m in self.messages:
            content = m.get("content")
            if not isinstance(content, list):
                continue
            for block in content:
                blocks = block.get("content", []) if block.get("type") == "tool_result" else [block]
                for b in blocks:
                    if b.get("type") == "image_url":
                        out.append(base64.b64decode(b["image_url"]["url"].split(",", 1)[1]))
                    elif b.get("type") == "image":
                        out.append(base64.b64decode(b["source"]["data"]))
        return out


def investigating_judge(data: Data, *, last_step: int = 2) -> Callable[[RecordedRequest], Any]:
    """Turn 1: read every step and view the first and last screenshots; turn 2: the right verdict."""
    usage = Usage(input_tokens=1000, output_tokens=50)

    def behave(recorded: RecordedRequest) -> Any:
        seen = Seen(recorded)
        item = data.item_of(json.dumps(recorded.body["messages"][:2]))
        if seen.turns == 0:
            return reply(
                "Let me look.",
                usage=usage,
                tool_calls=[
                    ToolCall("read_steps", {"first": 0, "last": last_step}),
                    ToolCall("view_screenshots", {"steps": [0, last_step]}),
                ],
            )
        ok = item.label == "positive"
        return reply(
            None,
            usage=usage,
            tool_calls=[
                ToolCall(
                    "submit_verdict",
                    {
                        "success": ok,
                        "reasoning": "checked the steps",
                        "confidence": "high",
                        "mistake_type": None if ok else item.mistake_type,
                    },
                )
            ],
        )

    return behave


def evaluate(data: Data, server: FakeLLMServer, wire: str = "openai", **kwargs: Any) -> EvalRun:
    j = judge(
        base_url=server.openai_base_url if wire == "openai" else server.anthropic_base_url,
        provider=wire,
        max_retries=0,
        timeout_s=10,
    )
    return asyncio.run(
        evaluate_items(
            data.ws,
            data.split,
            data.prompts,
            j,
            item_ids=data.split.ids,
            replicates=kwargs.pop("replicates", 1),
            options=PassOptions(**kwargs),
        )
    )


# --------------------------------------------------------------------------- end to end


@pytest.mark.parametrize("wire", ["openai", "anthropic"])
def test_a_conversation_per_verdict_through_the_sdk_then_fully_cached(
    data: Data, server: FakeLLMServer, wire: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    monkeypatch.setenv("ANTHROPIC_API_KEY", SECRET)
    server.default = investigating_judge(data)
    run = evaluate(data, server, wire)
    n = len(data.items)
    requests = server.inference_requests()
    assert len(requests) == 2 * n and run.calls_made == 2 * n
    metrics = score(load_labels(data.split), run.answers())
    assert metrics.kappa == 1.0 and metrics.invalid == 0

    follow_up = next(r for r in requests if Seen(r).turns == 1)  # calls of several items interleave
    first, second = Seen(requests[0]), Seen(follow_up)
    assert first.tools == ["read_steps", "view_screenshots", "submit_verdict"] and first.turns == 0
    assert first.images() == []  # nothing is shown up front: the opening is the goal and the action index
    assert "- Step 2: `" in json.dumps(requests[0].body)
    assert second.turns == 1
    step_text, screens_text = second.tool_texts()
    assert "### Step 0" in step_text and "### Step 2" in step_text
    assert "Step 0, the screen just before its action" in screens_text
    images = second.images()
    assert len(images) == 2 and all(img[:2] == b"\xff\xd8" for img in images)  # two JPEGs, in the tool answer

    if wire == "anthropic":
        body = follow_up.body
        assert body["tools"][2]["input_schema"]["required"] == [
            "success",
            "reasoning",
            "confidence",
            "mistake_type",
        ]
        results = body["messages"][-1]["content"]
        assert [b["type"] for b in results] == ["tool_result", "tool_result"]
        assert (
            results[0]["tool_use_id"] == body["messages"][1]["content"][1]["id"]
        )  # answers the call it names
        assert [b["type"] for b in results[1]["content"]] == ["text", "image", "text", "image"]
        assert results[-1].get("cache_control") == {"type": "ephemeral"}  # later turns re-read it cheaply
        # The bundled layout (trajectory-first): a fixed system prompt, then the action index, both
        # cached for an hour; the instructions after the index; the conversation's tail for 5 minutes.
        assert body["system"][0]["cache_control"] == {"type": "ephemeral", "ttl": "1h"}
        opening = body["messages"][0]["content"]
        assert (
            opening[0]["cache_control"] == {"type": "ephemeral", "ttl": "1h"}
            and "- Step 2: `" in opening[0]["text"]
        )
        assert "cache_control" not in opening[1] and "# Output contract" in opening[1]["text"]
    else:
        body = follow_up.body
        roles = [m["role"] for m in body["messages"]]
        assert roles == ["system", "user", "assistant", "tool", "tool", "user"]
        call_ids = [c["id"] for c in body["messages"][2]["tool_calls"]]
        assert [m["tool_call_id"] for m in body["messages"][3:5]] == call_ids
        assert "response_format" not in body

    assert (
        "agentic judge: 2.0 model calls per verdict; tool calls per verdict: read_steps 1.0, submit_verdict 1.0, "
        "view_screenshots 1.0" in run.notes
    )
    out = write_results(tmp_path / "out", run)
    one = json.loads((out / f"{data.items[0].trajectory_id}.json").read_text())
    rep = one["_meta"]["replicates"][0]
    assert rep["turns"] == 2
    assert rep["tool_calls"] == ["read_steps(0-2)", "view_screenshots(0, 2)", "submit_verdict"]

    # Again: every turn of every conversation comes from the cache; not one request.
    before = len(server.requests)
    again = evaluate(data, server, wire)
    assert len(server.requests) == before
    assert again.calls_made == 0 and again.cache_hits == n
    assert again.answers() == run.answers()
    for path in [*out.iterdir(), *data.ws.experiments_dir.rglob("*")]:
        if path.is_file():
            assert SECRET.encode() not in path.read_bytes(), path


def test_an_outage_mid_conversation_re_sends_only_the_unanswered_turn(
    data: Data, server: FakeLLMServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    victim = data.items[1].trajectory_id
    judge_ok = investigating_judge(data)

    def flaky(recorded: RecordedRequest) -> Any:
        item = data.item_of(json.dumps(recorded.body["messages"][:2]))
        if item.trajectory_id == victim and Seen(recorded).turns == 1:
            return server_error(503)
        return judge_ok(recorded)

    server.default = flaky
    run = evaluate(data, server)
    assert run.infra_error_ids == [victim]
    assert run.calls_made == 2 * len(data.items) - 1  # the victim's failed second turn was not answered

    server.default = judge_ok
    before = len(server.inference_requests())
    again = evaluate(data, server)
    resent = server.inference_requests()[before:]
    assert len(resent) == 1 and Seen(resent[0]).turns == 1  # its first turn came from the cache
    assert again.infra_error_ids == [] and again.calls_made == 1
    assert score(load_labels(data.split), again.answers()).kappa == 1.0


def test_the_last_turn_offers_only_submit_and_no_verdict_is_a_parse_failure(
    tmp_path: Path, server: FakeLLMServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    data = make_data(tmp_path, n_pairs=1)
    set_agentic(data, turns=3)
    server.default = lambda r: reply(None, tool_calls=[ToolCall("read_steps", {"first": 0, "last": 0})])
    run = evaluate(data, server)
    n = len(data.items)
    requests = server.inference_requests()
    assert len(requests) == 3 * n
    last = [Seen(r) for r in requests if Seen(r).turns == 2]
    assert len(last) == n and all(s.tools == ["submit_verdict"] for s in last)
    assert "This is your last turn" in last[0].tool_texts()[-1]
    assert all(a.status == "invalid" for a in run.answers().values())
    assert run.items[0].replicates[0].parse_error == "no verdict after 3 model calls (agent_max_turns)"
    assert score(load_labels(data.split), run.answers()).invalid == n  # counted wrong


def test_refused_tool_calls_are_answered_and_the_conversation_goes_on(
    tmp_path: Path, server: FakeLLMServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    data = make_data(tmp_path, n_pairs=1)
    set_agentic(data, screens=1)
    bad_args = {
        "id": "call_bad",
        "type": "function",
        "function": {"name": "read_steps", "arguments": "{not json"},
    }
    script = iter(
        [
            reply(None, message={"content": None, "tool_calls": [bad_args]}),
            reply(
                None,
                tool_calls=[
                    ToolCall("read_steps", {"first": 7, "last": 9}),
                    ToolCall("delete_everything", {}),
                    ToolCall("view_screenshots", {"steps": [0, 1]}),
                ],
            ),
            reply(
                json.dumps({"success": False, "reasoning": "r", "confidence": "low", "mistake_type": None})
            ),
        ]
    )
    server.default = lambda r: next(script) if Seen(r).turns < 3 else reply("unused")
    j = judge(base_url=server.openai_base_url, max_retries=0, timeout_s=10)
    item = data.split.ids[0]
    run = asyncio.run(evaluate_items(data.ws, data.split, data.prompts, j, item_ids=[item], replicates=1))
    requests = server.inference_requests()
    assert len(requests) == 3
    texts = Seen(requests[2]).tool_texts()
    assert texts[0] == "error: the arguments are not a JSON object"
    assert texts[1].startswith("error: steps are numbered 0..2")
    assert texts[2].startswith("error: no tool named 'delete_everything'")
    assert "step 1: not shown, the limit of 1 screenshots is reached" in texts[3]
    assert len(Seen(requests[2]).images()) == 1
    # A plain-text JSON answer without tool calls is the verdict, parsed strictly.
    assert run.answers()[item].success is False
    trace = run.items[0].replicates[0].trace
    assert trace == (
        JudgeToolCall("read_steps", None, "refused"),  # its arguments were not JSON
        JudgeToolCall("read_steps", {"first": 7, "last": 9}, "refused"),
        JudgeToolCall("delete_everything", {}, "refused"),
        JudgeToolCall("view_screenshots", {"steps": [0, 1]}),
        JudgeToolCall(None),
    )
    assert [str(c) for c in trace] == [
        "read_steps(…) (refused)",
        "read_steps(7-9) (refused)",
        "delete_everything(…) (refused)",
        "view_screenshots(0, 1)",
        "text answer",
    ]


def test_an_invalid_verdict_is_sent_back_while_turns_remain(
    tmp_path: Path, server: FakeLLMServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    data = make_data(tmp_path, n_pairs=1)
    set_agentic(data, turns=2)
    bad = {"success": "yes", "reasoning": "r", "confidence": "high", "mistake_type": None}
    good = {"success": True, "reasoning": "r", "confidence": "high", "mistake_type": None}
    script = iter(
        [
            reply(None, tool_calls=[ToolCall("submit_verdict", bad)]),
            reply(None, tool_calls=[ToolCall("submit_verdict", good)]),
            reply(None, tool_calls=[ToolCall("submit_verdict", bad)]),
            reply(None, tool_calls=[ToolCall("submit_verdict", bad)]),
        ]
    )
    server.default = lambda r: next(script)
    j = judge(base_url=server.openai_base_url, max_retries=0, timeout_s=10, max_concurrency=1)
    first, second = data.split.ids[:2]
    run = asyncio.run(
        evaluate_items(data.ws, data.split, data.prompts, j, item_ids=[first, second], replicates=1)
    )
    requests = server.inference_requests()
    assert len(requests) == 4
    assert Seen(requests[1]).tool_texts()[0].startswith("error: the verdict is not valid (")
    assert run.answers()[first].success is True  # corrected on its second turn
    assert run.items[0].replicates[0].trace == (
        JudgeToolCall("submit_verdict", outcome="invalid"),
        JudgeToolCall("submit_verdict"),
    )
    assert [str(c) for c in run.items[0].replicates[0].trace] == [
        "submit_verdict (invalid)",
        "submit_verdict",
    ]
    assert run.answers()[second].status == "invalid"  # still invalid on its last turn: a parse failure
    assert [str(c) for c in run.items[1].replicates[0].trace] == ["submit_verdict (invalid)"] * 2


def test_the_budget_is_checked_before_every_turn(
    data: Data, server: FakeLLMServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    server.default = investigating_judge(data)
    from optimizer.evaluation.budget import call_cost_usd
    from optimizer.judge.agentic import AgenticTask, ConversationState
    from optimizer.judge.types import ProviderReply

    task = AgenticTask(data.split.trajectory(data.split.ids[0]), data.split, data.prompts)
    guess = ProviderReply(
        text="",
        model=MODEL,
        input_tokens=task.estimate_input_tokens(ConversationState(task)),
        output_tokens=data.prompts.settings.max_tokens,
    )
    first_turn = call_cost_usd(guess, dict(data.ws.config.prices))
    assert first_turn > 0  # gpt-4o-mini is in the built-in price table
    budget = Budget(max_usd=2.5 * first_turn)  # room for a few turns, far from all 2n of them
    run = evaluate(data, server, budget=budget)
    assert run.stopped_early and "budget" in (run.stop_reason or "")
    assert budget.spent_usd <= budget.max_usd
    assert 0 < run.calls_made < 2 * len(data.items)


def test_a_provider_without_tools_is_refused_in_one_line(data: Data) -> None:
    provider = InTestProvider(lambda request: "{}")
    with pytest.raises(UserError, match='supports mode = "direct" only'):
        asyncio.run(
            evaluate_items(
                data.ws,
                data.split,
                data.prompts,
                judge(),
                item_ids=data.split.ids,
                replicates=1,
                options=PassOptions(provider=provider),
            )
        )
    assert provider.calls == []


def test_cmd_eval_runs_the_agentic_judge(
    data: Data, server: FakeLLMServer, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    server.default = investigating_judge(data)
    write_config(data.ws, server)
    code = main(["eval", "-w", str(data.ws.root), "--base-url", server.openai_base_url, "--json"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert json.loads(captured.out)["kappa"] == 1.0


def test_settings_know_both_modes_and_say_how_screenshots_arrive() -> None:
    agentic = parse_settings('mode = "agentic"\nagent_max_screenshots = 10\n', "judge.toml")
    assert (
        "view_screenshots" in agentic.screenshot_sentence() and "at most 10" in agentic.screenshot_sentence()
    )
    none = parse_settings('mode = "agentic"\nscreenshots = "none"\n', "judge.toml")
    assert "No screenshots are available" in none.screenshot_sentence()
    with pytest.raises(UserError, match="mode"):
        parse_settings('mode = "tools"\n', "judge.toml")


def test_the_loop_runs_with_an_agentic_judge(
    data: Data, server: FakeLLMServer, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from optimizer.ledger import Ledger
    from optimizer.workspace import gitops
    from tests.support.loop import commit_all

    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    server.default = investigating_judge(data)
    write_config(data.ws, server)
    commit_all(data.ws.root, "agentic judge on the tiny split")
    code = main(
        [
            "run",
            "-w",
            str(data.ws.root),
            "--base-url",
            server.openai_base_url,
            "--strategy",
            "library",
            "--max-experiments",
            "1",
        ]
    )
    assert code == 0, capsys.readouterr().err
    with Ledger(data.ws.experiments_dir / "ledger.sqlite") as led:
        run = led.latest_run()
        assert run is not None and run.status == "finished"
        exps = led.experiments(run.id)
        baseline_items = led.item_verdicts(exps[0].id)
    assert exps[0].status == "baseline" and exps[0].kappa == 1.0
    # The ledger keeps each verdict's tool calls as data (the TUI's item view lists them).
    assert {tuple(i.replicates[0].tools) for i in baseline_items} == {
        (
            JudgeToolCall("read_steps", {"first": 0, "last": 2}),
            JudgeToolCall("view_screenshots", {"steps": [0, 2]}),
            JudgeToolCall("submit_verdict"),
        )
    }
    # The baseline is already perfect (kappa 1): the candidate the agentic judge evaluated cannot be kept.
    assert exps[1].status == "rolled_back" and exps[1].items_evaluated > 0, exps[1].reason
    assert not gitops.is_dirty(data.ws.root)


def test_more_screenshots_than_a_request_may_carry_is_refused_in_one_line() -> None:
    with pytest.raises(UserError, match="agent_max_screenshots"):
        parse_settings('mode = "agentic"\nagent_max_screenshots = 150\n', "judge.toml")


def test_run_refuses_an_agentic_local_judge_before_starting(
    data: Data, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.support.loop import commit_all

    commit_all(data.ws.root, "agentic judge")
    code = main(
        ["run", "-w", str(data.ws.root), "--provider", "local", "--split", "tiny", "--strategy", "library"]
    )
    err = capsys.readouterr().err
    assert code == 2 and 'the local judge supports mode = "direct" only' in err and "Traceback" not in err
    assert not (data.ws.experiments_dir / "ledger.sqlite").exists() or _no_runs(data)


def _no_runs(data: Data) -> bool:
    from optimizer.ledger import Ledger

    with Ledger(data.ws.experiments_dir / "ledger.sqlite") as led:
        return led.latest_run() is None


# --------------------------------------------------------------------------- tool calls as data


TRACE_LINES = {
    # What ledgers written before tool calls were data hold, and what str() must still print.
    "read_steps(0-24)": JudgeToolCall("read_steps", {"first": 0, "last": 24}),
    "view_screenshots(3, 7)": JudgeToolCall("view_screenshots", {"steps": [3, 7]}),
    "submit_verdict": JudgeToolCall("submit_verdict"),
    "submit_verdict (invalid)": JudgeToolCall("submit_verdict", outcome="invalid"),
    "text answer": JudgeToolCall(None),
    "read_steps(…) (refused)": JudgeToolCall("read_steps", None, "refused"),
    "read_steps(7-9) (refused)": JudgeToolCall("read_steps", {"first": 7, "last": 9}, "refused"),
    "read_steps(None-4)": JudgeToolCall("read_steps", {"first": None, "last": 4}),
    "view_screenshots(…)": JudgeToolCall("view_screenshots", None),
    "delete_everything(…) (refused)": JudgeToolCall("delete_everything", None, "refused"),
    "submit_verdict(…) (refused)": JudgeToolCall(
        "submit_verdict", None, "refused"
    ),  # a second submit in a turn
}


@pytest.mark.parametrize("line", list(TRACE_LINES))
def test_a_tool_call_prints_its_trace_line_and_an_old_line_parses_back_to_the_call(line: str) -> None:
    call = TRACE_LINES[line]
    assert str(call) == line
    assert JudgeToolCall.from_text(line) == call
    assert JudgeToolCall.from_json(json.loads(json.dumps(call.to_json()))) == call


def test_an_old_trace_line_with_arguments_of_odd_types_still_prints_as_it_was_stored() -> None:
    # A model may send any JSON; the old lines printed Python values. Parsing keeps the text exact.
    for line in (
        "read_steps(-1-5)",
        "read_steps(a-b-c)",
        "view_screenshots()",
        "view_screenshots([1], True, x)",
        "read_steps(2.5-None)",
    ):
        assert str(JudgeToolCall.from_text(line)) == line, line
    assert JudgeToolCall.from_text("view_screenshots([1], True, x)").arguments == {"steps": [[1], True, "x"]}
