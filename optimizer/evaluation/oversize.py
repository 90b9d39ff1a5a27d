"""Items whose rendered request is oversized, named before anything is paid for them.

A trajectory of 100 MB imports, verifies and renders like any other, and then every evaluation pays for
it. `oversized_items` renders each item as the judge would be sent it (the prompts' layout, screenshots
encoded as the evaluation encodes them, through the on-disk image cache) and names every item whose
request holds more than `OVERSIZED_REQUEST_BYTES` (characters of text, system prompt included, plus
bytes of encoded images) with its size and its estimated cost per pass: the estimator's upper bound for
one call (`optimizer.judge.estimate.estimate_cost_usd`) times the replicates. `judgeloop devset import`,
`judgeloop eval` and a new `judgeloop run` (before its baseline) print one warning line per such item; nothing is refused (a long task may be real).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from optimizer.devset.split import Split
from optimizer.judge.estimate import estimate_cost_usd
from optimizer.judge.prompts import PromptSet
from optimizer.judge.providers.pricing import Price, price_for
from optimizer.judge.render import RenderOptions, build_request
from optimizer.judge.types import ImagePart, JudgeRequest
from optimizer.workspace.config import JudgeSection

# Rendered text + images of one request above which an item is named (a typical item is 50-300 KB).
OVERSIZED_REQUEST_BYTES = 2_000_000


def request_bytes(request: JudgeRequest) -> int:
    """The size of ``request`` as sent: characters of its system prompt and text parts plus the bytes of
    its encoded images."""
    size = len(request.system)
    for part in request.parts:
        size += len(part.data) if isinstance(part, ImagePart) else len(part.text)
    return size


def oversized_items(
    split: Split,
    prompts: PromptSet,
    judge: JudgeSection,
    *,
    prices: dict[str, Price],
    image_cache_dir: Path | None,
    item_ids: Sequence[str] | None = None,
    replicates: int = 1,
) -> list[str]:
    """One warning line per item of ``split`` (or ``item_ids``) whose rendered request is over
    `OVERSIZED_REQUEST_BYTES`, with its size (MB) and estimated cost per pass (US dollars, an upper
    bound; ``prices``: ``judgeloop.toml``'s price overrides). An agentic judge reads items through tools:
    nothing is rendered up front, so nothing is named."""
    if prompts.settings.mode != "direct":
        return []
    sampling = prompts.settings.sampling()
    known = price_for(judge.model, prices) is not None
    lines: list[str] = []
    for tid in item_ids if item_ids is not None else split.ids:
        request = build_request(
            split.trajectory(tid),
            split,
            prompts,
            options=RenderOptions(image_cache_dir=image_cache_dir),
        )
        size = request_bytes(request)
        if size <= OVERSIZED_REQUEST_BYTES:
            continue
        cost = (
            f"about ${replicates * estimate_cost_usd(request, sampling, judge.model, dict(prices)):,.2f} per pass "
            f"({replicates} call(s) of {judge.model})"
            if known
            else f"no price is known for {judge.model!r}, so its cost per pass is not estimated"
        )
        lines.append(
            f"item {tid} of split {split.name!r} renders to a {size / 1e6:,.1f} MB request (over "
            f"{OVERSIZED_REQUEST_BYTES / 1e6:g} MB of text and images): {cost}; check the trajectory, "
            "or leave it out of the manifest"
        )
    return lines
