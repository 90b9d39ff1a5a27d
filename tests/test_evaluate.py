"""Evaluation: concurrency, cache, replicates, infra errors, budgets, early stop, result files, `eval`.

Two kinds of test. The evaluator's own logic (ordering, the concurrency limit, budgets, early
stopping) is checked with a small in-test `Provider`. Everything a user would see end to end goes
through the real ``openai``/``anthropic`` SDK clients against the fake server in tests/support/fakeserver.py.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from optimizer.cli import main
from optimizer.cli.progress import StderrProgress
from optimizer.devset.labels import load_labels
from optimizer.errors import UserError
from optimizer.evaluation.budget import Budget
from optimizer.evaluation.cache import JudgeCache
from optimizer.evaluation.evaluator import PassOptions, evaluate_items
from optimizer.evaluation.files import write_results
from optimizer.evaluation.results import EvalRun, ItemResult
from optimizer.judge.types import (
    InfrastructureError,
    JudgeRequest,
    ProviderTraits,
)
from optimizer.stats.metrics import score
from optimizer.workspace.config import JudgeSection, Price
from tests.support.evaluation import (
    MODEL,
    SECRET,
    Data,
    InTestProvider,
    by_label,
    judge,
    make_data,
    verdict_text,
    write_config,
)
from tests.support.fakeserver import FakeLLMServer, RecordedRequest, server_error, verdict_reply


@pytest.fixture
def data(tmp_path: Path) -> Data:
    return make_data(tmp_path)


def run_eval(data: Data, provider: Any, **kwargs: Any) -> EvalRun:
    item_ids = kwargs.pop("item_ids", data.split.ids)
    replicates = kwargs.pop("replicates", 1)
    j = kwargs.pop("judge", judge())
    return asyncio.run(
        evaluate_items(
            data.ws,
            data.split,
            data.prompts,
            j,
            item_ids=item_ids,
            replicates=replicates,
            options=PassOptions(provider=provider, **kwargs),
        )
    )


# --------------------------------------------------------------------------- the evaluator's own logic


def test_calls_respect_the_concurrency_limit_and_start_in_item_order(tmp_path: Path) -> None:
    data = make_data(tmp_path, n_pairs=3)  # 12 items
    provider = InTestProvider(lambda r: verdict_text(True), delay=0.02)
    run = run_eval(data, provider, judge=judge(max_concurrency=3))
    assert provider.max_in_flight <= 3
    assert provider.max_in_flight >= 2  # it does run concurrently
    assert [data.request_item(r).trajectory_id for r in provider.calls] == data.split.ids
    assert [item.trajectory_id for item in run.items] == data.split.ids
    assert run.calls_made == 12 and run.cache_hits == 0


def test_replicates_are_separate_calls_with_majority_and_instability(data: Data) -> None:
    target = data.items[0].trajectory_id
    seen: dict[str, int] = {}

    def decide(request: JudgeRequest) -> str:
        item = data.request_item(request)
        seen[item.trajectory_id] = seen.get(item.trajectory_id, 0) + 1
        # The target item says yes, no, yes: majority yes, unstable.
        if item.trajectory_id == target:
            return verdict_text(seen[target] != 2)
        return verdict_text(False, "Critical Mistake")

    provider = InTestProvider(decide)
    run = run_eval(data, provider, judge=judge(max_concurrency=1), replicates=3)
    assert set(seen.values()) == {3}
    by_id = {item.trajectory_id: item for item in run.items}
    assert by_id[target].answer.success is True and by_id[target].unstable
    assert len({r.cache_key for r in by_id[target].replicates}) == 3
    others = [item for tid, item in by_id.items() if tid != target]
    assert all(item.answer.success is False and not item.unstable for item in others)
    assert all(item.answer.mistake_type == "Critical Mistake" for item in others)


def test_infrastructure_error_is_reported_apart_not_cached_and_rerun(data: Data) -> None:
    broken = data.items[1].trajectory_id

    def decide(request: JudgeRequest) -> str | Exception:
        if data.request_item(request).trajectory_id == broken:
            return InfrastructureError("server error 500 after 2 retries")
        return verdict_text(True)

    provider = InTestProvider(decide)
    first = run_eval(data, provider)
    assert first.infra_error_ids == [broken]
    assert first.answers()[broken].status == "infra_error"
    assert first.calls_made == len(data.items) - 1

    # Next time only the failed item is called again.
    healed = InTestProvider(lambda r: verdict_text(True))
    second = run_eval(data, healed)
    assert [data.request_item(r).trajectory_id for r in healed.calls] == [broken]
    assert second.infra_error_ids == [] and second.cache_hits == len(data.items) - 1


def test_user_error_from_the_provider_surfaces_as_is(data: Data) -> None:
    provider = InTestProvider(lambda r: UserError("model 'nope' not found at the server; check --model"))
    with pytest.raises(UserError, match="not found"):
        run_eval(data, provider)


def test_provider_made_by_evaluate_is_closed_after_a_user_error(
    data: Data, monkeypatch: pytest.MonkeyPatch
) -> None:
    made: list[InTestProvider] = []

    def fake_make_provider(_judge: JudgeSection, **_options: object) -> InTestProvider:
        made.append(InTestProvider(lambda r: UserError("OPENAI_API_KEY is rejected; export a valid key")))
        return made[-1]

    monkeypatch.setattr("optimizer.judge.providers.make_provider", fake_make_provider)
    with pytest.raises(UserError):
        asyncio.run(
            evaluate_items(data.ws, data.split, data.prompts, judge(), item_ids=data.split.ids, replicates=1)
        )
    assert made and made[0].closed


def test_on_item_stops_early_and_never_starts_the_rest(tmp_path: Path) -> None:
    data = make_data(tmp_path, n_pairs=3)  # 12 items
    provider = InTestProvider(lambda r: verdict_text(True), delay=0.01)
    completed: list[str] = []

    def on_item(result: ItemResult) -> bool:
        completed.append(result.trajectory_id)
        return len(completed) == 2

    run = run_eval(data, provider, judge=judge(max_concurrency=2), on_item=on_item)
    assert run.stopped_early and "stopped early" in (run.stop_reason or "")
    assert len(run.items) == 2
    called = {data.request_item(r).trajectory_id for r in provider.calls}
    # Only the items within the concurrency window at the stop were ever started.
    assert called <= set(data.split.ids[:4])
    # Every call that was made was answered and is counted and cached, including one still in flight
    # when the rule was met: a provider bills it either way.
    assert run.calls_made == len(provider.calls) >= 2
    with JudgeCache(data.ws.cache_path) as cache:
        assert cache.stats().entries == len(provider.calls)
    assert set(run.not_evaluated) == set(data.split.ids) - {item.trajectory_id for item in run.items}


def test_budget_stops_before_a_call_that_would_cross_it(data: Data) -> None:
    # Input tokens free, output $1/M: a call is estimated at max_tokens (1024) output tokens, $1024e-6,
    # and really costs its 200 output tokens, $200e-6 — numbers that do not depend on the renderer.
    priced = dataclasses.replace(
        data.ws, config=data.ws.config.model_copy(update={"prices": {MODEL: Price(input=0.0, output=1.0)}})
    )
    assert data.prompts.settings.sampling().max_tokens == 1024  # the bundled judge.toml
    provider = InTestProvider(lambda r: verdict_text(True))
    budget = Budget(max_usd=1500e-6)
    run = asyncio.run(
        evaluate_items(
            priced,
            data.split,
            data.prompts,
            judge(max_concurrency=1),
            item_ids=data.split.ids,
            replicates=1,
            options=PassOptions(provider=provider, budget=budget),
        )
    )
    # Call k is made iff (k-1)·200 + 1024 ≤ 1500 (µ$): 1024, 1224, 1424 fit; the 4th (1624) would not.
    assert run.calls_made == len(provider.calls) == 3
    assert budget.spent_usd == pytest.approx(600e-6)
    assert run.stopped_early and "budget" in (run.stop_reason or "")
    assert len(run.items) == 3 and len(run.not_evaluated) == len(data.items) - 3
    assert not set(run.not_evaluated) & {i.trajectory_id for i in run.items}

    # Cached calls need no budget: an exhausted budget still replays what is cached.
    again = InTestProvider(lambda r: verdict_text(True))
    replay = run_eval(data, again, judge=judge(max_concurrency=1), budget=Budget(max_usd=0.0))
    assert replay.cache_hits == run.calls_made and again.calls == []


# --------------------------------------------------------------------------- end to end, real SDKs


@pytest.fixture
def server() -> Any:
    with FakeLLMServer() as srv:
        yield srv


def openai_judge(server: FakeLLMServer, **update: Any) -> JudgeSection:
    return judge(base_url=server.openai_base_url, max_retries=0, timeout_s=10, **update)


def test_openai_eval_writes_files_and_second_run_makes_no_http_call(
    data: Data, server: FakeLLMServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    broken, garbled = data.items[1].trajectory_id, data.items[2].trajectory_id
    server.default = by_label(data, broken=broken, garbled=garbled)
    j = openai_judge(server)

    run = asyncio.run(
        evaluate_items(data.ws, data.split, data.prompts, j, item_ids=data.split.ids, replicates=1)
    )
    out = write_results(tmp_path / "out", run)
    n = len(data.items)
    assert len(server.inference_requests()) == n
    assert all(r.api_key_present for r in server.inference_requests())

    files = sorted(p.name for p in out.iterdir())
    assert "_summary.json" in files
    assert f"{broken}.json" not in files  # infra errors get no verdict file
    assert len(files) == n  # n-1 verdict files + the summary
    good = json.loads((out / f"{data.items[0].trajectory_id}.json").read_text())
    assert (
        good["success"] is True and good["_meta"]["model"] == MODEL and good["_meta"]["parse_status"] == "ok"
    )
    # Where the official compare_runs.py reads usage, turns and tool calls.
    assert good["_meta"]["raw"] == {
        "usage": {"input_tokens": 1000, "output_tokens": 50},
        "turns": 1,
        "tool_calls": 0,
    }
    assert good["_meta"]["input_tokens"] == 1000 and good["_meta"]["output_tokens"] == 50
    bad = json.loads((out / f"{garbled}.json").read_text())
    assert "success" not in bad and bad["raw_response"] == "I think it worked, probably."
    assert bad["_meta"]["parse_status"] == "parse_error"

    summary = json.loads((out / "_summary.json").read_text())
    assert summary["format_version"] == 1  # a script reading it can tell the shape it was written in
    assert summary["infra_error_ids"] == [broken]
    assert summary["counts"]["parse_failures"] == 1 and summary["counts"]["calls_made"] == n - 1
    assert summary["prompt_hash"] == data.prompts.prompt_hash() and summary["model"] == MODEL
    # The official analysis step finds the Markdown it remaps ids with here (`md_dir`).
    md_dir = Path(summary["md_dir"])
    assert md_dir.is_absolute() and sorted(p.stem for p in md_dir.glob("*.md")) == sorted(data.split.ids)
    per_call = [
        json.loads((out / f).read_text())["_meta"]["cost_usd"] for f in files if not f.startswith("_")
    ]
    assert summary["cost_usd"] == pytest.approx(sum(per_call))
    assert summary["cost_usd"] == pytest.approx((n - 1) * (1000 * 0.15 + 50 * 0.60) / 1e6)

    # The parse failure is scored wrong; the infra error counts as missing; the rest are right.
    metrics = score(load_labels(data.split), run.answers())
    assert (metrics.invalid, metrics.missing, metrics.infra_errors) == (1, 1, 1)
    assert metrics.tp + metrics.tn == n - 2

    # Same eval again: the cache answers everything except the infra error, which is retried.
    server.default = by_label(data)
    before = len(server.inference_requests())
    again = asyncio.run(
        evaluate_items(data.ws, data.split, data.prompts, j, item_ids=data.split.ids, replicates=1)
    )
    retried = server.inference_requests()[before:]
    assert [data.recorded_item(r).trajectory_id for r in retried] == [broken]
    assert again.cache_hits == n - 1 and again.infra_error_ids == []
    assert again.answers()[garbled].status == "invalid"  # the cached parse failure is still wrong

    # And a third time: zero HTTP requests of any kind.
    before = len(server.requests)
    third = asyncio.run(
        evaluate_items(data.ws, data.split, data.prompts, j, item_ids=data.split.ids, replicates=1)
    )
    assert len(server.requests) == before
    assert third.calls_made == 0 and third.cost_usd == 0.0

    # The API key is in no written file: results, summary, cache database.
    written = [*out.iterdir(), *data.ws.experiments_dir.rglob("*")]
    for path in written:
        if path.is_file():
            assert SECRET.encode() not in path.read_bytes(), path


def test_replicates_have_distinct_keys_through_the_anthropic_sdk(
    data: Data, server: FakeLLMServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", SECRET)
    server.default = lambda r: verdict_reply()
    j = JudgeSection(
        provider="anthropic", model="claude-haiku-4-5", base_url=server.anthropic_base_url, max_retries=0
    )
    run = asyncio.run(
        evaluate_items(data.ws, data.split, data.prompts, j, item_ids=data.split.ids, replicates=3)
    )
    requests = server.inference_requests()
    assert len(requests) == 3 * len(data.items)
    per_item: dict[str, int] = {}
    for r in requests:
        tid = data.recorded_item(r).trajectory_id
        per_item[tid] = per_item.get(tid, 0) + 1
    assert set(per_item.values()) == {3}
    with JudgeCache(data.ws.cache_path) as cache:
        assert cache.stats().entries == 3 * len(data.items)
    assert run.cost_usd == pytest.approx(sum(r.cost_usd for item in run.items for r in item.replicates))
    # A 4th replicate is a new call per item; the first three come from the cache.
    before = len(server.inference_requests())
    more = asyncio.run(
        evaluate_items(data.ws, data.split, data.prompts, j, item_ids=data.split.ids, replicates=4)
    )
    assert len(server.inference_requests()) - before == len(data.items)
    assert more.cache_hits == 3 * len(data.items)


def test_budget_and_early_stop_through_the_sdk(
    data: Data, server: FakeLLMServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    server.default = by_label(data)
    j = openai_judge(server, max_concurrency=1)
    stop_after = 3
    run = asyncio.run(
        evaluate_items(
            data.ws,
            data.split,
            data.prompts,
            j,
            item_ids=data.split.ids,
            replicates=1,
            options=PassOptions(
                on_item=lambda result: result.trajectory_id == data.split.ids[stop_after - 1],
            ),
        )
    )
    assert [item.trajectory_id for item in run.items] == data.split.ids[:stop_after]
    answered = len(server.inference_requests())
    # A call that took the freed slot just before the rule was met is answered (and billed) anyway:
    # it is counted and cached, never dropped; at most one per call slot.
    assert stop_after <= answered <= stop_after + j.max_concurrency and run.stopped_early
    assert run.calls_made == answered

    budget = Budget(max_usd=0.0)
    blocked = asyncio.run(
        evaluate_items(
            data.ws,
            data.split,
            data.prompts,
            j,
            item_ids=data.split.ids,
            replicates=1,
            options=PassOptions(budget=budget),
        )
    )
    assert len(server.inference_requests()) == answered  # not one more paid call
    assert blocked.cache_hits == answered and budget.spent_usd == 0.0
    assert blocked.stopped_early and "budget" in (blocked.stop_reason or "")


# --------------------------------------------------------------------------- `judgeloop eval`


def test_cmd_eval_writes_the_summary_and_verdict_meta_in_their_documented_shape(
    data: Data,
    server: FakeLLMServer,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`_summary.json` and each verdict file's ``_meta`` keep their keys, order and figures whether the
    evaluation's record is a dict or the typed `EvalMeta` (the official tools and scripts read them)."""
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    server.default = by_label(data)
    write_config(data.ws, server)
    out = tmp_path / "evals" / "shape"
    code = main(["eval", "-w", str(data.ws.root), "--base-url", server.openai_base_url, "--out", str(out)])
    assert code == 0, capsys.readouterr().err
    summary = json.loads((out / "_summary.json").read_text())
    assert list(summary) == [
        "format_version",
        "prompt_hash",
        "provider",
        "model",
        "judge_label",
        "judge_confinement",
        "base_url",
        "split",
        "split_fingerprint",
        "md_dir",
        "created",
        "parameters",
        "preprocessing",
        "counts",
        "input_tokens",
        "output_tokens",
        "cost_usd",
        "cached_cost_usd",
        "duration_s",
        "stopped_early",
        "stop_reason",
        "infra_error_ids",
        "infra_errors",
        "not_evaluated_ids",
    ]
    assert (summary["provider"], summary["model"], summary["split"]) == ("openai", MODEL, "tiny")
    assert summary["judge_label"] is None and summary["judge_confinement"] is None
    assert (
        summary["base_url"] == server.openai_base_url
        and summary["split_fingerprint"] == data.split.fingerprint
    )
    assert summary["md_dir"] == str((data.split.sandbox_root / "data" / "markdowns").resolve())
    assert list(summary["parameters"]) == [
        "sampling",
        "replicates",
        "max_concurrency",
        "timeout_s",
        "max_retries",
        "budget_usd",
        "settings",
    ]
    assert summary["parameters"]["replicates"] == data.prompts.settings.replicates
    assert summary["parameters"]["budget_usd"] is None
    assert summary["parameters"]["sampling"] == data.prompts.settings.sampling().as_dict()
    assert summary["preprocessing"]["text_only"] is False
    verdict = json.loads((out / f"{data.split.ids[0]}.json").read_text())
    assert list(verdict["_meta"])[:3] == ["model", "provider", "prompt_hash"]
    assert (
        verdict["_meta"]["provider"] == "openai" and verdict["_meta"]["prompt_hash"] == summary["prompt_hash"]
    )
    assert "judge_confinement" not in verdict["_meta"] and "memory" not in summary


