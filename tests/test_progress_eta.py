"""The progress line's ETA (issue 36 point 3): timed from the first judged item, so a model's loading is not
spread over the items, and "estimating" until two more items finished."""

from __future__ import annotations

import io

from optimizer.cli.progress import StderrProgress
from optimizer.events import ProgressSnapshot


def _snap(done: int, elapsed_s: float, total: int = 10) -> ProgressSnapshot:
    return ProgressSnapshot(done, total, 0, 0, done, 0, 0, 0, 0.0, elapsed_s)


def test_eta_excludes_the_model_loading_and_says_estimating_until_two_timed_items() -> None:
    out = io.StringIO()
    progress = StderrProgress(out)  # not a terminal: a plain line per snapshot here (10 items, one a line)
    progress(_snap(0, 5))
    progress(_snap(1, 120))  # the first item: two minutes of model loading
    progress(_snap(2, 130))
    progress(_snap(3, 140))  # two items timed at 10 s each
    lines = out.getvalue().splitlines()
    assert all("ETA estimating" in line for line in lines[:3]), lines
    # 7 items left at 10 s: 1m10s, not 7 × 46.7 s (the pace with the loading counted in).
    assert lines[3].endswith("ETA 1m10s"), lines[3]
