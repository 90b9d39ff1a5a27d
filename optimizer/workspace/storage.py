"""Storage faults a user can fix, as one-line `UserError`s: a full disk, a read-only or unwritable
folder, a corrupt SQLite file.

Only these are mapped — the errnos ENOSPC/EDQUOT, EROFS, EACCES/EPERM and the SQLite result codes
that mean them — at the seams that write (the ledger, the judge-call cache, the command line's last
line of defence). Any other `OSError` or `sqlite3` error is a bug and keeps its traceback.
"""

from __future__ import annotations

import errno
import os
import sqlite3
from pathlib import Path

from optimizer.errors import UserError

_FULL = {errno.ENOSPC, errno.EDQUOT}
_READ_ONLY = {errno.EROFS}
_DENIED = {errno.EACCES, errno.EPERM}
# Below this much free space a SQLite "disk I/O error" or "unable to open" is the disk being full
# (SQLite needs room for its -wal and -shm files beside the database, even to read it).
_NEARLY_FULL_BYTES = 1 << 20

AGAIN = "run the command again (what was already written is intact)"


def full_disk(where: Path | str) -> UserError:
    return UserError(f"no space left on the disk holding {where}; free some space and {AGAIN}")


def read_only(where: Path | str) -> UserError:
    return UserError(
        f"{where} is on a read-only file system; make it writable (or work on a writable copy "
        f"of the workspace) and {AGAIN}"
    )


def denied(where: Path | str) -> UserError:
    return UserError(
        f"permission denied for {where}; give this user read and write access to it and its "
        f"folder, then {AGAIN}"
    )


def os_fault(exc: OSError, where: Path | str | None = None) -> UserError | None:
    """The one-line error for a full disk, a read-only file system or a permission refusal, naming
    the file (``exc.filename``, else ``where``); None for any other `OSError`."""
    place = exc.filename if exc.filename else where
    if place is None:
        place = "the workspace"
    if exc.errno in _FULL:
        return full_disk(place)
    if exc.errno in _READ_ONLY:
        return read_only(place)
    if exc.errno in _DENIED:
        return denied(place)
    return None


def _folder_fault(path: Path) -> UserError | None:
    """Why SQLite could not open or write ``path``, found from its folder: read-only, not writable
    for this user, or (nearly) full; None when none of these holds."""
    folder = path.parent
    try:
        stats = os.statvfs(folder)
    except OSError:
        return None
    if stats.f_flag & os.ST_RDONLY:
        return read_only(folder)
    if not os.access(folder, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        return denied(path)
    if stats.f_bavail * stats.f_frsize < _NEARLY_FULL_BYTES:
        return full_disk(folder)
    return None


def sqlite_fault(exc: sqlite3.Error, path: Path, what: str, corrupt_advice: str) -> UserError | None:
    """The one-line error for a SQLite failure at ``path`` that the user can fix: the file is corrupt
    or not a database (``corrupt_advice`` says what to do; judgeloop never deletes it), the disk is
    full, or its folder is read-only or not writable. None for anything else."""
    code = getattr(exc, "sqlite_errorcode", None)
    primary = code & 0xFF if isinstance(code, int) else None
    if primary == sqlite3.SQLITE_CORRUPT:
        return UserError(f"{what} {path} is corrupt ({exc}); {corrupt_advice}")
    if primary == sqlite3.SQLITE_NOTADB:
        return UserError(f"{what} {path} is corrupt or no SQLite file at all ({exc}); {corrupt_advice}")
    if primary == sqlite3.SQLITE_FULL:
        return full_disk(path)
    if primary in (
        sqlite3.SQLITE_READONLY,
        sqlite3.SQLITE_CANTOPEN,
        sqlite3.SQLITE_IOERR,
        sqlite3.SQLITE_PERM,
    ):
        return _folder_fault(path)
    return None
