"""Warm-up and telemetry (issue 23, point 3): the fake's rule "an entry is readable only once the
writing response has begun", single-flight per item prefix through the real SDKs against the fake
server, the batch warm-up (and ``--batch-cold``), and the planned-vs-billed cache-read warning."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from optimizer.cli import main
from optimizer.devset.importer import import_split
from optimizer.evaluation.batch import BatchOptions
from optimizer.evaluation.conversation import Conversations
from optimizer.evaluation.evaluator import PassOptions, evaluate_items
from optimizer.evaluation.judging import ItemJudge
from optimizer.evaluation.results import EvalRun
from optimizer.evaluation.warmup import LOW_READS_SHARE, PrefixWarmth
from optimizer.judge.prompts import JUDGE_TOML, RUBRIC_MD, PromptSet
from optimizer.scaffold import init_workspace
from optimizer.workspace.config import JudgeSection
from optimizer.workspace.workspace import Workspace
from tests.support.config import with_layout, write_config
from tests.support.data import make_items, write_release
from tests.support.fakecache import ManualClock, PromptCache
from tests.support.fakeserver import Behaviour, FakeLLMServer, RecordedRequest, server_error, verdict_reply

MODELS = {"anthropic": "claude-sonnet-4-5", "openai": "gpt-5"}
SECRET = "sk-test-warmup-0123456789"
ITEMS = 3  # make_items(n) pairs: 2n items
# Long enough that the three calls of an item, sent together, are all in the server at once.
DELAY_S = 0.3


@pytest.fixture(autouse=True)
def keys(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", SECRET)
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)


def slow_verdicts(_request: RecordedRequest) -> Behaviour:
    return verdict_reply(delay_s=DELAY_S)


class Setup:
    """A workspace whose long items (14 steps with screenshots) are cacheable on both wires."""

    def __init__(self, tmp_path: Path, n_pairs: int = ITEMS) -> None:
        self.ws = init_workspace(tmp_path / "ws")
        items = make_items(n_pairs, n_steps=14)
        for i, item in enumerate(items):
            item.instruction = f"{item.instruction} Task number {i:03d}."
        release = write_release(tmp_path / "release", items)
        self.split = import_split(self.ws, release.root, "long", all_items=True, warn=lambda _msg: None)

    def prompts(self, rubric_note: str = "", layout: str = "trajectory-first") -> PromptSet:
        files = dict(PromptSet.from_dir(self.ws.prompts_dir).files)
        files[JUDGE_TOML] = with_layout(files[JUDGE_TOML], layout)
        files[RUBRIC_MD] = files[RUBRIC_MD] + rubric_note
        return PromptSet.from_files(files)

    def judge(self, server: FakeLLMServer, wire: str, concurrency: int = 8) -> JudgeSection:
        base_url = server.anthropic_base_url if wire == "anthropic" else server.openai_base_url
        return JudgeSection.model_validate(
            {
                "provider": wire,
                "model": MODELS[wire],
                "base_url": base_url,
                "max_concurrency": concurrency,
                "max_retries": 0,
            }
        )

    def evaluate(
        self,
        server: FakeLLMServer,
        wire: str,
        prompts: PromptSet,
        *,
        replicates: int = 3,
        batch: BatchOptions | None = None,
    ) -> EvalRun:
        return asyncio.run(
            evaluate_items(
                self.ws,
                self.split,
                prompts,
                self.judge(server, wire),
                item_ids=self.split.ids,
                replicates=replicates,
                options=PassOptions(batch=batch),
            )
        )


def writes_per_item(server: FakeLLMServer) -> list[int]:
    assert server.prompt_cache is not None
    return server.prompt_cache.write_counts()


# --------------------------------------------------------------------------- the fake's visibility rule


def _body(tail: str) -> dict[str, Any]:
    eph = {"type": "ephemeral", "ttl": "1h"}
    return {
        "model": "claude-sonnet-4-5",
        "system": [{"type": "text", "text": "static", "cache_control": eph}],
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "t" * 8000, "cache_control": eph},
                    {"type": "text", "text": tail},
                ],
            }
        ],
    }


def _openai_body(tail: str) -> dict[str, Any]:
    return {
        "model": "gpt-5",
        "messages": [{"role": "system", "content": "static"}, {"role": "user", "content": "t" * 8000 + tail}],
    }


def test_a_write_is_readable_only_once_its_response_has_begun() -> None:
    cache = PromptCache(clock=ManualClock())
    first = cache.begin_anthropic(_body("one"))
    overlapping = cache.begin_anthropic(_body("two"))  # arrived before the first's response began
    assert (
        first.usage.cache_write_tokens > 0
        and overlapping.usage.cache_write_tokens == first.usage.cache_write_tokens
    )
    assert overlapping.usage.cache_read_tokens == 0
    first.commit()
    overlapping.commit()
    later = cache.anthropic(_body("three"))  # after a response began: it reads
    assert later.cache_read_tokens == first.usage.cache_write_tokens and later.cache_write_tokens == 0
    assert cache.write_counts() == [2]

    cache = PromptCache(clock=ManualClock())
    a = cache.begin_openai(_openai_body("one"))
    b = cache.begin_openai(_openai_body("two"))
    assert a.usage.cache_read_tokens == b.usage.cache_read_tokens == 0
    a.commit()
    assert cache.openai(_openai_body("three")).cache_read_tokens >= 1024
    b.commit()
    assert cache.write_counts() == [2]


# --------------------------------------------------------------------------- single-flight, direct calls


@pytest.mark.slow
@pytest.mark.parametrize("wire", ["anthropic", "openai"])
def test_replicates_sent_together_pay_one_write_per_item_not_three(
    wire: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    setup = Setup(tmp_path)
    n = len(setup.split.ids)
    with FakeLLMServer(slow_verdicts, prompt_cache=PromptCache(clock=ManualClock())) as server:
        run = setup.evaluate(server, wire, setup.prompts())
        assert writes_per_item(server) == [1] * n
        assert len(server.replies) == 3 * n and run.calls_made == 3 * n
        # The followers read what the leader wrote, as the plan expects: no warning.
        assert not run.cache_reads.low and run.cache_reads.billed >= run.cache_reads.planned > 0
        assert not any("warning" in note for note in run.notes)
    # Before: without single-flight the three calls of an item overlap and each pays the write.
    monkeypatch.setattr(ItemJudge, "prefix_key", lambda _self, _request: None)
    old = Setup(tmp_path / "old")
    with FakeLLMServer(slow_verdicts, prompt_cache=PromptCache(clock=ManualClock())) as server:
        before = old.evaluate(server, wire, old.prompts())
        assert sum(writes_per_item(server)) > n and max(writes_per_item(server)) == 3
    assert [i.answer for i in before.items] == [i.answer for i in run.items]  # the same verdicts


def test_a_failed_leader_hands_the_prefix_to_a_follower_and_every_call_is_made(tmp_path: Path) -> None:
    setup = Setup(tmp_path, n_pairs=1)
    n = len(setup.split.ids)
    with FakeLLMServer(slow_verdicts, prompt_cache=PromptCache(clock=ManualClock())) as server:
        server.script(server_error(500))  # the first leader's call fails (no SDK retries)
        run = setup.evaluate(server, "anthropic", setup.prompts())
    assert len(server.replies) == 3 * n - 1  # every call was made; one failed
    assert writes_per_item(server) == [1] * n  # the next leader wrote it once, the rest read
    assert sum(1 for item in run.items if item.infra_error) == 1


def test_the_registry_lets_one_lead_and_the_rest_wait_for_its_answer() -> None:
    async def scenario() -> list[str]:
        warmth = PrefixWarmth(clock=ManualClock())
        order: list[str] = []

        async def call(name: str) -> None:
            lead = warmth.try_lead("p") or (not warmth.is_warm("p") and await warmth.wait_turn("p"))
            order.append(f"{name} starts{' (leads)' if lead else ''}")
            await asyncio.sleep(0)
            if lead:
                warmth.done("p", answered=True, ttl="1h")

        await asyncio.gather(call("a"), call("b"), call("c"))
        return order

    order = asyncio.run(scenario())
    assert order[0] == "a starts (leads)" and sorted(order[1:]) == ["b starts", "c starts"]


# --------------------------------------------------------------------------- telemetry


@pytest.mark.slow
def test_the_warning_fires_on_a_cold_pass_and_not_on_a_warm_one(tmp_path: Path) -> None:
    setup = Setup(tmp_path)
    with FakeLLMServer(slow_verdicts, prompt_cache=PromptCache(clock=ManualClock())) as server:
        setup.evaluate(server, "anthropic", setup.prompts(), replicates=1)
        warm = setup.evaluate(server, "anthropic", setup.prompts("\n- Rule one.\n"), replicates=1)
        assert warm.cache_reads.planned > 0 and not warm.cache_reads.low
        assert not any("warning" in note for note in warm.notes)
        assert server.prompt_cache is not None
        server.prompt_cache.clear()  # the provider lost every entry (eviction, another server)
        cold = setup.evaluate(server, "anthropic", setup.prompts("\n- Rule two.\n"), replicates=1)
    assert cold.cache_reads.billed < LOW_READS_SHARE * cold.cache_reads.planned
    warning = next(note for note in cold.notes if note.startswith("warning:"))
    assert f"{cold.cache_reads.billed:,} cache-read tokens of {cold.cache_reads.planned:,} planned" in warning


# --------------------------------------------------------------------------- batches, through the CLI


def cli_workspace(tmp_path: Path, server: FakeLLMServer) -> tuple[Setup, list[str]]:
    setup = Setup(tmp_path)
    cfg = Workspace.open(setup.ws.root).config
    judge = cfg.judge.model_copy(
        update={
            "provider": "anthropic",
            "model": MODELS["anthropic"],
            "max_retries": 0,
            "batch_poll_s": 0.01,
            "batch_poll_max_s": 0.04,
            "max_concurrency": 8,
        }
    )
    write_config(
        setup.ws.root,
        cfg.model_copy(
            update={"judge": judge, "workspace": cfg.workspace.model_copy(update={"dev_split": "long"})}
        ),
    )
    toml = setup.ws.prompts_dir / "judge.toml"
    toml.write_text(with_layout(toml.read_text(), "trajectory-first"))
    args = [
        "eval",
        "-w",
        str(setup.ws.root),
        "--base-url",
        server.anthropic_base_url,
        "--replicates",
        "3",
        "--batch",
        "--json",
    ]
    return setup, args


@pytest.mark.slow
def test_a_batch_pass_warms_its_cold_items_first_unless_batch_cold(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with FakeLLMServer(prompt_cache=PromptCache(clock=ManualClock()), batch_polls=1) as server:
        setup, args = cli_workspace(tmp_path / "warm", server)
        assert main(args) == 0
        n = len(setup.split.ids)
        captured = capsys.readouterr()
        assert writes_per_item(server) == [1] * n
        direct = [r for r in server.inference_requests() if r.batch_id is None]
        assert len(direct) == n and len(server.batch_creations) == 1  # one warm-up each, then one batch
        assert len(server.batch_entries(server.batch_creations[0])) == 2 * n
        assert "warning: the provider billed" not in captured.err
        assert f"warmed {n} cold item(s)" in captured.err
        assert json.loads(captured.out)  # the result is still one JSON object on stdout
    with FakeLLMServer(prompt_cache=PromptCache(clock=ManualClock()), batch_polls=1) as server:
        setup, args = cli_workspace(tmp_path / "cold", server)
        assert main([*args, "--batch-cold"]) == 0
        captured = capsys.readouterr()
        assert writes_per_item(server) == [3] * n  # the batch's entries run together: each writes
        assert not [r for r in server.inference_requests() if r.batch_id is None]
        assert "warning: the provider billed 0 cache-read tokens" in captured.err


def test_batch_cold_is_on_eval_run_and_confirm_with_its_default_in_the_help(
    capsys: pytest.CaptureFixture[str],
) -> None:
    for command in ("eval", "run", "confirm"):
        with pytest.raises(SystemExit):
            main([command, "--help"])
        out = capsys.readouterr().out
        assert "--batch-cold" in out and "default: warm first" in " ".join(out.split())


# --------------------------------------------------------------------------- the loop: ledger, report, stderr


def loop_workspace(tmp_path: Path, server: FakeLLMServer) -> Setup:
    setup = Setup(tmp_path)
    cfg = Workspace.open(setup.ws.root).config
    judge = cfg.judge.model_copy(
        update={
            "provider": "anthropic",
            "model": MODELS["anthropic"],
            "max_retries": 0,
            "base_url": server.anthropic_base_url,
        }
    )
    write_config(
        setup.ws.root,
        cfg.model_copy(
            update={"judge": judge, "workspace": cfg.workspace.model_copy(update={"dev_split": "long"})}
        ),
    )
    toml = setup.ws.prompts_dir / "judge.toml"
    toml.write_text(with_layout(toml.read_text(), "trajectory-first"))
    from tests.support.loop import commit_all

    commit_all(setup.ws.root, "judge trajectory-first against the fake")
    return setup


@pytest.mark.slow
@pytest.mark.parametrize("cleared", [False, True])
def test_a_run_records_planned_reads_and_warns_on_stderr_when_the_cache_was_lost(
    cleared: bool, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cache = PromptCache(clock=ManualClock())
    seen: list[RecordedRequest] = []

    def judge(request: RecordedRequest) -> Behaviour:
        seen.append(request)
        if cleared and len(seen) == n + 1:  # the candidate's first call: the provider lost every entry
            cache.clear()
        return verdict_reply()

    with FakeLLMServer(judge, prompt_cache=cache) as server:
        setup = loop_workspace(tmp_path, server)
        n = len(setup.split.ids)
        code = main(
            [
                "run",
                "-w",
                str(setup.ws.root),
                "--strategy",
                "library",
                "--max-experiments",
                "1",
                "--policy",
                "paired",
            ]
        )
        assert code == 0, capsys.readouterr().err
        run_err = capsys.readouterr().err
        assert main(["report", "-w", str(setup.ws.root)]) == 0
        report = capsys.readouterr().out
    from optimizer.ledger import Ledger

    with Ledger.open_readonly(setup.ws.ledger_path) as ledger:
        [run] = ledger.runs()
        baseline, candidate = ledger.experiments(run.id)
    assert baseline.planned_cache_read_tokens == 0  # every item's first call writes its prefix
    assert candidate.planned_cache_read_tokens > 0
    assert (
        f"cache reads: {candidate.cache_read_tokens:,} billed of {candidate.planned_cache_read_tokens:,}"
        in report
    )
    screen = experiment_screen(setup.ws.root, candidate.id)
    assert (
        f"cache reads: {candidate.cache_read_tokens:,} billed of {candidate.planned_cache_read_tokens:,}"
        in screen
    )
    assert ("WARNING below plan" in screen) is cleared
    if cleared:
        assert candidate.cache_read_tokens < LOW_READS_SHARE * candidate.planned_cache_read_tokens
        assert f"experiment {candidate.id}: warning: the provider billed" in run_err
        assert "WARNING below plan" in report
    else:
        assert candidate.cache_read_tokens >= candidate.planned_cache_read_tokens
        assert "warning: the provider billed" not in run_err and "WARNING below plan" not in report


def experiment_screen(ws_root: Path, experiment_id: int) -> str:
    """The text the TUI's experiment view shows for ``experiment_id`` (headless, one screenshot)."""
    import html
    import re

    from tui.app import JudgeloopApp, settle

    app = JudgeloopApp(
        ws_root, image_mode="halfcell", watch=False, experiment_id=experiment_id, start_view="experiment"
    )
    shot: list[str] = []

    async def go() -> None:
        async with app.run_test(size=(200, 60)) as pilot:
            await settle(app, pilot)
            shot.append(app.export_screenshot())

    asyncio.run(go())
    runs = re.findall(r"<text[^>]*>([^<]*)</text>", shot[0])
    return " ".join(html.unescape("".join(runs)).replace("\xa0", " ").split())


