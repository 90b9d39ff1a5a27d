"""`optimizer.workspace.storage`: which storage faults become one line, and that everything else stays a bug."""

from __future__ import annotations

import errno
import sqlite3
from pathlib import Path

import pytest

from optimizer.workspace import storage


def _sqlite_error(code: int, text: str) -> sqlite3.Error:
    exc = sqlite3.OperationalError(text)
    exc.sqlite_errorcode = code
    return exc


def test_only_the_fixable_errnos_are_mapped() -> None:
    for code, words in (
        (errno.ENOSPC, "no space left"),
        (errno.EDQUOT, "no space left"),
        (errno.EROFS, "read-only file system"),
        (errno.EACCES, "permission denied"),
    ):
        fault = storage.os_fault(OSError(code, "x", "/w/experiments/f"))
        assert fault is not None and words in str(fault) and "/w/experiments/f" in str(fault)
    # Written without a file name (a failed write() or flush): the caller's place is named instead.
    assert "/w" in str(storage.os_fault(OSError(errno.ENOSPC, "No space left on device"), "/w"))
    for code in (errno.ENOENT, errno.EISDIR, errno.EBADF, errno.EIO):
        assert storage.os_fault(OSError(code, "x", "/f")) is None


def test_sqlite_faults_are_mapped_by_result_code(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "db.sqlite"
    path.write_bytes(b"")

    def fault(code: int) -> str | None:
        found = storage.sqlite_fault(_sqlite_error(code, "boom"), path, "the db", "move it aside")
        return None if found is None else str(found)

    assert "is corrupt (boom); move it aside" in (fault(sqlite3.SQLITE_CORRUPT) or "")
    assert "no SQLite file" in (fault(sqlite3.SQLITE_NOTADB) or "")
    assert "no space left" in (fault(sqlite3.SQLITE_FULL) or "")
    # A folder that is writable, with room: an I/O error or a refusal to open is not explained, so it stays a bug.
    assert fault(sqlite3.SQLITE_IOERR) is None and fault(sqlite3.SQLITE_CANTOPEN) is None
    assert fault(sqlite3.SQLITE_ERROR) is None and fault(sqlite3.SQLITE_BUSY) is None
    # The same refusal in a folder this user may not write (root passes os.access: it is patched here).
    monkeypatch.setattr(storage.os, "access", lambda p, mode: False)
    assert f"permission denied for {path}" in (fault(sqlite3.SQLITE_CANTOPEN) or "")
