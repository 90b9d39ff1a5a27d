"""Panels (issue 19, point 1): judge.toml [panel], member calls sharing the item's cached trajectory,
the vote, the ledger's member verdicts, and the refusals a crafted judge.toml or member file meets."""

from __future__ import annotations

import asyncio
import hashlib
import os
from pathlib import Path
from typing import Any

import pytest

from optimizer.cli import main
from optimizer.devset.importer import import_split
from optimizer.errors import UserError
from optimizer.evaluation.cache import SCHEMA_VERSION as CACHE_SCHEMA
from optimizer.evaluation.cache import cache_key
from optimizer.evaluation.evaluator import evaluate_items
from optimizer.judge.prompts import JUDGE_MD, JUDGE_TOML, REQUIRED_FILES, PromptSet, parse_settings
from optimizer.judge.render import build_request
from optimizer.judge.types import VERDICT_SCHEMA, Sampling, stable_json
from optimizer.loop.guards import DevMaterial
from optimizer.models import Verdict
from optimizer.scaffold import init_workspace
from optimizer.workspace.config import JudgeSection
from tests.support.config import with_layout
from tests.support.data import make_items, write_release
from tests.support.fakecache import ManualClock, PromptCache
from tests.support.fakeserver import Behaviour, FakeLLMServer, RecordedRequest, verdict_reply
from tests.support.loop import commit_all, labels_of, present, report_json, run_loop, set_toml_key
from tests.support.panel import MEMBERS, PANEL_TOML, PanelJudge, member_of, member_text, write_members
from tests.support.scripted import latest, ledger_of
from tests.support.tui_driving import drive, svg_text
from tui.app import JudgeloopApp
from tui.views import ItemView


def _files(root: Path) -> dict[str, str]:
    return dict(PromptSet.from_dir(root / "prompts").files)


def _with_panel(files: dict[str, str], panel: str, members: dict[str, str] | None = None) -> dict[str, str]:
    out = {**files, JUDGE_TOML: files[JUDGE_TOML] + panel}
    for name, text in (members or {}).items():
        out[f"prompts/members/{name}.md"] = text
    return out


# --------------------------------------------------------------------------- settings, hostile


@pytest.mark.parametrize(
    ("panel", "expected"),
    [
        ('members = ["../labels"]\nvote = "majority"', "'../labels' is not a member name"),
        ('members = ["/etc/passwd"]\nvote = "majority"', "'/etc/passwd' is not a member name"),
        ('members = ["a/../../x"]\nvote = "majority"', "is not a member name"),
        ('members = [".hidden"]\nvote = "majority"', "is not a member name"),
        ('members = 3\nvote = "at_least:9"', "K must be between 1 and the 3 members"),
        ('members = 3\nvote = "at_least:0"', "K must be between 1 and the 3 members"),
        ('members = 3\nvote = "at_least:x"', 'use "unanimous", "majority" or "at_least:K"'),
        ('members = 3\nvote = "most"', 'use "unanimous", "majority" or "at_least:K"'),
        ('members = 0\nvote = "majority"', "2 to 9 members"),
        ('members = 100\nvote = "majority"', "2 to 9 members"),
        ('members = true\nvote = "majority"', "[panel.members"),
        ('members = ["a", "a"]\nvote = "majority"', "names a member twice"),
        (
            f'members = [{", ".join(repr(f"m{i}") for i in range(10))}]\nvote = "majority"',
            "a panel has 1 to 9",
        ),
        ("members = 3", "[panel.vote] Field required"),
        (
            'members = 3\nvote = "majority"\nweights = [1, 2, 3]',
            "[panel.weights] Extra inputs are not permitted",
        ),
    ],
)
def test_a_bad_panel_is_one_user_error_naming_the_file(panel: str, expected: str) -> None:
    with pytest.raises(UserError) as err:
        parse_settings(f"[panel]\n{panel}\n", "prompts/judge.toml")
    assert str(err.value).startswith("prompts/judge.toml: [panel")
    assert expected in str(err.value)


