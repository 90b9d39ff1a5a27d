"""The `library` and `reflect` strategies, the agent's tools, and the shared helpers."""

from __future__ import annotations

import asyncio
import io
import json
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from optimizer.errors import UserError
from optimizer.judge.prompts import LIBRARY_MD, RUBRIC_MD, enabled_entries, parse_library
from optimizer.judge.types import JudgeToolCall
from optimizer.loop.strategies import PastExperiment, ProposalError, make_strategy
from optimizer.loop.strategies.common import balanced_sample, rng_for, splice_section
from optimizer.loop.strategies.library import LibraryStrategy, classify, tried_sets
from optimizer.loop.strategies.reflect import ReflectStrategy, build_user_message
from optimizer.loop.strategies.tools import ToolState, run_tool
from optimizer.workspace.config import OptimizerSection, Price
from tests.support.fakeserver import FakeLLMServer, Usage, error, reply
from tests.support.strategies import DevFixture, disagreements_for, make_context, make_dev


@pytest.fixture(scope="module")
def dev(tmp_path_factory: pytest.TempPathFactory) -> DevFixture:
    """One read-only dev workspace for the module (strategies never write files)."""
    return make_dev(tmp_path_factory.mktemp("strategies"))


def _library_ids(dev: DevFixture) -> list[str]:
    """The rubric rules' ids (structural entries take part only with [optimizer] structure_moves)."""
    return [
        e.id
        for e in parse_library((dev.ws.root / LIBRARY_MD).read_text(encoding="utf-8"))
        if e.structure is None
    ]


# --------------------------------------------------------------------------- library


def test_library_is_deterministic_for_seed_sequence_and_history(dev: DevFixture) -> None:
    dis = disagreements_for(dev.items, missed=3, rejected=1)
    a = LibraryStrategy().propose_sync(make_context(dev, dis, seq=3, seed=7))
    b = LibraryStrategy().propose_sync(make_context(dev, dis, seq=3, seed=7))
    assert a.files == b.files and a.rationale == b.rationale
    others = {
        LibraryStrategy().propose_sync(make_context(dev, [], seq=s, seed=7)).rationale for s in range(1, 9)
    }
    assert len(others) > 1  # with no disagreements to steer it, the seed/sequence spreads the choice


def test_library_touches_only_the_rubric_and_stays_a_valid_prompt(dev: DevFixture) -> None:
    ctx = make_context(dev, disagreements_for(dev.items, missed=2, rejected=2))
    proposal = asyncio.run(make_strategy("library", OptimizerSection(), {}).propose(ctx))
    assert set(proposal.files) == {RUBRIC_MD}
    assert set(proposal.files) <= set(ctx.allowed_files)
    new_rubric = proposal.files[RUBRIC_MD]
    enabled = enabled_entries(new_rubric)
    assert len(enabled) == 1 and enabled[0] in _library_ids(dev)
    # Everything outside the library region is unchanged.
    old = ctx.current_files[RUBRIC_MD]
    assert (
        new_rubric.split("<!-- judgeloop:library:begin -->")[0]
        == old.split("<!-- judgeloop:library:begin -->")[0]
    )
    assert proposal.calls == 0 and proposal.cost_usd == 0.0


def test_library_never_repeats_a_tried_set_until_exhausted(dev: DevFixture) -> None:
    """Feed every proposal back as a rolled-back experiment: all sets differ, then the pairs, then an error."""
    dis = disagreements_for(dev.items, missed=3, rejected=0)
    n = len(_library_ids(dev))
    history: list[PastExperiment] = []
    order: list[frozenset[str]] = []
    base = frozenset(enabled_entries(make_context(dev, dis).current_files[RUBRIC_MD]))
    assert base == frozenset()
    for seq in range(1, n + 4):
        proposal = LibraryStrategy().propose_sync(make_context(dev, dis, history=history, seq=seq))
        enabled = frozenset(enabled_entries(proposal.files[RUBRIC_MD]))
        assert enabled not in order and enabled != base
        order.append(enabled)
        # The set is recorded as data, not parsed back out of the prose.
        assert proposal.meta == {"library_enabled": sorted(enabled)} and "[library:" not in proposal.rationale
        assert tried_sets(
            [PastExperiment(0, "rolled_back", "", proposal.rationale, None, None, "", proposal.meta)]
        ) == {enabled}
        assert tried_sets([PastExperiment(0, "rolled_back", "", proposal.rationale, None, None, "")]) == set()
        history.append(
            PastExperiment(
                seq, "rolled_back", "kappa did not rise", proposal.rationale, 0.5, 0.1, "", proposal.meta
            )
        )
    # From the empty set the first n proposals are the n single toggles; only then come pairs.
    assert [len(s) for s in order] == [1] * n + [2] * 3


