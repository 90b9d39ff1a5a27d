"""A hostile optimiser through the real CLI: ``judgeloop run --strategy agent`` with the agent's model a
script on the fake server (anthropic wire) and the judge the deterministic fake judge (openai wire).

The scripted agent tries what the red team tried: reading held-out labels through a ``..`` path,
writing through an absolute path, a rule with an unknown placeholder, a dev id hidden by zero-width
characters. Each is refused or rejected, recorded, and the run goes on to judge a real fix.
"""

from __future__ import annotations

import re
import threading
from pathlib import Path
from typing import cast

import pytest

from optimizer.judge.prompts import LIBRARY_MD, RUBRIC_MD, parse_library
from optimizer.loop.strategies import Proposal, ProposalContext
from optimizer.workspace import gitops
from tests.support.fakeserver import Behaviour, FakeLLMServer, RecordedRequest, ToolCall, Usage, reply
from tests.support.loop import GOOD_ENTRY, FakeJudge, commit_all, git, labels_of, run_loop
from tests.support.scripted import ScriptedStrategy, assert_clean, install, latest

OLD = "## Decision rules"


def _edit(new_rule: str, call_id: str) -> Behaviour:
    return reply(
        tool_calls=[
            ToolCall("edit_file", {"path": RUBRIC_MD, "old": OLD, "new": f"{OLD}\n\n{new_rule}"}, id=call_id)
        ],
        usage=Usage(900, 40),
    )


def _submit(why: str, call_id: str) -> Behaviour:
    return reply(tool_calls=[ToolCall("submit", {"rationale": why}, id=call_id)], usage=Usage(900, 20))


class HostileAgent:
    """The optimiser's model: a fixed sequence of replies, one per request on the anthropic wire; every
    other request (the judge's) goes to the fake judge."""

    def __init__(self, judge: FakeJudge, replies: list[Behaviour]) -> None:
        self.judge = judge
        self.replies = list(replies)
        self.requests: list[RecordedRequest] = []
        self.lock = threading.Lock()

    def __call__(self, request: RecordedRequest) -> Behaviour:
        if request.wire != "anthropic":
            return self.judge(request)
        with self.lock:
            self.requests.append(request)
            return self.replies.pop(0)


