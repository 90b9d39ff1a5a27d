"""Held-out splits stay apart: seen only through `judgeloop confirm`, sharing nothing with a dev split.

A split listed in ``[workspace] heldout_splits`` is evaluated only by `confirm`, which records and
caps every use: `eval` and `score` refuse it (`refuse_heldout`). A dev split and a held-out split
share no trajectory id and no recording (a label's ``original_id``, the recording shown, or its
``paired_id``, the recording whose instruction a negative borrows): `check_apart`, called at
`devset import`, at the start (and resume) of a `run` and at `confirm`. Reads labels, so it is on
the scoring side of the label firewall.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from optimizer.devset.labels import load_labels
from optimizer.devset.split import list_splits, open_split
from optimizer.errors import UserError
from optimizer.models import Label
from optimizer.workspace import Workspace


def refuse_heldout(ws: Workspace, split_name: str, command: str) -> None:
    """UserError when ``split_name`` is held out: only `confirm` may show its figures."""
    if split_name in ws.config.workspace.heldout_splits:
        raise UserError(
            f"split {split_name!r} is held out ([workspace] heldout_splits), so `judgeloop {command}` does not "
            f"show its figures; measure it with `judgeloop confirm --split {split_name}`, which records and caps each use"
        )


def recordings(labels: Iterable[Label]) -> dict[str, None]:
    """The recordings the items show or borrow an instruction from, in order (empty ids left out)."""
    found: dict[str, None] = {}
    for lab in labels:
        for rec in (lab.original_id, lab.paired_id):
            if rec:
                found.setdefault(rec, None)
    return found


def overlap(dev_name: str, dev: Mapping[str, Label], held_name: str, held: Mapping[str, Label]) -> str | None:
    """What a dev and a held-out split share (count and first, in the held-out split's order), or None."""
    shared_ids = [tid for tid in held if tid in dev]
    dev_recordings = recordings(dev.values())
    shared_recordings = [rec for rec in recordings(held.values()) if rec in dev_recordings]
    parts = []
    if shared_ids:
        parts.append(f"{len(shared_ids)} trajectory id(s) (first {shared_ids[0]})")
    if shared_recordings:
        parts.append(f"{len(shared_recordings)} recording(s) (first {shared_recordings[0]})")
    if not parts:
        return None
    return f"dev split {dev_name!r} and held-out split {held_name!r} share {' and '.join(parts)}"


def check_apart(
    ws: Workspace, name: str, labels: Mapping[str, Label] | None = None, *, others: Sequence[str] | None = None
) -> None:
    """UserError naming the overlap when split ``name`` shares an item or a recording with a split
    on the other side: a held-out split against ``others`` (default: ``[workspace] dev_split``),
    any other split against ``others`` (default: every held-out split). ``labels``: the split's
    own labels when it is not imported yet; splits of ``others`` not in the workspace are skipped.
    """
    cfg = ws.config.workspace
    held_out = name in cfg.heldout_splits
    if others is None:
        others = [cfg.dev_split] if held_out else list(cfg.heldout_splits)
    present = set(list_splits(ws))
    mine = labels
    for other in others:
        if other == name or other not in present:
            continue
        if mine is None:
            mine = load_labels(open_split(ws, name))
        theirs = load_labels(open_split(ws, other))
        problem = overlap(other, theirs, name, mine) if held_out else overlap(name, mine, other, theirs)
        if problem is not None:
            raise UserError(
                f"{problem}; a held-out item must never reach the loop: leave the shared items out of one of "
                "the two splits (re-import it with a --manifest)"
            )
