"""The confinement and the bounds of harness judges, through the real CLI and bubblewrap: a hostile CLI
finds no label, workspace path or other provider's key and writes nothing outside its folder; a daemon
holding stdout, a flood of output and an oversized verdict neither hang a run nor fill its files; a CLI
reporting more than its declared price stops a budget after one call; a timeout kills the item's whole
namespace, a daemon in a session of its own included; without bubblewrap the judge is
refused in one line unless ``sandbox = "none"``, which every result then states; sandboxes of a dead
judgeloop are pruned at the next start.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from optimizer.cli import main
from optimizer.devset.split import open_split
from optimizer.workspace.workspace import Workspace
from tests.support.fake_harness_cli import kind
from tests.support.harness_judge import (
    FAKE_CLI,
    HOSTILE_CLI,
    HarnessState,
    configure,
    records,
    sandbox_folders,
    survivors,
)
from tests.support.loop import add_small_dev_split, git, make_workspace

OPENAI_KEY = "sk-openai-test-not-real"
ANTHROPIC_KEY = "sk-ant-test-not-real"


@pytest.fixture
def ws(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, harness_state: HarnessState) -> Path:
    root = make_workspace(tmp_path)
    monkeypatch.setenv("ANTHROPIC_API_KEY", ANTHROPIC_KEY)
    monkeypatch.setenv("OPENAI_API_KEY", OPENAI_KEY)
    return root


def summary(out: Path) -> dict[str, Any]:
    return dict(json.loads((out / "_summary.json").read_text(encoding="utf-8")))


def first_ids(root: Path, what: str, n: int) -> tuple[int, list[str]]:
    """The --limit that takes in ``n`` items of the fake's kind ``what``, and those items."""
    ids = open_split(Workspace.open(root), "sample").ids
    chosen = [i for i, t in enumerate(ids) if kind(t) == what][:n]
    return chosen[-1] + 1, [ids[i] for i in chosen]