def test_library_counts_only_decided_candidates_as_tried(dev: DevFixture) -> None:
    """A candidate killed between the guards and the commit (recorded `error` on resume) was never tried."""
    dis = disagreements_for(dev.items, missed=3, rejected=0)
    first = LibraryStrategy().propose_sync(make_context(dev, dis, seq=1))
    interrupted = PastExperiment(
        1,
        "error",
        "interrupted before it was evaluated; rolled back on resume",
        first.rationale,
        None,
        None,
        "",
        first.meta,
    )
    assert tried_sets([interrupted]) == set()
    again = LibraryStrategy().propose_sync(make_context(dev, dis, history=[interrupted], seq=2))
    assert again.meta == first.meta  # the best move is proposed again, not skipped as "tried"
    for decided in ("kept", "rolled_back", "guard_rejected", "waiting"):
        past = PastExperiment(1, decided, "", first.rationale, None, None, "", first.meta)
        assert tried_sets([past]) == {frozenset(first.meta["library_enabled"])}
        assert (
            LibraryStrategy().propose_sync(make_context(dev, dis, history=[past], seq=2)).meta != first.meta
        )


def test_library_exhausted_raises_proposal_error(dev: DevFixture) -> None:
    ids = _library_ids(dev)
    from itertools import combinations

    every = [frozenset([i]) for i in ids] + [frozenset(p) for p in combinations(ids, 2)]
    history = [
        PastExperiment(k, "rolled_back", "", "x", None, None, "", {"library_enabled": sorted(s)})
        for k, s in enumerate(every)
    ]
    with pytest.raises(ProposalError, match="has been tried"):
        LibraryStrategy().propose_sync(make_context(dev, [], history=history))


def test_library_prefers_stricter_entries_for_missed_failures_and_lenient_for_rejected(
    dev: DevFixture,
) -> None:
    library = parse_library((dev.ws.root / LIBRARY_MD).read_text(encoding="utf-8"))
    lean = {e.id: classify(e).lean for e in library}
    strict_ctx = make_context(dev, disagreements_for(dev.items, missed=4, rejected=0))
    p = LibraryStrategy().propose_sync(strict_ctx)
    (enabled,) = enabled_entries(p.files[RUBRIC_MD])
    assert lean[enabled] == "stricter"
    assert "too lenient" in p.rationale and enabled in p.rationale

    lenient_ctx = make_context(dev, disagreements_for(dev.items, missed=0, rejected=4))
    p = LibraryStrategy().propose_sync(lenient_ctx)
    (enabled,) = enabled_entries(p.files[RUBRIC_MD])
    assert lean[enabled] == "lenient"  # lib-harmless-exploration in the default library
    assert "too strict" in p.rationale


def test_library_disables_a_strict_entry_when_the_judge_is_too_strict(dev: DevFixture) -> None:
    """With every lenient entry already tried, the next move for a too-strict judge removes a strict rule."""
    library = parse_library((dev.ws.root / LIBRARY_MD).read_text(encoding="utf-8"))
    from optimizer.judge.prompts import with_entries

    strict_ids = [e.id for e in library if classify(e).lean == "stricter"][:2]
    ctx = make_context(dev, disagreements_for(dev.items, missed=0, rejected=4))
    ctx.current_files[RUBRIC_MD] = with_entries(ctx.current_files[RUBRIC_MD], library, strict_ids)
    lenient_ids = [e.id for e in library if classify(e).lean == "lenient"]
    ctx.history = [
        PastExperiment(
            1, "rolled_back", "", "x", None, None, "", {"library_enabled": sorted([*strict_ids, i])}
        )
        for i in lenient_ids
    ]
    p = LibraryStrategy().propose_sync(ctx)
    after = set(enabled_entries(p.files[RUBRIC_MD]))
    assert len(after) == 1 and after < set(strict_ids)
    assert "Disabled library entry" in p.rationale