def test_a_missing_member_file_and_a_misused_marker_in_one_are_refused(tmp_path: Path) -> None:
    files = _files(init_workspace(tmp_path / "ws").root)
    with pytest.raises(
        UserError,
        match=r"prompts/members/strict.md is missing: judge.toml's \[panel\] names "
        r"member 'strict'",
    ):
        PromptSet.from_files(_with_panel(files, '\n[panel]\nmembers = ["strict"]\nvote = "unanimous"\n'))
    bad = "Judge strictly.\n<!-- judgeloop:protected:begin -->\nThe output contract.\n"
    with pytest.raises(UserError, match=r"prompts/members/strict.md:2: protected region is never closed"):
        PromptSet.from_files(
            _with_panel(files, '\n[panel]\nmembers = ["strict"]\nvote = "unanimous"\n', {"strict": bad})
        )
    inline = "Judge strictly. <!-- judgeloop:protected:end -->\n"
    with pytest.raises(UserError, match="must stand alone on its line"):
        PromptSet.from_files(
            _with_panel(files, '\n[panel]\nmembers = ["strict"]\nvote = "unanimous"\n', {"strict": inline})
        )
    with pytest.raises(UserError, match=r"prompts/members/strict.md:1: unknown placeholder \{\{labels\}\}"):
        PromptSet.from_files(
            _with_panel(
                files, '\n[panel]\nmembers = ["strict"]\nvote = "unanimous"\n', {"strict": "{{labels}}\n"}
            )
        )


def test_a_linked_member_file_or_folder_is_refused_on_disk(tmp_path: Path) -> None:
    ws = init_workspace(tmp_path / "ws")
    secret = tmp_path / "secret.md"
    secret.write_text("held-out labels\n", encoding="utf-8")
    toml = ws.prompts_dir / "judge.toml"
    toml.write_text(
        toml.read_text(encoding="utf-8") + '\n[panel]\nmembers = ["strict"]\nvote = "unanimous"\n'
    )
    (ws.prompts_dir / "members").mkdir()
    os.symlink(secret, ws.prompts_dir / "members" / "strict.md")
    with pytest.raises(UserError, match=r"prompts/members/strict\.md is a symbolic link"):
        PromptSet.from_dir(ws.prompts_dir)
    (ws.prompts_dir / "members" / "strict.md").unlink()
    (ws.prompts_dir / "members").rmdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "strict.md").write_text("Judge.\n", encoding="utf-8")
    os.symlink(elsewhere, ws.prompts_dir / "members")
    with pytest.raises(UserError, match="prompts/members is a symbolic link"):
        PromptSet.from_dir(ws.prompts_dir)


def test_member_files_count_in_the_prompt_hash_only_when_the_panel_names_them(tmp_path: Path) -> None:
    ws = init_workspace(tmp_path / "ws")
    files = _files(ws.root)
    single = PromptSet.from_files(files)
    # Without [panel]: the hash over exactly judge.md, rubric.md and judge.toml, as before panels.
    h = hashlib.sha256()
    for name in REQUIRED_FILES:
        h.update(name.encode() + b"\0" + files[name].encode() + b"\0")
    assert single.prompt_hash() == h.hexdigest()
    stray = PromptSet.from_files({**files, "prompts/members/a.md": "unused\n"})
    assert stray.prompt_hash() == single.prompt_hash()
    panel = _with_panel(files, '\n[panel]\nmembers = ["a"]\nvote = "unanimous"\n', {"a": "one\n"})
    edited = {**panel, "prompts/members/a.md": "two\n"}
    assert PromptSet.from_files(panel).prompt_hash() != PromptSet.from_files(edited).prompt_hash()


def test_without_a_panel_requests_and_cache_keys_are_what_they_were(tmp_path: Path) -> None:
    """The single judge's request and cache key, computed independently of the panel code."""
    ws = init_workspace(tmp_path / "ws")
    items = make_items(1, n_steps=3)
    release = write_release(tmp_path / "release", items)
    split = import_split(ws, release.root, "one", all_items=True, warn=lambda _m: None)
    prompts = PromptSet.from_dir(ws.prompts_dir)
    traj = split.trajectory(split.ids[0])
    request = build_request(traj, split, prompts)
    assert request.parts[-1].text.startswith(prompts.system_prompt())  # type: ignore[union-attr]
    sampling = Sampling()
    payload = {
        "v": CACHE_SCHEMA,
        "provider": "openai",
        "model": "m",
        "sampling": sampling.as_dict(),
        "schema": VERDICT_SCHEMA,
        "request": request.fingerprint(),
        "replicate": 0,
    }
    expected = hashlib.sha256(stable_json(payload).encode()).hexdigest()
    assert (
        cache_key(
            provider="openai",
            model="m",
            sampling=sampling,
            schema=VERDICT_SCHEMA,
            request=request,
            replicate=0,
        )
        == expected
    )
    # A member key differs from the single judge's, and between members with the same instructions.
    keys = {
        cache_key(
            provider="openai",
            model="m",
            sampling=sampling,
            schema=VERDICT_SCHEMA,
            request=request,
            replicate=0,
            member=m,
        )
        for m in (None, "0:m1", "1:m2")
    }
    assert len(keys) == 3


