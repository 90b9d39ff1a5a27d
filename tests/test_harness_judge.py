"""Harness judges (``[judge] provider = "command"``) through the real CLI and a fake coding-agent CLI
(tests/support/fake_harness_cli.py), confined by bubblewrap: the sample split judged item by item in
sandboxes that are inspected from inside, timeouts killed with their whole namespace, malformed
verdicts recorded as parse failures, kill -9 and resume from the cache (the sandbox left behind pruned),
budgets refused without a per-call price, and a loop that keeps and rolls back like any judge's.
The hostile CLI, bounded output and cost, and the unconfined mode: tests/test_harness_sandbox.py.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from optimizer.cli import main
from optimizer.devset.labels import load_labels
from optimizer.devset.split import open_split
from optimizer.workspace.config import load_config
from optimizer.workspace.workspace import Workspace
from tests.support.config import write_config
from tests.support.fake_harness_cli import kind, reported_cost
from tests.support.harness_judge import HarnessState, configure, records, sandbox_folders, survivors
from tests.support.loop import (
    BAD_ENTRY,
    GOOD_ENTRY,
    FakeJudge,
    add_small_dev_split,
    commit_all,
    git,
    make_workspace,
    wait_for,
)
from tests.support.processes import killed_cli
from tests.support.scripted import ScriptedStrategy, install, latest, toggle

INSTRUCTION_FILES = {"AGENTS.md", "CLAUDE.md", "GEMINI.md"}
# What a confined CLI's environment may hold (`optimizer.judge.sandbox.allowed_env`; LC_* too).
ALLOWED_ENV = {
    "PATH",
    "HOME",
    "LANG",
    "TERM",
    "PWD",
    "ANTHROPIC_API_KEY",
    "ANTHROPIC_AUTH_TOKEN",
    "CLAUDE_CODE_OAUTH_TOKEN",
    "FAKE_HARNESS_PASS",
}


def invocations(state: HarnessState) -> list[dict[str, Any]]:
    return records(state)


@pytest.fixture
def sample_ws(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, harness_state: HarnessState
) -> tuple[Path, HarnessState]:
    root = make_workspace(tmp_path)
    state = harness_state
    # Keys of several providers in judgeloop's environment: the claude harness may see only its own.
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test-not-real")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-not-real")
    monkeypatch.setenv("GEMINI_API_KEY", "gm-test-not-real")
    monkeypatch.setenv("SOME_SERVICE_TOKEN", "tok-test-not-real")
    monkeypatch.setenv("FAKE_HARNESS_PASS", "passed")
    return root, state


@pytest.mark.slow
def test_the_sample_split_through_a_fake_cli(
    sample_ws: tuple[Path, HarnessState], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root, state = sample_ws
    configure(root, state)
    split = open_split(Workspace.open(root), "sample")
    ids = split.ids
    kinds = Counter(kind(t) for t in ids)
    assert all(kinds[k] for k in ("late", "malformed", "message", "file")), kinds  # the sample exercises each
    out = tmp_path / "out"
    assert main(["eval", "-w", str(root), "--out", str(out)]) == 0
    captured = capsys.readouterr()
    runs = invocations(state)
    assert sorted(r["id"] for r in runs) == sorted(ids), "one CLI run per item (max_retries = 0)"

    summary = json.loads((out / "_summary.json").read_text(encoding="utf-8"))
    late = {t for t in ids if kind(t) == "late"}
    assert set(summary["infra_error_ids"]) == late
    assert "did not finish within 20 s (timeout_s); killed" in captured.out
    # The late CLIs and the children they started were killed with their namespaces.
    assert survivors(state.url) == [], "a late CLI or its child outlived its timeout"
    # Cost: what the CLI reported (claude's total_cost_usd) for every call that answered.
    assert summary["cost_usd"] == pytest.approx(sum(reported_cost(t) for t in ids if t not in late), abs=1e-6)

    for run in runs:
        tid = run["id"]
        if tid in late:
            assert not (out / f"{tid}.json").exists()
            continue
        result = json.loads((out / f"{tid}.json").read_text(encoding="utf-8"))
        markdown = next(f["text"] for f in run["files"] if f["path"] == f"agenthorizon_md/{tid}.md")
        if run["kind"] == "malformed":
            assert "success" not in result and result["_meta"]["parse_status"] == "parse_error"
        else:
            assert result["success"] is (hashlib.sha256(markdown.encode()).digest()[0] % 2 == 0)
            assert result["_meta"]["parse_status"] == "ok"

    # The sandboxes, as the CLI saw them.
    ws_paths = [str(root), str(root.resolve()), str(split.root), str(split.root.resolve())]
    for run in runs:
        tid, cwd = run["id"], Path(run["cwd"])
        others = [t for t in ids if t != tid]
        traj = split.trajectory(tid)
        images = {f"data/media/images/{tid}/step_{s.step_id + 1}.png" for s in traj.steps if s.screenshot}
        expected = {f"agenthorizon_md/{tid}.md", f"agenthorizon_json/{tid}.json", *INSTRUCTION_FILES, *images}
        seen = {f["path"] for f in run["files"]}
        assert seen == expected, f"{tid}: unexpected sandbox files {sorted(seen ^ expected)}"
        assert not any(f["symlink"] for f in run["files"]), "copies, never links into the release"
        for f in run["files"]:
            body = f["path"] + "\n" + f.get("text", "")
            assert not any(o in body for o in others), f"{tid}: {f['path']} names another item"
            for word in ('"label"', "paired_id", "original_id", "negative_source", "AgentHorizon.jsonl"):
                assert word not in body, f"{tid}: {f['path']} holds {word}"
        # The Markdown is the release's own text, its screenshot links moved to the item's folder.
        release_md = split.markdown_text(tid)
        for step in traj.steps:
            if step.screenshot:
                release_md = release_md.replace(
                    f"({step.screenshot})", f"(./data/media/images/{tid}/step_{step.step_id + 1}.png)"
                )
        assert (
            next(f["text"] for f in run["files"] if f["path"].endswith(".md") and "/" in f["path"])
            == release_md
        )
        # The prompt names the item; cwd is the sandbox's fixed mount (a fresh folder per run: it holds
        # exactly the item's files, above), nothing of the host's paths.
        assert f"`{tid}`" in run["prompt"] and "{{TRAJECTORY_ID}}" not in run["prompt"]
        assert cwd == Path("/sandbox") and run["env"]["PWD"] == "/sandbox"
        for value in [*run["argv"], *run["env"].values()]:
            assert not any(p in value for p in ws_paths), f"a workspace path reaches the CLI: {value!r}"
        env = run["env"]
        assert env.get("ANTHROPIC_API_KEY") == "sk-ant-test-not-real", "the claude harness keeps its own key"
        assert env.get("FAKE_HARNESS_PASS") == "passed", "pass_env is passed on"
        assert set(env) - {k for k in env if k.startswith("LC_")} <= ALLOWED_ENV, (
            "an allow-listed environment"
        )
    assert sandbox_folders(state) == [], "every sandbox folder is removed"


@pytest.mark.slow
def test_kill_9_mid_evaluation_then_resume_from_the_cache(sample_ws: tuple[Path, HarnessState]) -> None:
    root, state = sample_ws
    configure(root, state, max_concurrency=1)
    (state.folder / "no-late").write_text("", encoding="utf-8")
    ids = open_split(Workspace.open(root), "sample").ids[:24]
    gate_id = ids[9]
    (state.folder / "gate").write_text(gate_id, encoding="utf-8")

    def gate_reached() -> None:
        wait_for(lambda: any(r["id"] == gate_id for r in invocations(state)), "the gated item to start")

    killed_cli(["eval", "-w", str(root), "--limit", "24"], gate_reached)
    first = invocations(state)
    # The CLI dies with judgeloop (PR_SET_PDEATHSIG, bwrap --die-with-parent): its exit is the event.
    wait_for(lambda: not survivors(state.url), "a killed judgeloop's harness CLI to end")
    assert len(sandbox_folders(state)) == 1, "the one sandbox a kill -9 cannot remove"
    finished = [r["id"] for r in first if r["id"] != gate_id]
    assert len(finished) == 9, "one item at a time: nine finished before the gate"
    (state.folder / "gate").unlink()
    (state.folder / "invocations.jsonl").unlink()

    assert main(["eval", "-w", str(root), "--limit", "24"]) == 0
    second = [r["id"] for r in invocations(state)]
    assert sorted(second) == sorted(set(ids) - set(finished)), (
        "finished items come from the cache, never re-run"
    )
    assert sandbox_folders(state) == [], "the dead run's sandbox was pruned at the next start"


@pytest.mark.slow
def test_a_budget_without_a_per_call_price_is_refused_up_front(
    sample_ws: tuple[Path, HarnessState], capsys: pytest.CaptureFixture[str]
) -> None:
    root, state = sample_ws
    configure(root, state)
    assert (
        main(["run", "-w", str(root), "--strategy", "library", "--budget-usd", "1", "--max-experiments", "1"])
        == 2
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "price_per_call_usd" in err[0] and "Traceback" not in err[0]
    assert invocations(state) == [], "no CLI ran"
    assert git(root, "branch", "--list", "judgeloop/*").strip() == "", "refused before any run was created"


@pytest.mark.parametrize(
    ("judge", "message"),
    [
        ({"harness": "vscode"}, "unknown harness 'vscode'"),
        ({"command": []}, "[judge] command is empty; name the CLI to run"),
        ({}, '[judge] provider = "command" needs command = [...] or harness = "codex"'),
    ],
)
@pytest.mark.slow
def test_an_unknown_preset_or_an_empty_command_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], judge: dict[str, Any], message: str
) -> None:
    root = tmp_path / "ws"
    assert main(["init", str(root), "--sample"]) == 0
    text = (root / "judgeloop.toml").read_text(encoding="utf-8")
    extra = "".join(f"{k} = {json.dumps(v)}\n" for k, v in judge.items())
    (root / "judgeloop.toml").write_text(
        text.replace('provider = "local"', 'provider = "command"\n' + extra, 1), encoding="utf-8"
    )
    capsys.readouterr()
    assert main(["eval", "-w", str(root)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err


@pytest.mark.slow
def test_a_loop_with_a_harness_judge_keeps_and_rolls_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, harness_state: HarnessState
) -> None:
    root = make_workspace(tmp_path)
    add_small_dev_split(root)
    state = harness_state
    # The oracle: FakeJudge's table (a real improvement, GOOD_ENTRY; one that raises FPR, BAD_ENTRY),
    # answered by the fake CLI from which entries its AGENTS.md holds.
    judge = FakeJudge(root)
    labels = load_labels(open_split(Workspace.open(root), "small"))
    answers: dict[str, dict[str, Any]] = {}
    for tid, label in labels.items():
        answers[tid] = {}
        for enabled in ([], [GOOD_ENTRY], [BAD_ENTRY], sorted([GOOD_ENTRY, BAD_ENTRY])):
            success = label.is_positive if judge.correct(tid, set(enabled)) else not label.is_positive
            answers[tid]["+".join(enabled)] = [
                success,
                None if success else (label.mistake_type or "Critical Mistake"),
            ]
    entries = {e: judge.entry_text[e] for e in (GOOD_ENTRY, BAD_ENTRY)}
    (state.folder / "oracle.json").write_text(
        json.dumps({"entries": entries, "answers": answers}), encoding="utf-8"
    )
    (state.folder / "no-late").write_text("", encoding="utf-8")
    (state.folder / "well-formed").write_text("", encoding="utf-8")
    configure(root, state, max_concurrency=8)
    install(monkeypatch, ScriptedStrategy([toggle(GOOD_ENTRY), toggle(GOOD_ENTRY, BAD_ENTRY)]))
    assert main(["run", "-w", str(root), "--max-experiments", "2"]) == 0
    _run, exps = latest(root)
    assert [e.status for e in exps] == ["baseline", "kept", "rolled_back"]
    assert exps[1].fpr is not None and exps[0].fpr is not None and exps[1].fpr < exps[0].fpr
    # The harness read what the optimiser edited: the kept entry is in the instruction file of later runs.
    runs = invocations(state)
    with_good = [
        r
        for r in runs
        if any(f["path"] == "AGENTS.md" and entries[GOOD_ENTRY] in f.get("text", "") for f in r["files"])
    ]
    assert with_good, "no CLI run saw the kept edit"


@pytest.mark.slow
def test_the_cache_keys_the_command_and_the_instructions(sample_ws: tuple[Path, HarnessState]) -> None:
    root, state = sample_ws
    (state.folder / "no-late").write_text("", encoding="utf-8")
    configure(root, state)

    def new_runs(*extra: str) -> int:
        before = len(invocations(state))
        assert main(["eval", "-w", str(root), "--limit", "3", *extra]) == 0
        return len(invocations(state)) - before

    assert new_runs() == 3
    assert new_runs() == 0, "an unchanged harness, prompt and item come from the cache"
    judge_md = root / "prompts" / "judge.md"
    judge_md.write_text(
        judge_md.read_text(encoding="utf-8") + "\nLook at the last screenshot first.\n", encoding="utf-8"
    )
    commit_all(root, "edit the instructions")
    assert new_runs() == 3, "edited instructions are a new call"
    config = load_config(root / "judgeloop.toml")
    write_config(
        root,
        config.model_copy(
            update={
                "judge": config.judge.model_copy(
                    update={"command": [*config.judge.command[:-1], "--extra-flag", "{{PROMPT}}"]}
                )
            }
        ),
    )
    commit_all(root, "another command line")
    assert new_runs() == 3, "another command line is another judge"


def test_the_verdict_file_is_read_only_when_it_is_a_plain_file(tmp_path: Path) -> None:
    from optimizer.judge.harness import verdict_file_text

    secret = tmp_path / "outside.json"
    secret.write_text('{"success": true}', encoding="utf-8")
    (tmp_path / "box").mkdir()
    (tmp_path / "box" / "tid.json").symlink_to(secret)
    assert verdict_file_text(tmp_path / "box", "tid") is None, "a link out of the sandbox is not followed"
    (tmp_path / "box" / "tid.json").unlink()
    (tmp_path / "box" / "tid.json").write_bytes(b"x" * 2_000_000)
    note = verdict_file_text(tmp_path / "box", "tid")
    assert note is not None and "over the 1000000-byte cap: not read" in note, "an oversized file is not read"


@pytest.mark.parametrize(
    ("output", "stdout", "expected"),
    [
        # Claude Code --output-format json: one object; input_tokens exclude the cache reads and writes.
        (
            "claude-json",
            json.dumps(
                {
                    "result": "R",
                    "total_cost_usd": 0.25,
                    "usage": {
                        "input_tokens": 10,
                        "output_tokens": 5,
                        "cache_read_input_tokens": 100,
                        "cache_creation_input_tokens": 20,
                    },
                    "modelUsage": {"claude-opus-4-7": {}},
                }
            ),
            {
                "text": "R",
                "input_tokens": 10,
                "output_tokens": 5,
                "cache_read_tokens": 100,
                "cache_write_tokens": 20,
                "cost_usd": 0.25,
                "model": "claude-opus-4-7",
            },
        ),
        # codex exec --json: JSONL; turn.completed usage counts cached input inside input_tokens; no cost.
        (
            "codex-jsonl",
            "\n".join(
                json.dumps(e)
                for e in [
                    {"type": "thread.started", "thread_id": "t"},
                    {"type": "item.completed", "item": {"type": "agent_message", "text": "first"}},
                    {"type": "item.completed", "item": {"type": "command_execution", "command": "cat x"}},
                    {"type": "item.completed", "item": {"type": "agent_message", "text": "R"}},
                    {
                        "type": "turn.completed",
                        "usage": {"input_tokens": 26549, "cached_input_tokens": 22272, "output_tokens": 1590},
                    },
                ]
            )
            + "\nnot json\n",
            {
                "text": "R",
                "input_tokens": 26549 - 22272,
                "cache_read_tokens": 22272,
                "output_tokens": 1590,
                "cost_usd": None,
            },
        ),
        # opencode run --format json: JSONL; the cost and tokens of every step_finish are summed.
        (
            "opencode-jsonl",
            "\n".join(
                json.dumps(e)
                for e in [
                    {"type": "text", "part": {"text": "thinking aloud"}},
                    {
                        "type": "step_finish",
                        "part": {
                            "cost": 0.01,
                            "tokens": {"input": 100, "output": 10, "cache": {"read": 5, "write": 1}},
                        },
                    },
                    {"type": "text", "part": {"text": "R"}},
                    {
                        "type": "step_finish",
                        "part": {
                            "cost": 0.02,
                            "tokens": {"input": 50, "output": 4, "cache": {"read": 0, "write": 0}},
                        },
                    },
                ]
            ),
            {
                "text": "R",
                "input_tokens": 150,
                "output_tokens": 14,
                "cache_read_tokens": 5,
                "cache_write_tokens": 1,
                "cost_usd": pytest.approx(0.03),
            },
        ),
        # Gemini CLI --output-format json: `response`, tokens per model under stats.models; no cost.
        (
            "gemini-json",
            json.dumps(
                {
                    "response": "R",
                    "stats": {
                        "models": {
                            "gemini-3.1-pro": {"tokens": {"prompt": 1000, "candidates": 50, "cached": 400}}
                        }
                    },
                }
            ),
            {
                "text": "R",
                "input_tokens": 600,
                "cache_read_tokens": 400,
                "output_tokens": 50,
                "cost_usd": None,
                "model": "gemini-3.1-pro",
            },
        ),
        # Unreadable output: an empty final message (then a parse failure), never an exception.
        ("claude-json", "Traceback (most recent call last):", {"text": "", "cost_usd": None}),
        ("text", '{"success": true}', {"text": '{"success": true}', "cost_usd": None}),
    ],
)
def test_cli_output_is_read_in_each_harness_format(
    output: str, stdout: str, expected: dict[str, Any]
) -> None:
    from optimizer.judge.harness import parse_output

    parsed = parse_output(output, stdout)
    assert {k: getattr(parsed, k) for k in expected} == expected


@pytest.mark.parametrize("harness", ["codex", "claude", "gemini", "opencode"])
def test_each_preset_is_non_interactive_json_and_sends_the_prompt_once(harness: str) -> None:
    from optimizer.judge.harness import command_line, harness_spec
    from optimizer.workspace.config import JudgeSection

    spec = harness_spec(JudgeSection(provider="command", harness=harness, model="m-1"))
    argv, stdin = command_line(spec, "PROMPT TEXT", "tid")
    assert argv[0] == harness and "m-1" in argv and "json" in " ".join(argv)
    assert (argv.count("PROMPT TEXT") + (stdin == b"PROMPT TEXT")) == 1
    default = harness_spec(JudgeSection(provider="command", harness=harness))
    assert "m-1" not in command_line(default, "P", "tid")[0], "no model set: the CLI's own default"


@pytest.mark.slow
def test_a_failed_run_is_retried_then_an_infrastructure_error(
    sample_ws: tuple[Path, HarnessState], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root, state = sample_ws
    (state.folder / "no-late").write_text("", encoding="utf-8")
    (state.folder / "well-formed").write_text("", encoding="utf-8")
    (state.folder / "fail-first").write_text("", encoding="utf-8")
    configure(root, state, max_retries=1)
    ids = open_split(Workspace.open(root), "sample").ids[:2]
    assert main(["eval", "-w", str(root), "--limit", "2", "--out", str(tmp_path / "a")]) == 0
    runs = invocations(state)
    assert (
        sorted(r["id"] for r in runs) == sorted(ids * 2) and Counter(r["kind"] for r in runs)["failed"] == 2
    )
    assert json.loads((tmp_path / "a" / "_summary.json").read_text(encoding="utf-8"))["infra_error_ids"] == []
    # Without retries, a failing run is an infrastructure error naming the exit status and stderr.
    for tid in ids:
        (state.folder / f"failed-{tid}").unlink()
    configure(root, state, max_retries=0)
    capsys.readouterr()
    assert (
        main(["eval", "-w", str(root), "--limit", "2", "--out", str(tmp_path / "b"), "--replicates", "2"])
        == 0
    )
    out = capsys.readouterr().out
    assert "claude exited with status 3: transient failure: upstream 503 (1 attempt)" in out