def test_library_refuses_config_without_the_rubric(dev: DevFixture) -> None:
    with pytest.raises(UserError, match="allowed_files"):
        make_strategy("library", OptimizerSection(allowed_files=["prompts/judge.md"]), {})


# --------------------------------------------------------------------------- helpers


def test_balanced_sample_takes_both_directions_and_fills_from_the_other(dev: DevFixture) -> None:
    dis = disagreements_for(dev.items, missed=4, rejected=4)
    sample = balanced_sample(dis, 4, rng_for(0, 1))
    assert [d.direction for d in sample].count("missed_failure") == 2
    assert [d.direction for d in sample].count("rejected_success") == 2
    only_missed = balanced_sample(disagreements_for(dev.items, missed=4, rejected=1), 4, rng_for(0, 1))
    assert [d.direction for d in only_missed].count("missed_failure") == 3
    # Stable rejected successes come before unstable ones.
    rejected = balanced_sample(disagreements_for(dev.items, missed=0, rejected=4), 2, rng_for(0, 1))
    assert not any(d.unstable for d in rejected)


def test_splice_section_replaces_body_and_keeps_markers() -> None:
    text = "# A\n\nintro\n\n## B\n\nold b\n\n### B1\n\nsub\n\n## C\n\nc body\n<!-- judgeloop:library:begin -->\n<!-- judgeloop:library:end -->\n"
    out = splice_section(text, "## b", "## B\n\nnew b")
    assert (
        out
        == "# A\n\nintro\n\n## B\n\nnew b\n\n## C\n\nc body\n<!-- judgeloop:library:begin -->\n<!-- judgeloop:library:end -->\n"
    )
    out = splice_section(text, "C", "only the body")
    assert (
        out is not None and "only the body\n\n<!-- judgeloop:library:begin -->" in out and "c body" not in out
    )
    assert splice_section(text, "## Missing", "x") is None


# --------------------------------------------------------------------------- tools


def test_tools_refuse_heldout_ids_and_files_not_allowed(dev: DevFixture) -> None:
    state = ToolState(make_context(dev, []))
    foreign = dev.heldout[0].trajectory_id
    out = run_tool(state, "read_trajectory", {"trajectory_id": foreign})
    assert out.is_error and "not in the dev split" in out.text
    out = run_tool(state, "view_screenshot", {"trajectory_id": foreign, "step": 0})
    assert out.is_error
    out = run_tool(state, "read_file", {"path": "judgeloop.toml"})
    assert out.is_error and "not an allowed file" in out.text
    out = run_tool(state, "write_file", {"path": "../devset/dev/labels.jsonl", "text": "x"})
    assert out.is_error
    out = run_tool(state, "edit_file", {"path": "prompts/judge.md"})  # missing arguments
    assert out.is_error and "missing argument" in out.text
    out = run_tool(state, "no_such_tool", {})
    assert out.is_error
    assert state.errors == 6
    assert not state.changed_files()


