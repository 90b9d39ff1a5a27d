from __future__ import annotations

import io
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from PIL import Image

from optimizer.judge.estimate import request_input_tokens
from optimizer.judge.prompts import JudgeSettings, PromptSet
from optimizer.judge.render import (
    RenderOptions,
    build_request,
    clear_image_cache,
    evenly_spaced,
    format_ranges,
    image_tokens,
    select_frames,
    text_tokens,
)
from optimizer.judge.types import ImagePart, JudgeRequest, TextPart
from optimizer.models import Step, Trajectory
from tests.support.config import bundled_prompts

REPO = Path(__file__).resolve().parents[1]
BUNDLED = REPO / "prompts"
GOAL = "Rename report.txt to summary.txt in the Documents folder"


class FakeSplit:
    """The one method rendering needs from optimizer.devset.Split."""

    def __init__(self, sandbox: Path) -> None:
        self.sandbox_root = sandbox

    def screenshot_file(self, step: Step) -> Path | None:
        return None if step.screenshot is None else self.sandbox_root / step.screenshot


def _colour(i: int) -> tuple[int, int, int]:
    return ((i * 53) % 256, (i * 97 + 40) % 256, (i * 151 + 80) % 256)


def make_trajectory(
    sandbox: Path,
    n: int,
    *,
    thoughts: bool = False,
    missing: frozenset[int] = frozenset(),
    size: tuple[int, int] = (640, 400),
) -> Trajectory:
    """n steps, each with a solid-colour PNG screenshot (colour identifies the step)."""
    folder = sandbox / "data" / "media" / "images" / "rec"
    folder.mkdir(parents=True, exist_ok=True)
    steps = []
    for i in range(n):
        link = f"./data/media/images/rec/step_{i + 1}.png"
        if i not in missing:
            Image.new("RGB", size, _colour(i)).save(folder / f"step_{i + 1}.png")
        steps.append(
            {
                "step_id": i,
                "screenshot": link,
                "action": {"type": "click", "parameters": {"x": 10 + i, "y": 20, "button": "left"}}
                if i % 3
                else {"type": "type", "parameters": {"text": f"text {i}"}},
                "thought": f"I think step {i} is needed because of a long chain of reasoning. " * 3
                if thoughts
                else None,
                "timestamp_us": 1000 * i + 500,
            }
        )
    return Trajectory.model_validate(
        {"trajectory_id": "t-1", "task": {"instruction": f"  {GOAL}\n"}, "steps": steps}
    )


def prompts_with(tmp_path: Path, toml: str) -> PromptSet:
    folder = tmp_path / "prompts"
    if not folder.exists():
        shutil.copytree(BUNDLED, folder)
    (folder / "judge.toml").write_text(toml)
    return PromptSet.from_dir(folder)


def images(req: JudgeRequest) -> list[ImagePart]:
    return [p for p in req.parts if isinstance(p, ImagePart)]


def text(req: JudgeRequest) -> str:
    return "".join(p.text for p in req.parts if isinstance(p, TextPart))


def decode(part: ImagePart) -> Image.Image:
    img = Image.open(io.BytesIO(part.data))
    assert img.format == "JPEG" and part.media_type == "image/jpeg"
    return img.convert("RGB")


def close(a: float | tuple[int, ...] | None, b: tuple[int, ...], tol: int = 12) -> bool:
    assert isinstance(a, tuple), a  # an RGB pixel
    return all(abs(x - y) <= tol for x, y in zip(a, b, strict=True))


def estimate(req: JudgeRequest) -> int:
    total = text_tokens(req.system) + text_tokens(text(req))
    for part in images(req):
        w, h = decode(part).size
        total += image_tokens(w, h)
    return total


@pytest.fixture(autouse=True)
def _fresh_cache() -> Iterator[None]:
    clear_image_cache()
    yield
    clear_image_cache()


# --------------------------------------------------------------------------- layout


