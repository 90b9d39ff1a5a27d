"""Ids and paths from data files stay inside the workspace (issue 16, item 2).

A crafted release (ids that climb with ``..`` or hold ``/``, screenshot links that are absolute or
climb out) is refused at `devset import` in one line; a split tampered with after import (a link
edited to point outside, a screenshot replaced by a symlink) is refused wherever a path is used:
`devset verify`, the judge's renderer (through `judgeloop eval` against the fake server), the
optimiser's tools and the TUI's image helper. No byte of an outside file is ever read for them.
"""

from __future__ import annotations

import base64
import io
import json
import os
import re
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from optimizer.cli import main
from optimizer.devset.split import open_split
from optimizer.scaffold import init_workspace
from optimizer.workspace.workspace import Workspace
from tests.support.data import FakeItem, make_items, trajectory_dict, write_release
from tests.support.fakeserver import FakeLLMServer, RecordedRequest, reply

OUTSIDE_RGB = (255, 0, 255)  # no screenshot of the fake releases has this colour
OUTSIDE_SIZE = (40, 30)


@pytest.fixture
def ws(tmp_path: Path) -> Workspace:
    return init_workspace(tmp_path / "ws")


def files_under(root: Path, *, skip: Path | None = None) -> set[Path]:
    return {p for p in root.rglob("*") if skip is None or not p.is_relative_to(skip)}


def import_all(ws: Workspace, src: Path, name: str = "dev", *extra: str) -> int:
    return main(["devset", "import", str(src), "--name", name, "--all", "-w", str(ws.root), *extra])


def one_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err


def outside_png(path: Path) -> Path:
    Image.new("RGB", OUTSIDE_SIZE, OUTSIDE_RGB).save(path)
    return path


def add_label_row(release_root: Path, row: dict[str, Any]) -> None:
    path = release_root / "AgentHorizon.jsonl"
    path.write_text(path.read_text(encoding="utf-8") + json.dumps(row) + "\n", encoding="utf-8")


def add_trajectory_row(release_root: Path, traj: dict[str, Any]) -> None:
    """A full-form trajectory in a top-level JSONL (no per-item file: its id need not be a file name)."""
    path = release_root / "trajectories.jsonl"
    old = path.read_text(encoding="utf-8") if path.exists() else ""
    path.write_text(old + json.dumps(traj) + "\n", encoding="utf-8")


def crafted_item(tid: str, original_id: str = "rec-crafted", paired_id: str | None = None) -> FakeItem:
    return FakeItem(
        tid,
        "negative" if paired_id else "positive",
        original_id,
        "Open the crafted file.",
        paired_id=paired_id,
        mistake_type="Critical Mistake" if paired_id else None,
        n_steps=1,
    )


# ---------------------------------------------------------------------------------------------
# Ids


@pytest.mark.parametrize(
    ("field", "value"),
    [
        (
            "trajectory_id",
            "../../../../../../x",
        ),  # from devset/.NAME.importing-PID/sandbox/data/jsons: tmp_path/x
        ("trajectory_id", "a/b"),
        ("trajectory_id", ".hidden"),
        ("trajectory_id", "x" * 129),
        ("original_id", "../../../../../../../../evil"),
        ("paired_id", "../p"),
    ],
)
def test_import_refuses_an_unsafe_id_in_one_line_and_writes_nothing(
    ws: Workspace, tmp_path: Path, capsys: pytest.CaptureFixture[str], field: str, value: str
) -> None:
    release = write_release(tmp_path / "src", make_items(1))
    item = crafted_item("c0ffee00-0000-4000-8000-000000000001", paired_id="rec-other")
    setattr(item, field, value)
    add_label_row(release.root, item.label_row())
    add_trajectory_row(release.root, trajectory_dict(item, full_form=True, sandbox_root=release.sandbox_root))
    png = release.screenshot(item, 0)
    if field != "original_id":
        png.parent.mkdir(parents=True, exist_ok=True)
        Image.new("RGB", (8, 6), (1, 2, 3)).save(png)
    before = files_under(tmp_path, skip=release.root)

    assert import_all(ws, release.root) == 2
    err = one_line(capsys)
    assert repr(value)[:60] in err and field in err
    assert files_under(tmp_path, skip=release.root) == before  # nothing written, inside or outside
    assert not (ws.root / "devset" / "dev").exists()