@pytest.mark.boundary
def test_a_hostile_agent_is_refused_rejected_and_recorded_and_the_run_goes_on(
    ws: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    labels = labels_of(ws)
    dev_id = sorted(labels)[0]
    hidden_id = "\u200b".join(dev_id)  # zero-width spaces between every character
    good_text = {e.id: e.text for e in parse_library((ws / LIBRARY_MD).read_text(encoding="utf-8"))}[
        GOOD_ENTRY
    ]
    labels_file = next((ws / "devset").glob("*/labels.jsonl")).resolve()
    replies = [
        # Proposal 1: probe the file tools, then a rule with a placeholder no judge request can fill.
        reply(
            tool_calls=[ToolCall("read_file", {"path": "prompts/../devset/small/labels.jsonl"}, id="a1")],
            usage=Usage(900, 30),
        ),
        reply(
            tool_calls=[ToolCall("write_file", {"path": "/" + RUBRIC_MD, "text": "# mine now\n"}, id="a2")],
            usage=Usage(900, 30),
        ),
        _edit("- The typed text must equal {{expected_text}} exactly.", "a3"),
        _submit("Compare typed text with the expected text.", "a4"),
        # Proposal 2: an item reference the lint must see through.
        _edit(f"- Item {hidden_id} is a failure.", "b1"),
        _submit("Remember a hard case.", "b2"),
        # Proposal 3: a real rule (the fake judge's known fix).
        _edit(f"- {good_text}", "c1"),
        _submit("Check typed text exactly.", "c2"),
    ]
    toml = ws / "judgeloop.toml"
    with FakeLLMServer(default=HostileAgent(FakeJudge(ws), replies)) as server:
        text = toml.read_text(encoding="utf-8")
        text = re.sub(
            r"(?m)^\[optimizer\]\n", f'[optimizer]\nbase_url = "{server.anthropic_base_url}"\n', text
        )
        toml.write_text(text.replace('model = "claude-sonnet-5-5"', 'model = "opt-model"'), encoding="utf-8")
        commit_all(ws, "the agent's model is the fake server")
        monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test-not-a-real-key")
        assert run_loop(ws, server.openai_base_url, "--strategy", "agent", "--max-experiments", "3") == 0
        agent = cast(HostileAgent, server.default)
    run, exps = latest(ws)
    assert run.status == "finished"
    assert [e.status for e in exps] == ["baseline", "guard_rejected", "guard_rejected", "kept"]
    assert "unknown placeholder {{expected_text}}" in (exps[1].reason or "")
    assert f"the dev id {dev_id!r}" in (exps[2].reason or "")
    # The tools refused the path tricks: the model was told, and never saw a byte of the labels file.
    tool_results = [str(r.body) for r in agent.requests]
    assert any("is not an allowed file" in t and "labels.jsonl" in t for t in tool_results)
    assert any("is not an allowed file" in t and "'/prompts/rubric.md'" in t for t in tool_results)
    first_label_line = labels_file.read_text(encoding="utf-8").splitlines()[0]
    assert all(first_label_line not in t for t in tool_results)
    assert not Path("/prompts").exists()
    # Nothing rejected was committed; the kept rule is the branch tip and the tree is clean.
    assert set(gitops.rejected_refs(ws)) == set()
    assert gitops.rev_parse(ws, "HEAD") == exps[3].commit_sha
    assert good_text in (ws / RUBRIC_MD).read_text(encoding="utf-8")
    assert_clean(ws)
    assert "sk-ant-test-not-a-real-key" not in capsys.readouterr().out


@pytest.mark.slow
def test_a_commit_slipped_under_the_candidate_is_judged_by_the_guards_on_the_full_diff(
    ws: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An optimiser with a shell commits on the run branch while it proposes (after the loop checked the tip):
    a dev id in rubric.md. Its proposal, made on top of that commit, adds only a good rule, so the proposed
    files alone pass the guards. The guards read the whole incumbent → candidate diff: the candidate is
    guard-rejected before any judge call, nothing is kept, the branch is back at the incumbent and the
    slipped commit stays reachable (the rejected candidate's parent)."""
    dev_id = sorted(labels_of(ws))[0]
    good_text = {e.id: e.text for e in parse_library((ws / LIBRARY_MD).read_text(encoding="utf-8"))}[
        GOOD_ENTRY
    ]

    def slip_a_commit_then_propose(ctx: ProposalContext) -> Proposal:
        rubric = ws / RUBRIC_MD
        rubric.write_text(
            rubric.read_text(encoding="utf-8") + f"\n- Item {dev_id} is a failure.\n", encoding="utf-8"
        )
        git(ws, "commit", "-q", "-a", "-m", "remember a hard case")
        return Proposal(
            files={RUBRIC_MD: rubric.read_text(encoding="utf-8") + f"\n- {good_text}\n"},
            rationale="Check typed text exactly.",
        )

    install(monkeypatch, ScriptedStrategy([slip_a_commit_then_propose]))
    with FakeLLMServer(default=FakeJudge(ws)) as server:
        assert run_loop(ws, server.openai_base_url, "--max-experiments", "1") == 0
        run, exps = latest(ws)
        judged = {e.id: e.calls for e in exps}
    base, cand = exps
    assert cand.status == "guard_rejected", (cand.status, cand.reason)
    assert f"the dev id {dev_id!r}" in (cand.reason or "") and judged[cand.id] == 0
    assert gitops.rev_parse(ws, run.branch) == base.commit_sha == gitops.rev_parse(ws, "HEAD")
    rejected = gitops.rejected_refs(ws)[cand.id]
    slipped = git(ws, "rev-parse", f"{rejected}~1").strip()
    assert gitops.commit_message(ws, slipped).startswith("remember a hard case")
    assert dev_id not in (ws / RUBRIC_MD).read_text(encoding="utf-8")
    assert_clean(ws)