def test_every_step_text_is_followed_by_its_512x332_jpeg(tmp_path: Path) -> None:
    sandbox = tmp_path / "sb"
    traj = make_trajectory(sandbox, 5)
    rubric_first = bundled_prompts("rubric-first")
    req = build_request(traj, FakeSplit(sandbox), rubric_first)
    assert req.system == rubric_first.system_prompt()
    assert req.cache_prefix is None and req.cache_ttl is None
    assert req.notes == ()
    kinds = [type(p).__name__ for p in req.parts]
    assert kinds == ["TextPart", "ImagePart"] * 5 + ["TextPart"]
    first = req.parts[0]
    assert isinstance(first, TextPart)
    assert first.text.startswith(f"## Goal\n\n{GOAL}\n\n## Steps\n\nTotal steps: **5**")
    assert first.text.rstrip().endswith("**Timestamp:** 0 ms")  # 500 us rounds half to even
    assert '**Action:** `type "text 0"`' in first.text
    for k, part in enumerate(images(req)):
        assert part.step_ids == (k,)
        img = decode(part)
        assert img.size == (512, 332)
        assert close(img.getpixel((256, 166)), _colour(k))
        step_text = req.parts[2 * k]
        assert isinstance(step_text, TextPart) and f"### Step {k}\n" in step_text.text
    last = req.parts[-1]
    assert isinstance(last, TextPart) and last.text.endswith(f"{GOAL}\n\nAnswer with the JSON object only.")


def test_request_is_deterministic_so_the_cache_key_is_stable(tmp_path: Path) -> None:
    sandbox = tmp_path / "sb"
    traj = make_trajectory(sandbox, 4)
    prompts = PromptSet.from_dir(BUNDLED)
    first = build_request(traj, FakeSplit(sandbox), prompts).fingerprint()
    clear_image_cache()
    assert build_request(traj, FakeSplit(sandbox), prompts).fingerprint() == first


def test_custom_size_and_quality_apply(tmp_path: Path) -> None:
    sandbox = tmp_path / "sb"
    traj = make_trajectory(sandbox, 2)
    small = prompts_with(tmp_path, "image_width = 100\nimage_height = 60\njpeg_quality = 30\n")
    part = images(build_request(traj, FakeSplit(sandbox), small))[0]
    assert decode(part).size == (100, 60)


# --------------------------------------------------------------------------- policies


def test_policy_selection() -> None:
    assert select_frames(10, JudgeSettings()) == list(range(10))
    assert select_frames(10, JudgeSettings(screenshots="every_k", every_k=4)) == [0, 4, 8, 9]
    assert select_frames(12, JudgeSettings(screenshots="every_k", every_k=4)) == [0, 4, 8, 11]
    assert select_frames(121, JudgeSettings(screenshots="spaced", max_images=5)) == [0, 30, 60, 90, 120]
    assert select_frames(3, JudgeSettings(screenshots="spaced", max_images=5)) == [0, 1, 2]
    assert select_frames(10, JudgeSettings(screenshots="none")) == []
    assert select_frames(0, JudgeSettings()) == []
    # max_images caps every policy, keeping first and last.
    assert select_frames(100, JudgeSettings(max_images=3)) == [0, 50, 99]


def test_helpers() -> None:
    assert evenly_spaced([1, 2, 3, 4, 5], 3) == [1, 3, 5]
    assert evenly_spaced([1, 2], 5) == [1, 2]
    assert evenly_spaced([1, 2, 3], 1) == [3]
    assert format_ranges([5, 1, 2, 3, 9, 10]) == "1–3, 5, 9–10"
    assert image_tokens(512, 332) == 227 and image_tokens(1024, 664) == 907
    assert text_tokens("abcde") == 2


def test_every_k_policy_sends_the_selected_steps_only(tmp_path: Path) -> None:
    sandbox = tmp_path / "sb"
    traj = make_trajectory(sandbox, 10)
    req = build_request(
        traj, FakeSplit(sandbox), prompts_with(tmp_path, 'screenshots = "every_k"\nevery_k = 4\n')
    )
    assert [p.step_ids for p in images(req)] == [(0,), (4,), (8,), (9,)]
    assert "Screenshots of 4 of the 10 steps are included" in text(req)