def test_ctrl_c_while_followers_wait_leaves_nothing_behind_and_the_next_pass_runs(tmp_path: Path) -> None:
    setup = Setup(tmp_path, n_pairs=1)
    n = len(setup.split.ids)

    import threading

    arrived: list[RecordedRequest] = []
    leaders_in = threading.Event()

    def slow_leaders(request: RecordedRequest) -> Behaviour:
        arrived.append(request)
        if len(arrived) == n:
            leaders_in.set()
        return verdict_reply(delay_s=5.0)  # cut short when the server stops

    with FakeLLMServer(slow_leaders, prompt_cache=PromptCache(clock=ManualClock())) as server:

        async def interrupted() -> None:
            judge = setup.judge(server, "anthropic")
            task = asyncio.create_task(
                evaluate_items(
                    setup.ws, setup.split, setup.prompts(), judge, item_ids=setup.split.ids, replicates=3
                )
            )
            assert await asyncio.to_thread(leaders_in.wait, 60)
            task.cancel()  # what Ctrl-C does to the evaluation: each item's followers wait for its leader
            with pytest.raises(asyncio.CancelledError):
                await task

        asyncio.run(interrupted())
        assert len(server.inference_requests()) == n  # only the leaders went out
        server.default = slow_verdicts
        run = setup.evaluate(
            server, "anthropic", setup.prompts()
        )  # a new event loop: nobody waits on the old one
    assert all(not item.infra_error for item in run.items) and len(run.items) == n


