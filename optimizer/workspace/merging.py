"""Merging pooled candidates (`[loop] stack`): the edits of rolled-back candidates, each kept under
``refs/judgeloop/rejected/<id>``, merged onto their incumbent with git's own three-way merge.

Each candidate's commit has the incumbent as its parent, so its diff is "incumbent → candidate". The
candidates are merged one at a time, in the order given, with ``git merge-tree --write-tree`` (git ≥ 2.38:
no working tree, no index): the result so far against the next candidate, their merge base the incumbent.
A candidate whose edit conflicts with what is merged so far is left out (with the paths that conflict), as
is one that was not proposed on this incumbent or whose ref is gone; the rest are carried. Nothing here
moves a branch or touches the working tree: the result is the merged files' texts, which the loop proposes
as one candidate through its normal path (guards, commit, evaluation, the same policy).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import git

from optimizer.workspace.gitops import REJECTED_PREFIX
from optimizer.workspace.workspace import JUDGELOOP_ACTOR, repo_at

_ACTOR_ENV = {
    f"GIT_{who}_{part}": value
    for who in ("AUTHOR", "COMMITTER")
    for part, value in (("NAME", JUDGELOOP_ACTOR.name), ("EMAIL", JUDGELOOP_ACTOR.email))
}


@dataclass(frozen=True)
class Merged:
    """The pooled candidates merged onto the incumbent: the files that differ from the incumbent (path →
    merged text, None: deleted), the candidates carried, and those left out with why."""

    files: dict[str, str | None]
    carried: list[int]
    left_out: dict[int, str] = field(default_factory=dict)


def _merge_tree(repo: git.Repo, ours: str, theirs: str) -> tuple[str | None, list[str]]:
    """git's three-way merge of two commits: (the merged tree's oid, []) when clean, else (None, the
    conflicting paths)."""
    status, out, err = repo.git.merge_tree(
        "--write-tree",
        "--name-only",
        "--no-messages",
        ours,
        theirs,
        with_extended_output=True,
        with_exceptions=False,
    )
    lines = out.splitlines()
    if status == 0 and lines:
        return lines[0].strip(), []
    if status == 1:
        return None, sorted({line.strip() for line in lines[1:] if line.strip()})
    raise RuntimeError(f"git merge-tree failed ({status}): {err.strip() or out.strip()}")


def merge_pooled(root: Path, incumbent_sha: str, experiment_ids: Sequence[int]) -> Merged:
    """Merge the rejected commits of ``experiment_ids`` onto ``incumbent_sha`` (module docstring)."""
    carried: list[int] = []
    left_out: dict[int, str] = {}
    with repo_at(root) as repo:
        incumbent = repo.commit(incumbent_sha)
        ours = incumbent
        for exp_id in experiment_ids:
            ref = f"{REJECTED_PREFIX}{exp_id}"
            try:
                theirs = repo.commit(ref)
            except (git.BadName, ValueError):
                left_out[exp_id] = f"{ref} is gone"
                continue
            if [p.hexsha for p in theirs.parents] != [incumbent.hexsha]:
                left_out[exp_id] = "it was not proposed on this incumbent"
                continue
            tree, conflicts = _merge_tree(repo, ours.hexsha, theirs.hexsha)
            if tree is None:
                left_out[exp_id] = (
                    "its edit conflicts with "
                    + (f"experiment(s) {', '.join(str(c) for c in carried)}" if carried else "the incumbent")
                    + (f" in {', '.join(conflicts)}" if conflicts else "")
                )
                continue
            # The merge so far as a commit with both parents, so the next merge's base is the incumbent.
            sha = repo.git.commit_tree(
                tree,
                "-p",
                ours.hexsha,
                "-p",
                theirs.hexsha,
                "-m",
                f"judgeloop: pooled candidates merged so far (+{exp_id})",
                env=_ACTOR_ENV,
            )
            ours = repo.commit(sha.strip())
            carried.append(exp_id)
        files: dict[str, str | None] = {}
        for diff in incumbent.diff(ours):
            for path in {diff.a_path, diff.b_path} - {None}:
                assert path is not None
                try:
                    blob = ours.tree / path
                except KeyError:
                    files[path] = None
                    continue
                files[path] = blob.data_stream.read().decode("utf-8")
    return Merged(files, carried, left_out)
