"""Dev and held-out splits share no item and no recording: checked at `devset import` (issue 16, item 3).

The loop's side of the same rule (`run`, `confirm`) and the refusal of `eval`/`score` on a held-out
split are in tests/loop/test_loop_heldout.py.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from optimizer.cli import main
from optimizer.scaffold import init_workspace
from optimizer.workspace.workspace import Workspace
from tests.support.data import FakeItem, make_items, write_manifest, write_release


@pytest.fixture
def ws(tmp_path: Path) -> Workspace:
    ws = init_workspace(tmp_path / "ws")
    path = ws.root / "judgeloop.toml"
    text = path.read_text(encoding="utf-8")
    text = re.sub(r'(?m)^#? ?dev_split = "[^"]*".*$', 'dev_split = "dev"', text, count=1).replace(
        "heldout_splits = []", 'heldout_splits = ["held"]'
    )
    path.write_text(text, encoding="utf-8")
    return Workspace.open(ws.root)


def import_ids(ws: Workspace, src: Path, name: str, items: list[FakeItem], tmp_path: Path) -> int:
    manifest = write_manifest(tmp_path / f"{name}.txt", [it.trajectory_id for it in items])
    return main(
        ["devset", "import", str(src), "--name", name, "--manifest", str(manifest), "-w", str(ws.root)]
    )


def refusal(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err


# make_items(2): pair 0 is items 0-3 (pos A, pos B, neg A, neg B), pair 1 is items 4-7; each negative
# shows one recording of its pair and names the other as paired_id.


def test_a_heldout_split_sharing_a_trajectory_with_the_dev_split_is_refused_at_import(
    ws: Workspace, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    items = make_items(2)
    release = write_release(tmp_path / "src", items)
    assert import_ids(ws, release.root, "dev", items[:4], tmp_path) == 0
    capsys.readouterr()
    assert import_ids(ws, release.root, "held", [items[5], items[1], items[4], items[0]], tmp_path) == 2
    err = refusal(capsys)
    assert "share 2 trajectory id(s)" in err and f"first {items[1].trajectory_id}" in err
    assert not (ws.root / "devset" / "held").exists()
    # Apart, it imports.
    assert import_ids(ws, release.root, "held", items[4:], tmp_path) == 0


def test_a_heldout_split_sharing_only_a_recording_with_the_dev_split_is_refused_at_import(
    ws: Workspace, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    items = make_items(2)
    release = write_release(tmp_path / "src", items)
    assert import_ids(ws, release.root, "dev", [items[0], items[1], *items[4:]], tmp_path) == 0
    capsys.readouterr()
    # Pair 0's negatives: new trajectory ids, but the recordings of the dev split's two positives.
    assert import_ids(ws, release.root, "held", items[2:4], tmp_path) == 2
    err = refusal(capsys)
    assert "trajectory id" not in err and "share 2 recording(s)" in err
    assert f"first {items[2].original_id}" in err
    assert not (ws.root / "devset" / "held").exists()


def test_a_dev_split_sharing_items_with_an_imported_heldout_split_is_refused_at_import(
    ws: Workspace, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    items = make_items(2)
    release = write_release(tmp_path / "src", items)
    assert import_ids(ws, release.root, "held", items[4:], tmp_path) == 0
    capsys.readouterr()
    assert import_ids(ws, release.root, "dev", items, tmp_path) == 2
    err = refusal(capsys)
    assert "dev split 'dev'" in err and "held-out split 'held'" in err and "share 4 trajectory id(s)" in err
    assert not (ws.root / "devset" / "dev").exists()
    # A split on neither side is not checked at import (the loop checks the split it runs on).
    assert import_ids(ws, release.root, "scratch", items, tmp_path) == 0