def test_none_policy_says_so(tmp_path: Path) -> None:
    sandbox = tmp_path / "sb"
    traj = make_trajectory(sandbox, 3)
    req = build_request(traj, FakeSplit(sandbox), prompts_with(tmp_path, 'screenshots = "none"\n'))
    assert images(req) == [] and "No screenshots are included" in text(req)
    assert req.notes == ()


def test_text_only_drops_every_image_up_front_with_a_note(tmp_path: Path) -> None:
    sandbox = tmp_path / "sb"
    traj = make_trajectory(sandbox, 6)
    req = build_request(
        traj,
        FakeSplit(sandbox),
        PromptSet.from_dir(BUNDLED),
        options=RenderOptions(text_only=True),
    )
    assert images(req) == []
    assert "Screenshots are not included in this request" in text(req)
    assert req.notes == ("text only: dropped all 6 selected screenshots (the provider reads text only)",)


def test_missing_screenshot_is_skipped_with_a_note(tmp_path: Path) -> None:
    sandbox = tmp_path / "sb"
    traj = make_trajectory(sandbox, 4, missing=frozenset({2}))
    traj.steps[3].screenshot = None
    req = build_request(traj, FakeSplit(sandbox), PromptSet.from_dir(BUNDLED))
    assert [p.step_ids for p in images(req)] == [(0,), (1,)]
    assert any(n.startswith("step 2: screenshot file missing") for n in req.notes)
    assert any(n.startswith("step 3: no local screenshot") for n in req.notes)
    assert "### Step 2" in text(req) and "### Step 3" in text(req)


def test_undecodable_screenshot_is_skipped_with_a_note(tmp_path: Path) -> None:
    sandbox = tmp_path / "sb"
    traj = make_trajectory(sandbox, 3)
    (sandbox / "data/media/images/rec/step_2.png").write_bytes(b"not a png")
    req = build_request(traj, FakeSplit(sandbox), PromptSet.from_dir(BUNDLED))
    assert [p.step_ids for p in images(req)] == [(0,), (2,)]
    assert any(n.startswith("step 1: screenshot could not be decoded") for n in req.notes)


# --------------------------------------------------------------------------- tiling


def test_tiling_puts_four_consecutive_frames_row_major_into_1024x664(tmp_path: Path) -> None:
    sandbox = tmp_path / "sb"
    traj = make_trajectory(sandbox, 6)
    req = build_request(traj, FakeSplit(sandbox), prompts_with(tmp_path, "tiling = true\n"))
    tiles = images(req)
    assert [t.step_ids for t in tiles] == [(0, 1, 2, 3), (4, 5)]
    full = decode(tiles[0])
    assert full.size == (1024, 664)
    centres = [
        (256, 166),
        (768, 166),
        (256, 498),
        (768, 498),
    ]  # top-left, top-right, bottom-left, bottom-right
    for step, xy in enumerate(centres):
        assert close(full.getpixel(xy), _colour(step)), step
    partial = decode(tiles[1])
    assert partial.size == (1024, 664)
    assert close(partial.getpixel(centres[0]), _colour(4)) and close(partial.getpixel(centres[1]), _colour(5))
    assert close(partial.getpixel(centres[2]), (0, 0, 0)) and close(partial.getpixel(centres[3]), (0, 0, 0))

    body = text(req)
    assert "read row by row: top-left, top-right, bottom-left, bottom-right" in body
    assert (
        "[2x2 grid of steps 0–3: top-left = step 0, top-right = step 1, bottom-left = step 2, bottom-right = step 3]"
        in body
    )
    assert "bottom-right = step 3]" in body and "; the other positions are blank]" in body
    # Each tile follows the text of its last step.
    idx = req.parts.index(tiles[0])
    before = req.parts[idx - 1]
    assert isinstance(before, TextPart) and "### Step 3" in before.text and "### Step 4" not in before.text


