"""A person's file recorded in git under a side ref, and a lock beside it: the record of every legitimate
write of ``devset/<split>/corrections.jsonl`` (`optimizer.devset.corrections`).

`record_file` stores the bytes written as a commit under ``refs/judgeloop/corrections/<split>`` (one file
in its tree, each write's commit on the previous one: the history of a person's corrections, never on a
branch, so no run's reset or rollback moves it). `recorded_file` reads the bytes last recorded: a file
that differs from them was changed by something other than the writers that record (an agent with file
access, a hand edit). Plumbing only (``git hash-object``, ``mktree``, ``commit-tree``, ``update-ref``):
the working tree, the index and HEAD are never touched, so a write in the middle of a run moves nothing
of the run's.

`exclusive_lock` is an ``flock`` on a lock file beside the file: the kernel releases it when the process
ends, however it ends, and the lock file is removed by the holder, so no stale file is left in the split.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from optimizer.errors import UserError
from optimizer.workspace.workspace import JUDGELOOP_ACTOR

RECORD_PREFIX = "refs/judgeloop/corrections/"
# A lock file replaced between open and flock (its holder removes it) is opened again; this many times
# at most, far more than writers ever queue on one file.
_LOCK_ATTEMPTS = 10_000


def record_ref(split_name: str) -> str:
    """The side ref recording a split's corrections."""
    return RECORD_PREFIX + split_name


def _git(root: Path, *args: str, data: bytes | None = None, env: dict[str, str] | None = None) -> bytes:
    """Run one git plumbing command in ``root``; its stdout. A failure is a `UserError` naming the command."""
    try:
        proc = subprocess.run(
            ["git", "-C", str(root), *args],
            input=data,
            capture_output=True,
            check=False,
            env=None if env is None else os.environ | env,
        )
    except OSError as exc:
        raise UserError(f"cannot run git ({exc.strerror}); judgeloop needs git on the PATH") from None
    if proc.returncode != 0:
        detail = proc.stderr.decode("utf-8", "replace").strip().splitlines()
        raise UserError(
            f"git {args[0]} failed in {root} ({detail[-1] if detail else f'exit {proc.returncode}'}); "
            "check the workspace's git repository"
        )
    return proc.stdout


def recorded_file(root: Path, ref: str, name: str) -> bytes | None:
    """The bytes of ``name`` as last recorded under ``ref`` in the repository at ``root``; None when
    nothing is recorded (no ref, or one that does not hold ``name``)."""
    proc = subprocess.run(
        ["git", "-C", str(root), "cat-file", "blob", f"{ref}:{name}"], capture_output=True, check=False
    )
    return proc.stdout if proc.returncode == 0 else None


def record_file(root: Path, ref: str, name: str, data: bytes, message: str, by: str | None = None) -> str:
    """Record ``data`` as file ``name`` in a new commit under ``ref`` (on the one there, if any); its sha.
    Call under the file's lock: the ref moves only from the commit read here (``update-ref`` checks)."""
    previous = (
        subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}"],
            capture_output=True,
            check=False,
        )
        .stdout.decode()
        .strip()
    )
    blob = _git(root, "hash-object", "-w", "--stdin", data=data).decode().strip()
    tree = _git(root, "mktree", data=f"100644 blob {blob}\t{name}\n".encode()).decode().strip()
    who = {
        "GIT_AUTHOR_NAME": by or str(JUDGELOOP_ACTOR.name),
        "GIT_AUTHOR_EMAIL": str(JUDGELOOP_ACTOR.email),
        "GIT_COMMITTER_NAME": str(JUDGELOOP_ACTOR.name),
        "GIT_COMMITTER_EMAIL": str(JUDGELOOP_ACTOR.email),
    }
    parents = ["-p", previous] if previous else []
    commit = _git(root, "commit-tree", tree, *parents, "-m", message, env=who).decode().strip()
    _git(root, "update-ref", "-m", "judgeloop: record corrections", ref, commit, previous)
    return commit


@contextmanager
def exclusive_lock(path: Path) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``path`` (created if missing) for the block, then remove it.

    Blocks until the lock is free. The holder removes the file before releasing it, so a waiter may lock
    a file no longer at ``path``: it checks that the file it locked is the one there, else opens again.
    """
    for _ in range(_LOCK_ATTEMPTS):
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise UserError(
                f"cannot create the lock file {path} ({exc.strerror}); check the folder is writable"
            ) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                here = os.stat(path)
            except FileNotFoundError:
                continue  # its holder removed it: open the next one
            mine = os.fstat(fd)
            if (here.st_dev, here.st_ino) != (mine.st_dev, mine.st_ino):
                continue
            try:
                yield
            finally:
                os.unlink(path)  # while still holding it: a waiter on this file opens the next one
            return
        finally:
            os.close(fd)
    raise UserError(
        f"could not lock {path} after {_LOCK_ATTEMPTS:,} attempts; another writer keeps replacing it"
    )
