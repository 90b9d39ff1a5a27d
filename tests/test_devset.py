"""The data layer: importing both release layouts, refusals, verify, show, list, AH-D rebuild."""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path

import pytest

from optimizer.cli import main
from optimizer.devset.importer import AHD_COUNTS, import_split, rebuild_ahd, select_ahd
from optimizer.devset.labels import count_labels, fingerprint, load_labels, read_label_file
from optimizer.devset.markdown import render_markdown
from optimizer.devset.split import format_trajectory, open_split
from optimizer.devset.verify import verify_split
from optimizer.errors import UserError
from optimizer.models import Label
from optimizer.scaffold import init_workspace
from optimizer.workspace.workspace import Workspace
from tests.support.data import (
    TYPES,
    FakeItem,
    make_items,
    pair_items,
    write_manifest,
    write_release,
)
from tests.support.paths import SAMPLE_DIR


@pytest.fixture
def ws(tmp_path: Path) -> Workspace:
    return init_workspace(tmp_path / "ws")


def run(*argv: str) -> int:
    return main(list(argv))


def one_line_error(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    return err


# ---------------------------------------------------------------------------------------------
# Import


@pytest.mark.parametrize("layout", ["release", "authors"])
def test_import_with_manifest_in_either_layout_writes_the_workspace_split(
    ws: Workspace, tmp_path: Path, layout: str
) -> None:
    items = make_items(3)
    release = write_release(tmp_path / "src", items, layout=layout)  # type: ignore[arg-type]
    chosen = [items[5].trajectory_id, items[0].trajectory_id, items[2].trajectory_id]
    manifest = write_manifest(tmp_path / "m.txt", chosen)

    split = import_split(ws, release.root, "dev", manifest=manifest)

    root = ws.root / "devset" / "dev"
    assert split.ids == chosen  # manifest order is split order
    assert (root / "manifest.txt").read_text() == "".join(f"{t}\n" for t in chosen)
    rows = [json.loads(line) for line in (root / "labels.jsonl").read_text().splitlines()]
    assert [r["trajectory_id"] for r in rows] == chosen
    meta = json.loads((root / "split.json").read_text())
    assert set(meta) >= {"name", "fingerprint", "source", "created", "counts"}
    assert meta["name"] == "dev" and meta["fingerprint"] == split.fingerprint
    assert meta["counts"]["items"] == 3
    by_id = {it.trajectory_id: it for it in items}
    for tid in chosen:
        src_json = release.sandbox_root / ("data/jsons" if layout == "release" else "agenthorizon_json")
        assert (root / "sandbox/data/jsons" / f"{tid}.json").read_bytes() == (
            src_json / f"{tid}.json"
        ).read_bytes()
        assert (root / "sandbox/data/markdowns" / f"{tid}.md").is_file()
        rec = by_id[tid].original_id
        for k in range(3):
            png = root / "sandbox/data/media/images" / rec / f"step_{k + 1}.png"
            assert png.read_bytes() == release.screenshot(by_id[tid], k).read_bytes()
            assert not png.is_symlink()
    # Only chosen recordings were copied.
    recs = {p.name for p in (root / "sandbox/data/media/images").iterdir()}
    assert recs == {by_id[t].original_id for t in chosen}
    assert verify_split(split).ok


def test_import_all_renders_markdown_when_the_source_has_none(ws: Workspace, tmp_path: Path) -> None:
    items = make_items(2)
    release = write_release(tmp_path / "src", items, layout="authors", markdown=False)
    split = import_split(ws, release.root, "everything", all_items=True)
    assert split.ids == [it.trajectory_id for it in items]
    for tid in split.ids:
        assert split.markdown_text(tid) == render_markdown(split.trajectory(tid))
    assert verify_split(split).ok


def test_import_of_full_form_json_writes_the_blind_projection(ws: Workspace, tmp_path: Path) -> None:
    items = make_items(1)
    release = write_release(tmp_path / "src", items, full_form=True, markdown=False)
    split = import_split(ws, release.root, "full", all_items=True)
    for item in items:
        data = json.loads(split.json_path(item.trajectory_id).read_text())
        assert set(data) == {"trajectory_id", "task", "environment", "steps"}  # no version, no milestones
        links = [s["screenshot"] for s in data["steps"]]
        assert links == [f"./data/media/images/{item.original_id}/step_{k + 1}.png" for k in range(3)]
        assert f"]({links[0]})" in split.markdown_text(item.trajectory_id)
    assert verify_split(split).ok


def test_import_reads_trajectories_from_a_top_level_jsonl_when_json_files_are_absent(
    ws: Workspace, tmp_path: Path
) -> None:
    from tests.support.data import trajectory_dict

    items = make_items(1)
    release = write_release(tmp_path / "src", items, markdown=False)
    for path in (release.sandbox_root / "data" / "jsons").iterdir():
        path.unlink()
    rows = [
        json.dumps(trajectory_dict(it, full_form=True, sandbox_root=release.sandbox_root)) for it in items
    ]
    (release.root / "trajectories.jsonl").write_text("\n".join(rows) + "\n")
    split = import_split(ws, release.root, "fromjsonl", all_items=True)
    assert verify_split(split).ok
    assert split.trajectory(items[0].trajectory_id).task.instruction == items[0].instruction


def test_import_with_link_symlinks_screenshots(ws: Workspace, tmp_path: Path) -> None:
    items = make_items(1)
    release = write_release(tmp_path / "src", items)
    split = import_split(ws, release.root, "linked", all_items=True, link=True)
    step = split.trajectory(items[0].trajectory_id).steps[0]
    assert step.screenshot is not None and (split.sandbox_root / step.screenshot).is_symlink()
    # Read through the link, resolved: the release file it points to.
    assert split.screenshot_file(step) == release.screenshot(items[0], 0).resolve()
    assert verify_split(split).ok


def test_broken_source_label_line_is_reported_with_path_and_line_and_skipped(
    ws: Workspace, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    items = make_items(1)
    release = write_release(tmp_path / "src", items)
    lines = release.label_files[0].read_text().splitlines()
    lines.insert(1, "{not json")
    release.label_files[0].write_text("\n".join(lines) + "\n")
    assert run("devset", "import", str(release.root), "--name", "x", "--all", "-w", str(ws.root)) == 0
    captured = capsys.readouterr()
    assert f"{release.label_files[0]}:2: not valid JSON" in captured.err
    assert "imported 4 items" in captured.out


def test_missing_source_screenshots_are_warned_capped_and_left_for_verify(
    ws: Workspace, tmp_path: Path
) -> None:
    items = make_items(5)  # 10 recordings x 3 steps = 30 screenshots
    release = write_release(tmp_path / "src", items)
    for png in (release.sandbox_root / "data/media/images").rglob("*.png"):
        png.unlink()
    seen: list[str] = []
    split = import_split(ws, release.root, "bare", all_items=True, warn=seen.append)
    assert len(seen) == 21 and seen[-1].startswith("... and 10 more")
    assert all(": missing (screenshot of step" in w for w in seen[:20])
    problems = verify_split(split).problems
    assert len(problems) == 30 and all("missing screenshot" in p for p in problems)


# ---------------------------------------------------------------------------------------------
# Refusals: one clear line, exit 2, nothing left behind


def test_manifest_naming_an_unknown_id_is_refused(
    ws: Workspace, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    items = make_items(1)
    release = write_release(tmp_path / "src", items)
    manifest = write_manifest(tmp_path / "m.txt", [items[0].trajectory_id, "no-such-id"])
    code = run(
        "devset", "import", str(release.root), "--name", "x", "--manifest", str(manifest), "-w", str(ws.root)
    )
    err = one_line_error(capsys)
    assert code == 2 and "no-such-id" in err and "no label" in err
    assert not (ws.root / "devset" / "x").exists()
    assert [p.name for p in (ws.root / "devset").iterdir()] == [".gitkeep"]  # no temporary folder left


def test_labels_with_a_duplicate_id_are_refused(
    ws: Workspace, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    items = make_items(1)
    release = write_release(
        tmp_path / "src",
        items,
        label_files={"AgentHorizon.jsonl": items, "AgentHorizon-Simple.jsonl": [items[2]]},
    )
    code = run("devset", "import", str(release.root), "--name", "x", "--all", "-w", str(ws.root))
    err = one_line_error(capsys)
    assert code == 2 and items[2].trajectory_id in err and "appears twice" in err
    assert "AgentHorizon.jsonl:3" in err and "AgentHorizon-Simple.jsonl:1" in err


def test_a_folder_without_labels_is_refused(
    ws: Workspace, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    release = write_release(tmp_path / "src", make_items(1))
    release.label_files[0].unlink()
    code = run("devset", "import", str(release.root), "--name", "x", "--all", "-w", str(ws.root))
    err = one_line_error(capsys)
    assert code == 2 and "no labels" in err


def test_a_folder_in_neither_layout_is_refused(ws: Workspace, tmp_path: Path) -> None:
    (tmp_path / "odd").mkdir()
    (tmp_path / "odd" / "AgentHorizon.jsonl").write_text("")
    with pytest.raises(UserError, match="neither AgentHorizon layout"):
        import_split(ws, tmp_path / "odd", "x", all_items=True)


def test_an_existing_split_name_is_refused(
    ws: Workspace, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    release = write_release(tmp_path / "src", make_items(1))
    import_split(ws, release.root, "dev", all_items=True)
    code = run("devset", "import", str(release.root), "--name", "dev", "--all", "-w", str(ws.root))
    err = one_line_error(capsys)
    assert code == 2 and "already exists" in err and "pick another --name or delete" in err


def test_an_item_without_trajectory_json_is_refused_naming_it(ws: Workspace, tmp_path: Path) -> None:
    items = make_items(1)
    release = write_release(tmp_path / "src", items)
    (release.sandbox_root / "data" / "jsons" / f"{items[1].trajectory_id}.json").unlink()
    with pytest.raises(UserError, match=f"{items[1].trajectory_id} has no trajectory JSON"):
        import_split(ws, release.root, "x", all_items=True)


def test_manifest_listing_an_id_twice_is_refused(ws: Workspace, tmp_path: Path) -> None:
    items = make_items(1)
    release = write_release(tmp_path / "src", items)
    manifest = write_manifest(tmp_path / "m.txt", [items[0].trajectory_id, items[0].trajectory_id])
    with pytest.raises(UserError, match="listed twice"):
        import_split(ws, release.root, "x", manifest=manifest)


# ---------------------------------------------------------------------------------------------
# Verify


@pytest.fixture
def imported(ws: Workspace, tmp_path: Path) -> tuple[Workspace, list[FakeItem]]:
    items = make_items(2)
    release = write_release(tmp_path / "src", items)
    import_split(ws, release.root, "dev", all_items=True)
    return ws, items


def test_verify_prints_counts_and_exits_zero(
    imported: tuple[Workspace, list[FakeItem]], capsys: pytest.CaptureFixture[str]
) -> None:
    ws, _ = imported
    assert run("devset", "verify", "dev", "-w", str(ws.root)) == 0
    out = capsys.readouterr().out
    assert "items=8 positives=4 negatives=4" in out
    # make_items(2) cycles the types: Critical, Bad Side Effect, Misunderstanding, Critical.
    assert "  Critical Mistake: 2\n" in out
    assert "  Bad Side Effect: 1\n" in out
    assert "  Misunderstanding of the Instruction: 1\n" in out
    assert "  untyped: 0\n" in out


def test_verify_names_a_deleted_screenshot_and_exits_non_zero(
    imported: tuple[Workspace, list[FakeItem]], capsys: pytest.CaptureFixture[str]
) -> None:
    ws, items = imported
    victim = ws.root / "devset/dev/sandbox/data/media/images" / items[0].original_id / "step_2.png"
    victim.unlink()
    assert run("devset", "verify", "dev", "-w", str(ws.root)) == 1
    err = capsys.readouterr().err
    assert (
        f"devset/dev/sandbox/data/media/images/{items[0].original_id}/step_2.png: missing screenshot" in err
    )


def test_verify_names_a_corrupt_label_line_and_exits_non_zero(
    imported: tuple[Workspace, list[FakeItem]], capsys: pytest.CaptureFixture[str]
) -> None:
    ws, items = imported
    labels = ws.root / "devset/dev/labels.jsonl"
    lines = labels.read_text().splitlines()
    lines[2] = lines[2][:-5]  # truncate line 3
    labels.write_text("\n".join(lines) + "\n")
    assert run("devset", "verify", "dev", "-w", str(ws.root)) == 1
    err = capsys.readouterr().err
    assert "devset/dev/labels.jsonl:3: not valid JSON" in err
    assert f"no label for manifest item {items[2].trajectory_id}" in err


def test_verify_reports_a_bad_label_value_and_a_changed_fingerprint(
    imported: tuple[Workspace, list[FakeItem]],
) -> None:
    ws, _items = imported
    labels = ws.root / "devset/dev/labels.jsonl"
    rows = [json.loads(line) for line in labels.read_text().splitlines()]
    rows[0]["label"] = "maybe"
    rows[2]["mistake_type"] = "Bad Side Effect" if rows[2]["mistake_type"] != "Bad Side Effect" else None
    labels.write_text("".join(json.dumps(r) + "\n" for r in rows))
    report = verify_split(open_split(ws, "dev"))
    assert any(p.startswith("devset/dev/labels.jsonl:1: label:") for p in report.problems)
    rows[0]["label"] = "positive"
    labels.write_text("".join(json.dumps(r) + "\n" for r in rows))
    report = verify_split(open_split(ws, "dev"))
    assert len(report.problems) == 1 and "fingerprint" in report.problems[0]


def test_verify_reports_missing_markdown_and_json(imported: tuple[Workspace, list[FakeItem]]) -> None:
    ws, items = imported
    split = open_split(ws, "dev")
    split.markdown_path(items[1].trajectory_id).unlink()
    split.json_path(items[3].trajectory_id).unlink()
    problems = verify_split(split).problems
    assert f"devset/dev/sandbox/data/markdowns/{items[1].trajectory_id}.md: missing" in problems
    assert f"devset/dev/sandbox/data/jsons/{items[3].trajectory_id}.json: missing" in problems


def test_verify_without_name_checks_every_split(
    imported: tuple[Workspace, list[FakeItem]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ws, _ = imported
    other = write_release(tmp_path / "src2", make_items(1))
    import_split(ws, other.root, "other", all_items=True)
    assert run("devset", "verify", "-w", str(ws.root)) == 0
    out = capsys.readouterr().out
    assert "split dev " in out and "split other " in out
    (ws.root / "devset/other/manifest.txt").write_text("ghost-id\n")
    assert run("devset", "verify", "-w", str(ws.root)) == 1
    assert "ghost-id" in capsys.readouterr().err


def test_verify_of_a_workspace_without_splits_says_how_to_import(
    ws: Workspace, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run("devset", "verify", "-w", str(ws.root)) == 2
    assert "devset import" in one_line_error(capsys)


def test_open_split_of_unknown_name_lists_the_known_ones(imported: tuple[Workspace, list[FakeItem]]) -> None:
    ws, _ = imported
    with pytest.raises(UserError, match=r"no split named 'nope' .*\(known: dev\)"):
        open_split(ws, "nope")


# ---------------------------------------------------------------------------------------------
# Labels stay apart from judge input


def test_split_reads_judge_input_without_labels_and_load_labels_is_separate(
    imported: tuple[Workspace, list[FakeItem]],
) -> None:
    ws, items = imported
    split = open_split(ws, "dev")
    labels = load_labels(split)
    assert list(labels) == split.ids
    assert labels[items[2].trajectory_id].label == "negative"
    (split.root / "labels.jsonl").unlink()
    # Judge input still loads with no label file at all ...
    for tid in split.ids:
        assert split.trajectory(tid).trajectory_id == tid
        assert split.markdown_text(tid).startswith("# Trajectory Report\n")
    # ... while load_labels refuses clearly.
    with pytest.raises(UserError, match=r"labels\.jsonl is missing"):
        load_labels(split)


def test_load_labels_refuses_a_broken_line_instead_of_shrinking_the_denominator(
    imported: tuple[Workspace, list[FakeItem]],
) -> None:
    ws, _ = imported
    split = open_split(ws, "dev")
    path = split.root / "labels.jsonl"
    path.write_text(path.read_text().replace('"positive"', '"positiv"', 1))
    with pytest.raises(UserError, match=r"labels.jsonl:1: label: .*devset verify dev"):
        load_labels(split)


def test_fingerprint_is_sha256_over_sorted_id_label_type_lines() -> None:
    labels = [
        Label(trajectory_id="b", label="negative", original_id="r1", mistake_type="Bad Side Effect"),
        Label(trajectory_id="a", label="positive", original_id="r2"),
        Label(trajectory_id="c", label="negative", original_id="r3", mistake_type=None),
    ]
    text = "a\tpositive\t\nb\tnegative\tBad Side Effect\nc\tnegative\t\n"
    assert fingerprint(labels) == hashlib.sha256(text.encode()).hexdigest()
    assert fingerprint(reversed(labels)) == fingerprint(labels)  # order-free


def test_split_fingerprint_matches_its_labels(imported: tuple[Workspace, list[FakeItem]]) -> None:
    ws, items = imported
    split = open_split(ws, "dev")
    text = "".join(sorted(f"{it.trajectory_id}\t{it.label}\t{it.mistake_type or ''}\n" for it in items))
    assert split.fingerprint == hashlib.sha256(text.encode()).hexdigest()


def test_read_label_file_folds_the_plural_mistake_type(tmp_path: Path) -> None:
    path = tmp_path / "labels.jsonl"
    row = {
        "trajectory_id": "t",
        "label": "negative",
        "original_id": "r",
        "mistake_type": "Misunderstanding of the Instructions",
        "unknown_extra": 1,
    }
    path.write_text(json.dumps(row) + "\n\n[1]\n")
    rows, problems = read_label_file(path, display="labels.jsonl")
    assert rows[0].label.mistake_type == "Misunderstanding of the Instruction"
    assert problems == ["labels.jsonl:3: not a JSON object"]


# ---------------------------------------------------------------------------------------------
# show and list


def test_show_prints_goal_steps_thoughts_and_screenshots_but_no_label(
    imported: tuple[Workspace, list[FakeItem]], capsys: pytest.CaptureFixture[str]
) -> None:
    ws, items = imported
    neg = items[2]
    assert run("devset", "show", "dev", neg.trajectory_id[:13], "-w", str(ws.root)) == 0  # a unique prefix
    out = capsys.readouterr().out
    assert out.startswith(f"trajectory {neg.trajectory_id}  (split dev, 3 steps)\n")
    assert f"Goal:\n  {neg.instruction}\n" in out
    assert "Step 0  at 0 ms\n  action: left-click (10, 20)\n  thought: thinking about step 0\n" in out
    assert '  action: type "report-1.pdf"\n' in out
    assert "  action: hotkey Ctrl+s\n" in out
    shot = ws.root / "devset/dev/sandbox/data/media/images" / neg.original_id / "step_3.png"
    assert f"  screenshot: {shot}\n" in out
    assert neg.paired_id is not None
    for leak in ("negative", "positive", "Critical", "Bad Side Effect", "Misunderstanding", neg.paired_id):
        assert leak not in out


def test_format_trajectory_marks_missing_and_null_screenshots(
    imported: tuple[Workspace, list[FakeItem]],
) -> None:
    ws, items = imported
    split = open_split(ws, "dev")
    tid = items[0].trajectory_id
    data = json.loads(split.json_path(tid).read_text())
    data["steps"][0]["screenshot"] = None
    split.json_path(tid).write_text(json.dumps(data))
    (split.sandbox_root / "data/media/images" / items[0].original_id / "step_2.png").unlink()
    text = format_trajectory(split, tid)
    assert "  screenshot: none recorded\n" in text
    assert "step_2.png  [missing]\n" in text


def test_list_shows_counts_and_fingerprints(
    imported: tuple[Workspace, list[FakeItem]], capsys: pytest.CaptureFixture[str]
) -> None:
    ws, _ = imported
    assert run("devset", "list", "-w", str(ws.root)) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:5] == ["NAME", "ITEMS", "POS", "NEG", "FINGERPRINT"]
    fp = open_split(ws, "dev").fingerprint
    assert lines[1].split()[:5] == ["dev", "8", "4", "4", fp[:12]]


# ---------------------------------------------------------------------------------------------
# AH-D reconstruction


def ahd_release_items(*, drop_one_positive: bool = False) -> list[FakeItem]:
    """50 qualifying pairs giving exactly 62/100 and 32/26/41/1, plus pairs that must not qualify."""
    negative_types = [TYPES[0]] * 32 + [TYPES[1]] * 26 + [TYPES[2]] * 41 + [None]
    items: list[FakeItem] = []
    for pair in range(50):
        both = pair < 12  # 12 pairs with two positives, 38 with one: 62 positives
        positives = (True, both)
        if drop_one_positive and pair == 0:
            positives = (True, False)
        types = (negative_types[2 * pair], negative_types[2 * pair + 1])
        items.extend(pair_items(pair, positives=positives, types=types, n_steps=1, tag="ahd"))
    # A component of three recordings (A-B, C-B): excluded.
    a, b, c = "rec-x-a", "rec-x-b", "rec-x-c"
    items += [
        FakeItem("x-neg-a", "negative", a, "ia", b, TYPES[0], 1),
        FakeItem("x-neg-c", "negative", c, "ic", b, TYPES[0], 1),
        FakeItem("x-pos-b", "positive", b, "ib", n_steps=1),
    ]
    # Two recordings but one negative: excluded.
    items += [FakeItem("y-neg", "negative", "rec-y-a", "i", "rec-y-b", TYPES[1], 1)]
    # Two recordings and three negatives: excluded.
    items += [
        FakeItem(
            f"z-neg-{k}",
            "negative",
            "rec-z-a" if k else "rec-z-b",
            "i",
            "rec-z-b" if k else "rec-z-a",
            TYPES[2],
            1,
        )
        for k in range(3)
    ]
    return items


def test_rebuild_ahd_on_a_synthetic_release_gives_the_paper_counts(ws: Workspace, tmp_path: Path) -> None:
    items = ahd_release_items()
    simple = items[100:]
    release = write_release(
        tmp_path / "src",
        items,
        markdown=False,
        label_files={"AgentHorizon.jsonl": items[:100], "AgentHorizon-Simple.jsonl": simple},
    )
    split = import_split(ws, release.root, "ahd", rebuild_ahd=True)
    assert len(split.ids) == 162
    assert not any(tid.startswith(("x-", "y-", "z-")) for tid in split.ids)
    report = verify_split(split)
    assert report.ok, report.problems
    assert report.counts == AHD_COUNTS
    meta = json.loads((split.root / "split.json").read_text())
    assert meta["counts"] == AHD_COUNTS.as_json() and meta["method"] == "rebuild-ahd"


def test_rebuild_ahd_refuses_with_the_counts_it_got(
    ws: Workspace, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    release = write_release(tmp_path / "src", ahd_release_items(drop_one_positive=True), markdown=False)
    code = run("devset", "import", str(release.root), "--name", "ahd", "--rebuild-ahd", "-w", str(ws.root))
    err = one_line_error(capsys)
    assert code == 2
    assert "items=161 positives=61 negatives=100" in err
    assert "Critical Mistake 32, Bad Side Effect 26, Misunderstanding of the Instruction 41, untyped 1" in err
    assert not (ws.root / "devset" / "ahd").exists()


def test_select_ahd_sorts_components_by_joined_ids_then_shuffles_with_seed_42() -> None:
    # 60 qualifying pairs listed in a scrambled order; the selection must not depend on that order.
    items = [it for pair in range(60) for it in pair_items(pair, tag="sel", n_steps=1)]
    labels = [Label.model_validate(it.label_row()) for it in items]
    scrambled = labels[:]
    random.Random(7).shuffle(scrambled)

    components = sorted(
        "::".join(sorted((it.original_id, it.paired_id or ""))) for it in items if it.label == "negative"
    )
    components = sorted(set(components))
    random.Random(42).shuffle(components)
    expected_recordings = {rec for comp in components[:50] for rec in comp.split("::")}
    expected = {lab.trajectory_id for lab in labels if lab.original_id in expected_recordings}

    chosen = select_ahd(scrambled)
    assert set(chosen) == expected and len(chosen) == 200
    assert set(select_ahd(labels)) == expected
    with pytest.raises(UserError, match="items=200 positives=100 negatives=100"):
        rebuild_ahd(labels)


def test_count_labels_counts_untyped_negatives() -> None:
    labels = [
        Label(trajectory_id="1", label="negative", original_id="r"),
        Label(trajectory_id="2", label="positive", original_id="r"),
        Label(trajectory_id="3", label="negative", original_id="r", mistake_type="Critical Mistake"),
    ]
    counts = count_labels(labels)
    assert (counts.items, counts.positives, counts.negatives) == (3, 1, 2)
    assert counts.mistake_types["untyped"] == 1 and counts.mistake_types["Critical Mistake"] == 1


# ---------------------------------------------------------------------------------------------
# The bundled sample set


@pytest.mark.slow
def test_init_sample_then_verify_sample_exits_zero(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert (SAMPLE_DIR / "AgentHorizon.jsonl").is_file(), "the bundled sample set has not been generated yet"
    assert run("init", str(tmp_path / "ws"), "--sample") == 0
    assert run("devset", "verify", "sample", "-w", str(tmp_path / "ws")) == 0
    out = capsys.readouterr().out
    assert "items=" in out and "\nok\n" in out


# ---------------------------------------------------------------------------------------------
# Oversized items: named at import and before an evaluation


@pytest.mark.slow
def test_an_item_whose_request_is_megabytes_is_warned_about_at_import_and_before_eval(
    ws: Workspace, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A 2.5-million-character instruction imports and verifies (it may be a real task), but `devset import`
    and `eval` each name it in a warning line with its size and estimated cost per pass; the other items
    are not named."""
    import re

    from optimizer.evaluation.oversize import OVERSIZED_REQUEST_BYTES
    from tests.support.fakeserver import FakeLLMServer
    from tests.support.loop import commit_all, set_toml_key

    set_toml_key(ws.root, "judge", "provider", '"openai"')
    set_toml_key(ws.root, "judge", "model", '"fake-judge"')
    cfg = ws.root / "judgeloop.toml"
    cfg.write_text(
        cfg.read_text(encoding="utf-8") + '\n[prices."fake-judge"]\ninput = 10.0\noutput = 10.0\n',
        encoding="utf-8",
    )
    items = make_items(1)
    big = items[0]
    big.instruction = "Save the report as a PDF. " + "Then check every cell again. " * 90_000
    assert len(big.instruction) > OVERSIZED_REQUEST_BYTES
    release = write_release(tmp_path / "src", items)
    warned = re.compile(
        rf"(?:judgeloop(?: eval)?: )?warning: item {big.trajectory_id} of split 'big' renders to a (\d+\.\d) MB "
        r"request \(over 2 MB of text and images\): about \$([\d,]+\.\d\d) per pass \(1 call\(s\) "
        r"of fake-judge\); check the trajectory, or leave it out of the manifest"
    )
    capsys.readouterr()
    assert run("devset", "import", str(release.root), "-w", str(ws.root), "--name", "big", "--all") == 0
    err = capsys.readouterr().err
    found = warned.findall(err)
    assert len(found) == 1 and err.count("renders to a") == 1, err
    size_mb, cost = found[0]
    # At 4 characters a token and $10 a million input tokens, at least size/4 * $1e-5; the upper bound
    # prices the cacheable prefix at the dearest rate, so not twice that.
    at_input = float(size_mb) * 1e6 / 4 * 1e-5
    assert float(size_mb) >= 2.5 and at_input <= float(cost.replace(",", "")) < 2 * at_input, found
    assert run("devset", "verify", "big", "-w", str(ws.root)) == 0

    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-not-a-real-key")
    with FakeLLMServer() as server:
        capsys.readouterr()
        assert run("eval", "-w", str(ws.root), "--split", "big", "--base-url", server.openai_base_url) == 0
    err = capsys.readouterr().err
    assert len(warned.findall(err)) == 1, err
    assert err.index("renders to a") < err.index("judged "), err  # said before the first call was judged

    # A run says it before its baseline: every candidate would pay for the item again.
    commit_all(ws.root, "the fake judge and its price")
    with FakeLLMServer() as server:
        capsys.readouterr()
        assert (
            run(
                "run",
                "-w",
                str(ws.root),
                "--split",
                "big",
                "--strategy",
                "library",
                "--max-experiments",
                "1",
                "--base-url",
                server.openai_base_url,
            )
            == 0
        )
    captured = capsys.readouterr()
    assert len(warned.findall(captured.err)) == 1, captured.err
