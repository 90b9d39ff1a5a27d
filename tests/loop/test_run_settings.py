"""A run decides with its own settings (`optimizer.runsettings.RunSettings`): a resume after
``judgeloop.toml`` was edited, ``report``, ``attribute`` and ``confirm`` all read the run's snapshot
and its judge, with the override rules of `RunSettings.from_run`.

Same fixtures as tests/loop/test_loop_run.py: fresh copies of an ``init --sample`` workspace whose dev
split is a 32-item subset, a deterministic fake judge, the real openai SDK.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import git
import pytest

from optimizer.cli import main
from optimizer.errors import UserError
from optimizer.ledger import Run
from optimizer.runsettings import RunOverrides, RunSettings
from optimizer.workspace import gitops
from optimizer.workspace.config import Config, JudgeOverrides, JudgeSection, LoopSection
from tests.support.fakeserver import FakeLLMServer
from tests.support.loop import (
    BAD_ENTRY,
    GOOD_ENTRY,
    FakeJudge,
    commit_all,
    report_json,
    run_loop,
    set_toml_key,
    stop_after_baseline,
)
from tests.support.scripted import ScriptedStrategy, add_heldout_split, install, latest, toggle


def _stopped_run(root: Path, url: str, *extra: str) -> None:
    """A run that evaluated its baseline and stopped (a STOP file): unfinished, so resumable."""
    with stop_after_baseline():
        assert run_loop(root, url, *extra) == 0
    run, exps = latest(root)
    assert run.status == "stopped" and [e.status for e in exps] == ["baseline"]


def _edit_loop_settings(root: Path) -> None:
    """A person edits [loop] between the stop and the resume (committed: a resume refuses a dirty tree)."""
    set_toml_key(root, "loop", "alpha", "0.5")
    set_toml_key(root, "loop", "rejudge", "0")
    set_toml_key(root, "loop", "fpr_tolerance", "0.5")
    path = root / "judgeloop.toml"
    text = path.read_text(encoding="utf-8")
    assert "\n# fdr = 0.1" in text
    path.write_text(text.replace("\n# fdr = 0.1", "\nfdr = 0.2  #", 1), encoding="utf-8")
    commit_all(root, "a person's edit of [loop] mid-run")


def _attribute_json(
    root: Path, capsys: pytest.CaptureFixture[str], *extra: str
) -> tuple[dict[str, Any], str]:
    """`judgeloop attribute --json`: (the result, its status lines)."""
    capsys.readouterr()
    assert main(["attribute", "-w", str(root), "--json", *extra]) == 0
    out = capsys.readouterr()
    return json.loads(out.out), out.err


@pytest.mark.slow
def test_resume_after_editing_loop_decides_with_the_runs_own_settings(
    ws: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    install(monkeypatch, ScriptedStrategy([toggle(GOOD_ENTRY), toggle(GOOD_ENTRY, BAD_ENTRY)]))
    with FakeLLMServer(default=FakeJudge(ws)) as server:
        _stopped_run(ws, server.openai_base_url)
        _edit_loop_settings(ws)
        # The loop trusts only commits it made: a commit on the run's branch since it stopped (a person's or an
        # agent's, git cannot tell) is refused at the resume in one line naming it, and nothing is judged.
        run, _ = latest(ws)
        edit = gitops.rev_parse(ws, "HEAD")
        capsys.readouterr()
        assert run_loop(ws, server.openai_base_url, "--resume", "--max-experiments", "2") == 2
        refused = capsys.readouterr().err
        assert "commits the loop did not make" in refused and edit[:12] in refused
        assert len(latest(ws)[1]) == 1
        # The refusal's advice: keep the edit on another branch, put the run's branch back at its incumbent.
        repo = git.Repo(ws)
        repo.git.branch("mine", "HEAD")
        repo.git.reset("--hard", "HEAD~1")
        assert run_loop(ws, server.openai_base_url, "--resume", "--max-experiments", "2") == 0
        run, exps = latest(ws)
        _base, good, both = exps
        assert good.status == "kept" and both.status == "rolled_back"
        # alpha 0.1 (not 0.5, nor a LORD++ level of fdr 0.2); rejudge 2 (not 0); FPR tolerance 0 (not 0.5).
        assert good.alpha == 0.1 and both.alpha == 0.1
        assert good.test is not None and good.test["alpha"] == 0.1 and good.test["rejudge"] == 2
        assert good.rejudge_calls > 0
        assert "FPR rose" in (both.reason or "")

        # The report says what the decisions used: no FDR control, every candidate at alpha 0.1.
        acc = report_json(ws, capsys)["accounting"]
        assert acc["fdr"] is None and acc["tested"] == 2 and acc["expected_false_keeps"] == pytest.approx(0.2)
        assert [k["alpha"] for k in acc["kept"]] == [0.1]
        # attribute measures with the same settings, and says an edit of judgeloop.toml is ignored.
        assert "alpha = 0.1" in (ws / "judgeloop.toml").read_text(encoding="utf-8")
        _edit_loop_settings(ws)
        result, said = _attribute_json(ws, capsys, "--run", run.id)
        meta = result["attribution_meta"]
        assert meta["alpha"] == 0.1 and meta["rejudge"] == 2 and meta["judge"] == "openai:fake-judge"
        assert "re-judged 2 more time(s)" in said
        assert any(
            "judgeloop.toml [loop]" in line and "alpha 0.1 → 0.5" in line for line in said.splitlines()
        )


@pytest.mark.slow
def test_resume_refuses_another_policy_or_replicates(
    ws: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    install(monkeypatch, ScriptedStrategy([toggle(GOOD_ENTRY)]))
    with FakeLLMServer(default=FakeJudge(ws)) as server:
        _stopped_run(ws, server.openai_base_url)
        for flags, named in (
            (["--policy", "paired"], "--policy 'paired'"),
            (["--replicates", "3"], "--replicates 3"),
        ):
            capsys.readouterr()
            assert run_loop(ws, server.openai_base_url, "--resume", *flags) == 2
            err = capsys.readouterr().err.strip()
            assert len(err.splitlines()) == 1 and named in err and "start a new run" in err
            run, exps = latest(ws)
            assert run.status == "stopped" and len(exps) == 1  # refused before anything ran
        # The run's own values are not "another" one.
        assert (
            run_loop(
                ws,
                server.openai_base_url,
                "--resume",
                "--policy",
                "adaptive",
                "--replicates",
                "1",
                "--max-experiments",
                "1",
            )
            == 0
        )
    run, exps = latest(ws)
    assert run.status == "finished" and [e.status for e in exps] == ["baseline", "kept"]


def _other_judge_in_toml(root: Path, server: FakeLLMServer) -> None:
    """judgeloop.toml's own [judge]: another model on another server (the run is started with flags)."""
    set_toml_key(root, "judge", "provider", '"openai"')
    set_toml_key(root, "judge", "model", '"other-judge"')
    path = root / "judgeloop.toml"
    text = path.read_text(encoding="utf-8")
    path.write_text(
        text.replace("\n[judge]\n", f'\n[judge]\nbase_url = "{server.openai_base_url}"\n', 1),
        encoding="utf-8",
    )
    commit_all(root, "the workspace's own judge")