@pytest.mark.boundary
def test_a_hostile_judge_finds_no_label_no_workspace_no_other_key_and_writes_nothing(
    ws: Path, harness_state: HarnessState, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    state = harness_state
    # As the red team ran it: judgeloop started in its workspace, a codex-style harness (its key only).
    monkeypatch.chdir(ws)
    configure(ws, state, harness="codex", command=[str(HOSTILE_CLI), "--state", state.url, "{{PROMPT}}"])
    rubric = ws / "prompts" / "rubric.md"
    before = rubric.read_bytes()
    (state.folder / "targets").write_text(f"{rubric}\n{ws / 'devset' / 'x'}\n", encoding="utf-8")
    (state.folder / "walk").write_text("", encoding="utf-8")
    assert main(["eval", "-w", str(ws), "--limit", "2", "--out", str(tmp_path / "out")]) == 0

    reports = records(state, "hostile.jsonl")
    assert len(reports) == 2, "the hostile CLI ran once per item"
    workspace_paths = {str(ws), str(ws.resolve())}
    for report in reports:
        # (What it tried to write is the test's own list of targets: not something it found.)
        blob = json.dumps({k: v for k, v in report.items() if k != "writes"})
        assert not any(p in blob for p in workspace_paths), "a path of the workspace reached the CLI"
        assert "labels.jsonl" not in blob and "judgeloop.toml" not in blob, "a label file is in view"
        assert report["files_holding_labels"] == [], "a file naming the item's label is readable"
        assert not report.get("walk_truncated") and report["paths_outside_system"], (
            "the walk saw the whole view"
        )
        # Its own key, no other, in its environment or any process's it can see.
        assert report["env"].get("OPENAI_API_KEY") == OPENAI_KEY
        assert ANTHROPIC_KEY not in blob, "another provider's key reached the CLI"
        # Its own PID namespace: /proc/1 and its parent are bwrap's init, not judgeloop.
        assert len(report["pids_in_view"]) <= 8 and report["/proc/1/cwd"] in (
            "/",
            "/sandbox",
            "<PermissionError>",
        )
        assert report["cwd"] == "/sandbox"
        # Nothing but its folder takes writes (its HOME is a private tmpfs, gone with it).
        home = str(Path.home()) + "/"
        assert not any(v == "written" for k, v in report["writes"].items() if not k.startswith(home)), report[
            "writes"
        ]
    assert rubric.read_bytes() == before, "prompts/rubric.md was changed by the judge"
    assert not (ws / "devset" / "x").exists()
    assert survivors(state.url) == [], "the hostile CLI's double-forked daemon outlived its item"
    assert sandbox_folders(state) == []


@pytest.mark.slow
@pytest.mark.parametrize("sandbox", ["bwrap", "none"])
def test_a_daemon_holding_stdout_does_not_turn_items_into_timeouts(
    ws: Path, harness_state: HarnessState, tmp_path: Path, sandbox: str
) -> None:
    state = harness_state
    for flag in ("daemon", "no-late", "well-formed"):
        (state.folder / flag).write_text("", encoding="utf-8")
    configure(ws, state, timeout_s=15.0, sandbox=sandbox)
    out = tmp_path / "out"
    assert main(["eval", "-w", str(ws), "--limit", "3", "--out", str(out)]) == 0
    assert len(records(state)) == 3
    assert summary(out)["infra_error_ids"] == [], "an item waited on a pipe its daemon still held"
    if sandbox == "bwrap":  # (unconfined, a daemon in a session of its own escapes: one reason to confine)
        assert survivors(state.url) == [], "a daemon outlived its item"


@pytest.mark.slow
def test_a_timeout_kills_the_whole_namespace_a_daemon_in_its_own_session_included(
    ws: Path, harness_state: HarnessState, tmp_path: Path
) -> None:
    """A CLI that never answers, with a double-forked daemon (its own session: outside the CLI's process
    group) and a child: at the timeout the item is an infrastructure error and nothing of it survives."""
    state = harness_state
    (state.folder / "daemon").write_text("", encoding="utf-8")
    limit, late = first_ids(ws, "late", 1)
    configure(ws, state, timeout_s=5.0)
    out = tmp_path / "out"
    assert main(["eval", "-w", str(ws), "--limit", str(limit), "--out", str(out)]) == 0
    assert late[0] in summary(out)["infra_error_ids"]
    assert any(r["id"] == late[0] and r.get("child_pid") for r in records(state)), "the late item ran"
    assert survivors(state.url) == [], "a daemon or child of a timed-out item outlived it"
    assert sandbox_folders(state) == []


@pytest.mark.slow
def test_a_flood_of_stdout_is_capped_never_stored_whole(
    ws: Path, harness_state: HarnessState, tmp_path: Path
) -> None:
    state = harness_state
    (state.folder / "flood").write_text(str(50_000_000), encoding="utf-8")
    (state.folder / "no-late").write_text("", encoding="utf-8")
    # A plain-text CLI: its stdout is its final message (items of kind "message" answer only there).
    limit, messages = first_ids(ws, "message", 1)
    configure(
        ws,
        state,
        harness=None,
        max_concurrency=2,
        command=[str(FAKE_CLI), "--state", state.url, "--format", "text", "{{PROMPT}}"],
    )
    cache = ws / "experiments"
    size_before = sum(f.stat().st_size for f in cache.rglob("*") if f.is_file())
    out = tmp_path / "out"
    assert main(["eval", "-w", str(ws), "--limit", str(limit), "--out", str(out)]) == 0
    assert len(records(state)) == limit and summary(out)["infra_error_ids"] == []
    stored = sum(f.stat().st_size for f in cache.rglob("*") if f.is_file()) - size_before
    assert stored < 4_000_000 * limit, f"{stored} bytes stored for {limit} item(s) of 50 MB of output"
    for tid in messages:
        assert (out / f"{tid}.json").stat().st_size < 2_500_000, "a result file holds the whole output"
    notes = " ".join(summary(out)["preprocessing"]["run_notes"])
    assert "bytes of their output were dropped" in notes


@pytest.mark.slow
def test_an_oversized_verdict_file_is_a_parse_failure(
    ws: Path, harness_state: HarnessState, tmp_path: Path
) -> None:
    state = harness_state
    (state.folder / "big-verdict").write_text("", encoding="utf-8")
    limit, files = first_ids(ws, "file", 2)
    (state.folder / "no-late").write_text("", encoding="utf-8")
    (state.folder / "well-formed").write_text("", encoding="utf-8")
    configure(ws, state)
    out = tmp_path / "out"
    assert main(["eval", "-w", str(ws), "--limit", str(limit), "--out", str(out)]) == 0
    for tid in files:
        result = json.loads((out / f"{tid}.json").read_text(encoding="utf-8"))
        assert result["_meta"]["parse_status"] == "parse_error", (
            "the valid final message replaced the oversized file"
        )
        assert "over the 1000000-byte cap" in result["raw_response"]


@pytest.mark.slow
def test_a_cli_reporting_more_than_its_price_stops_the_budget_after_one_call(
    ws: Path, harness_state: HarnessState, capsys: pytest.CaptureFixture[str]
) -> None:
    state = harness_state
    (state.folder / "cost").write_text("5.0", encoding="utf-8")
    (state.folder / "no-late").write_text("", encoding="utf-8")
    configure(ws, state, price_per_call_usd=0.01, max_concurrency=4)
    capsys.readouterr()
    main(["run", "-w", str(ws), "--strategy", "library", "--budget-usd", "0.05", "--max-experiments", "1"])
    captured = capsys.readouterr()
    out = captured.out + captured.err
    assert len(records(state)) == 1, "calls went on past a reported cost that crossed the budget"
    stops = [line for line in out.splitlines() if "budget of $0.05 reached" in line]
    assert stops and "up to $5.0000, the highest cost one call of the CLI reported" in stops[0], out


@pytest.mark.slow
def test_max_cost_per_call_is_the_reservation_when_set(
    ws: Path, harness_state: HarnessState, capsys: pytest.CaptureFixture[str]
) -> None:
    state = harness_state
    (state.folder / "no-late").write_text("", encoding="utf-8")
    (state.folder / "cost").write_text("0.02", encoding="utf-8")
    configure(ws, state, price_per_call_usd=0.01, max_cost_per_call_usd=0.02, max_concurrency=1)
    main(["run", "-w", str(ws), "--strategy", "library", "--budget-usd", "0.07", "--max-experiments", "1"])
    assert len(records(state)) == 3, "three calls of at most $0.02 fit a $0.07 budget, a fourth does not"
    captured = capsys.readouterr()
    assert "up to $0.0200, [judge] max_cost_per_call_usd" in captured.out + captured.err


@pytest.mark.slow
def test_without_bubblewrap_a_harness_judge_is_refused_in_one_line(
    ws: Path,
    harness_state: HarnessState,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    state = harness_state
    configure(ws, state)
    bin_dir = tmp_path / "bin"  # python and git, no bwrap
    bin_dir.mkdir()
    for program in (sys.executable, shutil.which("git")):
        assert program is not None
        (bin_dir / Path(program).name).symlink_to(program)
    (bin_dir / "python3").symlink_to(sys.executable)
    monkeypatch.setenv("PATH", str(bin_dir))
    capsys.readouterr()
    assert main(["eval", "-w", str(ws), "--limit", "2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    # (eval's first line says what it was about to judge; then the refusal, one line.)
    refusal = [line for line in err if "bubblewrap" in line]
    assert len(refusal) == 1 and refusal[0] == err[-1] and "Traceback" not in "\n".join(err), err
    assert "apt-get install bubblewrap" in refusal[0] and 'sandbox = "none"' in refusal[0]
    assert records(state) == [], "no CLI ran"
    # `run` refuses before a run or its branch exist.
    assert main(["run", "-w", str(ws), "--strategy", "library", "--max-experiments", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "apt-get install bubblewrap" in err[0], err
    assert git(ws, "branch", "--list", "judgeloop/*").strip() == ""
    # A bwrap that cannot create namespaces here (user namespaces not permitted): refused the same way.
    (bin_dir / "bwrap").write_text(
        "#!/bin/sh\necho 'bwrap: No permissions to create new namespace' >&2\nexit 1\n", encoding="utf-8"
    )
    (bin_dir / "bwrap").chmod(0o755)
    (bin_dir / "sh").symlink_to("/bin/sh")
    assert main(["run", "-w", str(ws), "--strategy", "library", "--max-experiments", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert (
        len(err) == 1 and "No permissions to create new namespace" in err[0] and "user namespaces" in err[0]
    ), err
    assert records(state) == []


@pytest.mark.slow
def test_sandbox_none_runs_unconfined_and_says_so_in_every_result(
    ws: Path, harness_state: HarnessState, tmp_path: Path
) -> None:
    state = harness_state
    (state.folder / "no-late").write_text("", encoding="utf-8")
    (state.folder / "well-formed").write_text("", encoding="utf-8")
    configure(ws, state)
    assert main(["eval", "-w", str(ws), "--limit", "2", "--out", str(tmp_path / "a")]) == 0
    assert summary(tmp_path / "a")["judge_confinement"] == "bwrap"
    configure(ws, state, sandbox="none")
    out = tmp_path / "b"
    assert main(["eval", "-w", str(ws), "--limit", "2", "--out", str(out)]) == 0
    assert len(records(state)) == 4, "a confined verdict is not an unconfined one: not taken from the cache"
    assert records(state)[-1]["cwd"] != "/sandbox"
    found = summary(out)
    assert found["judge_confinement"] == "none"
    assert any("ran unconfined" in n for n in found["preprocessing"]["run_notes"])
    for tid in found.get("trajectory_ids", []) or [r["id"] for r in records(state)[-2:]]:
        assert (
            json.loads((out / f"{tid}.json").read_text(encoding="utf-8"))["_meta"]["judge_confinement"]
            == "none"
        )


@pytest.mark.slow
def test_sandboxes_of_a_dead_judgeloop_are_pruned_at_the_next_start(
    ws: Path, harness_state: HarnessState
) -> None:
    state = harness_state
    (state.folder / "no-late").write_text("", encoding="utf-8")
    finished = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, check=True
    )
    dead = state.temp / f"judgeloop-harness-{finished.stdout.strip()}-abc"
    (dead / "agenthorizon_md").mkdir(parents=True)
    live = state.temp / "judgeloop-harness-1-xyz"  # pid 1 lives
    other = state.temp / "judgeloop-harness-notapid"
    live.mkdir()
    other.mkdir()
    configure(ws, state)
    assert main(["eval", "-w", str(ws), "--limit", "1"]) == 0
    assert not dead.exists(), "the dead owner's sandbox was not pruned"
    assert live.exists() and other.exists(), "a live owner's or an unknown folder was removed"


@pytest.mark.slow
def test_a_certificate_says_the_harness_judge_ran_unconfined(
    ws: Path, harness_state: HarnessState, capsys: pytest.CaptureFixture[str]
) -> None:
    state = harness_state
    (state.folder / "no-late").write_text("", encoding="utf-8")
    add_small_dev_split(ws, per_class=4)  # certify judges the whole dev split, twice
    configure(ws, state, sandbox="none", max_concurrency=8)
    capsys.readouterr()
    assert main(["certify", "-w", str(ws), "--no-bias", "--json"]) == 0
    cert = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert cert["judge"]["confinement"] == "none"
    markdown = (ws / cert["files"]["markdown"]).read_text(encoding="utf-8")
    assert "**The harness judge ran unconfined**" in markdown


@pytest.mark.slow
def test_a_cascades_second_judge_as_a_harness_runs_sandboxed(
    ws: Path, harness_state: HarnessState, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Issue 34: the second judge of a cascade is a harness CLI like any other: confined by bubblewrap, it
    sees no workspace path and no label file, and the first judge (over HTTP) is unchanged."""
    from tests.support.fakeserver import FakeLLMServer

    state = harness_state
    monkeypatch.chdir(ws)
    second = ws / "prompts" / "second"
    second.mkdir()
    for name in ("judge.md", "rubric.md"):
        (second / name).write_text((ws / "prompts" / name).read_text(encoding="utf-8"), encoding="utf-8")
    command = json.dumps([str(HOSTILE_CLI), "--state", state.url, "{{PROMPT}}"])
    toml = ws / "prompts" / "judge.toml"
    toml.write_text(
        toml.read_text(encoding="utf-8")
        + '\nstructure = "cascade"\n\n[cascade]\nescalate = ["success", "failure", "invalid"]\n\n[cascade.second]\n'
        f'provider = "command"\nmodel = ""\nharness = "codex"\ncommand = {command}\ntimeout_s = 90.0\nmax_retries = 0\n',
        encoding="utf-8",
    )
    with FakeLLMServer() as server:
        code = main(
            ["eval", "-w", str(ws), "--limit", "2", "--out", str(tmp_path / "out"), "--provider", "openai",
             "--model", "fake-judge", "--base-url", server.openai_base_url]
        )  # fmt: skip
        assert code == 0
        assert len(server.inference_requests()) == 2, "the first judge judged both items over HTTP"
    reports = records(state, "hostile.jsonl")
    assert len(reports) == 2, "the second judge's CLI ran once per escalated item"
    for report in reports:
        blob = json.dumps({k: v for k, v in report.items() if k != "writes"})
        assert str(ws) not in blob and str(ws.resolve()) not in blob, (
            "a path of the workspace reached the CLI"
        )
        assert "labels.jsonl" not in blob and "judgeloop.toml" not in blob, "a label file is in view"
        assert report["cwd"] == "/sandbox"
    out = summary(tmp_path / "out")
    assert out["cascade"]["escalated"] == 2 and out["cascade"]["second"]["provider"] == "command"
    assert survivors(state.url) == [] and sandbox_folders(state) == []
