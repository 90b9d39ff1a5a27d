"""Judging with memory through the real CLI: cases cross-fitted over pair-aware folds, seen at the fake server.

The leakage test: a case whose ``source_items`` is item X never reaches a request for X or for X's pair
(every item of its instruction pair, grouped here from the labels, independently of the judge's folds),
and every other-fold case does reach it (``memory_k`` is larger than the memory, so every eligible case is
sent). Items are told apart at the server by their step count: two items of a pair share an instruction.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from optimizer.cli import main
from optimizer.devset.importer import import_split
from optimizer.judge.memory import CASES_JSONL, PRINCIPLES_MD
from optimizer.judge.prompts import PromptSet
from optimizer.scaffold import init_workspace
from optimizer.workspace.workspace import Workspace
from tests.support.config import write_config
from tests.support.data import FakeItem, fake_id, pair_items, write_release
from tests.support.fakeserver import FakeLLMServer, RecordedRequest, verdict_reply
from tests.support.loop import commit_all, request_texts

SECRET = "sk-test-SECRET-key-0123456789abcdef"
N_PAIRS = 3
PRINCIPLE = "A saved file must exist on disk at the end, under the name the instruction gives."


@pytest.fixture(autouse=True)
def _keys(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)


def _items(tag: str, pairs: range) -> list[FakeItem]:
    items = [item for pair in pairs for item in pair_items(pair, tag=tag)]
    for i, item in enumerate(items):  # a distinct step count per item: the server tells items apart by it
        item.n_steps = 2 + i
    return items


class Setup:
    """A git workspace whose dev split ``dev`` holds ``N_PAIRS`` instruction pairs, judged over the fake
    server with ``memory = "retrieve"`` and one case per item (its only source item)."""

    def __init__(self, tmp_path: Path, server: FakeLLMServer) -> None:
        self.root = tmp_path / "ws"
        ws = init_workspace(self.root)
        self.items = _items("m", range(N_PAIRS))
        release = write_release(tmp_path / "release", self.items)
        import_split(ws, release.root, "dev", all_items=True, warn=lambda _msg: None)
        cfg = ws.config
        write_config(
            self.root,
            cfg.model_copy(
                update={
                    "workspace": cfg.workspace.model_copy(update={"dev_split": "dev"}),
                    "judge": cfg.judge.model_copy(
                        update={
                            "provider": "openai",
                            "model": "fake-judge",
                            "max_retries": 0,
                            "base_url": server.openai_base_url,
                        }
                    ),
                    "optimizer": cfg.optimizer.model_copy(
                        update={
                            "allowed_files": [
                                "prompts/judge.md",
                                "prompts/rubric.md",
                                PRINCIPLES_MD,
                                CASES_JSONL,
                            ]
                        }
                    ),
                }
            ),
        )
        toml = self.root / "prompts" / "judge.toml"
        settings = {
            'screenshots = "all"': 'screenshots = "none"',
            'memory = "off"': 'memory = "retrieve"',
            "memory_k = 4": "memory_k = 16",
            "memory_folds = 5": "memory_folds = 3",
        }
        text = toml.read_text(encoding="utf-8")
        for old, new in settings.items():
            assert old in text
            text = text.replace(old, new)
        toml.write_text(text, encoding="utf-8")
        memory = self.root / "prompts" / "memory"
        memory.mkdir()
        (memory / "principles.md").write_text(f"# Principles\n\n- {PRINCIPLE}\n", encoding="utf-8")
        self.case_of = {item.trajectory_id: f"case-{i:02d}" for i, item in enumerate(self.items)}
        (memory / "cases.jsonl").write_text(
            "".join(
                json.dumps(
                    {
                        "id": self.case_of[item.trajectory_id],
                        "text": f"Save the report: check the file type. Verdict noted for {item.trajectory_id}.",
                        "source_items": [item.trajectory_id],
                    }
                )
                + "\n"
                for item in self.items
            ),
            encoding="utf-8",
        )
        commit_all(self.root, "memory on")
        self.by_steps = {item.n_steps: item for item in self.items}
        # The pair of each item, from the labels: every item sharing a recording with it.
        # Each pair: the component of recordings its labels link (original_id, paired_id), as the release pairs them.
        self.pair_of: dict[str, set[str]] = {}
        for item in self.items:
            group, recs = {item.trajectory_id}, {item.original_id}
            while True:
                more = {o.trajectory_id for o in self.items if {o.original_id, o.paired_id} & recs}
                recs |= {
                    r
                    for o in self.items
                    if o.trajectory_id in more
                    for r in (o.original_id, o.paired_id)
                    if r
                }
                if more <= group:
                    break
                group |= more
            self.pair_of[item.trajectory_id] = group

    def judged(self, request: RecordedRequest) -> tuple[FakeItem, set[str], str]:
        """(the item a request judges, the case ids it carries, its user text)."""
        _, user = request_texts(request.body)
        steps = re.search(r"Total steps: \*\*(\d+)\*\*", user)
        assert steps is not None
        return self.by_steps[int(steps.group(1))], set(re.findall(r"Case (case-\d\d):", user)), user


def _answer(request: RecordedRequest) -> Any:
    return verdict_reply({"success": True, "reasoning": "ok", "confidence": "high", "mistake_type": None})


@pytest.fixture
def setup(tmp_path: Path) -> Iterator[tuple[Setup, FakeLLMServer]]:
    with FakeLLMServer(default=_answer) as server:
        yield Setup(tmp_path, server), server


def _folds(out: Path) -> dict[str, int]:
    summary = json.loads((out / "_summary.json").read_text(encoding="utf-8"))
    record = summary["memory"]["folds"]
    assert record["k"] == 3
    return {tid: int(f) for tid, f in record["of"].items()}


def _check_requests(s: Setup, requests: list[RecordedRequest], folds: dict[str, int]) -> set[str]:
    """Every request: no case of the item's pair, exactly the cases of the other folds; the items judged."""
    seen: set[str] = set()
    source = {case: tid for tid, case in s.case_of.items()}
    for request in requests:
        item, cases, user = s.judged(request)
        tid = item.trajectory_id
        seen.add(tid)
        assert not cases & {s.case_of[t] for t in s.pair_of[tid]}, f"a case of {tid}'s own pair reached it"
        expected = {case for case, src in source.items() if folds[src] != folds[tid]}
        assert cases == expected
        assert PRINCIPLE in user
        # After the trajectory, before the instructions and the output contract.
        assert user.index("## Steps") < user.index("## Memory") < user.index("## Your verdict")
    return seen


