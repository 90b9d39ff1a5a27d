"""The protected places of a judgeloop workspace, and whether a path, a glob or a searched folder reaches them.

A path is checked twice: as written (``..`` folded, for a protected folder that is itself a link) and with
every symbolic link resolved (for a link elsewhere that points in). Any workspace the path lies in counts,
not only the one the hook was started for: a path outside the current workspace can resolve into another.
"""

from __future__ import annotations

import glob
import itertools
import os
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path

from optimizer.workspace.paths import CONFIG_NAME, CORRECTIONS_FILE, DEVSET_DIR, EXPERIMENTS_DIR

GIT_DIR = ".git"
# The workspace's folders no tool of the agent's host may reach, each with what it holds.
PROTECTED = {
    DEVSET_DIR: "the workspace's data: every split's labels and the held-out splits",
    EXPERIMENTS_DIR: "the ledger and the runs' files",
    GIT_DIR: "git's objects, where devset/ is committed too",
}
CORRECTIONS_WHY = "a person's label corrections"
# What the agent may use instead, by the place it reached.
INSTEAD = {
    DEVSET_DIR: "read dev items through the judgeloop MCP tools (disagreements, read_item, read_steps)",
    EXPERIMENTS_DIR: "use the judgeloop MCP tools status, history and report",
    GIT_DIR: "use the judgeloop MCP tool history for past candidates' diffs",
    CORRECTIONS_FILE: "only a person corrects labels (judgeloop label-fix)",
}
GLOB_CHARS = re.compile(r"[*?\[]")
# A glob is also expanded on disk (a link named by a pattern), up to this many matches.
MAX_GLOB_MATCHES = 2000
# Brace expansion ({a,b}) is followed up to this many alternatives.
MAX_BRACE_ALTERNATIVES = 64


@dataclass(frozen=True)
class Reach:
    """A protected place a path reaches: its kind (a key of `PROTECTED`, or ``corrections.jsonl``) and the
    folder or file itself."""

    kind: str
    place: Path

    def why(self) -> str:
        """What the place holds and what to use instead, one clause each."""
        what = CORRECTIONS_WHY if self.kind == CORRECTIONS_FILE else PROTECTED[self.kind]
        return f"{self.place} ({what}); {INSTEAD[self.kind]}"


@dataclass(frozen=True)
class _Root:
    kind: str
    path: Path


def has_glob(text: str) -> bool:
    """Whether ``text`` holds a glob character a shell or a Glob tool would expand (``*``, ``?``, ``[``)."""
    return bool(GLOB_CHARS.search(text))


def expand_braces(text: str) -> list[str]:
    """``text`` with each ``{a,b}`` expanded as bash does (``{dev,}set`` → ``devset``, ``set``), at most
    `MAX_BRACE_ALTERNATIVES` results; a brace without a comma stays as it is."""
    results: list[str] = []
    pending = [text]
    while pending and len(results) < MAX_BRACE_ALTERNATIVES:
        current = pending.pop()
        alternatives = _first_brace(current)
        if alternatives is None:
            results.append(current)
        else:
            pending.extend(reversed(alternatives))
    return results


def _first_brace(text: str) -> list[str] | None:
    """The alternatives of the first ``{...,...}`` group in ``text``, or None when it has none."""
    for start, char in enumerate(text):
        if char != "{":
            continue
        depth, commas = 0, list[int]()
        for end in range(start, len(text)):
            if text[end] == "{":
                depth += 1
            elif text[end] == "}":
                depth -= 1
                if depth == 0:
                    if not commas:
                        break
                    cuts = [start, *commas, end]
                    head, tail = text[:start], text[end + 1 :]
                    return [head + text[a + 1 : b] + tail for a, b in itertools.pairwise(cuts)]
            elif text[end] == "," and depth == 1:
                commas.append(end)
    return None


def workspace_of(start: Path) -> Path | None:
    """The nearest folder at or above ``start`` holding ``judgeloop.toml`` (as written, not resolved)."""
    start = Path(os.path.abspath(start))
    return next((f for f in (start, *start.parents) if (f / CONFIG_NAME).is_file()), None)


def _git_dirs(workspace: Path) -> Iterator[Path]:
    """The git folders holding the workspace's history: the nearest ``.git`` at or above it and, for a
    worktree's ``.git`` file, the folders it names (its own and the repository's common one)."""
    for folder in (workspace, *workspace.parents):
        dot_git = folder / GIT_DIR
        if dot_git.is_dir():
            yield dot_git
            return
        if dot_git.is_file():
            yield dot_git
            text = dot_git.read_text(encoding="utf-8", errors="replace").strip()
            if text.startswith("gitdir:"):
                own = (folder / text.removeprefix("gitdir:").strip()).resolve()
                yield own
                common = own / "commondir"
                if common.is_file():
                    yield (own / common.read_text(encoding="utf-8").strip()).resolve()
            return