def test_the_vote_counts_an_unparsed_member_as_a_vote_against() -> None:
    from optimizer.judge.verdicts import panel_vote

    yes = Verdict(success=True, reasoning="done")
    no = Verdict(success=False, reasoning="typed the wrong name", mistake_type="Critical Mistake")
    labels = ["a", "b", "c"]
    assert present(panel_vote(labels, [yes, yes, yes], 3, "unanimous")).success
    vote = present(panel_vote(labels, [yes, None, yes], 3, "unanimous"))
    assert not vote.success and "b: invalid" in vote.reasoning
    assert present(panel_vote(labels, [yes, no, yes], 2, "majority")).success
    failed = present(panel_vote(labels, [no, no, yes], 2, "majority"))
    assert (
        not failed.success
        and failed.mistake_type == "Critical Mistake"
        and "typed the wrong name" in failed.reasoning
    )
    assert panel_vote(labels, [None, None, None], 1, "at_least:1") is None


def test_a_panel_in_agentic_mode_is_refused_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ws = init_workspace(tmp_path / "ws", sample=True)
    toml = ws.prompts_dir / "judge.toml"
    text = toml.read_text(encoding="utf-8").replace('mode = "direct"', 'mode = "agentic"')
    toml.write_text(text + '\n[panel]\nmembers = 3\nvote = "majority"\n', encoding="utf-8")
    with FakeLLMServer() as server:
        code = main(
            [
                "eval",
                "-w",
                str(ws.root),
                "--split",
                "sample",
                "--provider",
                "openai",
                "--base-url",
                server.openai_base_url,
                "--model",
                "m",
                "--limit",
                "1",
            ]
        )
        assert server.inference_requests() == []
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    assert 'judge.toml has a [panel] and mode = "agentic"; panels run direct judges only' in err


# --------------------------------------------------------------------------- through the prompt-cache fake

MODEL = "claude-sonnet-4-5"


def _marked_verdicts(request: RecordedRequest) -> Behaviour:
    body = request.body if isinstance(request.body, dict) else {}
    last = str(body.get("messages", [{}])[-1])
    return verdict_reply(
        {"success": member_of(last) != "b", "reasoning": "r", "confidence": "medium", "mistake_type": None},
        delay_s=0.2,
    )


def test_every_member_after_the_first_reads_the_trajectory_from_the_cache(tmp_path: Path) -> None:
    ws = init_workspace(tmp_path / "ws")
    items = make_items(2, n_steps=14)
    for i, item in enumerate(items):
        item.instruction = f"{item.instruction} Task number {i:03d}."
    release = write_release(tmp_path / "release", items)
    split = import_split(ws, release.root, "long", all_items=True, warn=lambda _m: None)
    files = _files(ws.root)
    files[JUDGE_TOML] = with_layout(files[JUDGE_TOML], "trajectory-first")
    prompts = PromptSet.from_files(
        _with_panel(files, PANEL_TOML, {m: member_text(files[JUDGE_MD], m) for m in MEMBERS})
    )
    n = len(split.ids)
    os.environ["ANTHROPIC_API_KEY"] = "sk-test-panel"
    try:
        with FakeLLMServer(_marked_verdicts, prompt_cache=PromptCache(clock=ManualClock())) as server:
            judge = JudgeSection.model_validate(
                {
                    "provider": "anthropic",
                    "model": MODEL,
                    "max_retries": 0,
                    "base_url": server.anthropic_base_url,
                    "max_concurrency": 8,
                }
            )
            run = asyncio.run(evaluate_items(ws, split, prompts, judge, item_ids=split.ids, replicates=1))
            assert server.prompt_cache is not None
            assert server.prompt_cache.write_counts() == [1] * n  # one cache write per item, not three
            replies = [usage for _req, usage in server.replies]
            assert len(replies) == 3 * n
            # Every member call but each item's first read the trajectory prefix the first one wrote.
            assert sum(1 for u in replies if u.cache_read_tokens > 0) == 2 * n
            again = asyncio.run(evaluate_items(ws, split, prompts, judge, item_ids=split.ids, replicates=1))
            assert len(server.replies) == 3 * n  # the panel's calls are cached, member by member
    finally:
        del os.environ["ANTHROPIC_API_KEY"]
    assert run.calls_made == 3 * n and again.calls_made == 0 and again.cache_hits == 3 * n
    for result in run.items:
        (rep,) = result.replicates
        assert [m.member for m in rep.members] == list(MEMBERS)
        assert [present(m.verdict).success for m in rep.members] == [True, False, True]
        assert result.answer.success is False  # unanimous: b's failure decides
        assert rep.cost_usd == pytest.approx(sum(m.cost_usd for m in rep.members))
    assert [i.answer for i in again.items] == [i.answer for i in run.items]


