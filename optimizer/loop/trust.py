"""The loop trusts only commits it made.

Before every candidate (`judgeloop run`, the MCP ``propose``, ``decide``, ``run --resume``) the run's branch
must be checked out and its tip must be the commit the ledger records for the incumbent (or a commit the
loop made and recorded: a candidate being evaluated or waiting). Anything else is refused in one line
naming the unexpected commits (short sha and subject), before any judge call; nothing is reset, so a
person's (or an agent's) commits are never destroyed. After a candidate is committed, the guards read the
whole incumbent → candidate diff from git's objects (`full_diff`), so a commit slipped under the candidate
between the tip check and the commit is judged too.

Pure reads of git; the callers decide what a refusal means (a `UserError`, an MCP tool error).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from optimizer.workspace import gitops

SHORT = 12  # characters of a sha shown to a person
NAMED = 5  # unexpected commits named in one line (the rest counted)


def commits_line(commits: list[tuple[str, str]]) -> str:
    """``abc123def456 "subject"; ...`` for up to `NAMED` commits, then how many more."""
    shown = "; ".join(f'{sha[:SHORT]} "{subject}"' for sha, subject in commits[:NAMED])
    return shown + (f" and {len(commits) - NAMED} more" if len(commits) > NAMED else "")


def tip_problem(root: Path, branch: str, incumbent_sha: str, also: Iterable[str] = ()) -> str | None:
    """Why the checked-out tree is not the run's as the ledger records it, or None when it is: ``branch``
    must be checked out and its tip ``incumbent_sha`` or one of ``also`` (commits the loop made and recorded).
    The answer names the unexpected commits (or the moved tip) in one clause."""
    current = gitops.current_branch(root)
    if current != branch:
        where = f"branch {current}" if current else "a detached HEAD"
        return f"{where} is checked out, not the run's branch {branch}"
    return branch_problem(root, branch, incumbent_sha, also)


def branch_problem(root: Path, branch: str, incumbent_sha: str, also: Iterable[str] = ()) -> str | None:
    """`tip_problem` for ``branch`` whether or not it is checked out: its tip must be ``incumbent_sha`` or
    one of ``also``."""
    tip = gitops.rev_parse(root, branch)
    trusted = set(also)
    if tip == incumbent_sha or tip in trusted:
        return None
    # The loop's own commits (a waiting candidate under the foreign ones) are not named as foreign.
    unexpected = [c for c in gitops.commits_between(root, incumbent_sha, tip) if c[0] not in trusted]
    if unexpected:
        return (
            f"{branch} has commits the loop did not make on top of its incumbent {incumbent_sha[:SHORT]}: "
            f"{commits_line(unexpected)}"
        )
    return (
        f"the tip of {branch} was moved by hand to {tip[:SHORT]} (the incumbent is {incumbent_sha[:SHORT]})"
    )


def last_trusted(root: Path, branch: str, incumbent_sha: str, also: Iterable[str] = ()) -> str:
    """The newest commit the loop made under ``branch``'s tip: one of ``also`` (say, a waiting candidate)
    that the tip descends from, else ``incumbent_sha``. What `advice` resets the branch to, so a person
    following it loses none of the loop's commits."""
    tip = gitops.rev_parse(root, branch)
    below = [sha for sha in also if sha and sha != incumbent_sha and gitops.is_ancestor(root, sha, tip)]
    for sha in below:  # the newest: every other one is its ancestor
        if all(other == sha or gitops.is_ancestor(root, other, sha) for other in below):
            return sha
    return incumbent_sha


def advice(branch: str, reset_to: str) -> str:
    """What a person does about `tip_problem`: keep their commits elsewhere, put the branch back at
    ``reset_to`` (the incumbent's commit, or `last_trusted`)."""
    return (
        f"the loop trusts only commits it made: keep yours on another branch (`git branch mine {branch}`), "
        f"then `git checkout {branch} && git reset --hard {reset_to[:SHORT]}`, and retry"
    )


def refusal(problem: str, branch: str, reset_to: str) -> str:
    """`tip_problem`'s one-line refusal: what is wrong, that nothing was judged, what to do (`advice`)."""
    return f"{problem}; nothing was judged or committed — {advice(branch, reset_to)}"


def full_diff(root: Path, incumbent_sha: str, candidate_sha: str) -> dict[str, tuple[str | None, str | None]]:
    """The whole incumbent → candidate change, read from git's objects: what the guards judge after the commit."""
    return gitops.tree_changes(root, incumbent_sha, candidate_sha)


def slipped_commits(root: Path, incumbent_sha: str, candidate_sha: str) -> list[tuple[str, str]]:
    """The commits between the incumbent and the candidate that the loop did not make (the candidate's
    ancestors after the incumbent); empty when the candidate's only parent is the incumbent."""
    if gitops.parents(root, candidate_sha) == [incumbent_sha]:
        return []
    return gitops.commits_between(root, incumbent_sha, candidate_sha)[1:]