class Fence:
    """The protected places of the workspace at ``workspace`` (None: the hook runs outside any workspace,
    and only workspaces a path itself lies in are protected)."""

    def __init__(self, workspace: Path | None) -> None:
        self.workspace = Path(os.path.abspath(workspace)) if workspace is not None else None
        self.roots: tuple[_Root, ...] = tuple(self._roots())
        self._seen: dict[Path, Reach | None] = {}
        # The roots by inode too: a name that differs only in case on a case-insensitive disk, or a bind mount,
        # is the same folder.
        self.inodes: dict[tuple[int, int], _Root] = {}
        for root in self.roots:
            try:
                info = root.path.stat()
            except OSError:
                continue
            self.inodes.setdefault((info.st_dev, info.st_ino), root)

    def _roots(self) -> Iterator[_Root]:
        if self.workspace is None:
            return
        places = [_Root(kind, self.workspace / kind) for kind in PROTECTED]
        places += [_Root(GIT_DIR, g) for g in _git_dirs(self.workspace)]
        seen: set[Path] = set()
        for root in places:
            # A protected folder that is a link is protected under both names.
            for path in (root.path, Path(os.path.realpath(root.path))):
                if path not in seen:
                    seen.add(path)
                    yield _Root(root.kind, path)

    # -- one path -------------------------------------------------------------------------------------------

    def path_reach(self, text: str, bases: Sequence[Path]) -> Reach | None:
        """The protected place the path ``text`` reaches, read from each folder of ``bases`` (a relative path)
        or as it is (an absolute one, ``~`` and ``$VARS`` expanded); a glob is matched as a pattern."""
        expanded = os.path.expanduser(os.path.expandvars(text))
        if has_glob(expanded) or "{" in expanded:
            return self.glob_reach(expanded, bases)
        return self._plain_reach(expanded, bases)

    def _plain_reach(self, expanded: str, bases: Sequence[Path]) -> Reach | None:
        """`path_reach` of a path that is no pattern (its characters taken as they are)."""
        for base in bases:
            joined = os.path.join(base, expanded)
            for path in (Path(os.path.normpath(joined)), Path(os.path.realpath(joined))):
                reach = self._inside(path)
                if reach is not None:
                    return reach
        return None

    def _inside(self, path: Path) -> Reach | None:
        """The protected place an absolute path lies in: the workspace's, or another workspace's that the
        path's own folders hold (remembered: a long command names the same folders many times)."""
        if path not in self._seen:
            self._seen[path] = self._lookup(path)
        return self._seen[path]

    def _lookup(self, path: Path) -> Reach | None:
        for root in self.roots:
            if path == root.path or root.path in path.parents:
                return Reach(root.kind, root.path)
        for folder in (path, *path.parents):
            try:
                info = folder.stat()
            except OSError:
                continue
            same = self.inodes.get((info.st_dev, info.st_ino))
            if same is not None:
                return Reach(same.kind, same.path)
        if CORRECTIONS_FILE in path.parts:
            index = path.parts.index(CORRECTIONS_FILE)
            return Reach(CORRECTIONS_FILE, Path(*path.parts[: index + 1]))
        for folder in path.parents:
            if (folder / CONFIG_NAME).is_file():
                rel = path.relative_to(folder).parts
                if rel and rel[0] in PROTECTED:
                    return Reach(rel[0], folder / rel[0])
        return None

    # -- a glob ---------------------------------------------------------------------------------------------

    def glob_reach(self, pattern: str, bases: Sequence[Path]) -> Reach | None:
        """The protected place a glob pattern can match (inside or as a whole), by pattern and by what it
        matches on disk now (links included)."""
        for alternative in expand_braces(pattern):
            for base in bases:
                absolute = os.path.normpath(os.path.join(base, alternative))
                parts = Path(absolute).parts
                for root in self.roots:
                    if _may_match_under(parts, root.path.parts):
                        return Reach(root.kind, root.path)
                if not has_glob(absolute):
                    reach = self._plain_reach(absolute, [base])
                    if reach is not None:
                        return reach
                    continue
                for match in itertools.islice(glob.iglob(absolute, recursive=True), MAX_GLOB_MATCHES):
                    reach = self._plain_reach(match, [base])
                    if reach is not None:
                        return reach
        return None

    # -- a folder searched as a whole -----------------------------------------------------------------------

    def tree_reach(self, text: str, bases: Sequence[Path]) -> Reach | None:
        """The protected place a recursive search or copy of the folder ``text`` would enter: the folder
        itself lies in one, or holds one below it."""
        expanded = os.path.expanduser(os.path.expandvars(text))
        if has_glob(expanded) or "{" in expanded:
            return self.glob_reach(expanded, bases) or self._glob_holds(expanded, bases)
        reach = self._plain_reach(expanded, bases)
        if reach is not None:
            return reach
        for base in bases:
            joined = os.path.join(base, expanded)
            for folder in (Path(os.path.normpath(joined)), Path(os.path.realpath(joined))):
                for root in self.roots:
                    if folder in root.path.parents:
                        return Reach(root.kind, root.path)
                if (folder / CONFIG_NAME).is_file() or any(
                    (f / CONFIG_NAME).is_file() for f in _children(folder)
                ):
                    return Reach(DEVSET_DIR, folder)
        return None

    def _glob_holds(self, pattern: str, bases: Sequence[Path]) -> Reach | None:
        """A protected place below a folder the pattern matches (``grep -r x *`` from above the workspace)."""
        for alternative in expand_braces(pattern):
            for base in bases:
                absolute = os.path.normpath(os.path.join(base, alternative))
                for match in itertools.islice(glob.iglob(absolute), MAX_GLOB_MATCHES):
                    for root in self.roots:
                        if Path(match) in root.path.parents:
                            return Reach(root.kind, root.path)
        return None


def _children(folder: Path) -> Iterable[Path]:
    """The folders directly in ``folder`` (none when it cannot be listed): a workspace one level down."""
    try:
        return [child for child in folder.iterdir() if child.is_dir()]
    except OSError:
        return []


def _may_match_under(pattern: Sequence[str], root: Sequence[str]) -> bool:
    """Whether some path at or below ``root`` can match the glob ``pattern`` (both as path parts): each part
    of the pattern matches the root's part at its place until the root is used up, or a ``**`` reaches
    anything below."""
    for index, part in enumerate(pattern):
        if part == "**":
            return True
        if index == len(root):
            return True
        if not fnmatchcase(root[index], part):
            return False
    return len(pattern) >= len(root)