# --------------------------------------------------------------------------- the loop keeps a panel


@pytest.mark.slow
def test_a_unanimous_panel_lowers_fpr_and_the_loop_keeps_it(
    ws: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_members(ws)  # committed with the baseline, unused until judge.toml names them
    set_toml_key(
        ws,
        "optimizer",
        "allowed_files",
        '["prompts/judge.md", "prompts/rubric.md", "prompts/judge.toml"]'
        '\nstructure_moves = ["panel.members", "panel.vote"]',
    )  # judge.toml edits reach the structure guard
    cfg = ws / "judgeloop.toml"  # priced, so the report's cost per verdict is not all zeros
    cfg.write_text(
        cfg.read_text(encoding="utf-8") + '\n[prices."fake-judge"]\ninput = 10.0\noutput = 10.0\n',
        encoding="utf-8",
    )
    commit_all(ws, "panel members")
    toml = ws / JUDGE_TOML
    toml.write_text(toml.read_text(encoding="utf-8") + PANEL_TOML, encoding="utf-8")
    fake = PanelJudge(ws)
    with FakeLLMServer(default=fake) as server:
        assert run_loop(ws, server.openai_base_url, "--strategy", "manual", "-m", "a unanimous panel") == 0
    run, exps = latest(ws)
    assert [(e.seq, e.status) for e in exps] == [(0, "baseline"), (1, "kept")], capsys.readouterr().out
    base, panel = exps
    labels = labels_of(ws)
    negatives = [t for t, lab in labels.items() if not lab.is_positive]
    assert present(base.fpr) == pytest.approx(sum(fake.errs(t, None) for t in negatives) / len(negatives))
    assert present(panel.fpr) == 0.0 < present(base.fpr)
    assert set(fake.calls) == {None, *MEMBERS}
    rows = ledger_of(ws).item_verdicts(panel.id)
    assert rows and all([m.member for m in r.replicates[0].members] == list(MEMBERS) for r in rows)
    for row in rows:  # each member's verdict is kept, and the item's answer is their unanimous vote
        negative = not labels[row.trajectory_id].is_positive
        for rep in row.replicates:  # a re-judged item re-ran the whole panel
            assert [m.success for m in rep.members] == [
                fake.errs(row.trajectory_id, m) if negative else True for m in MEMBERS
            ]
            assert rep.success == all(m.success for m in rep.members)
    # Re-judging ran the whole panel again: every member as often as the incumbent's single judge.
    assert fake.calls["a"] == fake.calls["b"] == fake.calls["c"] == fake.calls[None] > len(rows)
    assert run.status == "finished"
    # The report: cost per verdict split by member, equal to the members' recorded costs per verdict.
    report = report_json(ws, capsys)
    entries = {e["id"]: e for e in report["experiments"]}
    assert entries[base.id]["panel_cost"] is None
    cost = entries[panel.id]["panel_cost"]
    reps = [rep for r in rows for rep in r.replicates]
    assert cost["verdicts"] == len(reps)
    for name in MEMBERS:
        spent = sum(m.cost_usd for rep in reps for m in rep.members if m.member == name)
        assert cost["members"][name] == pytest.approx(spent / len(reps)) and spent > 0
    assert cost["cost_per_verdict_usd"] == pytest.approx(sum(cost["members"].values()))
    capsys.readouterr()
    assert main(["report", "-w", str(ws)]) == 0
    assert (
        f"panel: ${cost['cost_per_verdict_usd']:.4f} per verdict over {len(reps)} verdicts (a $"
        in capsys.readouterr().out
    )
    # The TUI's item view shows each member's verdict and reason under the replicate.
    item = next(
        r for r in rows if not labels[r.trajectory_id].is_positive and fake.errs(r.trajectory_id, "b")
    )
    app = JudgeloopApp(
        ws,
        image_mode="halfcell",
        watch=False,
        experiment_id=panel.id,
        item_id=item.trajectory_id,
        start_view="item",
    )

    async def scenario(pilot: Any) -> None:
        assert isinstance(app.screen, ItemView) and app.screen.detail is not None
        text = svg_text(app)
        assert "judge (majority): failure" in text
        for name, said in (("a", "failure"), ("b", "success"), ("c", "failure")):
            assert f"member {name}: {said}" in text
            assert f"member {name} on {item.trajectory_id}" in text  # the member's own reason

    drive(app, scenario, size=(200, 60))


# --------------------------------------------------------------------------- through `judgeloop eval`


def _majority_panel_workspace(tmp_path: Path) -> Path:
    ws = init_workspace(tmp_path / "ws", sample=True)
    write_members(ws.root)
    toml = ws.prompts_dir / "judge.toml"
    toml.write_text(
        toml.read_text(encoding="utf-8").replace('screenshots = "all"', 'screenshots = "none"')
        + '\n[panel]\nmembers = ["a", "b", "c"]\nvote = "majority"\n',
        encoding="utf-8",
    )
    return ws.root


def _b_dissents(request: RecordedRequest) -> Behaviour:
    body = request.body if isinstance(request.body, dict) else {}
    member = member_of(str(body.get("messages", "")) + str(body.get("system", "")))
    return verdict_reply(
        {
            "success": member != "b",
            "reasoning": f"member {member} says so",
            "confidence": "high",
            "mistake_type": None if member != "b" else "Critical Mistake",
        }
    )


@pytest.mark.slow
def test_eval_writes_each_members_verdict_and_batch_refuses_a_panel(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import json

    root = _majority_panel_workspace(tmp_path)
    out = tmp_path / "out"
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-panel")
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-test-panel")
    with FakeLLMServer(_b_dissents) as server:
        assert (
            main(
                [
                    "eval",
                    "-w",
                    str(root),
                    "--split",
                    "sample",
                    "--provider",
                    "openai",
                    "--model",
                    "m",
                    "--base-url",
                    server.openai_base_url,
                    "--limit",
                    "2",
                    "--out",
                    str(out),
                ]
            )
            == 0
        )
        assert len(server.inference_requests()) == 2 * 3
        files = [json.loads(p.read_text()) for p in sorted(out.glob("*.json")) if p.name != "_summary.json"]
        assert len(files) == 2
        for body in files:
            assert body["success"] is True  # majority: a and c outvote b
            (rep,) = body["_meta"]["replicates"]
            assert [(m["member"], m["success"], m["reasoning"]) for m in rep["members"]] == [
                ("a", True, "member a says so"),
                ("b", False, "member b says so"),
                ("c", True, "member c says so"),
            ]
        # Two replicates: each runs the whole panel, and each replicate's members are its own calls.
        again = tmp_path / "again"
        assert (
            main(
                [
                    "eval",
                    "-w",
                    str(root),
                    "--split",
                    "sample",
                    "--provider",
                    "openai",
                    "--model",
                    "m",
                    "--base-url",
                    server.openai_base_url,
                    "--limit",
                    "2",
                    "--replicates",
                    "2",
                    "--out",
                    str(again),
                ]
            )
            == 0
        )
        assert len(server.inference_requests()) == 2 * 3 + 2 * 3  # replicate 0 was cached, 1 is new
        for path in sorted(again.glob("*.json")):
            if path.name == "_summary.json":
                continue
            reps = json.loads(path.read_text())["_meta"]["replicates"]
            assert [r["index"] for r in reps] == [0, 1]
            assert [[m["member"] for m in r["members"]] for r in reps] == [["a", "b", "c"]] * 2
            assert [[m["cached"] for m in r["members"]] for r in reps] == [[True] * 3, [False] * 3]
        capsys.readouterr()
        code = main(
            [
                "eval",
                "-w",
                str(root),
                "--split",
                "sample",
                "--provider",
                "anthropic",
                "--model",
                "claude-haiku-4-5",
                "--base-url",
                server.anthropic_base_url,
                "--limit",
                "2",
                "--batch",
            ]
        )
        err = capsys.readouterr().err
        assert code == 2 and "Traceback" not in err
        assert (
            "judge.toml has a [panel], which --batch does not send yet; drop --batch or remove [panel]" in err
        )
        assert server.batch_creations == [] and len(server.inference_requests()) == 4 * 3


# --------------------------------------------------------------------------- the optimiser's guards


def test_the_guards_hold_a_member_file_like_judge_md() -> None:
    from optimizer.loop.guards import check_candidate

    member = "prompts/members/strict.md"
    old = (
        "Judge strictly.\n<!-- judgeloop:protected:begin -->\nAnswer with the JSON object only.\n"
        "<!-- judgeloop:protected:end -->\n"
    )
    edited = old.replace("Judge strictly.", "Judge strictly; a missing save is a failure.")
    broken = old.replace("Answer with the JSON object only.", "Answer as you like.")

    def check(new: str, allowed: list[str]) -> tuple[bool, str]:
        result = check_candidate({member: (old, new)}, allowed, 50, DevMaterial([], [], []))
        return result.ok, result.reason or ""

    assert check(edited, ["prompts/judge.md", member]) == (True, "")
    ok, reason = check(edited, ["prompts/judge.md"])  # not an allowed file: never edited
    assert not ok and f"the candidate changes {member}, outside the allowed files" in reason
    ok, reason = check(broken, ["prompts/judge.md", member])
    assert not ok and f"{member} edits protected region 1" in reason
    ok, reason = check(edited.replace("<!-- judgeloop:protected:end -->\n", ""), [member])
    assert not ok and "removes a protection marker" in reason


def test_a_harness_judge_refuses_a_panel_before_any_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import sys

    from optimizer.workspace.config import load_config
    from tests.support.config import write_config
    from tests.support.loop import make_workspace

    root = make_workspace(tmp_path)
    state = tmp_path / "state"
    state.mkdir()
    fake_cli = Path(__file__).parent / "support" / "fake_harness_cli.py"
    config = load_config(root / "judgeloop.toml")
    judge = config.judge.model_copy(
        update={
            "provider": "command",
            "model": "",
            "harness": "claude",
            "max_retries": 0,
            "command": [
                sys.executable,
                str(fake_cli),
                "--state",
                str(state),
                "--format",
                "claude",
                "{{PROMPT}}",
            ],
        }
    )
    write_config(root, config.model_copy(update={"judge": judge}))
    toml = root / JUDGE_TOML
    toml.write_text(
        toml.read_text(encoding="utf-8") + '\n[panel]\nmembers = 2\nvote = "majority"\n', encoding="utf-8"
    )
    capsys.readouterr()
    assert main(["eval", "-w", str(root), "--limit", "1"]) == 2
    err = capsys.readouterr().err
    assert (
        "judge.toml has a [panel], which the command provider (a harness judge that reads its own files) "
        "cannot run"
        in err
        and "Traceback" not in err
    )
    assert not (state / "invocations.jsonl").exists()  # the harness was never started


def test_plan_prices_every_members_call(ws: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import json

    def plan() -> dict[str, Any]:
        capsys.readouterr()
        assert (
            main(
                [
                    "plan",
                    "-w",
                    str(ws),
                    "--json",
                    "--budget-usd",
                    "20",
                    "--provider",
                    "openai",
                    "--model",
                    "gpt-5",
                    "--policy",
                    "paired",
                ]
            )
            == 0
        )
        return dict(json.loads(capsys.readouterr().out))

    single = plan()
    toml = ws / JUDGE_TOML
    toml.write_text(
        toml.read_text(encoding="utf-8") + '\n[panel]\nmembers = 3\nvote = "unanimous"\n', encoding="utf-8"
    )
    panel = plan()
    assert panel["first_pass_warm_usd"] == pytest.approx(3 * single["first_pass_warm_usd"])
    assert panel["calls_per_candidate"] == 3 * single["calls_per_candidate"] == 3 * 32