def test_tiling_with_a_custom_size_doubles_it(tmp_path: Path) -> None:
    sandbox = tmp_path / "sb"
    traj = make_trajectory(sandbox, 4)
    req = build_request(
        traj,
        FakeSplit(sandbox),
        prompts_with(tmp_path, "tiling = true\nimage_width = 64\nimage_height = 40\n"),
    )
    (tile,) = images(req)
    assert decode(tile).size == (128, 80)


# --------------------------------------------------------------------------- token budget


def test_budget_drops_middle_images_first_keeping_first_and_last(tmp_path: Path) -> None:
    sandbox = tmp_path / "sb"
    traj = make_trajectory(sandbox, 40)
    prompts = PromptSet.from_dir(BUNDLED)
    unlimited = build_request(traj, FakeSplit(sandbox), prompts)
    budget = estimate(unlimited) - 10 * image_tokens(512, 332)
    req = build_request(traj, FakeSplit(sandbox), prompts, options=RenderOptions(token_budget=budget))
    sent = [p.step_ids[0] for p in images(req)]
    assert sent[0] == 0 and sent[-1] == 39
    assert 25 <= len(sent) < 40
    assert estimate(req) <= budget
    assert text(req).count("### Step ") == 40  # no text was compressed
    assert len(req.notes) == 1 and req.notes[0].startswith(
        f"token budget {budget}: dropped the screenshots of"
    )
    dropped = 40 - len(sent)
    assert f"of {dropped} middle steps" in req.notes[0]


def test_budget_then_compresses_middle_text_then_elides(tmp_path: Path) -> None:
    sandbox = tmp_path / "sb"
    traj = make_trajectory(sandbox, 60, thoughts=True)
    prompts = PromptSet.from_dir(BUNDLED)
    system = text_tokens(prompts.system_prompt())

    # Room for brief middle text but not for thoughts: images go, thoughts go, every step stays.
    brief = build_request(
        traj,
        FakeSplit(sandbox),
        prompts,
        options=RenderOptions(text_only=True, token_budget=system + 2600),
    )
    assert brief.notes[-1].endswith("dropped thoughts, descriptions and timestamps of middle steps")
    body = text(brief)
    assert body.count("### Step ") == 60
    assert "I think step 0 " in body and "I think step 59 " in body and "I think step 30 " not in body
    assert estimate(brief) <= system + 2600

    tight = system + 900
    req = build_request(traj, FakeSplit(sandbox), prompts, options=RenderOptions(token_budget=tight))
    assert estimate(req) <= tight
    body = text(req)
    assert GOAL in body and "### Step 0\n" in body and "### Step 59\n" in body
    assert "I think step 0 " in body and "I think step 59 " in body  # first and last steps keep their text
    omitted = [line for line in body.splitlines() if line.startswith("[steps ")]
    assert len(omitted) == 1 and "omitted:" in omitted[0] and "click" in omitted[0]
    assert [p.step_ids for p in images(req)] == [(0,), (59,)]
    notes = " | ".join(req.notes)
    assert "dropped the screenshots of 58 middle steps (1–58)" in notes
    assert "dropped thoughts" in notes and "elided the text of steps" in notes


def test_elision_summary_counts_the_actions(tmp_path: Path) -> None:
    sandbox = tmp_path / "sb"
    traj = make_trajectory(sandbox, 30)
    prompts = PromptSet.from_dir(BUNDLED)
    req = build_request(
        traj,
        FakeSplit(sandbox),
        prompts,
        options=RenderOptions(text_only=True, token_budget=text_tokens(prompts.system_prompt()) + 400),
    )
    (line,) = [x for x in text(req).splitlines() if x.startswith("[steps ")]
    a, b = (int(v) for v in line.removeprefix("[steps ").split(" omitted")[0].split("–"))
    kinds = [traj.steps[i].action.type for i in range(a, b + 1)]
    assert line == (
        f"[steps {a}–{b} omitted: {b - a + 1} actions ({kinds.count('click')} click, {kinds.count('type')} type)]"
    )
    assert a > 0 and b < 29


