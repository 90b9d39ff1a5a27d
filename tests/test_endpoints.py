"""``[judge] base_urls``: items pinned to OpenAI-compatible replicas by consistent hashing, failed
replicas drained, per-endpoint figures — through the real ``openai`` SDK against two fake servers,
each with its own prefix cache (one replica each: `PromptCache(openai_machines=1)`)."""

from __future__ import annotations

import asyncio
import json
import random
import re
import threading
from pathlib import Path
from typing import Any

import pytest

from optimizer.devset.importer import import_split
from optimizer.errors import UserError
from optimizer.evaluation.evaluator import PassOptions, evaluate_items
from optimizer.evaluation.results import EvalRun
from optimizer.judge.endpoints import HashRing, shown_url
from optimizer.judge.prompts import JUDGE_TOML, RUBRIC_MD, PromptSet
from optimizer.judge.providers import make_provider
from optimizer.scaffold import init_workspace
from optimizer.workspace.config import JudgeOverrides, JudgeSection
from tests.support.config import with_layout
from tests.support.data import make_items, write_release
from tests.support.fakecache import ManualClock, PromptCache
from tests.support.fakeserver import Behaviour as FakeBehaviour
from tests.support.fakeserver import FakeLLMServer, RecordedRequest, default_verdict

MODEL = "gpt-5"


class Setup:
    """A workspace with 16 long items (each prompt well above the 1024-token cache minimum)."""

    def __init__(self, tmp_path: Path) -> None:
        self.ws = init_workspace(tmp_path / "ws")
        self.items = make_items(4, n_steps=14)
        for i, item in enumerate(self.items):
            item.instruction = f"{item.instruction} Task number {i:03d}."
        release = write_release(tmp_path / "release", self.items)
        self.split = import_split(self.ws, release.root, "long", all_items=True, warn=lambda _msg: None)

    def prompts(self, rubric_note: str = "") -> PromptSet:
        files = dict(PromptSet.from_dir(self.ws.prompts_dir).files)
        files[JUDGE_TOML] = with_layout(files[JUDGE_TOML], "trajectory-first")
        files[RUBRIC_MD] = files[RUBRIC_MD] + rubric_note
        return PromptSet.from_files(files)

    def evaluate(self, urls: list[str], prompts: PromptSet, *, retries: int = 0) -> tuple[EvalRun, Any]:
        judge = JudgeSection(
            provider="openai", model=MODEL, base_urls=urls, max_concurrency=2, max_retries=retries
        )

        async def go() -> tuple[EvalRun, Any]:
            provider = make_provider(judge)
            try:
                run = await evaluate_items(
                    self.ws,
                    self.split,
                    prompts,
                    judge,
                    item_ids=self.split.ids,
                    replicates=1,
                    options=PassOptions(provider=provider),
                )
                return run, provider.endpoint_totals()  # type: ignore[attr-defined]
            finally:
                await provider.aclose()

        return asyncio.run(go())

    def item_of(self, recorded: RecordedRequest) -> str:
        text = str(recorded.body)
        found = [item.trajectory_id for item in self.items if item.instruction in text]
        assert len(found) == 1
        return found[0]


CANDIDATE_NOTE = "\n- A new rule: check the final state twice.\n"


def _hit_share(usages: list[int]) -> float:
    return sum(1 for cached in usages if cached > 0) / len(usages)


