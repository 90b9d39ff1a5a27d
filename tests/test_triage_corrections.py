"""Label triage's hostile inputs through the real CLI: crafted ``corrections.jsonl`` files, candidates
that would write or read it, a file edited outside `judgeloop label-fix` (refused at the next run and eval
until adopted), concurrent writers, an over-long reason and held-out items."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from optimizer.cli import main
from optimizer.devset.corrections import label_set
from optimizer.devset.labels import load_labels
from optimizer.devset.split import open_split
from optimizer.errors import UserError
from optimizer.judge.prompts import RUBRIC_MD
from optimizer.loop.guards import DevMaterial, check_candidate
from optimizer.loop.strategies import Proposal, ProposalContext
from optimizer.models import Label
from optimizer.workspace.workspace import Workspace
from tests.support.fakeserver import FakeLLMServer
from tests.support.loop import GOOD_ENTRY, FakeJudge, commit_all, git, run_loop, set_toml_key
from tests.support.scripted import ScriptedStrategy, install, latest, ledger_of, toggle
from tests.support.triage import SPLIT, corrections_file, run_cli

# -- hostile corrections files and candidates -------------------------------------------------------


@pytest.mark.parametrize(
    "case", ["unknown_id", "bad_label", "duplicate", "huge_line", "same_label", "not_json"]
)
@pytest.mark.slow
def test_a_crafted_corrections_file_is_one_clear_line_and_nothing_is_written(
    ws: Path, case: str, capsys: pytest.CaptureFixture[str]
) -> None:
    split = open_split(Workspace.open(ws), SPLIT)
    labels = load_labels(split)
    a, b = split.ids[0], split.ids[1]

    def line(tid: str, label: str | None = None, **extra: Any) -> str:
        flipped = "failure" if labels[tid].is_positive else "success"
        return (
            json.dumps(
                {
                    "id": tid,
                    "label": label or flipped,
                    "reason": "r",
                    "at": "2026-12-01T10:00:00+00:00",
                    **extra,
                }
            )
            + "\n"
        )

    crafted, expected = {
        "unknown_id": (
            line(a)
            + json.dumps(
                {"id": "no-such-item", "label": "success", "reason": "r", "at": "2026-12-01T10:00:00+00:00"}
            )
            + "\n",
            "corrections.jsonl:2: id 'no-such-item' is not an item of split 'small'",
        ),
        "bad_label": (line(a, "positive"), "corrections.jsonl:1: label 'positive' is not success or failure"),
        "duplicate": (
            line(a) + line(b) + line(a),
            f"corrections.jsonl:3: id {a} is corrected twice (first on line 1)",
        ),
        "huge_line": (line(a, reason="x" * 10_000_000), "corrections.jsonl:1: a line of 10,000,"),
        "same_label": (
            line(a, "success" if labels[a].is_positive else "failure"),
            f"id {a} is already labelled",
        ),
        "not_json": ("{not json\n", "corrections.jsonl:1: not valid JSON"),
    }[case]
    if case == "huge_line":
        crafted = json.dumps({"id": a, "label": "success", "reason": "x" * 10_000_000, "at": "2026"}) + "\n"
    corrections_file(ws).write_text(crafted, encoding="utf-8")
    before = corrections_file(ws).read_bytes()
    code, out, err = run_cli(
        capsys,
        "label-fix",
        "-w",
        str(ws),
        b,
        "--label",
        "failure" if labels[b].is_positive else "success",
        "--reason",
        "r",
    )
    assert code == 2 and out == "" and expected in err and len(err.strip().splitlines()) == 1
    assert len(err) < 500 and corrections_file(ws).read_bytes() == before
    code, _out, err = run_cli(
        capsys, "devset", "verify", SPLIT, "-w", str(ws)
    )  # listed with the split's problems
    assert code != 0 and f"problem: {ws}/devset/{SPLIT}/" in err and expected in err
    # A run deciding with the corrected labels refuses to start, in the same line; no run is recorded.
    set_toml_key(ws, "loop", "labels", '"corrected"')
    commit_all(ws, "corrected labels")
    code, out, err = run_cli(
        capsys,
        "run",
        "-w",
        str(ws),
        "--provider",
        "openai",
        "--base-url",
        "http://127.0.0.1:9/v1",
        "--model",
        "fake-judge",
    )
    assert code == 2 and expected in err and len(err.strip().splitlines()) == 1
    assert not (ws / "experiments" / "ledger.sqlite").exists() or not ledger_of(ws).runs()


def test_the_cli_refuses_an_unknown_id_an_empty_reason_and_a_label_already_given(
    ws: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    split = open_split(Workspace.open(ws), SPLIT)
    tid = split.ids[0]
    given = "success" if load_labels(split)[tid].is_positive else "failure"
    for argv, expected in (
        (["nope", "--label", "success", "--reason", "r"], "'nope' is not an item of split 'small'"),
        (
            [tid, "--label", "failure" if given == "success" else "success", "--reason", "  "],
            "--reason is empty",
        ),
        ([tid, "--label", given, "--reason", "r"], f"{tid} is already labelled {given}"),
    ):
        code, out, err = run_cli(capsys, "label-fix", "-w", str(ws), *argv)
        assert code == 2 and out == "" and expected in err and len(err.strip().splitlines()) == 1
    assert not corrections_file(ws).exists()
    code, _out, err = run_cli(capsys, "label-fix", "-w", str(ws), tid, "--label", "maybe", "--reason", "r")
    assert code == 2 and "invalid choice: 'maybe'" in err


@pytest.mark.slow
def test_no_candidate_can_write_or_read_the_corrections_file(
    ws: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from optimizer.loop.strategies.tools import ToolState, run_tool

    target = f"devset/{SPLIT}/corrections.jsonl"
    split = open_split(Workspace.open(ws), SPLIT)
    tid = split.ids[0]
    flipped = "failure" if load_labels(split)[tid].is_positive else "success"
    assert main(["label-fix", "-w", str(ws), tid, "--label", flipped, "--reason", "a person's"]) == 0
    before = corrections_file(ws).read_bytes()
    forged = json.dumps({"id": split.ids[1], "label": "success", "reason": "mine", "at": "2026-12-01"}) + "\n"

    def forge(ctx: ProposalContext) -> Proposal:
        # Both spellings: the canonical path and one through prompts/..
        return Proposal(
            files={
                target: forged,
                f"prompts/../{target}": forged,
                RUBRIC_MD: ctx.current_files[RUBRIC_MD] + "\n- Check the end state.\n",
            },
            rationale="fix the labels",
        )

    seen: list[ProposalContext] = []

    def tools(ctx: ProposalContext) -> Proposal:
        seen.append(ctx)
        state = ToolState(ctx)
        read = run_tool(state, "read_file", {"path": target})
        wrote = run_tool(state, "write_file", {"path": target, "text": forged})
        assert read.is_error and wrote.is_error and "not an allowed file" in read.text + wrote.text
        assert "a person's" not in read.text
        return toggle(GOOD_ENTRY)(ctx)

    install(monkeypatch, ScriptedStrategy([forge, tools]))
    with FakeLLMServer(default=FakeJudge(ws)) as server:
        assert run_loop(ws, server.openai_base_url, "--max-experiments", "2", "--replicates", "1") == 0
    _run, exps = latest(ws)
    assert exps[1].status == "guard_rejected" and "outside the allowed files" in (exps[1].reason or "")
    assert target in (exps[1].reason or "") and "mine" not in (exps[1].diff_text or "")
    assert corrections_file(ws).read_bytes() == before and seen
    # The guard alone, as every candidate meets it; and a configuration naming the file is refused.
    guard = check_candidate(
        {target: (before.decode(), forged)},
        ["prompts/judge.md", "prompts/rubric.md"],
        100,
        DevMaterial([], [], []),
    )
    assert not guard.ok and guard.guard == "allowed_files"
    set_toml_key(ws, "optimizer", "allowed_files", f'["prompts/rubric.md", "{target}"]')
    code, _out, err = run_cli(
        capsys,
        "run",
        "-w",
        str(ws),
        "--provider",
        "openai",
        "--base-url",
        "http://127.0.0.1:9/v1",
        "--model",
        "fake-judge",
    )
    assert code == 2 and "allowed_files" in err and len(err.strip().splitlines()) == 1


# -- side doors into the corrections (issue s24, item 7) ---------------------------------------------


def _flipped(labels: dict[str, Label], tid: str) -> str:
    return "failure" if labels[tid].is_positive else "success"


@pytest.mark.slow
def test_a_corrections_file_edited_outside_label_fix_is_refused_at_the_next_run_and_eval(
    ws: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    split = open_split(Workspace.open(ws), SPLIT)
    labels = load_labels(split)
    a, b = split.ids[0], split.ids[1]
    assert (
        main(["label-fix", "-w", str(ws), a, "--label", _flipped(labels, a), "--reason", "a person's"]) == 0
    )
    set_toml_key(ws, "loop", "labels", '"corrected"')
    commit_all(ws, "decide with the corrected labels")
    recorded = corrections_file(ws).read_bytes()
    # An agent with file access appends a line in the file's own format: valid, but no person wrote it.
    forged = (
        json.dumps(
            {
                "id": b,
                "label": _flipped(labels, b),
                "reason": "obviously",
                "by": "ana",
                "at": "2026-12-01T10:00:00+00:00",
            }
        )
        + "\n"
    )
    corrections_file(ws).write_bytes(recorded + forged.encode())
    code, out, err = run_cli(
        capsys,
        "run",
        "-w",
        str(ws),
        "--provider",
        "openai",
        "--base-url",
        "http://127.0.0.1:9/v1",
        "--model",
        "fake-judge",
    )
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert f"devset/{SPLIT}/corrections.jsonl" in err and "label-fix" in err and "label-adopt" in err
    assert not (ws / "experiments" / "ledger.sqlite").exists() or not ledger_of(ws).runs()
    with FakeLLMServer(default=FakeJudge(ws)) as server:
        code, out, err = run_cli(
            capsys,
            "eval",
            "-w",
            str(ws),
            "--provider",
            "openai",
            "--base-url",
            server.openai_base_url,
            "--model",
            "fake-judge",
        )
        assert server.inference_requests() == []
    assert code == 2 and "kappa" not in out.lower() and len(err.strip().splitlines()) == 1
    assert f"devset/{SPLIT}/corrections.jsonl" in err
    # A person's later label-fix refuses too: it must not bless the forged line by rewriting the file.
    c = split.ids[2]
    code, _out, err = run_cli(
        capsys, "label-fix", "-w", str(ws), c, "--label", _flipped(labels, c), "--reason", "r"
    )
    assert code == 2 and "corrections.jsonl" in err and b"obviously" in corrections_file(ws).read_bytes()
    # A file replaced by hand is refused, and so is one where no correction was ever recorded.
    corrections_file(ws).write_text(forged, encoding="utf-8")
    with pytest.raises(UserError, match=r"corrections\.jsonl was changed outside"):
        label_set(split, "corrected")
    ref = f"refs/judgeloop/corrections/{SPLIT}"
    record = git(ws, "rev-parse", ref).strip()
    git(ws, "update-ref", "-d", ref)
    with pytest.raises(UserError, match=r"corrections\.jsonl holds corrections no"):
        label_set(split, "corrected")
    git(ws, "update-ref", ref, record)
    # Back as recorded, it is read; a person who wants the hand edit adopts it, seeing what it changes.
    corrections_file(ws).write_bytes(recorded)
    assert list(label_set(split, "corrected").corrections) == [a]
    corrections_file(ws).write_bytes(recorded + forged.encode())
    code, out, err = run_cli(capsys, "label-adopt", "-w", str(ws))
    assert code == 0 and b in out and "1 added" in out, err
    assert list(label_set(split, "corrected").corrections) == [a, b]


@pytest.mark.slow
def test_concurrent_label_fix_processes_and_the_tui_writer_lose_no_correction(ws: Path) -> None:
    from tui.items import save_correction

    split = open_split(Workspace.open(ws), "sample")
    labels = load_labels(split)
    ids = split.ids
    assert len(ids) >= 88
    script = (
        "import sys\nfrom optimizer.cli import main\n"
        "for arg in sys.argv[3:]:\n"
        "    tid, label = arg.split('=')\n"
        "    code = main(['label-fix', '-w', sys.argv[1], '--split', sys.argv[2], tid, '--label', label,\n"
        "                 '--reason', 'seen ' + tid, '--by', 'proc'])\n"
        "    assert code == 0, code\n"
    )
    batches = [ids[0:40], ids[40:80]]
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", script, str(ws), "sample", *(f"{t}={_flipped(labels, t)}" for t in batch)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        for batch in batches
    ]
    for tid in ids[80:88]:  # the TUI's writer, meanwhile, in this process
        save_correction(ws, "sample", tid, _flipped(labels, tid), "from the tui", "tui")
    for proc in procs:
        _out, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err.decode()[-2000:]
    fixes = label_set(split, "corrected").corrections  # readable, and what label-fix recorded
    assert sorted(fixes) == sorted(ids[:88])
    assert all(fixes[t].label == _flipped(labels, t) for t in ids[:88])


def test_a_reason_over_what_the_reader_takes_is_refused_in_one_line_and_the_file_stays_readable(
    ws: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from optimizer.devset.corrections import MAX_LINE_BYTES

    split = open_split(Workspace.open(ws), SPLIT)
    labels = load_labels(split)
    a, b = split.ids[0], split.ids[1]
    assert main(["label-fix", "-w", str(ws), a, "--label", _flipped(labels, a), "--reason", "first"]) == 0
    before = corrections_file(ws).read_bytes()
    code, out, err = run_cli(
        capsys, "label-fix", "-w", str(ws), b, "--label", _flipped(labels, b), "--reason", "x" * 20_000
    )
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1 and len(err) < 500, err
    assert "--reason" in err and f"{MAX_LINE_BYTES:,}" in err
    assert corrections_file(ws).read_bytes() == before
    # Just under the limit still writes, and whatever was written reads back.
    code, out, err = run_cli(
        capsys,
        "label-fix",
        "-w",
        str(ws),
        b,
        "--label",
        _flipped(labels, b),
        "--reason",
        "y" * (MAX_LINE_BYTES - 400),
    )
    assert code == 0, err
    assert list(label_set(split, "corrected").corrections) == [a, b]
    c = split.ids[2]
    assert main(["label-fix", "-w", str(ws), c, "--label", _flipped(labels, c), "--reason", "later"]) == 0


def test_label_fix_on_a_heldout_item_gives_the_same_refusal_whatever_its_label(
    ws: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.support.heldout import import_held

    wsobj = Workspace.open(ws)
    dev = set(open_split(wsobj, SPLIT).ids)
    sample = load_labels(open_split(wsobj, "sample"))
    rest = [t for t in sample if t not in dev]
    pos = next(t for t in rest if sample[t].is_positive)
    neg = next(t for t in rest if not sample[t].is_positive)
    import_held(ws, [pos, neg])
    errors = []
    for split_name in ("held", "sample"):  # the held-out split, and the superset that holds its items
        for tid in (pos, neg):
            for label in ("success", "failure"):
                code, out, err = run_cli(
                    capsys,
                    "label-fix",
                    "-w",
                    str(ws),
                    "--split",
                    split_name,
                    tid,
                    "--label",
                    label,
                    "--reason",
                    "r",
                )
                assert code == 2 and out == "" and len(err.strip().splitlines()) == 1, err
                assert "already labelled" not in err and "held out" in err
                errors.append((split_name, err))
    for split_name in ("held", "sample"):
        assert (
            len({err for name, err in errors if name == split_name}) == 1
        )  # one message, whatever the label
    assert not (ws / "devset" / "held" / "corrections.jsonl").exists()
    assert not (ws / "devset" / "sample" / "corrections.jsonl").exists()