def test_a_batch_warm_up_is_reserved_and_charged_like_any_call(tmp_path: Path) -> None:
    from optimizer.evaluation.budget import Budget

    setup = Setup(tmp_path, n_pairs=1)
    n = len(setup.split.ids)
    budget = Budget(10.0)
    with FakeLLMServer(prompt_cache=PromptCache(clock=ManualClock()), batch_polls=1) as server:
        judge = setup.judge(server, "anthropic")
        charged = asyncio.run(
            evaluate_items(
                setup.ws,
                setup.split,
                setup.prompts(),
                judge,
                item_ids=setup.split.ids,
                replicates=3,
                options=PassOptions(budget=budget, batch=BatchOptions(poll_s=0.01)),
            )
        )
        direct = [r for r in server.inference_requests() if r.batch_id is None]
    assert len(direct) == n and charged.calls_made == 3 * n
    assert budget.spent_usd == pytest.approx(charged.cost_usd)  # warm-ups and batch entries alike
    # A budget below one warm-up: nothing is sent, the pass stops on the budget.
    tiny = Budget(1e-6)
    setup3 = Setup(tmp_path / "tiny", n_pairs=1)  # fresh: nothing cached, every prefix cold
    with FakeLLMServer(prompt_cache=PromptCache(clock=ManualClock()), batch_polls=1) as server:
        judge = setup3.judge(server, "anthropic")
        stopped = asyncio.run(
            evaluate_items(
                setup3.ws,
                setup3.split,
                setup3.prompts(),
                judge,
                item_ids=setup3.split.ids,
                replicates=3,
                options=PassOptions(budget=tiny, batch=BatchOptions(poll_s=0.01)),
            )
        )
        assert server.inference_requests() == [] and server.batch_creations == []
    assert stopped.stop is not None and stopped.stop.kind.value == "budget"