def test_affinity_keeps_each_item_on_its_replica_and_hits_its_prefix(tmp_path: Path) -> None:
    setup = Setup(tmp_path)
    caches = [PromptCache(clock=ManualClock(), openai_machines=1) for _ in range(2)]
    with FakeLLMServer(prompt_cache=caches[0]) as a, FakeLLMServer(prompt_cache=caches[1]) as b:
        urls = [a.openai_base_url, b.openai_base_url]
        setup.evaluate(urls, setup.prompts())
        before = {id(a): len(a.replies), id(b): len(b.replies)}
        run, totals = setup.evaluate(urls, setup.prompts(CANDIDATE_NOTE))
        baseline_bodies = [r.body for s in (a, b) for r, _ in s.replies[: before[id(s)]]]
        candidate = [(s, r, u) for s in (a, b) for r, u in s.replies[before[id(s)] :]]
        # Every item went to the replica the ring gives it, in both passes.
        ring = HashRing(urls)
        for server in (a, b):
            for recorded, _ in server.replies:
                assert ring.owner(setup.item_of(recorded)) == server.openai_base_url
        assert a.replies and b.replies, "16 items all on one of two replicas: the ring does not spread"
        affinity = _hit_share([u.cache_read_tokens for _, _, u in candidate])
        assert affinity >= 0.9
        # The per-endpoint report is what the servers billed.
        for server in (a, b):
            mine = [u for s, _, u in candidate if s is server]
            note = next(n for n in run.notes if n.startswith(f"endpoint {server.openai_base_url}:"))
            assert f"{len(mine)} calls, {sum(u.cache_read_tokens for u in mine):,} of " in note
            assert totals[server.openai_base_url]["calls"] == len(mine)
        # The same calls spread without affinity (round-robin under concurrency: any replica per
        # call) over two fresh replica caches hit about half the time.
        rng = random.Random(7)
        spread = [PromptCache(clock=ManualClock(), openai_machines=1) for _ in range(2)]
        for body in baseline_bodies:
            spread[rng.randrange(2)].openai(body)
        candidate_bodies = [r.body for _, r, _ in candidate]
        spread_hits = _hit_share(
            [spread[rng.randrange(2)].openai(body).cache_read_tokens for body in candidate_bodies]
        )
        assert 0.25 <= spread_hits <= 0.75
        assert affinity - spread_hits >= 0.25


def test_an_endpoint_killed_mid_pass_is_drained_and_every_item_judged_once(tmp_path: Path) -> None:
    setup = Setup(tmp_path)
    killed = threading.Event()
    servers: dict[str, FakeLLMServer] = {}
    victim: list[str] = []
    answered = {"n": 0}
    lock = threading.Lock()

    def behave(recorded: RecordedRequest) -> FakeBehaviour:
        with lock:
            answered["n"] += 1
            if answered["n"] == 3 and not killed.is_set():
                killed.set()
                threading.Thread(target=servers[victim[0]].stop, daemon=True).start()
        return default_verdict(recorded)

    with FakeLLMServer(behave) as a, FakeLLMServer(behave) as b:
        urls = [a.openai_base_url, b.openai_base_url]
        servers.update({a.openai_base_url: a, b.openai_base_url: b})
        ring = HashRing(urls)
        owners = [ring.owner(tid) for tid in setup.split.ids]
        victim.append(max(urls, key=owners.count))  # the busier replica, so the kill lands mid-pass
        run, totals = setup.evaluate(urls, setup.prompts())
        assert killed.is_set()
        assert len(run.items) == len(setup.split.ids)
        assert not run.infra_error_ids
        judged = [setup.item_of(r) for s in (a, b) for r, _ in s.replies]
        assert sorted(judged) == sorted(setup.split.ids), "each item answered exactly once"
        survivor = next(u for u in urls if u != victim[0])
        assert totals[victim[0]]["drained"] == 1 and totals[survivor]["drained"] == 0
        assert any(n.startswith(f"endpoint {victim[0]} drained (") for n in run.notes)
        # The survivor kept its own items and took over the victim's unanswered ones.
        assert totals[survivor]["calls"] > owners.count(survivor)


def test_every_endpoint_down_before_any_answer_is_one_user_error(tmp_path: Path) -> None:
    setup = Setup(tmp_path)
    with FakeLLMServer() as a, FakeLLMServer() as b:
        urls = [a.openai_base_url, b.openai_base_url]
    # Both stopped: nothing listens on either port.
    with pytest.raises(UserError, match="cannot connect to"):
        setup.evaluate(urls, setup.prompts())


def test_removing_an_endpoint_moves_only_its_items() -> None:
    names = ["http://a:8000/v1", "http://b:8000/v1", "http://c:8000/v1"]
    ring = HashRing(names)
    keys = [f"traj-{i}" for i in range(600)]
    before = {k: ring.owner(k) for k in keys}
    after = {k: ring.owner(k, {"http://b:8000/v1"}) for k in keys}
    moved = [k for k in keys if before[k] != after[k]]
    assert moved and all(before[k] == "http://b:8000/v1" for k in moved)
    assert all(after[k] != "http://b:8000/v1" for k in keys)
    # The virtual nodes spread the items: no endpoint holds less than a fifth of 600.
    assert min(list(before.values()).count(n) for n in names) >= 120
    # The same ring built again (another process) routes every item the same way.
    assert all(HashRing(list(reversed(names))).owner(k) == before[k] for k in keys)


