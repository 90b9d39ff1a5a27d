"""`devset import --format agentrewardbench|osreward` (issue 35, point 2): files written in each benchmark's
published schema import, verify, render into the judge's request and are judged through `eval`; malformed
or hostile files are refused in one line with exit 2 and nothing is left behind."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from optimizer.cli import main
from optimizer.devset.formats.registry import CONVERTERS, FORMAT_NAMES
from optimizer.devset.labels import load_labels
from optimizer.devset.split import open_split, split_meta
from optimizer.judge.prompts import PromptSet
from optimizer.judge.render import build_request
from optimizer.judge.types import ImagePart, TextPart
from optimizer.scaffold import init_workspace
from optimizer.vocab import IMPORT_FORMATS
from optimizer.workspace.workspace import Workspace
from tests.support.benchmarks import (
    ARB_AGENT,
    ArbItem,
    OsrTrace,
    arb_items,
    arb_trajectory_file,
    osreward_traces,
    png,
    write_arb,
    write_osreward,
)
from tests.support.heldout import list_held_out
from tests.support.loop import commit_all, judge_eval


@pytest.fixture
def fresh(tmp_path: Path) -> Workspace:
    return init_workspace(tmp_path / "ws", sample=False)


def import_(ws_root: Path, src: Path, name: str, fmt: str, *extra: str) -> int:
    return main(["devset", "import", str(src), "-w", str(ws_root), "--name", name, "--format", fmt, *extra])


def refused(capsys: pytest.CaptureFixture[str], code: int) -> str:
    """The one line an import was refused with (exit 2, no traceback)."""
    err = capsys.readouterr().err
    assert code == 2, err
    lines = [line for line in err.splitlines() if not line.startswith("judgeloop: warning:")]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def nothing_left(ws: Workspace, name: str) -> None:
    assert not ws.split_dir(name).exists()
    assert [p.name for p in ws.devset_dir.iterdir() if p.name.startswith(f".{name}")] == []


def test_the_cli_offers_every_registered_format() -> None:
    assert FORMAT_NAMES == IMPORT_FORMATS
    assert set(CONVERTERS) == {"agentrewardbench", "osreward"}


def test_agentrewardbench_imports_primary_sure_annotations_and_verifies(
    fresh: Workspace, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    items = arb_items()
    src = write_arb(tmp_path / "arb", items)
    assert import_(fresh.root, src, "arb", "agentrewardbench", "--all") == 0
    err = capsys.readouterr().err
    assert "1 secondary annotation(s) left out" in err and "Unsure left out" in err
    split = open_split(fresh, "arb")
    sure = [i for i in items if i.success != "Unsure"]
    assert split.ids == [i.item_id for i in sure]
    labels = load_labels(split)
    # The first row of a trajectory is its label; the secondary annotator's opposite label is not.
    assert {tid: lab.label for tid, lab in labels.items()} == {
        i.item_id: "positive" if i.success == "Successful" else "negative" for i in sure
    }
    meta = split_meta(split.root)
    assert meta.format == "agentrewardbench" and meta.source == str(src.resolve())
    assert main(["devset", "verify", "arb", "-w", str(fresh.root)]) == 0

    # Only the instruction, actions, thoughts and screenshots reach judge input: never the benchmark's
    # own reward, the annotations or the page dumps.
    for tid in split.ids:
        judge_input = split.json_path(tid).read_text() + split.markdown_text(tid)
        for leaked in ("cum_reward", "summary_info", "Successful", "Unsuccessful", "axtree", "Suboptimal"):
            assert leaked not in judge_input
    traj = split.trajectory(items[0].item_id)
    assert traj.task.instruction == items[0].goal
    assert [s.action.type for s in traj.steps] == ["click('a50')", "click('a51')", "send_msg_to_user('done')"]
    assert traj.steps[1].thought == "Step 1 of webarena.177: I look at the page first."
    shots = [split.screenshot_file(s) for s in traj.steps]
    assert all(shot is not None and shot.is_file() for shot in shots)


@pytest.mark.parametrize(
    ("fmt", "words", "images"),
    [
        ("agentrewardbench", ("Change my reddit bio", "click('a51')", "I look at the page first."), 3),
        ("osreward", ("Turn on Dark Mode", "click(coordinate=[101, 608])", "the Settings app is open"), 2),
    ],
)
def test_the_renderer_turns_converted_steps_into_the_judges_request(
    fresh: Workspace, tmp_path: Path, fmt: str, words: tuple[str, ...], images: int
) -> None:
    assert import_(fresh.root, write_source(fmt, tmp_path / "src"), "x", fmt, "--all") == 0
    split = open_split(fresh, "x")
    prompts = PromptSet.from_dir(fresh.prompts_dir)
    request = build_request(split.trajectory(split.ids[0]), split, prompts)
    text = "\n".join(part.text for part in request.parts if isinstance(part, TextPart))
    assert all(word in text for word in words), text
    assert sum(isinstance(part, ImagePart) for part in request.parts) == images


def test_osreward_imports_traces_with_labels_kept_apart(
    fresh: Workspace, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    traces = osreward_traces()
    src = write_osreward(tmp_path / "osr", traces)
    assert import_(fresh.root, src, "osr", "osreward", "--all") == 0
    capsys.readouterr()
    split = open_split(fresh, "osr")
    assert sorted(split.ids) == sorted(t.trace_id for t in traces)  # results.json is not a trace
    labels = load_labels(split)
    assert {t: lab.label for t, lab in labels.items()} == {
        t.trace_id: "positive" if t.human_label == "SUCCESS" else "negative" for t in traces
    }
    assert main(["devset", "verify", "osr", "-w", str(fresh.root)]) == 0
    traj = split.trajectory("calendar_1")
    assert traj.task.instruction == "Delete every event on 3 May."
    assert traj.steps[0].action.type == "click(coordinate=[100, 608])"
    # Screenshots are read relative to the trace's own folder; the unrecorded last frame stays unrecorded.
    assert [s.screenshot is not None for s in traj.steps] == [True, True, False]
    for tid in split.ids:
        judge_input = split.json_path(tid).read_text() + split.markdown_text(tid)
        for leaked in ("human_label", "SUCCESS", "FAIL", "human_alignment", "human_efficiency"):
            assert leaked not in judge_input


def test_a_manifest_imports_part_of_a_partial_download(
    fresh: Workspace, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    items = arb_items()
    src = write_arb(tmp_path / "arb", items)
    arb_trajectory_file(src, items[3]).unlink()  # not downloaded
    line = refused(capsys, import_(fresh.root, src, "all", "agentrewardbench", "--all"))
    assert "no trajectory" in line and "--manifest" in line
    manifest = tmp_path / "m.txt"
    manifest.write_text(f"{items[0].item_id}\n{items[1].item_id}\n")
    assert import_(fresh.root, src, "part", "agentrewardbench", "--manifest", str(manifest)) == 0
    assert open_split(fresh, "part").ids == [items[0].item_id, items[1].item_id]


def write_source(fmt: str, root: Path) -> Path:
    return (
        write_arb(root, arb_items()) if fmt == "agentrewardbench" else write_osreward(root, osreward_traces())
    )


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["agentrewardbench", "osreward"])
def test_an_imported_benchmark_is_judged_through_eval(
    ws: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], fmt: str
) -> None:
    assert import_(ws, write_source(fmt, tmp_path / "src"), "arb", fmt, "--all") == 0
    commit_all(ws, "another benchmark's split")
    capsys.readouterr()
    out = tmp_path / "out"
    code, sent = judge_eval(ws, out, "--split", "arb")
    assert code == 0, capsys.readouterr().err
    ids = open_split(Workspace.open(ws), "arb").ids
    assert len(sent) == len(ids)
    assert sorted(p.stem for p in out.glob("*.json") if not p.name.startswith("_")) == sorted(ids)
    assert "kappa" in capsys.readouterr().out


def test_an_imported_benchmark_listed_as_held_out_is_refused_by_eval(
    ws: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = write_osreward(tmp_path / "osr", osreward_traces())
    assert import_(ws, src, "osr", "osreward", "--all") == 0
    list_held_out(ws, "osr", "osr held out")
    capsys.readouterr()
    code = main(["eval", "-w", str(ws), "--split", "osr", "--provider", "openai", "--model", "fake-judge"])
    line = refused(capsys, code)
    assert "held out" in line and "judgeloop confirm" in line


# --- hostile and malformed sources ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("row", "expected"),
    [
        ({"task_id": "../../etc/passwd"}, "task_id '../../etc/passwd' is not a safe id"),
        ({"model_name": "../GenericAgent"}, "model_name '../GenericAgent' is not a safe id"),
        ({"benchmark": "/abs"}, "benchmark '/abs' is not a safe id"),
        ({"trajectory_success": "Maybe"}, "trajectory_success is 'Maybe'"),
        ({"trajectory_success": ""}, "no trajectory_success; label the trajectory"),
    ],
)
def test_agentrewardbench_refuses_hostile_annotation_rows(
    fresh: Workspace, tmp_path: Path, capsys: pytest.CaptureFixture[str], row: dict[str, str], expected: str
) -> None:
    base = {
        "annotator_name": "A",
        "benchmark": "webarena",
        "task_id": "webarena.9",
        "model_name": ARB_AGENT,
        "trajectory_success": "Successful",
    }
    src = write_arb(tmp_path / "arb", arb_items()[:2], extra_rows=[{**base, **row}])
    line = refused(capsys, import_(fresh.root, src, "arb", "agentrewardbench", "--all"))
    assert expected in line and "annotations.csv" in line
    nothing_left(fresh, "arb")


@pytest.mark.parametrize(
    ("link", "expected"),
    [
        ("/etc/hostname", "leads outside its folder"),
        ("trajectories/../../outside.png", "leads outside its folder"),
        ("../outside.png", "leads outside its folder"),
    ],
)
def test_agentrewardbench_refuses_screenshot_paths_outside_src(
    fresh: Workspace, tmp_path: Path, capsys: pytest.CaptureFixture[str], link: str, expected: str
) -> None:
    png(tmp_path / "outside.png", 7)
    item = ArbItem("webarena.1", "Successful", goal="Do it")
    src = write_arb(tmp_path / "arb", [item])
    path = arb_trajectory_file(src, item)
    traj = json.loads(path.read_text())
    traj["steps"][1]["screenshot_path"] = link
    path.write_text(json.dumps(traj))
    line = refused(capsys, import_(fresh.root, src, "arb", "agentrewardbench", "--all"))
    assert expected in line and "step 1" in line
    nothing_left(fresh, "arb")


def test_a_screenshot_symlinked_out_of_src_is_refused(
    fresh: Workspace, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    png(tmp_path / "secret.png", 9)
    src = write_osreward(tmp_path / "osr", [OsrTrace("t0", "SUCCESS")])
    shot = src / "desktop" / "screenshots" / "t0" / "step_0000.png"
    shot.unlink()
    os.symlink(tmp_path / "secret.png", shot)
    line = refused(capsys, import_(fresh.root, src, "osr", "osreward", "--all"))
    assert "outside" in line and "secret.png" in line
    nothing_left(fresh, "osr")


@pytest.mark.parametrize(
    ("traces", "expected"),
    [
        ([OsrTrace("a", "SUCCESS"), OsrTrace("a", "FAIL", folder="other")], "trace_id 'a' again"),
        ([OsrTrace("a", None)], "has no human_label, not SUCCESS or FAIL"),
        ([OsrTrace("a", "PARTIAL")], "has human_label 'PARTIAL', not SUCCESS or FAIL"),
        ([OsrTrace("../../x", "SUCCESS")], "trace_id '../../x' is not a safe id"),
        ([OsrTrace("a", "SUCCESS", instruction="x" * 20_001)], "instruction is 20,001 characters"),
        ([OsrTrace("a", "SUCCESS", extra={"instruction": None})], "no instruction"),
        ([OsrTrace("a", "SUCCESS", extra={"trajectory": {"0": {}}})], "not a list of steps"),
        (
            [OsrTrace("a", "SUCCESS", extra={"trajectory": [{"action": "type('" + "y" * 3000 + "')"}]})],
            "action is 3,008 characters, over the limit of 2,000",
        ),
        ([], "holds no OSReward trace"),
    ],
)
def test_osreward_refuses_malformed_traces_in_one_line(
    fresh: Workspace,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    traces: list[OsrTrace],
    expected: str,
) -> None:
    src = write_osreward(tmp_path / "osr", traces)
    line = refused(capsys, import_(fresh.root, src, "osr", "osreward", "--all"))
    assert expected in line
    nothing_left(fresh, "osr")


def test_agentrewardbench_refuses_missing_labels_huge_fields_and_broken_files(
    fresh: Workspace, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    item = ArbItem("webarena.1", "Successful", goal="Do it")
    src = write_arb(tmp_path / "arb", [item])
    annotations = src / "annotations.csv"
    good = annotations.read_text()
    annotations.write_text(good.replace("trajectory_success", "success"))
    assert "no column trajectory_success" in refused(
        capsys, import_(fresh.root, src, "arb", "agentrewardbench", "--all")
    )
    annotations.write_text(good)
    path = arb_trajectory_file(src, item)
    path.write_text(json.dumps({"goal": "g" * 20_001, "steps": []}))
    assert "goal is 20,001 characters, over the limit" in refused(
        capsys, import_(fresh.root, src, "arb", "agentrewardbench", "--all")
    )
    path.write_text("{not json")
    assert "not valid JSON" in refused(capsys, import_(fresh.root, src, "arb", "agentrewardbench", "--all"))
    (src / "annotations.csv").unlink()
    assert "not in the AgentRewardBench layout (no annotations.csv" in refused(
        capsys, import_(fresh.root, src, "arb", "agentrewardbench", "--all")
    )
    nothing_left(fresh, "arb")


def test_agenthorizon_only_options_are_refused_for_other_formats(
    fresh: Workspace, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = write_osreward(tmp_path / "osr", osreward_traces())
    assert "--rebuild-ahd reconstructs" in refused(
        capsys, import_(fresh.root, src, "osr", "osreward", "--rebuild-ahd")
    )
    assert "--link is for AgentHorizon" in refused(
        capsys, import_(fresh.root, src, "osr", "osreward", "--all", "--link")
    )
    nothing_left(fresh, "osr")


def test_agentrewardbench_reads_success_values_as_the_official_scoring_does(tmp_path: Path) -> None:
    from optimizer.devset.formats.agentrewardbench import convert

    items = [
        ArbItem(f"webarena.{k}", value, goal=f"Task {k}")
        for k, value in enumerate(("'successful'", " YES", "Failure", "no"))
    ]
    converted = convert(write_arb(tmp_path / "arb", items))
    assert [i.label["label"] for i in converted.items] == ["positive", "positive", "negative", "negative"]


def test_a_trajectory_folder_symlinked_out_of_src_is_refused(
    fresh: Workspace, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    item = ArbItem("webarena.1", "Successful", goal="Do it")
    elsewhere = write_arb(tmp_path / "elsewhere", [item])
    src = write_arb(tmp_path / "arb", [item])
    exp = arb_trajectory_file(src, item).parent
    for child in exp.iterdir():
        child.unlink()
    exp.rmdir()
    os.symlink(arb_trajectory_file(elsewhere, item).parent, exp)
    line = refused(capsys, import_(fresh.root, src, "arb", "agentrewardbench", "--all"))
    assert "the trajectory" in line and "outside" in line
    nothing_left(fresh, "arb")
