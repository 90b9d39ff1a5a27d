"""Ids and paths that come from data files: the one rule for each, used wherever one becomes a path.

An id (a trajectory id, a recording id) names files and folders of a split, so it is letters,
digits, ``.``, ``_`` and ``-``, not starting with ``.``, 1 to 128 characters (`check_id`).
A path a data file names (a screenshot link, an item's file) is resolved with symlinks followed and
must lie inside the folder it belongs to (`inside`): an absolute link, a ``..`` step or a symlink
out of the folder is refused. Judge-input side: this module reads no labels.
"""

from __future__ import annotations

import functools
import os
import re
import stat
from pathlib import Path, PurePosixPath

from optimizer.errors import UserError

MAX_ID_LENGTH = 128
SAFE_ID = re.compile(rf"[A-Za-z0-9_-][A-Za-z0-9._-]{{0,{MAX_ID_LENGTH - 1}}}")
ID_RULE = f"1-{MAX_ID_LENGTH} letters, digits, '.', '_' or '-', not starting with '.'"


def shown(value: object, limit: int = 240) -> str:
    """``repr(value)`` cut to ``limit`` characters: one line, whatever a data file holds."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def is_safe_id(value: object) -> bool:
    return isinstance(value, str) and SAFE_ID.fullmatch(value) is not None


def check_id(value: object, what: str, where: str, fix: str) -> str:
    """``value`` when it is a safe id; otherwise UserError ``"<where>: <what> <value> is not a safe id ...; <fix>"``."""
    if isinstance(value, str) and SAFE_ID.fullmatch(value):
        return value
    raise UserError(f"{where}: {what} {shown(value)} is not a safe id ({ID_RULE}); {fix}")


class OutsideError(UserError):
    """A path named by a data file that leads outside the folder it must stay in."""


def is_remote(link: str) -> bool:
    """A URL or a data: link: never a file judgeloop reads."""
    return "://" in link or link.startswith("data:")


def relative_link(link: str) -> PurePosixPath:
    """``link`` as a clean relative path (``\\`` read as ``/``, ``.`` steps dropped); OutsideError when
    it is empty, absolute, a URL, has a drive or a ``..`` step. Lexical only: `inside` resolves."""
    path = PurePosixPath(link.replace("\\", "/"))
    parts = [part for part in path.parts if part != "."]
    if is_remote(link) or path.is_absolute() or not parts or ".." in parts or parts[0].endswith(":"):
        raise OutsideError(
            f"{shown(link)} leads outside its folder (only relative paths without '..' stay inside)"
        )
    return PurePosixPath(*parts)


def inside(base: Path, relative: str | PurePosixPath, *, also: Path | None = None) -> Path:
    """``base / relative`` resolved (symlinks followed); OutsideError unless it lies inside ``base``.

    ``relative`` must pass `relative_link`. ``also`` is one more folder the resolved file may lie in
    (the release a ``devset import --link`` symlinked the screenshots to).
    """
    rel = relative_link(str(relative))
    resolved = _resolve_below(_real_folder(str(base)), rel.parts)
    for root in (base, also):
        if root is not None and _within(resolved, _real_folder(str(root))):
            return Path(resolved)
    raise OutsideError(f"{shown(str(relative))} resolves to {resolved}, outside {base}")


def _resolve_below(real_base: str, parts: tuple[str, ...]) -> str:
    """``real_base`` joined with ``parts``, symlinks followed: each part below the (already real) base
    is checked with one ``lstat``, and only a path that holds a link is resolved in full. This runs for
    every screenshot of every judged item: ``os.path.realpath`` of the whole path cost 3x as much."""
    path = real_base
    for part in parts:
        path = os.path.join(path, part)
        try:
            if stat.S_ISLNK(os.lstat(path).st_mode):
                return os.path.realpath(os.path.join(real_base, *parts))
        except OSError:  # missing: nothing below it can be a link (the caller reports a missing file)
            break
    return os.path.join(real_base, *parts)


@functools.lru_cache(maxsize=64)
def _real_folder(folder: str) -> str:
    # Cached: a folder that later becomes a link elsewhere only makes more paths fall outside it.
    return os.path.realpath(folder)


def _within(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)