@pytest.mark.parametrize(
    ("section", "message"),
    [
        ({"provider": "openai", "base_urls": []}, "base_urls is empty"),
        ({"provider": "openai", "base_urls": ["a:8000/v1"]}, "is not an http(s) URL"),
        ({"provider": "openai", "base_urls": ["http://a/v1", "http://a/v1/"]}, "listed twice"),
        ({"provider": "openai", "base_urls": ["http://a/v1"], "base_url": "http://b/v1"}, "exclusive"),
        ({"provider": "anthropic", "base_urls": ["http://a/v1"]}, 'needs provider = "openai"'),
        ({"provider": "openai", "base_urls": [f"http://h{i}/v1" for i in range(65)]}, "at most 64"),
        ({"provider": "openai", "base_urls": ["http://"]}, "is not an http(s) URL"),
        ({"provider": "openai", "base_urls": ["file:///etc/passwd"]}, "is not an http(s) URL"),
    ],
)
def test_base_urls_refusals_are_one_line(tmp_path: Path, section: dict[str, Any], message: str) -> None:
    from optimizer.workspace.config import load_config
    from tests.support.config import dumps_toml

    path = tmp_path / "judgeloop.toml"
    path.write_text(dumps_toml({"judge": section}))
    with pytest.raises(UserError) as caught:
        load_config(path)
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_a_command_line_base_url_replaces_the_replicas() -> None:
    judge = JudgeSection(provider="openai", model=MODEL, base_urls=["http://a/v1", "http://b/v1"])
    assert JudgeOverrides(base_url="http://c/v1").apply(judge).base_urls is None
    assert JudgeOverrides(provider="local").apply(judge).base_urls is None


def test_reports_never_show_credentials_in_an_endpoint_url() -> None:
    assert shown_url("http://user:s3cret@host:8000/v1") == "http://host:8000/v1"
    assert shown_url("https://host/v1") == "https://host/v1"
    assert "s3cret" not in shown_url("http://a:b@c@host/v1")


def test_eval_through_the_cli_reports_each_endpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from optimizer.cli import main
    from tests.support.evaluation import by_label, make_data, write_config

    data = make_data(tmp_path, n_pairs=3)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)  # a keyless self-hosted pool needs none
    with FakeLLMServer() as a, FakeLLMServer() as b:
        a.default = b.default = by_label(data)
        write_config(data.ws, a)
        path = data.ws.root / "judgeloop.toml"
        text = path.read_text()
        line = '# base_urls = ["http://a:8000/v1", "http://b:8000/v1"]'
        assert line in text
        urls = [a.openai_base_url, b.openai_base_url]
        path.write_text(text.replace(line, f"base_urls = {json.dumps(urls)}"))
        capsys.readouterr()
        assert main(["eval", "-w", str(data.ws.root)]) == 0
        err = capsys.readouterr().err
        for server in (a, b):
            assert f"note: endpoint {server.openai_base_url}: {len(server.replies)} calls" in err
        assert len(a.replies) + len(b.replies) == len(data.items)


def test_when_every_endpoint_has_failed_the_next_call_tries_them_all_again() -> None:
    from optimizer.judge.endpoints import EndpointPool

    pool = EndpointPool({"http://a/v1": "A", "http://b/v1": "B"})
    home = pool.route("traj-1")
    assert home is not None
    assert pool.drain(home[0], "HTTP 503") and not pool.drain(home[0], "again")
    other = pool.route("traj-1")
    assert other is not None and other[0] != home[0]  # rehashed to the survivor
    pool.drain(other[0], "connection failed")
    assert pool.route("traj-1") is None
    pool.revive_all()
    assert pool.route("traj-1") == home  # back on its own replica, where its prefix is
    _, drains = pool.take_report()
    assert [name for name, _ in drains] == [home[0], other[0]]  # both drains still reported, once
    assert pool.take_report()[1] == []
    assert pool.ever_drained(home[0]) and pool.ever_drained(other[0])