def test_a_manifest_or_a_split_on_disk_with_an_unsafe_id_is_refused(
    ws: Workspace, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    items = make_items(1)
    release = write_release(tmp_path / "src", items)
    manifest = tmp_path / "m.txt"
    manifest.write_text(f"{items[0].trajectory_id}\n../../x\n", encoding="utf-8")
    assert (
        main(
            [
                "devset",
                "import",
                str(release.root),
                "--name",
                "m",
                "--manifest",
                str(manifest),
                "-w",
                str(ws.root),
            ]
        )
        == 2
    )
    assert "'../../x'" in one_line(capsys)

    assert import_all(ws, release.root) == 0
    capsys.readouterr()
    split_manifest = ws.root / "devset" / "dev" / "manifest.txt"
    split_manifest.write_text(
        split_manifest.read_text(encoding="utf-8") + "../../../outside\n", encoding="utf-8"
    )
    assert main(["devset", "verify", "dev", "-w", str(ws.root)]) == 2
    assert "'../../../outside'" in one_line(capsys)


# ---------------------------------------------------------------------------------------------
# Screenshot links at import


@pytest.mark.parametrize("kind", ["absolute", "climbing"])
def test_import_refuses_a_kept_screenshot_link_outside_naming_the_item_and_step(
    ws: Workspace, tmp_path: Path, capsys: pytest.CaptureFixture[str], kind: str
) -> None:
    items = make_items(1)
    release = write_release(tmp_path / "src", items)
    outside = outside_png(tmp_path / "outside.png")
    item = items[0]
    # With no recording id the official renderer keeps the stored links: the link itself would be kept.
    rows = [json.loads(line) for line in release.label_files[0].read_text().splitlines()]
    rows[0]["original_id"] = ""
    release.label_files[0].write_text("".join(json.dumps(r) + "\n" for r in rows))
    traj = trajectory_dict(item)
    link = str(outside) if kind == "absolute" else "../../outside.png"  # sandbox -> src -> tmp_path
    traj["steps"][1]["screenshot"] = link
    (release.sandbox_root / "data/jsons" / f"{item.trajectory_id}.json").write_text(json.dumps(traj))

    assert import_all(ws, release.root) == 2
    err = one_line(capsys)
    assert item.trajectory_id in err and "step 1" in err and link in err
    assert not (ws.root / "devset" / "dev").exists()


def test_import_never_reads_a_stored_link_outside_the_source_when_relinking(
    ws: Workspace, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    items = make_items(1)
    release = write_release(tmp_path / "src", items, full_form=True)
    outside = outside_png(tmp_path / "outside.png")
    item = items[0]
    # The canonical file is missing and the full form points outside the release: it is not copied.
    release.screenshot(item, 0).unlink()
    path = release.sandbox_root / "data/jsons" / f"{item.trajectory_id}.json"
    traj = json.loads(path.read_text())
    traj["steps"][0]["screenshot"] = str(outside)
    path.write_text(json.dumps(traj))

    assert import_all(ws, release.root) == 0
    split = open_split(Workspace.open(ws.root), "dev")
    copied = split.sandbox_root / "data/media/images" / item.original_id / "step_1.png"
    assert not copied.exists()
    assert str(outside) in capsys.readouterr().err  # said, as a warning


def test_import_refuses_a_source_screenshot_that_is_a_symlink_out_of_the_release(
    ws: Workspace, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    items = make_items(1)
    release = write_release(tmp_path / "src", items)
    outside = outside_png(tmp_path / "outside.png")
    png = release.screenshot(items[0], 2)
    png.unlink()
    png.symlink_to(outside)
    assert import_all(ws, release.root) == 2
    err = one_line(capsys)
    assert items[0].trajectory_id in err and "step 2" in err
    assert not (ws.root / "devset" / "dev").exists()


def test_a_linked_import_still_works_and_verifies(ws: Workspace, tmp_path: Path) -> None:
    items = make_items(1)
    release = write_release(tmp_path / "src", items)
    assert import_all(ws, release.root, "dev", "--link") == 0
    assert main(["devset", "verify", "dev", "-w", str(ws.root)]) == 0
    split = open_split(Workspace.open(ws.root), "dev")
    step = split.trajectory(items[0].trajectory_id).steps[0]
    shot = split.screenshot_file(step)
    assert shot is not None and shot == release.screenshot(items[0], 0).resolve()


# ---------------------------------------------------------------------------------------------
# A split tampered with after import


def tamper_link(split_root: Path, tid: str, step: int, link: str) -> None:
    """Point one step's screenshot at ``link`` in the split's JSON and Markdown (consistently)."""
    from optimizer.devset.markdown import render_markdown
    from optimizer.models import Trajectory

    path = split_root / "sandbox/data/jsons" / f"{tid}.json"
    traj = json.loads(path.read_text())
    traj["steps"][step]["screenshot"] = link
    path.write_text(json.dumps(traj, indent=2) + "\n")
    md = split_root / "sandbox/data/markdowns" / f"{tid}.md"
    md.write_text(render_markdown(Trajectory.model_validate(traj)))


def tamper_symlink(split_root: Path, item: FakeItem, step: int, target: Path) -> None:
    png = split_root / "sandbox/data/media/images" / item.original_id / f"step_{step + 1}.png"
    png.unlink()
    png.symlink_to(target)


TAMPERS = ["climbing-link", "absolute-link", "symlink"]


def tamper(kind: str, ws: Workspace, item: FakeItem, outside: Path) -> None:
    root = ws.root / "devset" / "dev"
    if kind == "climbing-link":
        tamper_link(root, item.trajectory_id, 0, os.path.relpath(outside, root / "sandbox"))
    elif kind == "absolute-link":
        tamper_link(root, item.trajectory_id, 0, str(outside))
    else:
        tamper_symlink(root, item, 0, outside)


TARGET = 5  # the tampered item: its recording is shown by items 5 and 7 only, after items 0-4 in split order


@pytest.fixture
def imported(ws: Workspace, tmp_path: Path) -> tuple[Workspace, list[FakeItem], Path]:
    items = make_items(2)
    for i, item in enumerate(items):
        item.instruction = f"{item.instruction} Task number {i:03d}."
    release = write_release(tmp_path / "src", items)
    assert import_all(ws, release.root) == 0
    text = (ws.root / "judgeloop.toml").read_text()
    text = re.sub(r'(?m)^#? ?dev_split = "[^"]*".*$', 'dev_split = "dev"', text, count=1)
    text = text.replace('provider = "local"          #', 'provider = "openai"         #', 1)
    text = text.replace('model = "smollm2-135m"      #', 'model = "gpt-4o-mini"      #', 1)
    (ws.root / "judgeloop.toml").write_text(text.replace("max_retries = 4", "max_retries = 0"))
    return Workspace.open(ws.root), items, outside_png(tmp_path / "outside.png")


@pytest.mark.parametrize("kind", TAMPERS)
def test_verify_reports_a_screenshot_outside_the_split(
    imported: tuple[Workspace, list[FakeItem], Path], capsys: pytest.CaptureFixture[str], kind: str
) -> None:
    ws, items, outside = imported
    tamper(kind, ws, items[TARGET], outside)
    capsys.readouterr()
    assert main(["devset", "verify", "dev", "-w", str(ws.root)]) == 1
    err = capsys.readouterr().err
    assert "outside" in err and items[TARGET].trajectory_id in err


def request_images(request: RecordedRequest) -> list[Image.Image]:
    """Every image of an OpenAI chat request, decoded."""
    found: list[Image.Image] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            url = node.get("url")
            if isinstance(url, str) and url.startswith("data:image/"):
                found.append(Image.open(io.BytesIO(base64.b64decode(url.split(",", 1)[1]))).convert("RGB"))
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(request.body)
    return found


def looks_outside(img: Image.Image) -> bool:
    """Any magenta area (a 2x2 tile may hold the outside file in one quadrant)."""
    small = img.resize((64, 64))
    pixels = (small.getpixel((x, y)) for x in range(64) for y in range(64))
    return any(r > 200 and g < 60 and b > 200 for r, g, b in pixels)  # type: ignore[misc]


@pytest.mark.parametrize("kind", TAMPERS)
def test_the_judge_refuses_a_tampered_split_and_never_sends_the_outside_file(
    imported: tuple[Workspace, list[FakeItem], Path],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    kind: str,
) -> None:
    ws, items, outside = imported
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-not-a-real-key")
    tamper(kind, ws, items[TARGET], outside)
    verdict = json.dumps({"success": True, "reasoning": "r", "confidence": "high", "mistake_type": None})
    with FakeLLMServer(default=lambda _r: reply(verdict)) as server:
        code = main(["eval", "-w", str(ws.root), "--base-url", server.openai_base_url, "--concurrency", "1"])
        requests = server.inference_requests()
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "outside" in err and "step 0" in err and "Traceback" not in err
    images = [img for r in requests for img in request_images(r)]
    # The items before it may have gone out with their screenshots (or the size scan before the first call
    # met the tampered item first and nothing went out); the outside file never did.
    assert not any(looks_outside(img) for img in images)
    assert not any(items[TARGET].instruction in json.dumps(r.body) for r in requests)


@pytest.mark.parametrize("kind", TAMPERS)
def test_the_optimisers_tools_refuse_a_screenshot_outside_the_split(
    imported: tuple[Workspace, list[FakeItem], Path], kind: str
) -> None:
    from optimizer.loop.strategies.tools import ToolState, run_tool
    from tests.support.strategies import DevFixture, make_context

    ws, items, outside = imported
    tamper(kind, ws, items[TARGET], outside)
    dev = DevFixture(ws, open_split(ws, "dev"), items, [])
    state = ToolState(make_context(dev, []))
    out = run_tool(state, "view_screenshot", {"trajectory_id": items[TARGET].trajectory_id, "step": 0})
    assert out.is_error and out.image is None and "outside" in out.text
    read = run_tool(state, "read_trajectory", {"trajectory_id": items[TARGET].trajectory_id})
    assert read.image is None  # refused or shown, it never raises (and holds no file bytes)
    other = run_tool(state, "view_screenshot", {"trajectory_id": items[0].trajectory_id, "step": 0})
    assert not other.is_error and other.image is not None


@pytest.mark.parametrize("kind", TAMPERS)
def test_the_tui_image_helper_refuses_a_screenshot_outside_the_split(
    imported: tuple[Workspace, list[FakeItem], Path], kind: str
) -> None:
    from optimizer.errors import UserError
    from tui.items import step_lines

    ws, items, outside = imported
    tamper(kind, ws, items[TARGET], outside)
    split = open_split(ws, "dev")
    try:
        steps = step_lines(split, split.trajectory(items[TARGET].trajectory_id))
    except UserError as exc:  # a link refused with the trajectory: the item view shows this line
        assert "outside" in str(exc)
        return
    assert steps[0].screenshot is None and steps[0].problem is not None and "outside" in steps[0].problem
    assert steps[1].screenshot is not None and steps[1].screenshot.is_file()