def test_cmd_eval_json_prints_the_score_keys_and_writes_results(
    data: Data,
    server: FakeLLMServer,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    server.default = by_label(data)
    write_config(data.ws, server)
    out = tmp_path / "evals" / "one"
    code = main(
        ["eval", "-w", str(data.ws.root), "--base-url", server.openai_base_url, "--out", str(out), "--json"]
    )
    captured = capsys.readouterr()
    assert code == 0, captured.err
    result = json.loads(captured.out)
    # Pinned to `score --json`'s keys. Deliberately not all of eval's: with [judge] base_urls of two or more
    # endpoints one key follows these, "endpoints" (the pass's figures per replica, which `score` reading
    # verdict files cannot know; tests/test_endpoints.py); one endpoint, as here, adds nothing.
    assert list(result) == [
        "n",
        "balanced_accuracy",
        "tpr",
        "tnr",
        "fpr",
        "fnr",
        "kappa",
        "invalid",
        "missing",
        "mistake_type_recall",
    ]
    assert result["n"] == len(data.items) and result["kappa"] == 1.0
    assert "split 'tiny'" in captured.err
    assert len(list(out.glob("*.json"))) == len(data.items) + 1

    # `judgeloop score` agrees with `eval --json` on the written files.
    assert main(["score", str(out), "--split", "tiny", "-w", str(data.ws.root), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == result

    # --limit and the table output; everything is cached now.
    code = main(
        [
            "eval",
            "-w",
            str(data.ws.root),
            "--base-url",
            server.openai_base_url,
            "--limit",
            "2",
            "--out",
            str(tmp_path / "evals" / "two"),
        ]
    )
    captured = capsys.readouterr()
    assert code == 0
    assert "0 new, 2 cached" in captured.out and "balanced accuracy" in captured.out


def test_the_same_eval_out_command_twice_replaces_its_own_results_and_nothing_else(
    data: Data,
    server: FakeLLMServer,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    server.default = by_label(data)
    write_config(data.ws, server)
    out = tmp_path / "results"
    argv = ["eval", "-w", str(data.ws.root), "--base-url", server.openai_base_url, "--out", str(out)]
    assert main([*argv, "--limit", "3"]) == 0
    assert len(list(out.glob("*.json"))) == 3 + 1
    capsys.readouterr()
    # The same command with more items: the folder now holds exactly the new evaluation.
    assert main(argv) == 0
    captured = capsys.readouterr()
    assert "replacing the previous evaluation" in captured.err
    names = sorted(p.name for p in out.iterdir())
    assert names == sorted([f"{tid}.json" for tid in data.split.ids] + ["_summary.json"])
    assert json.loads((out / "_summary.json").read_text())["counts"]["items"] == len(data.split.ids)
    # Something judgeloop did not write makes it refuse, naming the file, and delete nothing.
    (out / "analysis.json").write_text('{"summary": {}}', encoding="utf-8")
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "analysis.json" in err and "did not write" in err
    assert sorted(p.name for p in out.iterdir()) == sorted([*names, "analysis.json"])
    # A folder with no judgeloop evaluation at all is refused too.
    other = tmp_path / "notes"
    other.mkdir()
    (other / "todo.txt").write_text("keep me", encoding="utf-8")
    assert main([*argv[:-1], str(other)]) == 2
    assert "holds no judgeloop evaluation" in capsys.readouterr().err
    assert (other / "todo.txt").read_text() == "keep me"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        # SERVER stands for the fake server's OpenAI base URL, known only once it is running.
        (["--base-url", "SERVER", "--split", "nope"], "no split named 'nope'"),
        (["--provider", "anthropic"], "ANTHROPIC_API_KEY"),
        (["--base-url", "http://127.0.0.1:9/v1"], "127.0.0.1:9"),
        (["--base-url", "SERVER", "--model", "no-such-model"], "no-such-model"),
    ],
    ids=["unknown-split", "missing-anthropic-key", "unreachable-server", "unknown-model"],
)
def test_cmd_eval_user_problems_are_one_line(
    data: Data,
    argv: list[str],
    message: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    with FakeLLMServer(models=[MODEL]) as srv:
        write_config(data.ws, srv)
        monkeypatch.setenv("OPENAI_API_KEY", SECRET)
        monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
        args = [srv.openai_base_url if arg == "SERVER" else arg for arg in argv]
        code = main(["eval", "-w", str(data.ws.root), *args])
    err = capsys.readouterr().err
    assert code == 2
    last = err.strip().splitlines()[-1]
    assert last.startswith("judgeloop: error:") and message in last
    assert "Traceback" not in err and SECRET not in err


def test_progress_is_plain_lines_when_not_a_terminal(data: Data) -> None:
    import io

    stream = io.StringIO()
    progress = StderrProgress(stream)
    run_eval(data, InTestProvider(lambda r: verdict_text(True)), progress=progress)
    progress.close()
    lines = stream.getvalue().splitlines()
    assert lines and "\r" not in stream.getvalue()
    assert lines[-1].startswith(f"judged {len(data.items)}/{len(data.items)} items")


def test_fully_cached_items_are_not_rendered_again_until_an_input_changes(
    data: Data, monkeypatch: pytest.MonkeyPatch
) -> None:
    import optimizer.judge.render

    first = run_eval(data, InTestProvider(lambda r: verdict_text(True)))
    real_build = optimizer.judge.render.build_request
    rendered: list[str] = []

    def counting_build(traj: Any, *args: Any, **kwargs: Any) -> JudgeRequest:
        rendered.append(traj.trajectory_id)
        return real_build(traj, *args, **kwargs)

    monkeypatch.setattr(optimizer.judge.render, "build_request", counting_build)
    provider = InTestProvider(lambda r: verdict_text(True))
    again = run_eval(data, provider)
    assert rendered == [] and provider.calls == []
    assert again.answers() == first.answers()

    # A changed screenshot is a changed request: rendered again and judged again.
    item = data.items[0]
    traj = data.split.trajectory(item.trajectory_id)
    shot = data.split.screenshot_file(traj.steps[0])
    assert shot is not None
    from PIL import Image

    Image.new("RGB", (8, 6), (1, 2, 3)).save(shot)
    changed = run_eval(data, provider)
    # Exactly the items showing that recording (its positive and its negative) are rendered again.
    assert sorted(rendered) == sorted(
        i.trajectory_id for i in data.items if i.original_id == item.original_id
    )
    assert {data.request_item(r).trajectory_id for r in provider.calls} == set(rendered)
    assert changed.calls_made == len(provider.calls) >= 1


def test_switching_provider_without_model_takes_that_providers_default_model() -> None:
    from optimizer.workspace.config import DEFAULT_JUDGE_MODELS, JudgeOverrides, JudgeSection

    local = JudgeSection()  # provider local, model smollm2-135m
    assert JudgeOverrides(provider="anthropic").apply(local).model == DEFAULT_JUDGE_MODELS["anthropic"]
    assert JudgeOverrides(provider="openai", model="my-model").apply(local).model == "my-model"
    same = JudgeOverrides(provider="local", concurrency=2).apply(local)
    assert same.model == "smollm2-135m" and same.max_concurrency == 2
    with pytest.raises(UserError, match="--concurrency must be at least 1"):
        JudgeOverrides(concurrency=0).apply(local)


def test_infrastructure_errors_are_judged_again_in_later_rounds(
    data: Data, server: FakeLLMServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    flaky = data.items[1].trajectory_id
    seen: list[str] = []
    good = by_label(data)

    def behave(recorded: RecordedRequest) -> Any:
        tid = data.recorded_item(recorded).trajectory_id
        seen.append(tid)
        if tid == flaky and seen.count(tid) <= 2:  # down for the first pass and the first retry round
            return server_error(503)
        return good(recorded)

    server.default = behave
    j = openai_judge(server)
    run = asyncio.run(
        evaluate_items(
            data.ws,
            data.split,
            data.prompts,
            j,
            item_ids=data.split.ids,
            replicates=1,
            options=PassOptions(infra_retry_rounds=2, infra_retry_pause_s=0.01),
        )
    )
    assert run.infra_error_ids == [] and seen.count(flaky) == 3
    assert len(seen) == len(data.items) + 2  # only the failing item was judged again
    assert any(
        "round 2: 1 item(s) with infrastructure errors judged again; 0 still failing" in n for n in run.notes
    )
    assert score(load_labels(data.split), run.answers()).kappa == 1.0

    # Without retry rounds (plain `judgeloop eval`) the same outage is reported as an infrastructure error.
    seen.clear()
    flaky = data.items[2].trajectory_id
    run = asyncio.run(
        evaluate_items(data.ws, data.split, data.prompts, j, item_ids=data.split.ids, replicates=2)
    )
    assert run.infra_error_ids == [flaky]  # (replicate 1 is new for every item; replicate 0 is cached)


def test_eval_of_the_working_tree_warns_while_a_loop_command_holds_the_workspace(
    data: Data, server: FakeLLMServer, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import os

    from optimizer.workspace.workspace import command_lock, lock_holder

    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    server.default = by_label(data)
    write_config(data.ws, server)
    assert lock_holder(data.ws) is None
    with command_lock(data.ws, "run"):
        assert lock_holder(data.ws) == f"judgeloop run, pid {os.getpid()}"
        assert (
            main(["eval", "-w", str(data.ws.root), "--base-url", server.openai_base_url, "--limit", "1"]) == 0
        )
    err = capsys.readouterr().err
    assert "note: judgeloop run, pid" in err and "pass --rev to evaluate a fixed revision" in err
    assert lock_holder(data.ws) is None  # released with its holder
    assert main(["eval", "-w", str(data.ws.root), "--base-url", server.openai_base_url, "--limit", "1"]) == 0
    assert "note:" not in capsys.readouterr().err
    assert (
        len(list((data.ws.experiments_dir / "evals").iterdir())) == 2
    )  # one folder each, even within a second


def test_a_provider_that_runs_one_call_at_a_time_gets_one_call_slot(tmp_path: Path) -> None:
    data = make_data(tmp_path, n_pairs=2)  # 8 items
    provider = InTestProvider(lambda r: verdict_text(True), delay=0.01)
    run_eval(data, provider, judge=judge(max_concurrency=4))
    assert provider.max_in_flight > 1  # without the limit, calls overlap

    serial = InTestProvider(lambda r: verdict_text(True), delay=0.01)
    serial.traits = ProviderTraits(max_parallel_calls=1)  # as the local judge declares
    stopped: list[str] = []

    def stop_at_two(r: ItemResult) -> bool:
        stopped.append(r.trajectory_id)
        return len(stopped) == 2

    run = run_eval(data, serial, judge=judge(max_concurrency=4), replicates=2, on_item=stop_at_two)
    assert serial.max_in_flight == 1
    # So nothing waits inside the provider when the rule is met: at most the call in flight runs on.
    assert len(serial.calls) <= 2 * 2 + 1 and run.calls_made == len(serial.calls)


def test_a_second_server_with_the_same_model_name_is_asked_not_served_the_first_ones_verdicts(
    data: Data,
    server: FakeLLMServer,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    write_config(data.ws, server)
    server.default = by_label(data)
    n = len(data.items)

    def run_eval(url: str) -> str:
        capsys.readouterr()
        assert main(["eval", "-w", str(data.ws.root), "--base-url", url, "--out", str(tmp_path / "out")]) == 0
        return capsys.readouterr().out

    assert f"{n} new, 0 cached" in run_eval(server.openai_base_url)
    with FakeLLMServer() as other:
        other.default = by_label(data)
        assert f"{n} new, 0 cached" in run_eval(other.openai_base_url)
        assert len(other.inference_requests()) == n
        # Each endpoint keeps its own entries: both are answered from the cache now.
        assert f"0 new, {n} cached" in run_eval(other.openai_base_url)
    assert f"0 new, {n} cached" in run_eval(server.openai_base_url.rstrip("/") + "/")
    assert len(server.inference_requests()) == n