@pytest.mark.slow
def test_a_run_records_a_drained_endpoint_in_the_ledger_and_still_judges_every_item(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from optimizer.cli import main
    from optimizer.ledger import Ledger
    from optimizer.workspace.workspace import Workspace
    from tests.support.loop import FakeJudge, add_small_dev_split, commit_all, make_workspace

    root = make_workspace(tmp_path)
    ids = add_small_dev_split(root, per_class=8)
    judge = FakeJudge(root)
    servers: list[FakeLLMServer] = []
    answered = {"n": 0}
    lock = threading.Lock()

    def behave(recorded: RecordedRequest) -> FakeBehaviour:
        with lock:
            answered["n"] += 1
            if answered["n"] == 4:  # mid-baseline: the second replica goes away for good
                threading.Thread(target=servers[1].stop, daemon=True).start()
        return judge(recorded)

    with FakeLLMServer(behave) as a, FakeLLMServer(behave) as b:
        servers += [a, b]
        urls = [a.openai_base_url, b.openai_base_url]
        ring = HashRing(urls)
        assert any(ring.owner(t) == b.openai_base_url for t in ids)
        config = root / "judgeloop.toml"
        text = config.read_text().replace('provider = "local"          #', 'provider = "openai"         #', 1)
        config.write_text(
            text.replace(
                '# base_urls = ["http://a:8000/v1", "http://b:8000/v1"]', f"base_urls = {json.dumps(urls)}"
            )
        )
        commit_all(root, "two replicas")
        capsys.readouterr()
        code = main(
            [
                "run",
                "-w",
                str(root),
                "--provider",
                "openai",
                "--model",
                "fake-judge",
                "--max-experiments",
                "1",
                "--strategy",
                "library",
            ]
        )
        out, err = capsys.readouterr()
        assert code == 0, err
    with Ledger.open_readonly(Workspace.open(root).ledger_path) as ledger:
        run = ledger.runs()[-1]
        baseline = ledger.experiments(run.id)[0]
        drains = [
            e
            for e in ledger.events_since(0, run_id=run.id)
            if e.kind == "stage" and e.payload.get("stage") == "endpoint_drained"
        ]
    assert baseline.items_evaluated == len(ids) and baseline.status == "baseline"
    assert len(drains) == 1 and drains[0].experiment_id == baseline.id
    assert str(drains[0].payload["text"]).startswith(f"endpoint {urls[1]} drained (")
    assert f"endpoint {urls[1]} drained (" in out


# -- per-endpoint figures: each pass's, `eval --json`'s, and the ledger's ------------------------------


def _served(server: FakeLLMServer, since: int = 0, until: int | None = None) -> dict[str, int]:
    """What ``server`` answered (its own record of replies), as the endpoint figures count it."""
    usages = [u for _, u in server.replies[since:until]]
    return {
        "calls": len(usages),
        "prompt_tokens": sum(u.input_tokens + u.cache_read_tokens for u in usages),
        "cached_tokens": sum(u.cache_read_tokens for u in usages),
    }


def test_each_pass_s_endpoint_figures_equal_what_each_server_answered(tmp_path: Path) -> None:
    setup = Setup(tmp_path)
    caches = [PromptCache(clock=ManualClock(), openai_machines=1) for _ in range(2)]
    with FakeLLMServer(prompt_cache=caches[0]) as a, FakeLLMServer(prompt_cache=caches[1]) as b:
        urls = [a.openai_base_url, b.openai_base_url]
        first, _ = setup.evaluate(urls, setup.prompts())
        before = {id(a): len(a.replies), id(b): len(b.replies)}
        second, _ = setup.evaluate(urls, setup.prompts(CANDIDATE_NOTE))
        for run, bounds in ((first, lambda s: (0, before[id(s)])), (second, lambda s: (before[id(s)], None))):
            assert list(run.endpoints) == urls
            for server in (a, b):
                figures = run.endpoints[server.openai_base_url]
                assert {k: figures[k] for k in ("calls", "prompt_tokens", "cached_tokens")} == _served(
                    server, *bounds(server)
                )
                assert figures["failures"] == figures["drained"] == 0
        assert (
            sum(f["cached_tokens"] for f in second.endpoints.values()) > 0
        )  # the second pass read the caches


def test_a_killed_endpoint_s_failures_and_drain_are_in_the_pass_figures(tmp_path: Path) -> None:
    setup = Setup(tmp_path)
    servers: dict[str, FakeLLMServer] = {}
    victim: list[str] = []
    answered = {"n": 0}
    lock = threading.Lock()

    def behave(recorded: RecordedRequest) -> FakeBehaviour:
        with lock:
            answered["n"] += 1
            if answered["n"] == 3:
                threading.Thread(target=servers[victim[0]].stop, daemon=True).start()
        return default_verdict(recorded)

    with FakeLLMServer(behave) as a, FakeLLMServer(behave) as b:
        urls = [a.openai_base_url, b.openai_base_url]
        servers.update({a.openai_base_url: a, b.openai_base_url: b})
        owners = [HashRing(urls).owner(tid) for tid in setup.split.ids]
        victim.append(max(urls, key=owners.count))
        run, totals = setup.evaluate(urls, setup.prompts())
        survivor = next(u for u in urls if u != victim[0])
        dead, alive = run.endpoints[victim[0]], run.endpoints[survivor]
        assert dead["drained"] == 1 and dead["failures"] >= 1 and alive["drained"] == alive["failures"] == 0
        for url in urls:
            assert run.endpoints[url]["calls"] == len(servers[url].replies) == totals[url]["calls"]
        assert dead["calls"] + alive["calls"] == len(setup.split.ids)


def _point_config_at(setup: Setup, urls: list[str]) -> None:
    cfg = setup.ws.root / "judgeloop.toml"
    text = cfg.read_text(encoding="utf-8").replace('provider = "local"', 'provider = "openai"')
    text = re.sub(r"(?m)^base_urls = .*\n", "", text)
    text = re.sub(
        r'(?m)^model = "(smollm2-135m|gpt-5)"',
        f'model = "{MODEL}"\nbase_urls = {json.dumps(urls)}',
        text,
        count=1,
    )
    cfg.write_text(text, encoding="utf-8")


def test_eval_json_adds_endpoints_to_the_score_keys_only_with_several_endpoints(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from optimizer.cli import main

    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-not-a-real-key")
    setup = Setup(tmp_path)
    with FakeLLMServer() as a, FakeLLMServer() as b:
        urls = [a.openai_base_url, b.openai_base_url]
        _point_config_at(setup, urls)
        out = tmp_path / "evals" / "two"
        capsys.readouterr()
        assert main(["eval", "-w", str(setup.ws.root), "--split", "long", "--out", str(out), "--json"]) == 0
        result = json.loads(capsys.readouterr().out)
        for server in (a, b):
            figures = result["endpoints"][server.openai_base_url]
            assert {k: figures[k] for k in ("calls", "prompt_tokens", "cached_tokens")} == _served(server)
            assert figures["failures"] == figures["drained"] == 0
    # `score --json` has the same keys but "endpoints", which only the judging pass can know.
    assert list(result)[-1] == "endpoints"
    assert main(["score", str(out), "--split", "long", "-w", str(setup.ws.root), "--json"]) == 0
    score = json.loads(capsys.readouterr().out)
    assert score == {k: v for k, v in result.items() if k != "endpoints"}
    with FakeLLMServer() as only:  # one endpoint (base_urls of one): exactly score --json's keys
        _point_config_at(setup, [only.openai_base_url])
        assert (
            main(
                [
                    "eval",
                    "-w",
                    str(setup.ws.root),
                    "--split",
                    "long",
                    "--out",
                    str(tmp_path / "one"),
                    "--json",
                ]
            )
            == 0
        )
        assert list(json.loads(capsys.readouterr().out)) == list(score)


def test_replacing_the_second_endpoint_asks_again_instead_of_reusing_its_verdicts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The judge-call cache keys the whole endpoint set: after base_urls [A, B] is judged, [A, C] (another
    server in B's place, possibly other weights under the same model name) is asked again — C answers the
    items the ring gives it — and the result files name every replica. Keyed by A alone, C got 0 calls."""
    from optimizer.cli import main
    from tests.support.evaluation import by_label, make_data, write_config

    data = make_data(tmp_path, n_pairs=3)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)  # a keyless self-hosted pool needs none
    path = data.ws.root / "judgeloop.toml"
    line = '# base_urls = ["http://a:8000/v1", "http://b:8000/v1"]'
    with FakeLLMServer() as a, FakeLLMServer() as b, FakeLLMServer() as c:
        a.default = b.default = c.default = by_label(data)
        write_config(data.ws, a)
        template = path.read_text()
        assert line in template
        for second in (b, c):
            urls = [a.openai_base_url, second.openai_base_url]
            path.write_text(template.replace(line, f"base_urls = {json.dumps(urls)}"))
            assert main(["eval", "-w", str(data.ws.root), "--json"]) == 0
            capsys.readouterr()
        ring = HashRing([a.openai_base_url, c.openai_base_url])
        owned_by_c = sum(1 for item in data.items if ring.owner(item.trajectory_id) == c.openai_base_url)
        assert owned_by_c > 0
        assert len(c.replies) == owned_by_c
        assert len(a.replies) + len(b.replies) + len(c.replies) == 2 * len(data.items)
        pool = [a.openai_base_url, c.openai_base_url]
    summaries = sorted((data.ws.root / "experiments" / "evals").glob("*/_summary.json"))
    recorded = [json.loads(p.read_text(encoding="utf-8")).get("base_urls") for p in summaries]
    assert pool in recorded, recorded
