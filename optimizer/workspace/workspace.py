"""A workspace: a git repository holding judgeloop.toml, prompts/, devset/ and experiments/.

Git is driven through GitPython with one short-lived ``Repo`` per operation (``repo_at``), closed
after use: GitPython keeps helper processes alive per Repo and is not thread-safe.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import git

from optimizer.errors import UserError
from optimizer.workspace.config import Config, load_config
from optimizer.workspace.paths import CONFIG_NAME as CONFIG_NAME  # spelled in optimizer.workspace.paths
from optimizer.workspace.paths import LOCK_FILE as LOCK_FILE  # spelled in optimizer.workspace.paths
from optimizer.workspace.paths import WorkspacePaths

JUDGELOOP_ACTOR = git.Actor("judgeloop", "judgeloop@localhost")


def find_root(start: Path) -> Path:
    """The nearest folder at or above ``start`` holding ``judgeloop.toml``, as git finds its repository
    (so a command run in ``ws/prompts/`` works on ``ws``); none is a `UserError` in one line."""
    start = start.resolve()
    for folder in (start, *start.parents):
        if (folder / CONFIG_NAME).is_file():
            return folder
    raise UserError(
        f"no judgeloop workspace here: neither {start} nor any folder above it holds {CONFIG_NAME}; "
        "create one with `judgeloop init DIR`, or pass -w DIR"
    )


@dataclass(frozen=True)
class Workspace:
    root: Path
    config: Config

    @classmethod
    def open(cls, path: Path | str | None = None) -> Workspace:
        """Open the workspace at ``path``, exactly; with None, the one found from the current folder
        (`find_root`). A folder without ``judgeloop.toml`` is refused in one line."""
        if path is None:
            try:
                here = Path.cwd()
            except FileNotFoundError:  # the shell's folder was deleted under it
                raise UserError(
                    "the current folder no longer exists; cd into a workspace or pass -w DIR"
                ) from None
            root = find_root(here)
        else:
            root = Path(path).resolve()
        if not (root / CONFIG_NAME).is_file():
            # -w means exactly that folder; the workspace above it is named, never used unasked.
            above = next((f for f in root.parents if (f / CONFIG_NAME).is_file()), None)
            hint = (
                f"it is inside the workspace {above}: pass -w {above}, or leave -w out to find it"
                if above
                else "run `judgeloop init DIR` or pass -w/--workspace DIR"
            )
            raise UserError(f"{root} is not a judgeloop workspace (no {CONFIG_NAME}); {hint}")
        if not (root / ".git").exists():
            raise UserError(f"{root} has {CONFIG_NAME} but is not a git repository; run `git init` there")
        return cls(root=root, config=load_config(root / CONFIG_NAME))

    @property
    def paths(self) -> WorkspacePaths:
        """Where this workspace keeps its files (`optimizer.workspace.paths.WorkspacePaths`)."""
        return WorkspacePaths(self.root)

    @property
    def prompts_dir(self) -> Path:
        return self.paths.prompts

    @property
    def devset_dir(self) -> Path:
        return self.paths.devset

    @property
    def experiments_dir(self) -> Path:
        return self.paths.experiments

    @property
    def ledger_path(self) -> Path:
        return self.paths.ledger

    @property
    def cache_path(self) -> Path:
        return self.paths.cache

    @property
    def guidance_path(self) -> Path:
        return self.paths.guidance

    @property
    def stop_path(self) -> Path:
        return self.paths.stop

    def split_dir(self, name: str) -> Path:
        return self.paths.split(name)


@contextmanager
def repo_at(root: Path) -> Iterator[git.Repo]:
    """A GitPython Repo for one operation, always closed (it leaks processes otherwise)."""
    repo = git.Repo(root)
    try:
        yield repo
    finally:
        repo.close()


def lock_holder(ws: Workspace) -> str | None:
    """Who holds the workspace's loop lock right now (e.g. "judgeloop run, pid 123"), or None."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover
        return None
    path = ws.paths.lock
    if not path.is_file():
        return None
    with path.open("r", encoding="utf-8") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return handle.read().strip() or "another process"
        return None  # closing the file drops the shared lock at once


@contextmanager
def command_lock(ws: Workspace, what: str) -> Iterator[None]:
    """Hold the workspace's loop lock while ``what`` (``run``, ``decide``, ``confirm``) works.

    Those commands move the git branch and write the ledger; two of them at once in one workspace
    (a second ``run --resume`` while the overnight run goes on, a ``decide`` in the middle of a
    candidate) would corrupt both. The lock is an ``flock`` on ``experiments/loop.lock``: the kernel
    releases it when the process ends, however it ends, so a ``kill -9`` never leaves it stale.
    Where ``fcntl`` does not exist (Windows) it is not taken.
    """
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not on the platforms judgeloop is tested on
        yield
        return
    import os

    path = ws.paths.lock
    path.parent.mkdir(parents=True, exist_ok=True)
    handle = path.open("a+", encoding="utf-8")
    try:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "another process"
            raise UserError(
                f"another judgeloop command is working in this workspace ({holder}); wait for it, or stop a run "
                "with `touch experiments/STOP` (s in the TUI), then retry"
            ) from None
        handle.seek(0)
        handle.truncate()
        handle.write(f"judgeloop {what}, pid {os.getpid()}\n")
        handle.flush()
        yield
    finally:
        handle.close()  # closing the descriptor releases the lock
