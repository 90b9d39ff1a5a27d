"""A run's waves of candidates read back from its rows (`[loop] wave`, `optimizer.loop.waves.run_wave`).

Each wave candidate's row holds ``proposal_meta["wave"] = {"size", "alpha", "incumbent", "number"}``:
the wave's size (Holm's family), its level, the incumbent it was proposed against and its number in
the run (1-based, counted over the run's rows, so a resumed run goes on counting). Rows written before
``number`` existed are grouped by what they hold (see `waves`). A record that is not what the loop
writes (not an object, a size outside 2..MAX_WAVE, an incumbent that is not the row's parent, a number
larger than the run's experiments) is no wave: the row reads as a single candidate.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from optimizer.ledger.rows import Experiment
from optimizer.workspace.config import MAX_WAVE


@dataclass(frozen=True)
class WaveMeta:
    """One row's well-formed wave record (``number`` None on rows written before it was recorded)."""

    size: int
    incumbent: int
    alpha: float | None
    number: int | None


@dataclass(frozen=True)
class Wave:
    """One wave: its number in the run, size (Holm's family), incumbent, level and members' ids (id order)."""

    number: int
    size: int
    incumbent: int
    alpha: float | None
    members: tuple[int, ...]

    def position(self, experiment_id: int) -> int:
        """The member's place in the wave, 1-based."""
        return self.members.index(experiment_id) + 1

    def tag(self, experiment_id: int) -> str:
        """``w3 2/4``: wave 3, member 2 of its 4 rows."""
        return f"w{self.number} {self.position(experiment_id)}/{len(self.members)}"


def _whole(value: object, low: int, high: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def wave_meta(exp: Experiment, max_number: int) -> WaveMeta | None:
    """``exp``'s wave record, or None when it has none or a malformed one (``max_number``: the most
    waves the run can hold, its number of experiments)."""
    raw = exp.proposal_meta.get("wave") if isinstance(exp.proposal_meta, Mapping) else None
    if not isinstance(raw, Mapping) or exp.seq == 0:
        return None
    size, incumbent, alpha, number = (raw.get(k) for k in ("size", "incumbent", "alpha", "number"))
    if not _whole(size, 2, MAX_WAVE) or not _whole(incumbent, 1, 2**62) or exp.parent_id != incumbent:
        return None
    if number is not None and not _whole(number, 1, max_number):
        return None
    level = float(alpha) if isinstance(alpha, int | float) and not isinstance(alpha, bool) else None
    if level is not None and not (math.isfinite(level) and 0 < level <= 1):
        level = None
    assert isinstance(size, int) and isinstance(incumbent, int)
    return WaveMeta(size, incumbent, level, number if isinstance(number, int) else None)


def _absorbable(exp: Experiment, incumbent: int) -> bool:
    """An old row of a wave's optimiser failure: no wave record (the loop wrote none there before
    ``number`` existed), an error, proposed against the wave's incumbent."""
    return (
        "wave" not in exp.proposal_meta
        and exp.status == "error"
        and exp.seq > 0
        and exp.parent_id == incumbent
    )


def waves(experiments: Sequence[Experiment]) -> list[Wave]:
    """The run's waves, by their first member's id. Rows with a ``number`` group by it (and their
    incumbent and size). Rows without one (written before it was recorded) fall back to runs of
    consecutive rows, in id order, with the same incumbent and size, cut into chunks of the size and
    numbered after the waves before them; an optimiser failure's row of that time (no record) joins the
    run it sits in, or the run it ends while the run's last chunk has room. Either way a wave holds at
    most its size of rows."""
    ordered = sorted(experiments, key=lambda e: e.id)
    metas = {e.id: wave_meta(e, len(ordered)) for e in ordered}
    by_number: dict[tuple[int, int, int], list[int]] = {}
    runs: list[tuple[WaveMeta, list[int]]] = []
    current: tuple[WaveMeta, list[int]] | None = None
    pending: list[int] = []

    def close() -> None:
        nonlocal current
        if current is not None:
            meta, ids = current
            room = -len(ids) % meta.size
            ids.extend(pending[:room])
            runs.append(current)
        current = None
        pending.clear()

    for exp in ordered:
        meta = metas[exp.id]
        if meta is not None and meta.number is not None:
            close()
            by_number.setdefault((meta.number, meta.incumbent, meta.size), []).append(exp.id)
        elif meta is not None:
            if current is not None and (current[0].incumbent, current[0].size) == (meta.incumbent, meta.size):
                current[1].extend(pending)
                pending.clear()
                current[1].append(exp.id)
            else:
                close()
                current = (meta, [exp.id])
        elif current is not None and _absorbable(exp, current[0].incumbent):
            pending.append(exp.id)
        else:
            close()
    close()

    chunks: list[tuple[int | None, WaveMeta, tuple[int, ...]]] = []
    for (number, incumbent, size), ids in by_number.items():
        alpha = next((m.alpha for i in ids if (m := metas[i]) is not None and m.alpha is not None), None)
        meta = WaveMeta(size, incumbent, alpha, number)
        chunks += [(number, meta, tuple(ids[i : i + size])) for i in range(0, len(ids), size)]
    for meta, ids in runs:
        chunks += [(None, meta, tuple(ids[i : i + meta.size])) for i in range(0, len(ids), meta.size)]
    out: list[Wave] = []
    last = 0
    for stored, meta, members in sorted(chunks, key=lambda c: c[2][0]):
        number = stored if stored is not None else last + 1
        last = max(last, number)
        out.append(Wave(number, meta.size, meta.incumbent, meta.alpha, members))
    return out


def waves_by_member(experiments: Sequence[Experiment]) -> dict[int, Wave]:
    """Each wave member's id → its wave."""
    return {member: wave for wave in waves(experiments) for member in wave.members}


def next_wave_number(experiments: Sequence[Experiment]) -> int:
    """The number the run's next wave takes: one more than the largest of its waves so far."""
    return max((w.number for w in waves(experiments)), default=0) + 1


def _fully_tested(exp: Experiment) -> bool:
    """Decided on a full test: what `optimizer.stats.decision.decide_wave` ranks by its p-value (an early
    stop's p is a bound, and a decision without a test counts as p = 1)."""
    return (
        exp.status in ("kept", "rolled_back")
        and not exp.early_stopped
        and exp.test is not None
        and exp.p_value is not None
    )


def holm_rank(exp: Experiment, members: Sequence[Experiment]) -> int | None:
    """``exp``'s Holm rank in its wave (``members``: the wave's rows, itself included), recomputed as
    `optimizer.stats.decision.holm` orders the p-values (smaller first, ties by id); None when it had no
    full test or p = 1 (counted as p = 1, its rank among the other p = 1 ones says nothing)."""
    if not _fully_tested(exp) or exp.p_value is None or exp.p_value >= 1:
        return None
    own = (exp.p_value, exp.id)
    return 1 + sum(
        1 for m in members if m.id != exp.id and _fully_tested(m) and (m.p_value or 0.0, m.id) < own
    )