def test_eval_with_memory_never_sends_an_item_a_case_of_its_own_pair(
    setup: tuple[Setup, FakeLLMServer], capsys: pytest.CaptureFixture[str]
) -> None:
    s, server = setup
    out = s.root / "experiments" / "evals" / "mem"
    assert main(["eval", "-w", str(s.root), "--out", str(out)]) == 0
    folds = _folds(out)
    # Pair-aware: each pair (grouped from the labels) in one fold; three pairs, three folds.
    for tid, pair in s.pair_of.items():
        assert len(pair) == 4 and {folds[t] for t in pair} == {folds[tid]}
    assert sorted(folds.values()).count(0) == 4 and len(set(folds.values())) == 3
    seen = _check_requests(s, server.inference_requests(), folds)
    assert seen == {item.trajectory_id for item in s.items}
    # Fixed per split fingerprint: a second evaluation (cached) records the same folds.
    again = s.root / "experiments" / "evals" / "mem2"
    assert main(["eval", "-w", str(s.root), "--out", str(again)]) == 0
    assert _folds(again) == folds
    assert len(server.inference_requests()) == len(s.items)  # every call of the second pass was cached


@pytest.mark.slow
@pytest.mark.parametrize("carrier", ["id", "instruction"])
def test_eval_never_sends_an_item_a_case_about_it_whatever_its_sources_declare(
    setup: tuple[Setup, FakeLLMServer], carrier: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """The red team's case: its text names item B (its id, or its instruction) and B's label, its source_items
    an item of another fold. Cross-fitting by the declared source alone sent it to B; by content it reaches
    neither B's fold nor its source's, and still every item of the third fold."""
    from optimizer.devset.split import open_split
    from optimizer.judge.memory import split_folds

    s, server = setup
    folds = split_folds(open_split(Workspace.open(s.root), "dev"), 3).of
    b = s.items[0]
    a = next(item.trajectory_id for item in s.items if folds[item.trajectory_id] != folds[b.trajectory_id])
    about = b.trajectory_id if carrier == "id" else b.instruction
    evil = {
        "id": "case-99",
        "text": f"Save the report: {about} was judged; its label is negative, a failure.",
        "source_items": [a],
    }
    cases = s.root / CASES_JSONL
    cases.write_text(cases.read_text(encoding="utf-8") + json.dumps(evil) + "\n", encoding="utf-8")
    commit_all(s.root, "a case about another fold's item")
    out = s.root / "experiments" / "evals" / "evil"
    assert main(["eval", "-w", str(s.root), "--out", str(out)]) == 0
    withheld = {folds[a], folds[b.trajectory_id]}
    reached = set()
    for request in server.inference_requests():
        item, carried, _ = s.judged(request)
        tid = item.trajectory_id
        if folds[tid] in withheld:
            assert "case-99" not in carried, f"the case about {b.trajectory_id} reached {tid}"
        else:
            assert "case-99" in carried
            reached.add(tid)
    assert reached and len(reached) == sum(1 for t in folds.values() if t not in withheld)
    summary = json.loads((out / "_summary.json").read_text(encoding="utf-8"))
    assert b.trajectory_id in summary["memory"]["about"]["case-99"]


@pytest.mark.slow
def test_a_run_with_memory_cross_fits_the_baseline_and_a_candidate_that_edits_cases(
    setup: tuple[Setup, FakeLLMServer], capsys: pytest.CaptureFixture[str]
) -> None:
    s, server = setup
    cases = s.root / CASES_JSONL
    first = s.items[0].trajectory_id
    # The candidate adds a case about its own source only (a case about another item is guard-rejected:
    # tests/loop/test_loop_memory.py); it is cross-fitted like the baseline's.
    extra = {
        "id": "case-new",
        "text": f"Save the report as PDF; compare the saved file's type with {first}'s request.",
        "source_items": [first],
    }
    cases.write_text(cases.read_text(encoding="utf-8") + json.dumps(extra) + "\n", encoding="utf-8")
    assert main(["run", "-w", str(s.root), "--strategy", "manual", "-m", "one more case"]) == 0
    report = capsys.readouterr()
    assert "guard" not in report.err.lower()
    requests = server.inference_requests()
    # A run's folds are the eval's: the same function of the split fingerprint and memory_folds.
    out = s.root / "experiments" / "evals" / "after-run"
    assert main(["eval", "-w", str(s.root), "--out", str(out)]) == 0
    folds = _folds(out)
    assert len(server.inference_requests()) == len(requests)  # the run judged this very prompt set
    from optimizer.ledger import Ledger

    with Ledger(Workspace.open(s.root).ledger_path) as ledger:
        (run,) = ledger.runs()
    assert run.config is not None and run.config["memory_folds"]["of"] == folds  # recorded in the ledger too
    assert len(requests) > len(s.items)  # the baseline's, then the candidate's (maybe stopped early)
    for n, request in enumerate(requests):
        item, carried, user = s.judged(request)
        tid = item.trajectory_id
        assert not carried & {s.case_of[t] for t in s.pair_of[tid]}
        if n < len(s.items):
            assert "Case case-new:" not in user
        else:  # the candidate's new case reaches exactly the items outside its source's fold
            assert ("Case case-new:" in user) == (folds[tid] != folds[first])
            assert ("Case case-new:" in user) <= (tid not in s.pair_of[first])


def test_memory_off_sends_the_same_requests_as_a_workspace_without_memory(tmp_path: Path) -> None:
    from tests.support.evaluation import make_data

    data = make_data(tmp_path)
    plain = data.prompts
    files = dict(plain.files)
    files[PRINCIPLES_MD] = f"- {PRINCIPLE}\n"
    files[CASES_JSONL] = (
        json.dumps({"id": "c1", "text": "Save the report", "source_items": [data.split.ids[0]]}) + "\n"
    )
    with_files = PromptSet.from_files(files)
    from optimizer.judge.render import RenderOptions, build_request

    for tid in data.split.ids:
        traj = data.split.trajectory(tid)
        a = build_request(traj, data.split, plain, options=RenderOptions(text_only=True))
        b = build_request(traj, data.split, with_files, options=RenderOptions(text_only=True))
        assert a == b and a.fingerprint() == b.fingerprint()
    # A judge.toml from before the memory keys existed renders the same requests, hence the same cache keys.
    from optimizer.judge.prompts import JUDGE_TOML

    old_toml = "\n".join(
        line for line in plain.files[JUDGE_TOML].splitlines() if not line.startswith("memory")
    )
    assert "memory =" not in old_toml
    before = PromptSet.from_files({**plain.files, JUDGE_TOML: old_toml})
    for layout in ("trajectory-first", "rubric-first"):
        traj = data.split.trajectory(data.split.ids[0])
        assert (
            build_request(traj, data.split, before, options=RenderOptions(layout=layout)).fingerprint()
            == build_request(
                traj,
                data.split,
                with_files,
                options=RenderOptions(layout=layout),
            ).fingerprint()
        )
    assert before.settings.dump() == plain.settings.dump()
    # The settings as results record them carry no memory key while memory is off.
    assert "memory" not in plain.settings.dump() and plain.prompt_hash() != with_files.prompt_hash()
    assert PromptSet.from_files(dict(plain.files)).prompt_hash() == plain.prompt_hash()


# --------------------------------------------------------------------------- hostile memories


def _eval_err(s: Setup, capsys: pytest.CaptureFixture[str], *extra: str) -> str:
    capsys.readouterr()
    assert main(["eval", "-w", str(s.root), *extra]) == 2
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("judgeloop: error:")]
    assert len(errors) == 1 and "Traceback" not in err
    return errors[0]