def test_tools_read_steps_view_screenshots_and_edit_in_memory(dev: DevFixture) -> None:
    item = dev.items[0]
    ctx = make_context(dev, disagreements_for(dev.items, missed=2, rejected=1))
    state = ToolState(ctx)
    listed = json.loads(run_tool(state, "list_disagreements", {"direction": "missed_failure"}).text)
    assert listed["summary"]["matching"] == 2 and all(i["label"] == "negative" for i in listed["items"])
    text = run_tool(
        state, "read_trajectory", {"trajectory_id": item.trajectory_id, "start": 1, "end": 2}
    ).text
    assert 'step 1: type "report-1.pdf"' in text and "step 2: hotkey Ctrl+s" in text and "step 0:" not in text
    shot = run_tool(state, "view_screenshot", {"trajectory_id": item.trajectory_id, "step": 3})
    assert not shot.is_error and shot.image is not None
    assert Image.open(io.BytesIO(shot.image)).format == "JPEG"
    assert run_tool(state, "view_screenshot", {"trajectory_id": item.trajectory_id, "step": 40}).is_error
    judge_before = (dev.ws.root / "prompts/judge.md").read_text(encoding="utf-8")
    ok = run_tool(
        state, "edit_file", {"path": "./prompts/judge.md", "old": "# Role", "new": "# Role and duty"}
    )
    assert not ok.is_error
    assert state.changed_files()["prompts/judge.md"].startswith(
        judge_before.split("# Role")[0] + "# Role and duty"
    )
    assert (dev.ws.root / "prompts/judge.md").read_text(encoding="utf-8") == judge_before  # never on disk
    assert run_tool(state, "edit_file", {"path": "prompts/judge.md", "old": "nowhere", "new": "x"}).is_error
    assert run_tool(state, "read_guidance", {}).text == "Prefer short rules."
    assert run_tool(state, "submit", {"rationale": "Sharper role."}).text == "submitted"
    assert state.submitted == "Sharper role."


# --------------------------------------------------------------------------- reflect


def _section_reply(section: str = "## Decision rules") -> str:
    return json.dumps(
        {
            "file": "prompts/rubric.md",
            "section_heading": section,
            "new_section": "## Decision rules\n\n- The instruction is the reference; check every parameter.",
            "rationale": "Tighten the decision rules so near-miss executions are judged false.",
        }
    )


def test_reflect_through_anthropic_sdk_splices_the_section(
    dev: DevFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "test-key")
    with FakeLLMServer() as server:
        server.script(reply("Here it is:\n```json\n" + _section_reply() + "\n```", usage=Usage(1000, 200)))
        cfg = OptimizerSection(
            strategy="reflect", provider="anthropic", model="opt-model", base_url=server.anthropic_base_url
        )
        strategy = make_strategy("reflect", cfg, {"opt-model": Price(input=3.0, output=15.0)})
        ctx = make_context(dev, disagreements_for(dev.items, missed=3, rejected=2))
        proposal = asyncio.run(strategy.propose(ctx))
        (request,) = server.inference_requests()
    assert request.wire == "anthropic" and request.model == "opt-model"
    prompt = request.body["messages"][0]["content"][0]["text"]
    assert "prompts/rubric.md" in prompt and "missed failure" in prompt and "rejected success" in prompt
    assert dev.items[2].instruction in prompt  # a disagreement's instruction is shown (dev split)
    assert set(proposal.files) == {"prompts/rubric.md"}
    new = proposal.files["prompts/rubric.md"]
    assert "- The instruction is the reference; check every parameter." in new
    assert "Missing evidence is not success" not in new  # the old section body is gone
    assert "<!-- judgeloop:library:begin -->" in new  # the library region survives
    assert proposal.calls == 1 and proposal.input_tokens == 1000 and proposal.output_tokens == 200
    assert proposal.cost_usd == pytest.approx((1000 * 3.0 + 200 * 15.0) / 1e6)
    assert proposal.rationale.startswith("Tighten the decision rules")


