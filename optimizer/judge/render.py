"""Rendering one trajectory into a `JudgeRequest`: system prompt, goal, steps, screenshots.

Two layouts (``judge.toml`` ``layout``). ``rubric-first``: the system prompt is
``prompts.system_prompt()`` (judge.md with the rubric); the user content is the goal, then every
step's text (its action string, plus thought / description / timestamp when the trajectory has them)
followed by its screenshot when the screenshot policy selected it, then a closing reminder of the
instruction. ``trajectory-first``: the system prompt is the fixed `STATIC_SYSTEM_PROMPT`; the user
content is the same goal, steps and screenshots (``JudgeRequest.cache_prefix`` parts, identical for
every candidate), then one text part holding judge.md with the rubric (the output contract at its
end) and the closing reminder — so only that last part changes from one candidate to the next. Screenshots are the screen *before* the step's action, resized
to exactly ``image_width`` x ``image_height`` pixels and sent as JPEG; with ``tiling`` four
consecutive selected frames are pasted row-major into one image twice as wide and tall.

Token estimates (used only for the budget) are `optimizer.judge.estimate`'s: text = ceil(characters
/ 4) per piece; an image = ceil(width * height / 750) tokens, at least 85 (227 tokens at 512x332, 907
for a 1024x664 tile). Over budget, in order: drop middle-step screenshots (keeping an evenly spaced subset), drop
middle steps' thoughts / descriptions / timestamps, elide a centred run of middle steps behind a
one-line summary, and finally drop the first and last steps' screenshots. The goal and the first and
last steps' text are always sent. Every drop or compression is recorded in ``JudgeRequest.notes``.

This module never sees labels: it reads trajectories and screenshot files only.
"""

from __future__ import annotations

import hashlib
import io
import math
import os
import threading
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Protocol

from PIL import Image

from optimizer.devset.markdown import action_string, timestamp_ms_text
from optimizer.judge.estimate import image_tokens, text_tokens
from optimizer.judge.prompts import STATIC_SYSTEM_PROMPT, JudgeSettings, PromptSet
from optimizer.judge.types import ImagePart, JudgeRequest, Part, TextPart
from optimizer.models import Step, Trajectory

# Bump when the resizing or encoding changes, so on-disk cached JPEGs are not reused.
RENDER_VERSION = 1
TILE_SLOTS = ("top-left", "top-right", "bottom-left", "bottom-right")
_BLANK = (0, 0, 0)
FileKey = tuple[str, int, int]  # (path, mtime_ns, size): an edited file gets a new cache key


class ScreenshotSource(Protocol):
    """What rendering needs from a split (`optimizer.devset.Split` satisfies it)."""

    def screenshot_file(self, step: Step) -> Path | None: ...


def format_ranges(indices: Sequence[int]) -> str:
    """``[1, 2, 3, 5]`` → ``"1–3, 5"`` (sorted, de-duplicated)."""
    values = sorted(set(indices))
    out: list[str] = []
    i = 0
    while i < len(values):
        j = i
        while j + 1 < len(values) and values[j + 1] == values[j] + 1:
            j += 1
        out.append(str(values[i]) if i == j else f"{values[i]}–{values[j]}")
        i = j + 1
    return ", ".join(out)


def evenly_spaced(items: Sequence[int], count: int) -> list[int]:
    """``count`` items of ``items`` spread evenly, always keeping the first and last (count ≥ 2)."""
    if count >= len(items):
        return list(items)
    if count <= 0:
        return []
    if count == 1:
        return [items[-1]]
    last = len(items) - 1
    picked = sorted({round(j * last / (count - 1)) for j in range(count)})
    return [items[p] for p in picked]


def select_frames(n_steps: int, settings: JudgeSettings) -> list[int]:
    """Step positions whose screenshot the policy selects, before missing files and the budget."""
    if n_steps == 0 or settings.screenshots == "none":
        return []
    if settings.screenshots == "all":
        chosen = list(range(n_steps))
    elif settings.screenshots == "every_k":
        chosen = sorted({*range(0, n_steps, settings.every_k), n_steps - 1})
    else:  # spaced
        chosen = evenly_spaced(range(n_steps), settings.max_images or n_steps)
    if settings.max_images is not None and len(chosen) > settings.max_images:
        chosen = evenly_spaced(chosen, settings.max_images)
    return chosen


