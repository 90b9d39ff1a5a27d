"""Held-out splits stay apart: seen only through `judgeloop confirm`, sharing nothing with a dev split.

A split listed in ``[workspace] heldout_splits`` is evaluated only by `confirm`, which records and
caps every use. Held out goes by *item*, not by name: any split that shares a trajectory id or a
recording with a held-out split (the superset ``sample`` that ``init --sample`` leaves, once a
held-out split is imported from the same items) is held out too, so `eval`, `score`, `bias` and
`label-fix` refuse it as they refuse the held-out split itself (`refuse_heldout`, `heldout_reason`);
its figures come only through `confirm` of the held-out split. A dev split and a held-out split
share no trajectory id and no recording (a label's ``original_id``, the recording shown, or its
``paired_id``, the recording whose instruction a negative borrows): `check_apart`, called at
`devset import`, at the start (and resume) of a `run` and at `confirm`. Reads labels, so it is on
the scoring side of the label firewall; nothing it says depends on a label's value.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from optimizer.devset.labels import load_labels
from optimizer.devset.split import list_splits, open_split
from optimizer.errors import UserError
from optimizer.models import Label
from optimizer.workspace.workspace import Workspace


def heldout_reason(ws: Workspace, split_name: str) -> tuple[str, str] | None:
    """Why split ``split_name`` is held out — (the reason, the held-out split `confirm` measures) — or
    None: listed in ``[workspace] heldout_splits``, or sharing a trajectory id or a recording with a
    listed split that is imported (by item, whatever its name). The reason names counts and the first
    shared id, never a label."""
    held = ws.config.workspace.heldout_splits
    if split_name in held:
        return f"split {split_name!r} is held out ([workspace] heldout_splits)", split_name
    present = set(list_splits(ws))
    if split_name not in present:
        return None
    mine: Mapping[str, Label] | None = None
    for other in held:
        if other not in present:
            continue
        if mine is None:
            mine = load_labels(open_split(ws, split_name))
        what = shared(mine, load_labels(open_split(ws, other)))
        if what is not None:
            return (
                f"split {split_name!r} holds held-out items (it and held-out split {other!r} share {what}), "
                "so it is held out too"
            ), other
    return None


def refuse_heldout(ws: Workspace, split_name: str, command: str) -> None:
    """UserError when ``split_name`` is held out (`heldout_reason`: by name or by item): only `confirm`
    may show a held-out item's figures, and it records and caps each use."""
    found = heldout_reason(ws, split_name)
    if found is not None:
        reason, held = found
        raise UserError(
            f"{reason}, so `judgeloop {command}` does not show its figures; measure the held-out items with "
            f"`judgeloop confirm --split {held}`, which records and caps each use"
        )


def recordings(labels: Iterable[Label]) -> dict[str, None]:
    """The recordings the items show or borrow an instruction from, in order (empty ids left out)."""
    found: dict[str, None] = {}
    for lab in labels:
        for rec in (lab.original_id, lab.paired_id):
            if rec:
                found.setdefault(rec, None)
    return found


def shared(dev: Mapping[str, Label], held: Mapping[str, Label]) -> str | None:
    """What two splits' labels share — "N trajectory id(s) (first X) and M recording(s) (first Y)", in
    the held-out split's order — or None."""
    shared_ids = [tid for tid in held if tid in dev]
    dev_recordings = recordings(dev.values())
    shared_recordings = [rec for rec in recordings(held.values()) if rec in dev_recordings]
    parts = []
    if shared_ids:
        parts.append(f"{len(shared_ids)} trajectory id(s) (first {shared_ids[0]})")
    if shared_recordings:
        parts.append(f"{len(shared_recordings)} recording(s) (first {shared_recordings[0]})")
    return " and ".join(parts) or None


def overlap(dev_name: str, dev: Mapping[str, Label], held_name: str, held: Mapping[str, Label]) -> str | None:
    """What a dev and a held-out split share (count and first, in the held-out split's order), or None."""
    what = shared(dev, held)
    return None if what is None else f"dev split {dev_name!r} and held-out split {held_name!r} share {what}"


def check_apart(
    ws: Workspace,
    name: str,
    labels: Mapping[str, Label] | None = None,
    *,
    others: Sequence[str] | None = None,
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