def _write_cases(s: Setup, *cases: dict[str, Any]) -> None:
    (s.root / CASES_JSONL).write_text("".join(json.dumps(c) + "\n" for c in cases), encoding="utf-8")


def test_hostile_cases_are_refused_in_one_line_before_any_call(
    setup: tuple[Setup, FakeLLMServer], capsys: pytest.CaptureFixture[str]
) -> None:
    s, server = setup
    _write_cases(s, {"id": "c1", "text": "x", "source_items": []})
    assert "cannot be kept out of its items' fold" in _eval_err(s, capsys)
    stranger = fake_id("not", "in", "split")
    _write_cases(s, {"id": "c1", "text": "x", "source_items": [stranger]})
    assert f"names source item {stranger}, not an item of split 'dev'" in _eval_err(s, capsys)
    (s.root / CASES_JSONL).write_text("{}\n" * 5_000_000, encoding="utf-8")  # 15 MB
    assert "bytes, more than the 1000000" in _eval_err(s, capsys)
    (s.root / CASES_JSONL).write_text(
        '{"id": "c1", "text": "x", "source_items": ["a"], "label": "negative"}\n'
    )
    assert "cases.jsonl:1: unknown key 'label'" in _eval_err(s, capsys)
    assert server.inference_requests() == []


def test_a_case_naming_a_held_out_item_is_refused_and_a_held_out_split_gets_every_case(
    setup: tuple[Setup, FakeLLMServer], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import asyncio

    from optimizer.evaluation.evaluator import memory_retriever
    from optimizer.judge.providers import make_provider

    s, _server = setup
    held_items = _items("h", range(N_PAIRS, N_PAIRS + 2))
    release = write_release(tmp_path / "held-release", held_items)
    import_split(Workspace.open(s.root), release.root, "held", all_items=True, warn=lambda _msg: None)
    cfg = Workspace.open(s.root).config
    write_config(
        s.root,
        cfg.model_copy(update={"workspace": cfg.workspace.model_copy(update={"heldout_splits": ["held"]})}),
    )
    ws = Workspace.open(s.root)
    from optimizer.devset.split import open_split

    held = open_split(ws, "held")
    provider = make_provider(ws.config.judge)
    try:
        prompts = PromptSet.from_dir(ws.prompts_dir)
        retriever = memory_retriever(ws, held, prompts, provider)
        assert retriever is not None and retriever.folds is None
        for tid in held.ids:
            chosen = retriever.select(tid, held.trajectory(tid).task.instruction)
            assert len(chosen.cases) == len(s.items)  # confirm on a held-out split: every case
        _write_cases(s, {"id": "c1", "text": "Save the report", "source_items": [held.ids[0]]})
        with pytest.raises(Exception, match=rf"names {held.ids[0]}, an item of held-out split 'held'"):
            memory_retriever(ws, held, PromptSet.from_dir(ws.prompts_dir), provider)
    finally:
        asyncio.run(provider.aclose())


@pytest.mark.slow
def test_a_candidate_whose_case_names_an_id_outside_the_split_is_rejected_and_principles_are_linted(
    setup: tuple[Setup, FakeLLMServer], capsys: pytest.CaptureFixture[str]
) -> None:
    from optimizer.ledger import Ledger

    s, _server = setup
    cases = s.root / CASES_JSONL
    original = cases.read_text(encoding="utf-8")
    stranger = fake_id("outside")
    cases.write_text(
        original + json.dumps({"id": "c-x", "text": "Save the report", "source_items": [stranger]}) + "\n",
        encoding="utf-8",
    )
    assert main(["run", "-w", str(s.root), "--strategy", "manual", "-m", "a stranger's case"]) == 0
    ws = Workspace.open(s.root)
    with Ledger(ws.ledger_path) as ledger:
        (run,) = ledger.runs()
        candidate = next(e for e in ledger.experiments(run.id) if e.seq == 1)
    assert candidate.status == "guard_rejected" and f"names source item {stranger}" in (
        candidate.reason or ""
    )
    # principles.md is linted: copying an item's id into it is refused by the overfit guard.
    cases.write_text(original, encoding="utf-8")  # the manual strategy handed the rejected edit back
    principles = s.root / PRINCIPLES_MD
    principles.write_text(
        principles.read_text(encoding="utf-8") + f"- {s.items[0].trajectory_id} is a failure\n"
    )
    assert main(["run", "-w", str(s.root), "--strategy", "manual", "-m", "a label in the principles"]) == 0
    with Ledger(ws.ledger_path) as ledger:
        last = ledger.latest_run()  # not max(id): two runs started in one second differ by a random suffix
        assert last is not None
        candidate = next(e for e in ledger.experiments(last.id) if e.seq == 1)
    assert candidate.status == "guard_rejected" and "contains the dev id" in (candidate.reason or "")


def test_a_batch_eval_carries_the_same_cross_fitted_memory(tmp_path: Path) -> None:
    with FakeLLMServer(default=_answer, batch_polls=1) as server:
        s = Setup(tmp_path, server)
        cfg = Workspace.open(s.root).config
        write_config(
            s.root,
            cfg.model_copy(
                update={
                    "judge": cfg.judge.model_copy(update={"batch_poll_s": 0.01, "batch_poll_max_s": 0.04})
                }
            ),
        )
        out = s.root / "experiments" / "evals" / "batch"
        assert main(["eval", "-w", str(s.root), "--out", str(out), "--batch", "--batch-cold"]) == 0
        entries = [r for r in server.inference_requests() if r.batch_id is not None]
        assert len(entries) == len(s.items)
        assert _check_requests(s, entries, _folds(out)) == {item.trajectory_id for item in s.items}


def test_memory_is_refused_in_one_line_where_the_request_is_not_built_in_common_code(
    setup: tuple[Setup, FakeLLMServer], capsys: pytest.CaptureFixture[str]
) -> None:
    s, server = setup
    toml = s.root / "prompts" / "judge.toml"
    toml.write_text(
        toml.read_text(encoding="utf-8").replace('mode = "direct"', 'mode = "agentic"'), encoding="utf-8"
    )
    assert 'memory = "retrieve" with mode = "agentic"' in _eval_err(s, capsys)
    assert server.inference_requests() == []


def test_a_harness_judge_with_memory_is_refused_in_one_line(tmp_path: Path) -> None:
    from optimizer.evaluation.evaluator import memory_refusal
    from optimizer.judge.types import ProviderTraits
    from tests.support.evaluation import InTestProvider, make_data

    data = make_data(tmp_path)
    files = dict(data.prompts.files)
    files["prompts/judge.toml"] = files["prompts/judge.toml"].replace('memory = "off"', 'memory = "retrieve"')
    prompts = PromptSet.from_files(files)
    provider = InTestProvider(lambda _r: "")
    assert memory_refusal(prompts, provider) is None and memory_refusal(data.prompts, provider) is None
    provider.traits = ProviderTraits(sandbox="codex")
    refusal = memory_refusal(prompts, provider)
    assert refusal is not None and "harness judge" in refusal and 'set memory = "off"' in refusal