@pytest.mark.slow
def test_agentic_conversations_of_one_item_pay_one_write_for_its_opening(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.support.fakeserver import ToolCall, reply

    def submits(_request: RecordedRequest) -> Behaviour:
        return reply(
            None,
            delay_s=DELAY_S,
            tool_calls=[
                ToolCall(
                    "submit_verdict",
                    {"success": True, "reasoning": "checked", "confidence": "high", "mistake_type": None},
                )
            ],
        )

    setup = Setup(tmp_path, n_pairs=1)
    n = len(setup.split.ids)
    files = dict(setup.prompts().files)
    files[JUDGE_TOML] = files[JUDGE_TOML].replace('mode = "direct"', 'mode = "agentic"')
    agentic = PromptSet.from_files(files)
    assert agentic.settings.mode == "agentic" and agentic.trajectory_first
    with FakeLLMServer(submits, prompt_cache=PromptCache(clock=ManualClock())) as server:
        run = setup.evaluate(server, "anthropic", agentic)
        assert len(server.replies) == 3 * n and all(not item.infra_error for item in run.items)
        assert writes_per_item(server) == [1] * n
    monkeypatch.setattr(Conversations, "opening_prefix_key", lambda _self, _task: None)  # before: all at once
    old = Setup(tmp_path / "old", n_pairs=1)
    with FakeLLMServer(submits, prompt_cache=PromptCache(clock=ManualClock())) as server:
        old.evaluate(server, "anthropic", agentic)
        assert max(writes_per_item(server)) == 3


def test_batch_cold_without_batch_is_refused_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    setup = Setup(tmp_path, n_pairs=1)
    assert main(["eval", "-w", str(setup.ws.root), "--split", "long", "--batch-cold"]) == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines() == [
        "judgeloop: error: --batch-cold applies to a batch pass only: add --batch, or drop --batch-cold"
    ]


@pytest.mark.slow
@pytest.mark.parametrize("caching", [False, True])
def test_a_server_that_never_reads_the_cache_is_warned_about_twice_a_run_then_silenced(
    caching: bool, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """No prompt cache at the fake (a self-hosted server without prefix caching): every candidate pass
    plans reads and is billed none. The first two such passes are said, the second saying why no more
    will be; the ledger keeps every pass's figures. A server that cached, then keeps nothing, is still
    warned about every pass that lost it."""
    cache = PromptCache(clock=ManualClock()) if caching else None
    seen: list[RecordedRequest] = []

    def judge(request: RecordedRequest) -> Behaviour:
        seen.append(request)
        if cache is not None and len(seen) > 2 * n:  # from then on the server keeps no entry
            cache.clear()
        return verdict_reply()

    with FakeLLMServer(judge, prompt_cache=cache) as server:
        setup = loop_workspace(tmp_path, server)
        n = len(setup.split.ids)
        code = main(
            [
                "run",
                "-w",
                str(setup.ws.root),
                "--strategy",
                "library",
                "--max-experiments",
                "4",
                "--policy",
                "paired",
            ]
        )
        assert code == 0, capsys.readouterr().err
        run_err = capsys.readouterr().err
    from optimizer.ledger import Ledger

    with Ledger.open_readonly(setup.ws.ledger_path) as ledger:
        [run] = ledger.runs()
        candidates = [e for e in ledger.experiments(run.id) if e.seq > 0]
    said = [line for line in run_err.splitlines() if "warning: the provider billed" in line]
    low = [
        e
        for e in candidates
        if e.planned_cache_read_tokens > 0
        and e.cache_read_tokens < LOW_READS_SHARE * e.planned_cache_read_tokens
    ]
    if caching:  # reads were billed before the cache went: every pass after is said
        assert candidates[0].cache_read_tokens > 0 and low and len(said) == len(low), (said, low)
        assert not any("says it no more" in line for line in said)
        return
    assert len(low) == 4 and not any(e.cache_read_tokens for e in low)  # every pass, all in the ledger
    assert len(said) == 2 and "says it no more" not in said[0] and "this run says it no more" in said[1], said
