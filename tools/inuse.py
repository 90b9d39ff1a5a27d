"""Whether a folder is in use: a live loop lock (`optimizer.workspace.workspace.lock_holder`) or a process whose
working folder or open files lie inside it (Linux ``/proc``). Deleting a folder a TUI still has open
leaves that TUI showing a ledger that no longer exists, and still offering to act on it."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from optimizer.errors import UserError
from optimizer.workspace.workspace import CONFIG_NAME, Workspace, lock_holder


@dataclass(frozen=True)
class Holder:
    """A process using a folder: its pid, its command name and how (its working folder, or an open file)."""

    pid: int
    command: str
    how: str

    def describe(self) -> str:
        return f"process {self.pid} ({self.command}) {self.how}"


def _inside(target: str, folder: str) -> bool:
    return target == folder or target.startswith(folder.rstrip("/") + "/")


def _command(proc: Path) -> str:
    try:
        args = (proc / "cmdline").read_bytes().split(b"\0")
        text = " ".join(a.decode(errors="replace") for a in args if a)
    except OSError:
        text = ""
    if not text:
        try:
            text = (proc / "comm").read_text(encoding="utf-8", errors="replace").strip()
        except OSError:
            text = "?"
    return text if len(text) <= 80 else text[:77] + "..."


def holders(
    folder: Path, *, proc_root: Path = Path("/proc"), ignore_pids: frozenset[int] = frozenset()
) -> list[Holder]:
    """Every process (but this one and ``ignore_pids``) whose working folder, root or an open file
    descriptor lies inside ``folder``, by pid. Processes this user may not inspect are skipped; an
    empty list where ``/proc`` does not exist."""
    real = os.path.realpath(folder)
    skip = ignore_pids | {os.getpid()}
    found: list[Holder] = []
    try:
        entries = sorted((int(e.name), e) for e in os.scandir(proc_root) if e.name.isdigit())
    except OSError:
        return []
    for pid, entry in entries:
        if pid in skip:
            continue
        proc = Path(entry.path)
        how = None
        for link, what in (("cwd", "has its working folder in it"), ("root", "has its root in it")):
            try:
                if _inside(os.readlink(proc / link), real):
                    how = what
                    break
            except OSError:
                continue
        if how is None:
            try:
                fds = os.scandir(proc / "fd")
            except OSError:
                fds = None
            if fds is not None:
                with fds:
                    for fd in fds:
                        try:
                            target = os.readlink(fd.path)
                        except OSError:
                            continue
                        if _inside(target, real):
                            how = f"has {target} open"
                            break
        if how is not None:
            found.append(Holder(pid=pid, command=_command(proc), how=how))
    return found


def ensure_unused(folder: Path, *, what: str, ignore_pids: frozenset[int] = frozenset()) -> None:
    """Refuse (one `UserError` line naming the process and what to do) when ``folder`` is in use:
    a judgeloop command holds its loop lock, or a process works in it or has a file in it open.
    ``what`` names the action refused, e.g. "delete the previous demo"."""
    try:
        holder = lock_holder(Workspace.open(folder)) if (folder / CONFIG_NAME).is_file() else None
    except UserError:  # not a readable workspace: the open-file scan below still sees a run's lock file
        holder = None
    if holder is not None:
        raise UserError(
            f"cannot {what} {folder}: {holder} is working in it; wait for it to end, "
            "or stop it with `touch experiments/STOP`, then retry"
        )
    found = holders(folder, ignore_pids=ignore_pids)
    if found:
        more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
        raise UserError(
            f"cannot {what} {folder}: {found[0].describe()}{more}; close it (or cd out of the "
            f"folder), or pass another folder, then retry"
        )