def test_impossible_budget_keeps_goal_and_ends_and_says_so(tmp_path: Path) -> None:
    sandbox = tmp_path / "sb"
    traj = make_trajectory(sandbox, 12)
    req = build_request(
        traj,
        FakeSplit(sandbox),
        PromptSet.from_dir(BUNDLED),
        options=RenderOptions(token_budget=300),
    )
    body = text(req)
    assert GOAL in body and "### Step 0\n" in body and "### Step 11\n" in body
    assert images(req) == []
    assert "first/last steps (0, 11)" in " ".join(req.notes)
    assert req.notes[-1].startswith("token budget 300: still about")


def test_budget_with_tiling_counts_tiles(tmp_path: Path) -> None:
    sandbox = tmp_path / "sb"
    traj = make_trajectory(sandbox, 24)
    prompts = prompts_with(tmp_path, "tiling = true\ntoken_budget = 100000\n")
    full = build_request(traj, FakeSplit(sandbox), prompts)
    assert len(images(full)) == 6 and full.notes == ()
    budget = estimate(full) - 3 * image_tokens(1024, 664)
    req = build_request(traj, FakeSplit(sandbox), prompts, options=RenderOptions(token_budget=budget))
    tiles = images(req)
    assert estimate(req) <= budget and 1 <= len(tiles) <= 3
    assert tiles[0].step_ids[0] == 0 and tiles[-1].step_ids[-1] == 23


def test_disk_image_cache_reuses_encoded_jpegs_across_processes(tmp_path: Path) -> None:
    sandbox = tmp_path / "sb"
    cache = tmp_path / "images"
    traj = make_trajectory(sandbox, 5)
    prompts = prompts_with(tmp_path, "tiling = true\n")
    first = build_request(traj, FakeSplit(sandbox), prompts, options=RenderOptions(image_cache_dir=cache))
    stored = sorted(cache.rglob("*.jpg"))
    assert len(stored) == 2  # two tiles
    assert {p.read_bytes() for p in stored} == {part.data for part in images(first)}

    clear_image_cache()  # a new process: only the disk cache is left
    for p in stored:
        with Image.open(p) as img:
            marked = img.convert("RGB")
        marked.putpixel((0, 0), (255, 0, 255))
        marked.save(p, "JPEG")
    again = build_request(traj, FakeSplit(sandbox), prompts, options=RenderOptions(image_cache_dir=cache))
    assert sorted(part.data for part in images(again)) == sorted(p.read_bytes() for p in stored)
    assert {part.data for part in images(again)}.isdisjoint(part.data for part in images(first))
    assert not list(cache.rglob("*.tmp"))


@pytest.mark.slow
def test_renders_a_bundled_sample_item_through_the_real_split(tmp_path: Path) -> None:
    from optimizer.devset.split import open_split
    from optimizer.scaffold import init_workspace

    ws = init_workspace(tmp_path / "ws", sample=True)
    split = open_split(ws, ws.config.workspace.dev_split)
    traj = split.trajectory(split.ids[0])
    req = build_request(traj, split, PromptSet.from_dir(ws.prompts_dir))
    assert req.notes == ()
    assert len(images(req)) == len(traj.steps)
    assert all(decode(p).size == (512, 332) for p in images(req))
    assert traj.task.instruction.strip() in text(req)


def test_a_request_rendered_within_a_token_budget_is_within_it_for_the_spending_budget_too(
    tmp_path: Path,
) -> None:
    """Rendering and the spending budget count with one estimator (`optimizer.judge.estimate`): a
    small screenshot (100x60, under a billed image's 85-token floor) costs the plan what it costs the
    reservation, so a request rendered to fit ``token_budget`` is estimated within it."""
    sandbox = tmp_path / "sb"
    traj = make_trajectory(sandbox, 12)
    small = prompts_with(tmp_path, "image_width = 100\nimage_height = 60\n")
    full = build_request(traj, FakeSplit(sandbox), small)
    budget = estimate(full)
    fitted = build_request(traj, FakeSplit(sandbox), small, options=RenderOptions(token_budget=budget))
    assert len(images(fitted)) >= 10  # about as rendered: the images are what the two counts disagreed on
    assert request_input_tokens(fitted) <= budget