@pytest.mark.slow
def test_attribute_and_confirm_without_judge_flags_use_the_runs_judge(
    ws: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    add_heldout_split(ws)
    install(monkeypatch, ScriptedStrategy([toggle(GOOD_ENTRY)]))
    with FakeLLMServer(default=FakeJudge(ws)) as started, FakeLLMServer(default=FakeJudge(ws)) as configured:
        _other_judge_in_toml(ws, configured)
        assert run_loop(ws, started.openai_base_url, "--max-experiments", "1") == 0
        run, exps = latest(ws)
        assert [e.status for e in exps] == ["baseline", "kept"]
        n_started = len(started.inference_requests())
        assert (
            _attribute_json(ws, capsys, "--run", run.id)[0]["attribution_meta"]["judge"]
            == "openai:fake-judge"
        )
        assert main(["confirm", "-w", str(ws), "--split", "held"]) == 0
        after = started.inference_requests()[n_started:]
        assert configured.inference_requests() == []  # never the workspace's [judge]
    assert after and {r.model for r in after} == {"fake-judge"}


@pytest.mark.slow
def test_base_url_may_move_and_provider_or_model_may_not_for_resume_attribute_and_confirm(
    ws: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    add_heldout_split(ws)
    install(monkeypatch, ScriptedStrategy([toggle(GOOD_ENTRY)]))
    with FakeLLMServer(default=FakeJudge(ws)) as first, FakeLLMServer(default=FakeJudge(ws)) as moved:
        _stopped_run(ws, first.openai_base_url)
        refused = (["--model", "other-judge"], "--model 'other-judge'")
        commands = (
            ["run", "--resume", "--max-experiments", "1"],
            ["attribute"],
            ["confirm", "--split", "held"],
        )
        # The same judge served elsewhere: every command follows --base-url alike.
        for command in commands:
            n_first = len(first.inference_requests())
            assert main([command[0], "-w", str(ws), *command[1:], "--base-url", moved.openai_base_url]) == 0
            assert len(first.inference_requests()) == n_first, command
            if command[0] == "run":
                run, exps = latest(ws)
                assert run.status == "finished" and [e.status for e in exps] == ["baseline", "kept"]
        assert {r.model for r in moved.inference_requests()} == {"fake-judge"}
        for command in commands[1:]:
            capsys.readouterr()
            assert main([command[0], "-w", str(ws), *command[1:], *refused[0]]) == 2
            err = capsys.readouterr().err.strip()
            assert len(err.splitlines()) == 1 and refused[1] in err and "fake-judge" in err


@pytest.mark.slow
def test_resume_with_batch_checks_the_runs_judge_not_the_workspaces(
    ws: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # judgeloop.toml's [judge] is the local judge (no batch API); the run judges with openai.
    path = ws / "judgeloop.toml"
    path.write_text(
        path.read_text(encoding="utf-8").replace(
            "\n[judge]\n", "\n[judge]\nbatch_poll_s = 0.01\nbatch_poll_max_s = 0.04\n", 1
        ),
        encoding="utf-8",
    )
    commit_all(ws, "poll batches fast")
    install(monkeypatch, ScriptedStrategy([toggle(GOOD_ENTRY)]))
    with FakeLLMServer(default=FakeJudge(ws), batch_polls=1) as server:
        _stopped_run(ws, server.openai_base_url)
        assert main(["run", "-w", str(ws), "--resume", "--batch", "--max-experiments", "1"]) == 0
        assert len(server.batch_creations) >= 1
    run, exps = latest(ws)
    assert run.status == "finished" and [e.status for e in exps] == ["baseline", "kept"]


# -- RunSettings.from_run on its own -------------------------------------------------------------------


def _run(config: dict[str, Any], budgets: dict[str, Any] | None = None, policy: str = "adaptive") -> Run:
    return Run(
        id="r1",
        created=datetime.now(UTC),
        status="stopped",
        strategy="library",
        policy=policy,
        split="small",
        split_fingerprint="f",
        start_rev="0" * 40,
        branch="judgeloop/r1",
        budgets=budgets or {},
        config=config,
    )


def test_an_old_snapshot_takes_what_it_lacks_from_the_current_config() -> None:
    current = Config(
        judge=JudgeSection(provider="openai", model="m", timeout_s=33.0),
        loop=LoopSection(alpha=0.3, rejudge=4, infra_retry_rounds=7),
    )
    # An old ledger's snapshot: no rejudge/fdr/infra_retry_* in [loop], no timeout_s in [judge],
    # a key this version no longer has; no replicates, no seed.
    old = _run(
        {
            "judge": {"provider": "openai", "model": "m"},
            "loop": {"policy": "paired", "alpha": 0.05, "retired_key": 1},
        },
        budgets={"max_experiments": 3},
        policy="paired",
    )
    settings = RunSettings.from_run(old, current)
    assert settings.loop.policy == "paired" and settings.loop.alpha == 0.05
    assert settings.loop.rejudge == 4 and settings.loop.infra_retry_rounds == 7
    assert settings.judge.timeout_s == 33.0 and settings.judge.model == "m"
    assert settings.limits.max_experiments == 3 and settings.limits.patience == current.loop.patience
    assert settings.replicates == 1 and settings.seed == current.optimizer.seed and not settings.batch
    # The note names what the snapshot recorded and the file now says otherwise, not what it lacked.
    assert settings.loop_note is not None and "alpha 0.05 → 0.3" in settings.loop_note
    assert "policy paired → adaptive" in settings.loop_note and "rejudge" not in settings.loop_note


def test_the_note_names_each_loop_setting_the_run_keeps_and_limits_follow_the_command_line() -> None:
    snapshot = Config(loop=LoopSection(alpha=0.1, patience=5)).model_dump(mode="json")
    run = _run(
        snapshot,
        budgets={
            "max_experiments": 10,
            "budget_usd": 2.0,
            "hours": None,
            "patience": 5,
            "replicates": 3,
            "batch": True,
        },
    )
    current = Config(loop=LoopSection(alpha=0.2, patience=9))
    settings = RunSettings.from_run(
        run,
        current,
        RunOverrides(max_experiments=2, hours=1.5, propose_only=True, judge=JudgeOverrides(concurrency=16)),
    )
    assert settings.loop.alpha == 0.1 and settings.replicates == 3 and settings.batch
    assert settings.limits.max_experiments == 2 and settings.limits.budget_usd == 2.0
    assert settings.limits.hours == 1.5 and settings.limits.patience == 5 and settings.limits.propose_only
    assert settings.judge.max_concurrency == 16
    assert settings.loop_note is not None
    assert "alpha 0.1 → 0.2" in settings.loop_note and "patience 5 → 9" in settings.loop_note
    with pytest.raises(UserError, match="--provider 'anthropic'"):
        RunSettings.from_run(run, current, RunOverrides(judge=JudgeOverrides(provider="anthropic")))
