"""The one path rule for the files the loop may edit, and writes that never follow a link.

Every path a strategy, a tool, the guards, the runner or ``[optimizer] allowed_files`` names goes
through `prompt_file`: a workspace-relative POSIX path to a file inside ``prompts/``, returned in
one canonical spelling (``prompts/rubric.md``) or refused with the reason. The guards compare
canonical names and the runner writes to canonical names, so no spelling (``/prompts/…``,
``prompts/../judgeloop.toml``, ``prompts\\rubric.md``) can mean one thing to one of them and another
thing to the other.

On disk, `check_prompt_target` refuses a file under ``prompts/`` that is a symbolic link, has a
second hard link, or sits below a linked folder: reading it could show the optimiser (or send the
judge) another file, e.g. held-out labels, and writing it would overwrite that file.
`write_prompt_file` writes through a temporary file and ``os.replace``, so even a link that appears
between the check and the write is replaced, never followed.
"""

from __future__ import annotations

import os
import posixpath
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path

from optimizer.errors import UserError

PROMPTS_DIR = "prompts"
# The judge's settings (replicates, mode, panel, ...), one of the prompt files (`optimizer.judge.prompts`).
JUDGE_TOML = "prompts/judge.toml"
MAX_PATH_CHARS = 200
# An edited prompt file larger than this is refused (the bundled judge.md + rubric.md are ~9k
# characters): a candidate of tens of megabytes would be sent whole to the judge on every item.
MAX_PROMPT_FILE_CHARS = 60_000


class PathRefused(ValueError):
    """A path that is not a file inside ``prompts/``; the message says why."""


def prompt_file(path: object) -> str:
    """The canonical ``prompts/<name>`` spelling of ``path``, or `PathRefused` with the reason.

    Accepted: a relative POSIX path whose first part is ``prompts`` and which names a file below it
    (``prompts/judge.md``, ``./prompts/judge.md``, ``prompts//judge.md``). Refused: absolute paths,
    any ``..`` part, backslashes, control characters, empty names, paths outside ``prompts/``.
    """
    if not isinstance(path, str):
        raise PathRefused(f"{path!r} is not a path")
    if not path or len(path) > MAX_PATH_CHARS:
        raise PathRefused(f"{path[:60]!r} is not a path of 1 to {MAX_PATH_CHARS} characters")
    if any(ord(c) < 32 or ord(c) == 127 for c in path):
        raise PathRefused(f"{path!r} contains a control character")
    if "\\" in path:
        raise PathRefused(f"{path!r} uses a backslash; write workspace paths with '/'")
    if path.startswith("/"):
        raise PathRefused(
            f"{path!r} is absolute; name a file inside {PROMPTS_DIR}/ relative to the workspace"
        )
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise PathRefused(f"{path!r} contains '..'; name a file inside {PROMPTS_DIR}/ directly")
    canonical = posixpath.join(*parts) if parts else ""
    if len(parts) < 2 or parts[0] != PROMPTS_DIR:
        raise PathRefused(
            f"{path!r} is outside {PROMPTS_DIR}/; the loop may edit only files inside {PROMPTS_DIR}/"
        )
    if any(p.startswith(".") for p in parts[1:]):
        raise PathRefused(f"{path!r} names a hidden file; name a regular file inside {PROMPTS_DIR}/")
    return canonical


def prompt_file_or_none(path: object) -> str | None:
    """`prompt_file`, with None instead of an exception."""
    try:
        return prompt_file(path)
    except PathRefused:
        return None


def allowed_name(
    path: object, allowed: tuple[str, ...] | list[str] | frozenset[str] | set[str]
) -> str | None:
    """The canonical name of ``path`` when it is one of the ``allowed`` files, else None."""
    name = prompt_file_or_none(path)
    if name is None:
        return None
    return name if name in {prompt_file_or_none(a) for a in allowed} else None


def check_prompt_target(root: Path, name: str) -> Path:
    """The on-disk path of canonical prompt file ``name`` in workspace ``root``, checked to be safe to
    read and write: no part of it below the workspace is a symbolic link, the file (if it exists) is
    a regular file with one link, and the resolved path lies inside ``root/prompts``. `UserError`
    naming the file otherwise."""
    canonical = prompt_file(name)
    base = Path(root)
    current = base
    for part in canonical.split("/"):
        current = current / part
        try:
            info = os.lstat(current)
        except FileNotFoundError:
            break
        if stat.S_ISLNK(info.st_mode):
            raise UserError(
                f"{current.relative_to(base)} is a symbolic link (to {os.readlink(current)}); judgeloop never reads "
                f"or writes through links in {PROMPTS_DIR}/: replace it with a regular file and commit that"
            )
        if current != base / canonical and not stat.S_ISDIR(info.st_mode):
            raise UserError(
                f"{current.relative_to(base)} is not a folder; {canonical} cannot be a prompt file"
            )
    target = base / canonical
    try:
        found: os.stat_result | None = os.lstat(target)
    except FileNotFoundError:
        found = None
    if found is not None:
        if not stat.S_ISREG(found.st_mode):
            raise UserError(f"{canonical} is not a regular file; judgeloop edits regular files only")
        if found.st_nlink > 1:
            raise UserError(
                f"{canonical} has {found.st_nlink} hard links (another path shares its contents); judgeloop never "
                "writes a file that is also another file: copy it (`cp --remove-destination`) so it stands alone"
            )
    prompts_root = (base / PROMPTS_DIR).resolve()
    if not target.resolve().is_relative_to(prompts_root):
        raise UserError(
            f"{canonical} resolves outside {PROMPTS_DIR}/; judgeloop edits files inside {PROMPTS_DIR}/ only"
        )
    return target


