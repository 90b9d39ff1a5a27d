"""What the person following a run sees of a wave's judging: one line summed over its candidates
(`WaveProgress`), and a finished pass's figures (`pass_figures`). One pass's own reporter is
`optimizer.loop.evaluate.pass_reporter`."""

from __future__ import annotations

import dataclasses
import time

from optimizer.evaluation.results import EvalRun
from optimizer.events import Listener, Progress, ProgressSnapshot


def pass_figures(run: EvalRun, *, items: bool = True) -> ProgressSnapshot:
    """A finished pass's figures as a progress snapshot (``items`` False: its calls only, no items)."""
    judged = run.items if items else []
    return ProgressSnapshot(
        done=len(judged),
        total=len(judged),
        infra_errors=sum(1 for i in judged if i.infra_error),
        parse_errors=sum(1 for i in judged if i.answer.status == "invalid"),
        calls_made=run.usage.calls,
        cache_hits=run.cache_hits,
        input_tokens=run.usage.input_tokens,
        output_tokens=run.usage.output_tokens,
        cost_usd=run.cost_usd,
        elapsed_s=run.duration_s if items else 0.0,
    )


class WaveProgress:
    """One progress line for a wave's candidates judged together: every member's latest first-pass
    snapshot summed (a member that stopped early keeps its figures: its items were judged), plus the
    calls of its re-judging passes once each ends; the wave's elapsed time. ``items``: a first pass's."""

    MIN_INTERVAL_S = 0.25

    def __init__(self, ids: list[int], items: int, events: Listener) -> None:
        contiguous = ids == list(range(ids[0], ids[0] + len(ids)))
        which = (
            f"experiment {ids[0]}"
            if len(ids) == 1
            else f"experiments {ids[0]}–{ids[-1]}"
            if contiguous
            else f"experiments {', '.join(map(str, ids))}"
        )
        self.label = f"wave of {len(ids)} ({which})"
        zero = ProgressSnapshot.summed([])
        self.first = {i: dataclasses.replace(zero, total=items) for i in ids}
        self.extra = {i: zero for i in ids}
        self.events = events
        self.started = time.monotonic()
        self._shown = 0.0

    def snapshot(self) -> ProgressSnapshot:
        snap = ProgressSnapshot.summed([*self.first.values(), *self.extra.values()])
        return dataclasses.replace(snap, elapsed_s=time.monotonic() - self.started, label=self.label)

    def update(self, experiment_id: int, snap: ProgressSnapshot) -> None:
        """Member ``experiment_id``'s first pass so far (its phases counted in)."""
        self.first[experiment_id] = snap
        self._show()

    def rejudged(self, experiment_id: int, passes: list[EvalRun]) -> None:
        """Member ``experiment_id``'s re-judging passes so far (every one that ended)."""
        self.extra[experiment_id] = ProgressSnapshot.summed(pass_figures(p, items=False) for p in passes)
        self._show(force=True)

    def _show(self, *, force: bool = False) -> None:
        snap = self.snapshot()
        now = time.monotonic()
        if force or snap.done >= snap.total or now - self._shown >= self.MIN_INTERVAL_S:
            self._shown = now
            self.events(Progress(snap))
