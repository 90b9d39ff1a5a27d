"""The bundled sample set generator: deterministic, complete, linked, valid, small and honest pictures."""

from __future__ import annotations

import hashlib
import itertools
import json
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from optimizer.devset.markdown import render_markdown
from optimizer.models import MISTAKE_TYPES, Label, Trajectory
from tools.sample_desktop import COLORS
from tools.samplegen import DEFAULT_SEED, PAIRS, generate_sample, main

REPO_ROOT = Path(__file__).resolve().parents[1]
COMMITTED = REPO_ROOT / "devset" / "sample"


def _tree_hashes(root: Path) -> dict[str, str]:
    return {
        p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


@pytest.fixture(scope="module")
def sample(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("sample") / "out"
    generate_sample(out, DEFAULT_SEED)
    return out


@pytest.fixture(scope="module")
def labels(sample: Path) -> list[Label]:
    lines = (sample / "AgentHorizon.jsonl").read_text(encoding="utf-8").splitlines()
    return [Label.model_validate_json(line) for line in lines]


def _json_docs(sample: Path) -> dict[str, dict[str, Any]]:
    return {
        p.stem: json.loads(p.read_text(encoding="utf-8"))
        for p in (sample / "sandbox" / "data" / "jsons").glob("*.json")
    }


@pytest.mark.slow
def test_same_seed_writes_byte_identical_files(sample: Path, tmp_path: Path) -> None:
    again = tmp_path / "again"
    generate_sample(again, DEFAULT_SEED)
    assert _tree_hashes(again) == _tree_hashes(sample)


@pytest.mark.slow
def test_other_seed_changes_ids_but_not_the_content_shape(
    sample: Path, tmp_path: Path, labels: list[Label]
) -> None:
    other = tmp_path / "other"
    summary = generate_sample(other, DEFAULT_SEED + 1, pairs=PAIRS[:2])
    other_rows = [json.loads(line) for line in (other / "AgentHorizon.jsonl").read_text().splitlines()]
    assert {r["trajectory_id"] for r in other_rows}.isdisjoint({lab.trajectory_id for lab in labels})
    assert summary.items == len(other_rows) == 8
    assert [r["label"] for r in other_rows] == [lab.label for lab in labels[:8]]


def test_committed_sample_matches_the_generator(sample: Path) -> None:
    """devset/sample is what the generator writes today: text files exactly, the same image files."""
    fresh, committed = _tree_hashes(sample), _tree_hashes(COMMITTED)
    assert sorted(fresh) == sorted(committed)
    text = [k for k in fresh if not k.endswith(".png")]
    assert {k: fresh[k] for k in text} == {k: committed[k] for k in text}


def test_counts_pairs_steps_and_label_shapes(sample: Path, labels: list[Label]) -> None:
    assert len(PAIRS) >= 20
    assert len({p.key for p in PAIRS}) == len(PAIRS)
    assert len(labels) == 4 * len(PAIRS)
    assert len({lab.trajectory_id for lab in labels}) == len(labels)
    by_scenario: dict[str, list[Label]] = defaultdict(list)
    for lab in labels:
        by_scenario[str(lab.trajectory_scenario)].append(lab)
    for pair in PAIRS:
        items = by_scenario[pair.key]
        positives = [lab for lab in items if lab.is_positive]
        negatives = [lab for lab in items if not lab.is_positive]
        assert len(positives) == 2 and len(negatives) == 2
        recordings = {lab.original_id for lab in positives}
        assert all(lab.trajectory_id == lab.original_id and lab.paired_id is None for lab in positives)
        for neg in negatives:
            # a negative shows one recording of the pair with the other recording's instruction
            assert {neg.original_id, neg.paired_id} == recordings
            assert neg.trajectory_id not in recordings
            assert neg.negative_source in (
                "parent_instruction_child_trajectory",
                "child_instruction_parent_trajectory",
            )
        assert {neg.mistake_type for neg in negatives} <= {pair.b_under_a, pair.a_under_b}
    types = Counter(lab.mistake_type for lab in labels if not lab.is_positive)
    assert set(MISTAKE_TYPES) <= set(types)  # every type occurs
    assert types[None] >= 2  # and a couple of untyped negatives, as in the release
    docs = _json_docs(sample)
    for lab in labels:
        n = len(docs[lab.trajectory_id]["steps"])
        assert 8 <= n <= 30, (lab.trajectory_id, n)


def test_negative_carries_the_sibling_instruction_and_the_shown_recording(
    sample: Path, labels: list[Label]
) -> None:
    docs = _json_docs(sample)
    for lab in labels:
        if lab.is_positive:
            continue
        shown, borrowed = docs[lab.original_id], docs[str(lab.paired_id)]
        neg = docs[lab.trajectory_id]
        assert neg["task"]["instruction"] == borrowed["task"]["instruction"]
        assert neg["task"]["instruction"] != shown["task"]["instruction"]
        assert neg["steps"] == shown["steps"]  # same actions and the same screenshot files


def test_every_json_is_a_blind_valid_trajectory_and_markdown_matches(sample: Path) -> None:
    docs = _json_docs(sample)
    md_dir = sample / "sandbox" / "data" / "markdowns"
    assert {p.stem for p in md_dir.glob("*.md")} == set(docs)
    for tid, doc in docs.items():
        assert set(doc) == {"trajectory_id", "task", "environment", "steps"}  # no label, pairing, milestones
        traj = Trajectory.model_validate(doc)
        assert traj.trajectory_id == tid
        assert [s.step_id for s in traj.steps] == list(range(len(traj.steps)))
        stamps = [s.timestamp_us for s in traj.steps]
        assert all(a is not None and b is not None and a < b for a, b in itertools.pairwise(stamps))
        assert (md_dir / f"{tid}.md").read_text(encoding="utf-8") == render_markdown(traj)


def test_every_linked_screenshot_exists_and_none_is_orphaned(sample: Path, labels: list[Label]) -> None:
    sandbox = sample / "sandbox"
    linked: set[Path] = set()
    for tid, doc in _json_docs(sample).items():
        recording = next(lab.original_id for lab in labels if lab.trajectory_id == tid)
        for step in doc["steps"]:
            assert step["screenshot"] == f"./data/media/images/{recording}/step_{step['step_id'] + 1}.png"
            path = (sandbox / step["screenshot"]).resolve()
            assert path.is_file(), path
            linked.add(path)
    on_disk = {p.resolve() for p in (sandbox / "data" / "media" / "images").rglob("*.png")}
    assert on_disk == linked
    folders = {p.name for p in (sandbox / "data" / "media" / "images").iterdir()}
    assert folders == {lab.original_id for lab in labels}  # one image folder per recording


def test_action_vocabulary_is_varied(sample: Path) -> None:
    kinds = Counter(step["action"]["type"] for doc in _json_docs(sample).values() for step in doc["steps"])
    assert {"click", "type", "press", "hotkey", "scroll", "drag", "wait"} <= set(kinds)


def test_whole_folder_is_under_5_mb_and_screenshots_are_small_palette_pngs(sample: Path) -> None:
    total = sum(p.stat().st_size for p in sample.rglob("*") if p.is_file())
    assert total < 5 * 1024 * 1024
    for png in list((sample / "sandbox").rglob("*.png"))[:20]:
        with Image.open(png) as img:
            assert img.format == "PNG" and img.mode == "P" and img.size == (640, 400)


def _final_frame(sample: Path, recording: str) -> Path:
    folder = sample / "sandbox" / "data" / "media" / "images" / recording
    return folder / f"step_{len(list(folder.glob('*.png')))}.png"


def test_final_frames_differ_between_the_two_recordings_of_every_pair(
    sample: Path, labels: list[Label]
) -> None:
    for pair in PAIRS:
        recs = [lab.original_id for lab in labels if lab.is_positive and lab.trajectory_scenario == pair.key]
        a, b = (_final_frame(sample, r).read_bytes() for r in recs)
        assert a != b, pair.key


def test_screenshots_show_the_state_the_steps_produce(sample: Path, labels: list[Label]) -> None:
    """The drawn shape is really on the final frame: a red rectangle covers more red than a red ellipse
    of the same box (area ratio pi/4), and the first frame has no red at all."""
    recs = [lab.original_id for lab in labels if lab.is_positive and lab.trajectory_scenario == "draw-shape"]
    red = COLORS["red"]

    def red_pixels(path: Path) -> int:
        with Image.open(path) as img:
            colors = img.convert("RGB").getcolors(maxcolors=1 << 16) or []
        return sum(count for count, rgb in colors if rgb == red)

    rect_rec, ellipse_rec = recs  # PAIRS order: A is the rectangle, B the ellipse
    rect_red, ellipse_red = (
        red_pixels(_final_frame(sample, rect_rec)),
        red_pixels(_final_frame(sample, ellipse_rec)),
    )
    assert ellipse_red > 5000
    assert 0.70 < ellipse_red / rect_red < 0.86
    first = sample / "sandbox" / "data" / "media" / "images" / rect_rec / "step_1.png"
    assert red_pixels(first) == 0


def test_frames_change_as_the_recording_progresses(sample: Path, labels: list[Label]) -> None:
    for lab in labels:
        if not lab.is_positive:
            continue
        folder = sample / "sandbox" / "data" / "media" / "images" / lab.original_id
        frames = {hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.glob("*.png")}
        assert len(frames) >= 5, lab.trajectory_scenario


def test_out_dir_refuses_a_foreign_folder_and_replaces_a_previous_generation(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "mine.txt").write_text("keep me")
    assert main([str(foreign)]) == 2
    assert "not empty" in capsys.readouterr().err
    assert (foreign / "mine.txt").read_text() == "keep me"
    # a previous generation (README starts with the marker) is replaced, stale files included
    from tools.samplegen import README_MARKER, _prepare_out_dir

    previous = tmp_path / "previous"
    stale = previous / "sandbox" / "data" / "jsons" / "stale.json"
    stale.parent.mkdir(parents=True)
    stale.write_text("{}")
    (previous / "README.md").write_text(README_MARKER + "\nold\n")
    _prepare_out_dir(previous)
    assert not stale.exists() and not (previous / "README.md").exists()