# --------------------------------------------------------------------------- images


def _file_key(path: Path) -> FileKey:
    st = path.stat()
    return str(path), st.st_mtime_ns, st.st_size


def _load_resized(path: str, width: int, height: int) -> Image.Image:
    with Image.open(path) as img:
        img.draft("RGB", (width, height))  # JPEG sources decode at reduced scale: much faster
        rgb = img.convert("RGB")
    # Bilinear after an integer box reduction: ~2x faster than Lanczos at screenshot sizes, and at
    # 512 px wide the difference is not visible.
    return rgb.resize((width, height), Image.Resampling.BILINEAR, reducing_gap=2.0)


def _encode(img: Image.Image, quality: int) -> bytes:
    buf = io.BytesIO()
    img.save(buf, "JPEG", quality=quality)
    return buf.getvalue()


def _disk_cached(cache_dir: str | None, key: tuple[object, ...], make: Callable[[], bytes]) -> bytes:
    """``make()``'s bytes, stored under ``cache_dir`` by a hash of ``key`` (no cache when None)."""
    if cache_dir is None:
        return make()
    name = hashlib.sha256(repr((RENDER_VERSION, key)).encode()).hexdigest()
    path = Path(cache_dir) / name[:2] / f"{name}.jpg"
    try:
        return path.read_bytes()
    except FileNotFoundError:
        pass
    data = make()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.{threading.get_ident()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)  # atomic: concurrent renderers never read half a file
    return data


@lru_cache(maxsize=2048)
def frame_jpeg(key: FileKey, width: int, height: int, quality: int, cache_dir: str | None) -> bytes:
    return _disk_cached(
        cache_dir,
        ("frame", key, width, height, quality),
        lambda: _encode(_load_resized(key[0], width, height), quality),
    )


