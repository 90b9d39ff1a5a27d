"""`judgeloop runs prune`: remove old runs' branches and folders, safely.

Only finished runs older than the ``keep`` newest are pruned. A run is spared when it is unfinished
(running, waiting, stopped or crashed: `run --resume` or `decide` may still continue it), when its
branch is checked out, or when HEAD stands on its kept chain (the branch tip is an ancestor of HEAD).
Nothing is lost: the ledger keeps every run's rows, and each removed branch's tip stays in git under
``refs/judgeloop/pruned/<run id>`` (``git branch NAME refs/judgeloop/pruned/<run id>`` brings it back);
the run's folder ``experiments/runs/<run id>/`` holds its exported report, which `judgeloop report`
writes again from the ledger.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path

from optimizer.ledger import Ledger, Run
from optimizer.workspace import gitops
from optimizer.workspace.workspace import Workspace, command_lock

DEFAULT_KEEP = 5  # the newest runs never pruned


@dataclass(frozen=True)
class Prunable:
    """A run whose branch and folder `prune_runs` removes (either may already be gone)."""

    run_id: str
    branch: str | None  # the run's branch, when it still exists
    folder: Path | None  # experiments/runs/<id>/, when it exists


@dataclass
class PrunePlan:
    """What a prune would remove, and each spared run with why (run id → reason)."""

    remove: list[Prunable] = field(default_factory=list)
    spared: dict[str, str] = field(default_factory=dict)


def plan_prune(ws: Workspace, ledger: Ledger, keep: int = DEFAULT_KEEP) -> PrunePlan:
    """The runs past the ``keep`` newest that can go, and the ones spared; changes nothing."""
    plan = PrunePlan()
    current = gitops.current_branch(ws.root)
    head = gitops.rev_parse(ws.root, "HEAD")
    for index, run in enumerate(ledger.runs()):  # newest first
        why = _spared(ws, run, index, keep, current, head)
        if why is not None:
            plan.spared[run.id] = why
            continue
        branch = run.branch if gitops.branch_exists(ws.root, run.branch) else None
        folder = _run_folder(ws, run.id)
        if branch is not None or folder is not None:
            plan.remove.append(Prunable(run.id, branch, folder))
    return plan


def _spared(ws: Workspace, run: Run, index: int, keep: int, current: str | None, head: str) -> str | None:
    if index < keep:
        return f"one of the {keep} newest runs"
    if run.status != "finished":
        return f"{run.status}: `judgeloop run --resume` or `judgeloop decide` may still continue it"
    if run.branch == current:
        return "its branch is checked out"
    if gitops.branch_exists(ws.root, run.branch) and gitops.is_ancestor(ws.root, run.branch, head):
        return "HEAD stands on its kept chain"
    return None


def _run_folder(ws: Workspace, run_id: str) -> Path | None:
    """experiments/runs/<run_id>/ when it is a real folder inside experiments/runs/ (never a link out)."""
    base = ws.paths.runs
    folder = base / run_id
    if "/" in run_id or run_id in ("", ".", "..") or folder.is_symlink() or not folder.is_dir():
        return None
    return folder if folder.resolve().parent == base.resolve() else None


def prune_runs(ws: Workspace, plan: PrunePlan) -> list[str]:
    """Remove what ``plan`` lists, under the loop lock (no run, decide or confirm meanwhile); one line each."""
    lines: list[str] = []
    with command_lock(ws, "runs prune"):
        current = gitops.current_branch(ws.root)
        for item in plan.remove:
            done: list[str] = []
            if (
                item.branch is not None
                and item.branch != current
                and gitops.branch_exists(ws.root, item.branch)
            ):
                sha = gitops.archive_branch(ws.root, item.branch, f"{gitops.PRUNED_PREFIX}{item.run_id}")
                done.append(
                    f"branch {item.branch} (tip {sha[:12]} kept under {gitops.PRUNED_PREFIX}{item.run_id})"
                )
            if item.folder is not None and item.folder.is_dir() and not item.folder.is_symlink():
                shutil.rmtree(item.folder)
                done.append(f"folder {item.folder.relative_to(ws.root)}")
            if done:
                lines.append(f"run {item.run_id}: removed " + " and ".join(done))
    return lines