def check_unlinked(path: Path, shown: str) -> None:
    """Refuse (`UserError` naming ``shown``) a prompt file that is a symbolic link or has a second hard link."""
    info = os.lstat(path)
    if stat.S_ISLNK(info.st_mode):
        raise UserError(
            f"{shown} is a symbolic link (to {os.readlink(path)}); judgeloop never reads or writes through "
            f"links in {PROMPTS_DIR}/: replace it with a regular file and commit that"
        )
    if stat.S_ISREG(info.st_mode) and info.st_nlink > 1:
        raise UserError(
            f"{shown} has a second hard link (another path shares its contents); judgeloop never writes a file "
            "that is also another file: copy it (`cp --remove-destination`) so it stands alone"
        )


def check_prompts_tree(root: Path) -> None:
    """Refuse (one `UserError`) a ``prompts/`` folder holding any link: a symbolic link anywhere in it
    (or ``prompts`` itself one) or a file with a second hard link."""
    base = Path(root)
    top = base / PROMPTS_DIR
    if top.is_symlink():
        raise UserError(f"{PROMPTS_DIR}/ is a symbolic link (to {os.readlink(top)}); make it a real folder")
    if not top.is_dir():
        return
    for folder, dirs, files in os.walk(top, followlinks=False):
        for entry in sorted([*dirs, *files]):
            path = Path(folder) / entry
            check_unlinked(path, path.relative_to(base).as_posix())


def read_prompt_file(root: Path, name: str) -> str | None:
    """The text of prompt file ``name`` (None when absent), read only after `check_prompt_target`."""
    target = check_prompt_target(root, name)
    if not target.is_file():
        return None
    try:
        return target.read_bytes().decode("utf-8")  # as written: no newline translation
    except UnicodeDecodeError:
        raise UserError(f"{name} is not UTF-8 text; fix the file") from None


def write_prompt_file(root: Path, name: str, text: str) -> None:
    """Write ``text`` to prompt file ``name``: checked (`check_prompt_target`), then a temporary file
    in the same folder renamed over it, so a link at the target is replaced, never followed."""
    target = check_prompt_target(root, name)
    target.parent.mkdir(parents=True, exist_ok=True)
    mode = stat.S_IMODE(os.lstat(target).st_mode) if target.exists() else 0o644
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as handle:
            handle.write(text)
        os.chmod(tmp, mode)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def unused_path(folder: Path, stem: str, suffix: str = ".json") -> Path:
    """``folder/<stem><suffix>``, or ``<stem>-2``, ``-3``… when that name is taken (two records
    written within the same second never overwrite each other); creates ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    path, n = folder / f"{stem}{suffix}", 1
    while path.exists():
        n += 1
        path = folder / f"{stem}-{n}{suffix}"
    return path


# -- where a workspace keeps its files ---------------------------------------------------------------

# The file that makes a folder a workspace (optimizer.workspace.workspace.find_root looks for it).
CONFIG_NAME = "judgeloop.toml"
DEVSET_DIR = "devset"
EXPERIMENTS_DIR = "experiments"
# A split's labels, devset/<split>/labels.jsonl (only optimizer.devset.labels reads it).
LABELS_FILE = "labels.jsonl"
# A person's label corrections beside them, devset/<split>/corrections.jsonl (optimizer.devset.corrections).
CORRECTIONS_FILE = "corrections.jsonl"
# The loop's lock (optimizer.workspace.workspace.command_lock), experiments/loop.lock.
LOCK_FILE = "loop.lock"


@dataclass(frozen=True)
class WorkspacePaths:
    """Where the workspace at ``root`` keeps its files, spelled once for the engine, the CLI and the TUI
    (which holds a root, not a loaded `Workspace`: `Workspace.paths` is the same object). Paths only:
    nothing here reads or checks the disk."""

    root: Path

    @property
    def prompts(self) -> Path:
        return self.root / PROMPTS_DIR

    @property
    def devset(self) -> Path:
        return self.root / DEVSET_DIR

    @property
    def experiments(self) -> Path:
        return self.root / EXPERIMENTS_DIR

    @property
    def ledger(self) -> Path:
        return self.experiments / "ledger.sqlite"

    @property
    def cache(self) -> Path:
        return self.experiments / "cache.sqlite"

    @property
    def guidance(self) -> Path:
        return self.experiments / "guidance.md"

    @property
    def stop(self) -> Path:
        """Created to ask a running loop to stop after its current step."""
        return self.experiments / "STOP"

    @property
    def lock(self) -> Path:
        return self.experiments / LOCK_FILE

    @property
    def runs(self) -> Path:
        """experiments/runs/: a TUI-started run's log, a run's exported report folder."""
        return self.experiments / "runs"

    @property
    def reviews_export(self) -> Path:
        """experiments/reviews.jsonl, where the reviews are exported."""
        return self.experiments / "reviews.jsonl"

    def split(self, name: str) -> Path:
        return self.devset / name

    def labels(self, split: str) -> Path:
        return self.split(split) / LABELS_FILE

    def corrections(self, split: str) -> Path:
        return self.split(split) / CORRECTIONS_FILE