@lru_cache(maxsize=512)
def _tile_jpeg(
    keys: tuple[FileKey, ...], width: int, height: int, quality: int, cache_dir: str | None
) -> bytes:
    def make() -> bytes:
        tile = Image.new("RGB", (2 * width, 2 * height), _BLANK)
        for slot, key in enumerate(keys):
            tile.paste(_load_resized(key[0], width, height), ((slot % 2) * width, (slot // 2) * height))
        return _encode(tile, quality)

    return _disk_cached(cache_dir, ("tile", keys, width, height, quality), make)


def file_state(path: Path) -> FileKey | None:
    """The file's cache key (path, mtime, size), or None when it is not a readable file."""
    try:
        return _file_key(path) if path.is_file() else None
    except OSError:
        return None


DECODE_ERRORS = (OSError, ValueError, SyntaxError, Image.DecompressionBombError)


# --------------------------------------------------------------------------- step text


@dataclass
class _StepText:
    full: str
    brief: str


def step_text(index: int, step: Step) -> _StepText:
    head = f"### Step {index}\n\n**Action:** `{action_string(step.action)}`"
    extra = []
    if step.thought:
        extra.append(f"**Thought:** {step.thought.strip()}")
    if step.action_description:
        extra.append(f"**Description:** {step.action_description.strip()}")
    ms = timestamp_ms_text(step.timestamp_us)
    if ms is not None:
        extra.append(f"**Timestamp:** {ms} ms")
    full = "\n\n".join([head, *extra]) + "\n\n"
    return _StepText(full=full, brief=head + "\n\n")


def _elision_line(steps: Sequence[Step], first: int, last: int) -> str:
    kinds = Counter(steps[i].action.type for i in range(first, last + 1))
    count = last - first + 1
    detail = ", ".join(f"{n} {kind}" for kind, n in sorted(kinds.items(), key=lambda kv: (-kv[1], kv[0])))
    noun = "action" if count == 1 else "actions"
    return f"[steps {first}–{last} omitted: {count} {noun} ({detail})]\n\n"


# --------------------------------------------------------------------------- the plan


@dataclass
class _Plan:
    frames: list[int]  # step positions whose screenshot is sent
    brief_middle: bool = False
    elided: tuple[int, int] | None = None  # inclusive run of middle step positions replaced by one line


class _Costs:
    """Token estimates for the parts of one request, so budget search is arithmetic."""

    def __init__(
        self, fixed: str, texts: list[_StepText], steps: Sequence[Step], settings: JudgeSettings
    ) -> None:
        self.fixed = text_tokens(fixed)
        self.full = [text_tokens(t.full) for t in texts]
        self.brief = [text_tokens(t.brief) for t in texts]
        self.steps = steps
        self.tiling = settings.tiling
        self.frame = image_tokens(settings.image_width, settings.image_height)
        self.tile = image_tokens(2 * settings.image_width, 2 * settings.image_height)

    def images(self, n_frames: int) -> int:
        return math.ceil(n_frames / 4) * self.tile if self.tiling else n_frames * self.frame

    def total(self, plan: _Plan) -> int:
        n = len(self.full)
        cost = self.fixed + self.images(len(plan.frames))
        for i in range(n):
            if plan.elided and plan.elided[0] <= i <= plan.elided[1]:
                continue
            middle = 0 < i < n - 1
            cost += self.brief[i] if (plan.brief_middle and middle) else self.full[i]
        if plan.elided:
            cost += text_tokens(_elision_line(self.steps, *plan.elided))
        # Each tile carries a one-line position legend (~30 tokens).
        return cost + (30 * math.ceil(len(plan.frames) / 4) if self.tiling else 0)


def _fit_budget(costs: _Costs, frames: list[int], n: int, budget: int, notes: list[str]) -> _Plan:
    plan = _Plan(frames=list(frames))
    if costs.total(plan) <= budget:
        return plan
    ends = [f for f in frames if f in (0, n - 1)]
    middle = [f for f in frames if f not in (0, n - 1)]
    kept: list[int] = []
    for m in range(len(middle) - 1, -1, -1):
        kept = evenly_spaced(middle, m)
        plan = _Plan(frames=sorted([*ends, *kept]))
        if costs.total(plan) <= budget:
            break
    dropped = sorted(set(middle) - set(kept))
    if dropped:
        notes.append(
            f"token budget {budget}: dropped the screenshots of {len(dropped)} middle steps ({format_ranges(dropped)})"
        )
    if costs.total(plan) <= budget:
        return plan

    if any(costs.brief[i] != costs.full[i] for i in range(1, n - 1)):
        plan.brief_middle = True
        notes.append(f"token budget {budget}: dropped thoughts, descriptions and timestamps of middle steps")
        if costs.total(plan) <= budget:
            return plan

    inner = n - 2
    for length in range(1, inner + 1):
        start = 1 + (inner - length) // 2
        plan.elided = (start, start + length - 1)
        if costs.total(plan) <= budget:
            break
    if plan.elided:
        a, b = plan.elided
        notes.append(
            f"token budget {budget}: elided the text of steps {a}–{b} ({b - a + 1} steps) behind a summary"
        )
    if costs.total(plan) <= budget:
        return plan

    if plan.frames:
        notes.append(
            f"token budget {budget}: dropped the screenshots of the first/last steps ({format_ranges(plan.frames)})"
        )
        plan.frames = []
    total = costs.total(plan)
    if total > budget:
        notes.append(
            f"token budget {budget}: still about {total} tokens after every reduction (the goal and the first "
            "and last steps are always sent)"
        )
    return plan


# --------------------------------------------------------------------------- the request


def _screenshot_intro(settings: JudgeSettings, n_frames: int, n_steps: int, text_only: bool) -> str:
    if text_only:
        return "Screenshots are not included in this request: judge from the recorded actions alone.\n\n"
    if n_frames == 0:
        return "No screenshots are included: judge from the recorded actions alone.\n\n"
    if settings.tiling:
        return (
            f"Screenshots of {n_frames} of the {n_steps} steps are included, each showing the screen just before "
            "that step's action. They come in 2x2 grids of four consecutive included screenshots, read row by "
            "row: top-left, top-right, bottom-left, bottom-right. Each grid follows the text of its last step, "
            "introduced by a line naming the step in each position.\n\n"
        )
    return (
        f"Screenshots of {n_frames} of the {n_steps} steps are included, each right after its step's text and "
        "showing the screen just before that step's action.\n\n"
    )


def _tile_legend(step_ids: Sequence[int]) -> str:
    slots = ", ".join(f"{TILE_SLOTS[k]} = step {s}" for k, s in enumerate(step_ids))
    blank = "; the other positions are blank" if len(step_ids) < 4 else ""
    return f"[2x2 grid of steps {format_ranges(step_ids)}: {slots}{blank}]\n\n"


@dataclass(frozen=True)
class RenderOptions:
    """How `build_request` renders beyond judge.toml (every field optional; see its docstring)."""

    text_only: bool = False
    token_budget: int | None = None  # estimated input tokens, system prompt included
    image_cache_dir: Path | None = None
    layout: str | None = None
    memory: str = ""
    extra_instructions: str = ""
    replace_instructions: str | None = None


def build_request(
    traj: Trajectory,
    split: ScreenshotSource,
    prompts: PromptSet,
    options: RenderOptions | None = None,
) -> JudgeRequest:
    """Render ``traj`` for the judge described by ``prompts`` (screenshots read through ``split``).

    ``options`` (`RenderOptions`, default none of them):
    ``text_only`` drops every screenshot up front (providers that cannot read images);
    ``token_budget`` overrides ``judge.toml``'s (estimated input tokens, system prompt included);
    ``layout`` overrides ``judge.toml``'s (a provider whose cache works better with the other one);
    ``image_cache_dir`` keeps encoded JPEGs on disk across processes (decoding and resizing a
    full-size PNG costs tens of milliseconds; a cached re-evaluation should not pay it again).
    Encoded images are also cached in memory per process. ``memory``: the item's memory block
    (`optimizer.judge.memory.Selection.block`), placed after the trajectory and before the instructions
    (trajectory-first: its own part after the cache breakpoint, so the cached prefix is unchanged) or
    before the closing reminder (rubric-first); "" sends none, the request byte for byte as without it.
    Encoded images are also cached in memory per process.
    ``extra_instructions`` go after the judge's instructions, before the closing reminder (a criteria
    check's derived criteria, `optimizer.judge.criteria`); ``replace_instructions`` replaces the
    instructions and the closing reminder altogether and implies trajectory-first (a review call).
    """
    o = options if options is not None else RenderOptions()
    text_only, token_budget, layout, memory = o.text_only, o.token_budget, o.layout, o.memory
    extra_instructions, replace_instructions = o.extra_instructions, o.replace_instructions
    cache_dir = None if o.image_cache_dir is None else str(o.image_cache_dir)
    settings = prompts.settings
    trajectory_first = replace_instructions is not None or (layout or settings.layout) == "trajectory-first"
    # rubric-first: the instructions are the system prompt. trajectory-first: a fixed system prompt,
    # and the instructions follow the trajectory (after the cache breakpoint).
    system = STATIC_SYSTEM_PROMPT if trajectory_first else prompts.system_prompt()
    instructions = prompts.instructions() + "\n" if trajectory_first else ""
    steps = traj.steps
    n = len(steps)
    notes: list[str] = []
    budget = token_budget if token_budget is not None else settings.token_budget

    frames = select_frames(n, settings)
    if text_only and frames:
        notes.append(
            f"text only: dropped all {len(frames)} selected screenshots (the provider reads text only)"
        )
        frames = []
    keys: dict[int, FileKey] = {}
    for i in frames:
        path = split.screenshot_file(steps[i])
        if path is None:
            notes.append(f"step {i}: no local screenshot ({steps[i].screenshot or 'null'}); sent without it")
            continue
        found = file_state(path)
        if found is None:
            notes.append(f"step {i}: screenshot file missing ({path}); sent without it")
            continue
        keys[i] = found
    frames = [i for i in frames if i in keys]

    goal = traj.task.instruction.strip()
    header_core = f"## Goal\n\n{goal}\n\n## Steps\n\nTotal steps: **{n}**\n\n"
    closing = (
        "## Your verdict\n\nJudge whether the steps above accomplish exactly this instruction:\n\n"
        f"{goal}\n\nAnswer with the JSON object only."
    )
    if extra_instructions:
        closing = extra_instructions.rstrip("\n") + "\n\n" + closing
    if replace_instructions is not None:
        instructions, closing = "", replace_instructions
    texts = [step_text(i, s) for i, s in enumerate(steps)]
    # The intro's length barely depends on the frame count; estimate with the longest variant.
    intro_guess = _screenshot_intro(settings, max(len(frames), 1), n, text_only)
    costs = _Costs(
        system + instructions + header_core + intro_guess + memory + closing, texts, steps, settings
    )
    plan = _fit_budget(costs, frames, n, budget, notes) if budget is not None else _Plan(frames=frames)

    parts: list[Part] = []
    buffer: list[str] = [header_core + _screenshot_intro(settings, len(plan.frames), n, text_only)]

    def flush() -> None:
        if buffer:
            parts.append(TextPart("".join(buffer)))
            buffer.clear()

    frame_set = set(plan.frames)
    groups: dict[int, list[int]] = {}  # last step of a tile group → its frames
    if settings.tiling:
        for g in range(0, len(plan.frames), 4):
            group = plan.frames[g : g + 4]
            groups[group[-1]] = group
    for i in range(n):
        if plan.elided and plan.elided[0] <= i <= plan.elided[1]:
            if i == plan.elided[0]:
                buffer.append(_elision_line(steps, *plan.elided))
            continue
        text = texts[i]
        buffer.append(text.brief if plan.brief_middle and 0 < i < n - 1 else text.full)
        if settings.tiling and i in groups:
            group = groups[i]
            part = _image_part(group, keys, settings, notes, cache_dir)
            if part is not None:
                buffer.append(_tile_legend(part.step_ids))
                flush()
                parts.append(part)
        elif not settings.tiling and i in frame_set:
            part = _image_part([i], keys, settings, notes, cache_dir)
            if part is not None:
                flush()
                parts.append(part)
    if not trajectory_first:
        buffer.append(memory + closing)
        flush()
        return JudgeRequest(system=system, parts=tuple(parts), notes=tuple(notes), item_id=traj.trajectory_id)
    flush()
    prefix = len(parts)  # goal, steps and screenshots: the same for every candidate
    if memory:
        parts.append(TextPart(memory))
    parts.append(TextPart(instructions + closing))
    return JudgeRequest(
        system=system,
        parts=tuple(parts),
        notes=tuple(notes),
        cache_prefix=prefix,
        cache_ttl=settings.cache_ttl,
        item_id=traj.trajectory_id,
    )


def _image_part(
    group: list[int],
    keys: dict[int, FileKey],
    settings: JudgeSettings,
    notes: list[str],
    cache_dir: str | None,
) -> ImagePart | None:
    """Encode one frame (no tiling) or one 2x2 tile; a frame that fails to decode is left out with a note."""
    w, h, q = settings.image_width, settings.image_height, settings.jpeg_quality
    usable = list(group)
    if settings.tiling:
        try:
            return ImagePart(
                data=_tile_jpeg(tuple(keys[i] for i in usable), w, h, q, cache_dir), step_ids=tuple(usable)
            )
        except DECODE_ERRORS:
            pass  # find the frame(s) at fault below, then tile the rest
    for i in group:
        try:
            frame_jpeg(keys[i], w, h, q, cache_dir)
        except DECODE_ERRORS as exc:
            notes.append(f"step {i}: screenshot could not be decoded ({type(exc).__name__}); sent without it")
            usable.remove(i)
    if not usable:
        return None
    if not settings.tiling:
        return ImagePart(data=frame_jpeg(keys[usable[0]], w, h, q, cache_dir), step_ids=(usable[0],))
    return ImagePart(
        data=_tile_jpeg(tuple(keys[i] for i in usable), w, h, q, cache_dir), step_ids=tuple(usable)
    )


def clear_image_cache() -> None:
    """Forget cached encoded screenshots (tests; long-lived processes after data changes)."""
    frame_jpeg.cache_clear()
    _tile_jpeg.cache_clear()
