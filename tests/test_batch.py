"""Batch evaluation (`--batch`): the real ``anthropic`` and ``openai`` SDKs against the fake server's
batch endpoints (Message Batches; Batch API with a JSONL input file)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from optimizer.cli import main
from optimizer.evaluation.batch import EARLY_STOP_NOTE, BatchOptions
from optimizer.evaluation.budget import Budget
from optimizer.evaluation.cache import JudgeCache
from optimizer.evaluation.evaluator import PassOptions, evaluate_items
from optimizer.evaluation.results import ItemResult
from optimizer.events import StopKind
from optimizer.judge.providers.pricing import batch_cost_usd, cost_usd
from optimizer.judge.types import ProviderReply
from optimizer.workspace.config import JudgeSection
from optimizer.workspace.workspace import Workspace
from tests.support.config import write_config
from tests.support.evaluation import SECRET, Data, by_label, make_data
from tests.support.fakeserver import FakeLLMServer, RecordedRequest, server_error
from tests.support.loop import wait_for
from tests.support.processes import killed_cli

MODELS = {"anthropic": "claude-haiku-4-5", "openai": "gpt-4o-mini"}


def base_url(server: FakeLLMServer, wire: str) -> str:
    return server.anthropic_base_url if wire == "anthropic" else server.openai_base_url


def configure(data: Data, wire: str, *, poll_s: float = 0.01) -> None:
    """The workspace judges the split "tiny" with ``wire``'s provider (no SDK retries) and polls
    batches every ``poll_s`` seconds (at most 4x that)."""
    root = data.ws.root
    cfg = Workspace.open(root).config
    judge = cfg.judge.model_copy(
        update={
            "provider": wire,
            "model": MODELS[wire],
            "max_retries": 0,
            "batch_poll_s": poll_s,
            "batch_poll_max_s": poll_s * 4,
        }
    )
    workspace = cfg.workspace.model_copy(update={"dev_split": "tiny"})
    write_config(root, cfg.model_copy(update={"judge": judge, "workspace": workspace}))


def eval_args(data: Data, server: FakeLLMServer, wire: str, out: Path, *extra: str) -> list[str]:
    return ["eval", "-w", str(data.ws.root), "--base-url", base_url(server, wire), "--out", str(out), *extra]


def verdict_files(out: Path) -> dict[str, dict[str, Any]]:
    """Every verdict file, without what differs between any two evaluations (cost, time, cached flags)."""
    files = {}
    for path in sorted(out.glob("*.json")):
        if path.name == "_summary.json":
            continue
        body = json.loads(path.read_text())
        meta = body["_meta"]
        for key in ("cost_usd", "duration_s", "cached"):
            meta.pop(key)
        for rep in meta["replicates"]:
            for key in ("cost_usd", "duration_s", "cached"):
                rep.pop(key)
        files[path.name] = body
    return files


def batch_rows(ws_root: Path) -> list[tuple[str | None, str]]:
    conn = sqlite3.connect(ws_root / "experiments" / "cache.sqlite")
    try:
        return [(r[0], r[1]) for r in conn.execute("SELECT batch_id, status FROM batches ORDER BY id")]
    except sqlite3.OperationalError:  # not created yet
        return []
    finally:
        conn.close()


@pytest.fixture(autouse=True)
def keys(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", SECRET)
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)


# --------------------------------------------------------------------------- same results as direct calls


@pytest.mark.slow
@pytest.mark.parametrize("wire", ["anthropic", "openai"])
def test_batch_gives_the_same_verdict_files_as_direct_calls_at_half_price(
    wire: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = make_data(tmp_path)
    configure(data, wire)
    with FakeLLMServer(default=by_label(data), batch_polls=2) as server:
        assert main(eval_args(data, server, wire, tmp_path / "direct", "--replicates", "2")) == 0
        direct_calls = len(server.inference_requests())
        direct_summary = json.loads((tmp_path / "direct" / "_summary.json").read_text())
        (data.ws.root / "experiments" / "cache.sqlite").unlink()  # the batch pays for everything again
        capsys.readouterr()

        assert main(eval_args(data, server, wire, tmp_path / "batch", "--replicates", "2", "--batch")) == 0
        captured = capsys.readouterr()
        assert len(server.batch_creations) == 1
        entries = server.batch_entries(server.batch_creations[0])
        assert len(entries) == direct_calls == 2 * len(data.items)
        assert f"batch {server.batch_creations[0]}: " in captured.err  # the polled states
        assert "early stopping does not apply" in captured.err
        assert verdict_files(tmp_path / "batch") == verdict_files(tmp_path / "direct")
        batch_summary = json.loads((tmp_path / "batch" / "_summary.json").read_text())
        assert batch_summary["cost_usd"] == pytest.approx(direct_summary["cost_usd"] / 2)

        # Same cache keys: a direct evaluation of the same prompts now makes no call at all.
        assert main(eval_args(data, server, wire, tmp_path / "again", "--replicates", "2")) == 0
        assert len(server.inference_requests()) == direct_calls + len(entries)
        assert verdict_files(tmp_path / "again") == verdict_files(tmp_path / "direct")
    assert batch_rows(data.ws.root) == [(server.batch_creations[0], "collected")]
    assert SECRET not in (data.ws.root / "experiments" / "cache.sqlite").read_bytes().decode("latin-1")


def test_only_the_uncached_replicates_are_sent(tmp_path: Path) -> None:
    data = make_data(tmp_path)
    configure(data, "openai")
    with FakeLLMServer(default=by_label(data)) as server:
        assert main(eval_args(data, server, "openai", tmp_path / "one", "--limit", "3")) == 0
        assert main(eval_args(data, server, "openai", tmp_path / "all", "--batch")) == 0
        assert len(server.batch_entries(server.batch_creations[0])) == len(data.items) - 3
        assert main(eval_args(data, server, "openai", tmp_path / "cached", "--batch")) == 0
        assert len(server.batch_creations) == 1  # everything cached: no batch at all


@pytest.mark.slow
@pytest.mark.parametrize("wire", ["anthropic", "openai"])
def test_a_pass_larger_than_the_providers_batch_limits_goes_out_as_several_batches(
    wire: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from optimizer.evaluation.batch import request_bytes, split_for_limits
    from optimizer.judge.providers.anthropic_provider import AnthropicProvider
    from optimizer.judge.providers.openai_provider import OpenAIProvider

    # The splitting rule itself: consecutive chunks under both caps (85% of the byte limit).
    sizes = {"a": 40, "b": 40, "c": 40, "d": 200, "e": 10}
    assert split_for_limits(list(sizes), sizes, max_requests=2, max_bytes=None) == [
        ["a", "b"],
        ["c", "d"],
        ["e"],
    ]
    assert split_for_limits(list(sizes), sizes, max_requests=None, max_bytes=100) == [
        ["a", "b"],
        ["c"],
        ["d"],
        ["e"],
    ]
    data = make_data(tmp_path)
    configure(data, wire)
    provider = AnthropicProvider if wire == "anthropic" else OpenAIProvider
    limits = provider.traits.batch
    assert limits is not None
    # A tiny limit, so the sample's pass must split.
    monkeypatch.setattr(
        provider,
        "traits",
        dataclasses.replace(provider.traits, batch=dataclasses.replace(limits, max_requests=3)),
    )
    with FakeLLMServer(default=by_label(data)) as server:
        assert main(eval_args(data, server, wire, tmp_path / "direct")) == 0
        (data.ws.root / "experiments" / "cache.sqlite").unlink()
        assert main(eval_args(data, server, wire, tmp_path / "batch", "--batch")) == 0
        sent = [len(server.batch_entries(b)) for b in server.batch_creations]
    assert sent == [3] * (len(data.items) // 3) + ([len(data.items) % 3] if len(data.items) % 3 else [])
    assert verdict_files(tmp_path / "batch") == verdict_files(tmp_path / "direct")
    assert [status for _, status in batch_rows(data.ws.root)] == ["collected"] * len(sent)
    # A request's size in a batch file: its text, its images base64-encoded, a kilobyte of JSON.
    from optimizer.judge.types import ImagePart, JudgeRequest, TextPart

    request = JudgeRequest(system="s" * 100, parts=(TextPart("t" * 50), ImagePart(b"x" * 3000)))
    assert request_bytes(request) == 100 + 50 + 4000 + 1024


def test_batch_cost_is_half_the_direct_price_cache_prices_included() -> None:
    reply = ProviderReply(
        text="",
        model="claude-sonnet-4-5",
        input_tokens=1000,
        output_tokens=100,
        cache_read_tokens=30_000,
        cache_write_tokens=2000,
    )
    assert batch_cost_usd(reply.model, reply) == pytest.approx(cost_usd(reply.model, reply) / 2)


# --------------------------------------------------------------------------- failures and retries


@pytest.mark.parametrize("wire", ["anthropic", "openai"])
def test_an_entry_that_errors_is_resubmitted_alone(wire: str, tmp_path: Path) -> None:
    data = make_data(tmp_path)
    configure(data, wire)
    with FakeLLMServer(default=by_label(data)) as server:
        server.script(server_error(500))  # the first entry of the first batch errors
        assert main(eval_args(data, server, wire, tmp_path / "out", "--batch")) == 0
        first, second = server.batch_creations
        failed = server.batch_entries(first)[0]
        [again] = server.batch_entries(second)
        assert again.body == failed.body
    files = verdict_files(tmp_path / "out")
    assert len(files) == len(data.items) and all("success" in body for body in files.values())


def test_expired_entries_are_resubmitted_and_give_up_as_infrastructure_errors(tmp_path: Path) -> None:
    from tests.support.fakeserver import expired

    data = make_data(tmp_path)
    configure(data, "anthropic")
    answer = by_label(data)
    doomed = data.split.ids[0]

    def behave(request: RecordedRequest) -> Any:  # one item's entry expires in every batch
        return expired() if data.recorded_item(request).trajectory_id == doomed else answer(request)

    with FakeLLMServer(default=behave) as server:
        run = asyncio.run(
            evaluate_items(
                data.ws,
                data.split,
                data.prompts,
                judge_section("anthropic", server),
                item_ids=data.split.ids,
                replicates=1,
                options=PassOptions(batch=BatchOptions(poll_s=0.01, retry_rounds=2)),
            )
        )
        assert [len(server.batch_entries(b)) for b in server.batch_creations] == [len(data.items), 1, 1]
    assert run.infra_error_ids == [doomed] and "expired" in (run.items[0].error or "")
    assert len(run.items) == len(data.items)


def test_a_batch_that_fails_validation_is_submitted_again(tmp_path: Path) -> None:
    data = make_data(tmp_path)
    configure(data, "openai")
    with FakeLLMServer(default=by_label(data)) as server:
        server.fail_batches = 1
        assert main(eval_args(data, server, "openai", tmp_path / "out", "--batch")) == 0
        assert len(server.batch_creations) == 2
        assert len(server.batch_entries(server.batch_creations[1])) == len(data.items)
    assert len(verdict_files(tmp_path / "out")) == len(data.items)


# --------------------------------------------------------------------------- budget


def judge_section(wire: str, server: FakeLLMServer) -> JudgeSection:
    return JudgeSection(provider=wire, model=MODELS[wire], base_url=base_url(server, wire), max_retries=0)  # type: ignore[arg-type]


def test_the_whole_batch_is_reserved_against_the_budget_before_it_is_sent(tmp_path: Path) -> None:
    data = make_data(tmp_path)
    seen_reserved: list[float] = []
    answer = by_label(data)
    budget = Budget(100.0)

    def behave(request: RecordedRequest) -> Any:
        seen_reserved.append(budget.reserved_usd)  # the fake creates the batch's entries on submission
        return answer(request)

    with FakeLLMServer(default=behave) as server:
        run = asyncio.run(
            evaluate_items(
                data.ws,
                data.split,
                data.prompts,
                judge_section("openai", server),
                item_ids=data.split.ids,
                replicates=1,
                options=PassOptions(budget=budget, batch=BatchOptions(poll_s=0.01)),
            )
        )
    assert len(seen_reserved) == len(data.items)
    assert seen_reserved[0] > 0 and seen_reserved[0] == seen_reserved[-1]  # all of it, before the first entry
    assert budget.reserved_usd == pytest.approx(0.0)
    assert run.cost_usd > 0 and budget.spent_usd == pytest.approx(run.cost_usd)


def test_a_batch_that_would_cross_the_budget_is_not_sent(tmp_path: Path) -> None:
    data = make_data(tmp_path)
    with FakeLLMServer(default=by_label(data)) as server:
        run = asyncio.run(
            evaluate_items(
                data.ws,
                data.split,
                data.prompts,
                judge_section("anthropic", server),
                item_ids=data.split.ids,
                replicates=1,
                options=PassOptions(budget=Budget(0.0001), batch=BatchOptions(poll_s=0.01)),
            )
        )
        assert server.batch_creations == [] and server.requests == []
    assert run.stop is not None and run.stop.kind is StopKind.BUDGET
    assert "nothing was sent" in run.stop.message and run.items == []
    assert sorted(run.not_evaluated) == sorted(data.split.ids)
    assert batch_rows(data.ws.root) == []


# --------------------------------------------------------------------------- refusals


@pytest.mark.parametrize("command", [["eval"], ["run", "--strategy", "library"]])
def test_batch_with_the_local_provider_is_one_line_and_a_nonzero_exit(
    command: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = make_data(tmp_path)
    configure(data, "openai")
    code = main([*command, "-w", str(data.ws.root), "--provider", "local", "--batch"])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert (
        err.count("\n") == 0 and "--batch needs a provider with a batch API" in err and "drop --batch" in err
    )


def test_early_stopping_does_not_apply_in_batch_mode_every_item_is_judged(tmp_path: Path) -> None:
    """What ``--batch``'s help promises: a stop asked for after the first item ends a direct pass early,
    and a batch pass judges every item anyway (its calls are paid for once it is sent)."""

    def stop_at_once(_item: ItemResult) -> bool:
        return True

    with FakeLLMServer() as server:
        runs = {}
        for mode, batch in (("direct", None), ("batch", BatchOptions(poll_s=0.01))):
            data = make_data(tmp_path / mode)  # its own cache: nothing is served from the other pass
            server.default = by_label(data)
            runs[mode] = asyncio.run(
                evaluate_items(
                    data.ws,
                    data.split,
                    data.prompts,
                    judge_section("openai", server),
                    item_ids=data.split.ids,
                    replicates=1,
                    options=PassOptions(on_item=stop_at_once, batch=batch),
                )
            )
    assert runs["direct"].stopped_early and len(runs["direct"].items) < len(data.items)
    assert not runs["batch"].stopped_early and len(runs["batch"].items) == len(data.items)
    assert EARLY_STOP_NOTE in runs["batch"].notes


# --------------------------------------------------------------------------- kill -9 and collect


@pytest.mark.slow
def test_kill_9_with_a_batch_pending_then_the_same_eval_collects_it(tmp_path: Path) -> None:
    data = make_data(tmp_path)
    configure(data, "openai")
    with FakeLLMServer(default=by_label(data), batch_polls=10**9) as server:
        args = eval_args(data, server, "openai", tmp_path / "out", "--batch")

        def submitted_and_polled() -> None:
            wait_for(
                lambda: (
                    len(server.batch_creations) == 1
                    and batch_rows(data.ws.root) == [(server.batch_creations[0], "submitted")]
                ),
                "the batch to be submitted and recorded",
                60,
            )
            wait_for(
                lambda: sum(r.path.endswith(server.batch_creations[0]) for r in server.requests) >= 2,
                "the child to poll the batch",
            )

        killed_cli(args, submitted_and_polled)
        assert not (tmp_path / "out").exists()

        server.end_batches()
        assert main(args) == 0
        assert len(server.batch_creations) == 1  # collected, not submitted again
    files = verdict_files(tmp_path / "out")
    assert len(files) == len(data.items) and all("success" in body for body in files.values())
    assert batch_rows(data.ws.root) == [(server.batch_creations[0], "collected")]
    with JudgeCache(data.ws.cache_path) as cache:
        assert cache.stats().entries == len(data.items)