def test_reflect_through_openai_sdk(dev: DevFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "test-key")
    with FakeLLMServer() as server:
        server.script(reply(_section_reply(), usage=Usage(500, 100, cache_read_tokens=200)))
        # A model of the built-in price table: cached prompt tokens are billed at the cache-read rate.
        cfg = OptimizerSection(provider="openai", model="gpt-4o-mini", base_url=server.openai_base_url)
        proposal = asyncio.run(
            ReflectStrategy(cfg, {}).propose(
                make_context(dev, disagreements_for(dev.items, missed=1, rejected=1))
            )
        )
        (request,) = server.inference_requests()
    assert request.wire == "openai" and request.body["messages"][0]["role"] == "system"
    # The providers' token convention: input_tokens are the uncached prompt tokens (700 - 200 cached).
    assert "prompts/rubric.md" in proposal.files and proposal.input_tokens == 500
    assert proposal.cost_usd == pytest.approx((500 * 0.15 + 200 * 0.075 + 100 * 0.60) / 1e6)


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("I would tighten the rules.", "not a JSON object"),
        (json.dumps({"file": "prompts/rubric.md", "section_heading": "## Decision rules"}), "new_section"),
        (
            json.dumps(
                {"file": "judgeloop.toml", "section_heading": "x", "new_section": "y", "rationale": "z"}
            ),
            "not an allowed file",
        ),
        (_section_reply("## No such section"), "no section headed"),
    ],
)
def test_reflect_malformed_reply_is_a_proposal_error(
    dev: DevFixture, monkeypatch: pytest.MonkeyPatch, text: str, match: str
) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "test-key")
    with FakeLLMServer() as server:
        server.script(reply(text))
        cfg = OptimizerSection(provider="anthropic", model="m", base_url=server.anthropic_base_url)
        with pytest.raises(ProposalError, match=match) as info:
            asyncio.run(ReflectStrategy(cfg, {}).propose(make_context(dev, [])))
    assert info.value.calls == 1  # what was spent is carried by the error


def test_reflect_transport_failure_is_a_proposal_error_and_bad_key_a_user_error(
    dev: DevFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "test-key")
    with FakeLLMServer() as server:
        server.script(error(503, message="overloaded"))
        cfg = OptimizerSection(
            provider="anthropic", model="m", base_url=server.anthropic_base_url, max_retries=0
        )
        with pytest.raises(ProposalError, match="HTTP 503"):
            asyncio.run(ReflectStrategy(cfg, {}).propose(make_context(dev, [])))
        server.script(error(401, error_type="authentication_error", message="bad key"))
        with pytest.raises(UserError, match="ANTHROPIC_API_KEY"):
            asyncio.run(ReflectStrategy(cfg, {}).propose(make_context(dev, [])))


def test_llm_strategies_refuse_a_missing_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    with pytest.raises(UserError, match="ANTHROPIC_API_KEY is not set"):
        make_strategy("agent", OptimizerSection(provider="anthropic"), {})
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with pytest.raises(UserError, match="OPENAI_API_KEY is not set"):
        make_strategy("reflect", OptimizerSection(provider="openai"), {})


def test_reflect_request_never_mentions_heldout_items(dev: DevFixture) -> None:
    ctx = make_context(dev, disagreements_for(dev.items, missed=4, rejected=4))
    text = build_user_message(ctx)
    assert all(h.trajectory_id not in text for h in dev.heldout)
    assert all(d.trajectory_id not in text for d in ctx.disagreements)  # ids would only invite overfitting


def test_the_optimiser_sees_what_an_agentic_judge_looked_at() -> None:
    from optimizer.loop.strategies import Disagreement
    from optimizer.loop.strategies.common import disagreement_dict

    base: dict[str, Any] = dict(
        trajectory_id="t",
        instruction="i",
        label_positive=False,
        mistake_type="Critical Mistake",
        judge_success=True,
        reasoning="r",
        confidence="high",
        unstable=False,
    )
    assert "judge_tool_calls" not in disagreement_dict(Disagreement(**base))  # a direct judge: nothing to add
    tools = (JudgeToolCall("read_steps", {"first": 0, "last": 24}), JudgeToolCall("submit_verdict"))
    agentic = Disagreement(**base, judge_tools=tools)
    assert disagreement_dict(agentic)["judge_tool_calls"] == ["read_steps(0-24)", "submit_verdict"]


def test_the_agent_is_told_when_the_judge_is_agentic(tmp_path: Path) -> None:
    import dataclasses

    from optimizer.loop.strategies.agent import AGENTIC_JUDGE_NOTE, _opening

    ctx = make_context(make_dev(tmp_path), [])
    assert AGENTIC_JUDGE_NOTE not in _opening(ctx)
    assert AGENTIC_JUDGE_NOTE in _opening(dataclasses.replace(ctx, judge_mode="agentic"))
