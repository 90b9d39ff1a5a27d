"""One call per cache key at a time (`ItemJudge._call`): evaluations that run at once in one process and
need the same judgement (a wave's candidates re-judging the incumbent on an item they both disagree
on) pay it once; the second waits for the first and takes the answer from the cache, a hit on its own
figures. Through the real openai SDK against the fake server; a failed or cancelled first call leaves
the second to make its own."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest

from optimizer.devset.importer import import_split
from optimizer.devset.split import Split
from optimizer.evaluation.cache import JudgeCache
from optimizer.evaluation.evaluator import PassOptions, evaluate_items
from optimizer.evaluation.results import EvalRun
from optimizer.judge.prompts import PromptSet
from optimizer.judge.providers import make_provider
from optimizer.scaffold import init_workspace
from optimizer.workspace.config import JudgeSection
from optimizer.workspace.workspace import Workspace
from tests.support.data import make_items, write_release
from tests.support.fakeserver import Behaviour, FakeLLMServer, RecordedRequest, error, verdict_reply

SECRET = "sk-test-flight-0123456789"


@pytest.fixture(autouse=True)
def keys(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)


def _setup(tmp_path: Path) -> tuple[Workspace, Split, PromptSet]:
    ws = init_workspace(tmp_path / "ws")
    items = make_items(2, n_steps=3)
    for i, item in enumerate(items):  # each its own request (the sample pairs render alike)
        item.instruction = f"{item.instruction} Task number {i:03d}."
    release = write_release(tmp_path / "release", items)
    split = import_split(ws, release.root, "s", all_items=True, warn=lambda _msg: None)
    return ws, split, PromptSet.from_dir(ws.prompts_dir)


def _judge(server: FakeLLMServer) -> JudgeSection:
    return JudgeSection.model_validate(
        {
            "provider": "openai",
            "model": "gpt-5",
            "base_url": server.openai_base_url,
            "max_concurrency": 4,
            "max_retries": 0,
        }
    )


async def _together(
    ws: Workspace, split: Split, prompts: PromptSet, server: FakeLLMServer, n: int = 2
) -> list[EvalRun]:
    """``n`` evaluations of the same prompts at once, sharing one provider and one cache (as a wave's)."""
    judge = _judge(server)
    provider = make_provider(judge)
    with JudgeCache(ws.cache_path) as cache:
        try:
            return list(
                await asyncio.gather(
                    *(
                        evaluate_items(
                            ws,
                            split,
                            prompts,
                            judge,
                            item_ids=split.ids,
                            replicates=2,
                            options=PassOptions(provider=provider, cache=cache),
                        )
                        for _ in range(n)
                    )
                )
            )
        finally:
            await provider.aclose()


def test_two_evaluations_needing_the_same_calls_at_once_pay_each_once(tmp_path: Path) -> None:
    ws, split, prompts = _setup(tmp_path)
    with FakeLLMServer(lambda _r: verdict_reply(delay_s=0.2)) as server:
        runs = asyncio.run(_together(ws, split, prompts, server))
        received = len(server.inference_requests())
    calls = 2 * len(split.ids)
    assert received == calls  # each judgement asked for once
    assert sum(r.calls_made for r in runs) == calls and sum(r.cache_hits for r in runs) == calls
    assert sum(r.cost_usd for r in runs) == pytest.approx(sum(r.usage.cost_usd for r in runs))
    assert [i.answer for i in runs[0].items] == [i.answer for i in runs[1].items]


def test_a_failed_first_call_leaves_the_waiting_one_to_make_its_own(tmp_path: Path) -> None:
    ws, split, prompts = _setup(tmp_path)
    with FakeLLMServer(lambda _r: verdict_reply(delay_s=0.2)) as server:
        # The first call that arrives fails, late (the other evaluation's is waiting on it; no SDK retries).
        server.script(error(500, message="internal error (fake)", delay_s=0.3))
        runs = asyncio.run(_together(ws, split, prompts, server))
        received = len(server.inference_requests())
    calls = 2 * len(split.ids)
    assert received == calls + 1  # the failed one, then the waiting one's own call for that key
    infra = [i for r in runs for i in r.items if i.infra_error]
    assert len(infra) == 1  # only the evaluation whose call failed sees the failure
    assert sum(r.calls_made for r in runs) == calls  # the failed one is not billed


@pytest.mark.slow
def test_a_cancelled_first_evaluation_lets_the_waiting_one_finish(tmp_path: Path) -> None:
    ws, split, prompts = _setup(tmp_path)
    first_in = threading.Event()

    def slow(_request: RecordedRequest) -> Behaviour:
        first_in.set()
        return verdict_reply(delay_s=0.5)

    with FakeLLMServer(slow) as server:

        async def scenario() -> EvalRun:
            judge = _judge(server)
            provider = make_provider(judge)
            with JudgeCache(ws.cache_path) as cache:
                try:

                    def one() -> asyncio.Task[EvalRun]:
                        return asyncio.create_task(
                            evaluate_items(
                                ws,
                                split,
                                prompts,
                                judge,
                                item_ids=split.ids,
                                replicates=2,
                                options=PassOptions(provider=provider, cache=cache),
                            )
                        )

                    leader = one()
                    assert await asyncio.to_thread(first_in.wait, 60)
                    follower = one()
                    await asyncio.sleep(0.05)  # the follower is waiting on the leader's calls
                    leader.cancel()
                    with pytest.raises(asyncio.CancelledError):
                        await leader
                    return await asyncio.wait_for(follower, 60)  # not left waiting on a call that ended
                finally:
                    await provider.aclose()

        run = asyncio.run(scenario())
    assert len(run.items) == len(split.ids) and not any(i.infra_error for i in run.items)
