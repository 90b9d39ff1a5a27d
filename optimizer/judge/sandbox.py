"""Confinement of harness judges by bubblewrap (``bwrap``, Debian package ``bubblewrap``).

`[judge] sandbox = "bwrap"` (the default) runs each item's CLI in its own PID, mount, IPC and UTS
namespaces with (`bwrap_arguments`):

- a read-only view of the system: ``/usr`` and its ``/bin``, ``/sbin``, ``/lib*``, and the parts of
  ``/etc`` a program needs to run and reach its API (`ETC_ENTRIES`; not ``/etc/shadow``, not ssh keys);
- the CLI read-only: the resolved program, every link on the way to it, its install tree (the folder
  above its ``bin/``, e.g. a venv or ``/opt/node``, else its own folder) and, for a script, its
  interpreter's (`program_views`);
- ``HOME`` an empty private tmpfs holding only the harness's own config dirs, read-only
  (`optimizer.judge.harness.HarnessSpec.config_paths`: ``~/.codex``, ``~/.claude``, ...);
- the item's sandbox folder as its only writable place on the host, mounted at `SANDBOX_MOUNT` and
  its cwd (``/tmp`` and ``HOME`` are private tmpfs, gone with the item; the rest is read-only);
- a fresh ``/proc`` of its own PID namespace, a minimal ``/dev``;
- an environment built from an allow-list (`allowed_env`), no capabilities, and death with judgeloop.

Everything else (the workspace, its devset and labels, other home folders, the parent's ``/proc``) does
not exist inside. The network is NOT confined: the CLI must reach its model's API.

bwrap's own arguments go through a memory file (``--args FD``), so neither the keys passed to the CLI nor
the folders bound appear in any process's command line; bwrap itself starts with an empty environment
(it is PID 1 inside, and its ``/proc/1/environ`` is readable there).

Sandbox folders are named ``judgeloop-harness-<pid>-*`` in the system's temp folder (`new_folder`); a
folder whose owner pid is dead (judgeloop killed with -9) is removed at the next start (`prune_stale`).
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from optimizer.errors import UserError

SANDBOX_PREFIX = "judgeloop-harness-"
_FOLDER_RE = re.compile(rf"^{SANDBOX_PREFIX}(\d+)-")
# Where the item's folder appears inside the sandbox (a fixed path: nothing about the host in it).
SANDBOX_MOUNT = "/sandbox"
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
# What of /etc a CLI needs: users and names, DNS and TLS, the dynamic linker, time zone, alternatives.
ETC_ENTRIES = (
    "alternatives",
    "ca-certificates",
    "ca-certificates.conf",
    "crypto-policies",
    "fonts",
    "gai.conf",
    "group",
    "host.conf",
    "hostname",
    "hosts",
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "localtime",
    "mime.types",
    "nsswitch.conf",
    "os-release",
    "passwd",
    "pki",
    "protocols",
    "resolv.conf",
    "services",
    "ssl",
    "timezone",
)
# Variables a confined CLI gets besides its own keys and [judge] pass_env (LC_* too).
ENV_ALLOWED = ("PATH", "HOME", "LANG", "TERM")
INSTALL_HINT = "apt-get install bubblewrap"


# -- sandbox folders ------------------------------------------------------------------------------


def new_folder() -> Path:
    """A fresh, empty sandbox folder in the system's temp folder, named with this process's pid."""
    return Path(tempfile.mkdtemp(prefix=f"{SANDBOX_PREFIX}{os.getpid()}-"))


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process: alive
    return True


def prune_stale(parent: Path | None = None) -> list[Path]:
    """Remove the sandbox folders of dead judgeloop processes (this user's, in ``parent``, the system's
    temp folder by default) and return them. A folder whose owner pid lives is left alone."""
    root = Path(parent or tempfile.gettempdir())
    removed = []
    with contextlib.suppress(OSError):
        for entry in root.iterdir():
            match = _FOLDER_RE.match(entry.name)
            if match is None or _pid_alive(int(match.group(1))):
                continue
            with contextlib.suppress(OSError):
                if entry.is_symlink() or not entry.is_dir() or entry.stat().st_uid != os.getuid():
                    continue
                shutil.rmtree(entry)
                removed.append(entry)
    return removed


# -- is bubblewrap usable here? -------------------------------------------------------------------


def bwrap_program() -> str | None:
    """The ``bwrap`` on this process's PATH, resolved, or None."""
    found = shutil.which("bwrap")
    return os.path.realpath(found) if found else None


@functools.cache
def _probe(bwrap: str) -> str | None:
    """Why ``bwrap`` cannot confine a process here (None: it can). Run once per process per program."""
    true = shutil.which("true") or "/bin/true"
    argv = [
        bwrap,
        "--ro-bind",
        "/",
        "/",
        "--unshare-pid",
        "--unshare-ipc",
        "--unshare-uts",
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        "--die-with-parent",
        "--",
        true,
    ]
    try:
        done = subprocess.run(argv, capture_output=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"could not run {bwrap} ({exc})"
    if done.returncode != 0:
        tail = done.stderr.decode(errors="replace").strip().splitlines()
        return f"{bwrap} cannot create namespaces here ({tail[-1] if tail else f'exit {done.returncode}'})"
    return None


def require_bwrap() -> str:
    """The path of a working ``bwrap``; a `UserError` naming what to install or allow when there is none."""
    bwrap = bwrap_program()
    if bwrap is None:
        raise UserError(
            "a harness judge runs confined by bubblewrap, which is not installed: "
            f'{INSTALL_HINT} (or set [judge] sandbox = "none" to run it unconfined)'
        )
    why = _probe(bwrap)
    if why is not None:
        raise UserError(
            f"a harness judge runs confined by bubblewrap, but {why}: allow unprivileged user "
            'namespaces (sysctl kernel.unprivileged_userns_clone=1) or set [judge] sandbox = "none"'
        )
    return bwrap


# -- what the CLI sees ----------------------------------------------------------------------------


def allowed_env(
    source: Mapping[str, str], keep: Iterable[str], set_env: Iterable[tuple[str, str]]
) -> dict[str, str]:
    """The CLI's environment: `ENV_ALLOWED`, ``LC_*`` and the names in ``keep`` (the harness's own
    keys and pass_env) from ``source``, then ``set_env``. Nothing else (no other provider's key)."""
    wanted = set(ENV_ALLOWED) | set(keep)
    env = {k: v for k, v in source.items() if k in wanted or k.startswith("LC_")}
    env.update(set_env)
    return env


def _too_broad(path: Path, home: Path) -> bool:
    """A folder never shown whole: the root, a top-level folder, the home folder or one above it, a
    home's shared dot-folders, or a repository or workspace root (it may hold a workspace)."""
    if len(path.parts) <= 2 or path == home or path in home.parents:
        return True
    if path in {home / ".local", home / ".local" / "share", home / ".config", home / ".cache"}:
        return True
    return any((path / marker).exists() for marker in (".git", "judgeloop.toml"))


def _in_system(path: Path) -> bool:
    return any(path == Path(d) or Path(d) in path.parents for d in SYSTEM_DIRS)


def judgeloop_folders() -> list[Path]:
    """Where judgeloop's own package is installed: its source and any installed copy of its data (the
    bundled sample set holds labels), which a shown venv must not show."""
    import optimizer

    return [Path(p).resolve() for p in optimizer.__path__]


@dataclass
class ProgramView:
    """What of the host a CLI needs read-only: folders (or files) bound at their own path, links
    recreated at their own path (``(target as written, link path)``), and folders inside those hidden
    again under an empty tmpfs (``masks``: judgeloop's own package and data, e.g. in a shared venv)."""

    binds: list[Path] = field(default_factory=list)
    links: list[tuple[str, Path]] = field(default_factory=list)
    masks: list[Path] = field(default_factory=list)

    def covers(self, path: Path) -> bool:
        return _in_system(path) or any(path == b or b in path.parents for b in self.binds)

    def add_bind(self, path: Path) -> None:
        if not self.covers(path):
            self.binds = [b for b in self.binds if path not in b.parents] + [path]


def _install_tree(path: Path, home: Path, *, final: bool) -> Path | None:
    """The folder to show for ``path``: above its ``bin/`` (a venv, /opt/node, ~/.npm-global/...), else
    (the program itself) its folder, else None (the file alone)."""
    if path.parent.name == "bin" and not _too_broad(path.parent.parent, home):
        return path.parent.parent
    if final and path.parent.name != "bin" and not _too_broad(path.parent, home):
        return path.parent
    return None


def _link_chain(path: Path) -> tuple[list[tuple[str, Path]], Path]:
    """The links from ``path`` to the file it names (each ``(target as written, link)``) and that file."""
    links: list[tuple[str, Path]] = []
    current = Path(os.path.abspath(path))
    for _ in range(40):  # a link loop ends here; the kernel allows 40 too
        # The link's own folder may itself sit behind links: follow those first.
        current = Path(os.path.realpath(current.parent)) / current.name
        if not current.is_symlink():
            break
        target = os.readlink(current)
        links.append((target, current))
        current = Path(os.path.normpath(current.parent / target))
    return links, current


def _interpreter(program: Path, path_env: str) -> Path | None:
    """The interpreter a script's ``#!`` line names (``env X`` looked up on ``path_env``), or None."""
    try:
        with program.open("rb") as f:
            head = f.read(256)
    except OSError:
        return None
    if not head.startswith(b"#!"):
        return None
    words = head[2:].split(b"\n", 1)[0].decode(errors="replace").split()
    if not words:
        return None
    if Path(words[0]).name == "env":
        name = next((w for w in words[1:] if not w.startswith("-") and "=" not in w), None)
        found = shutil.which(name, path=path_env) if name else None
        return Path(found) if found else None
    return Path(words[0])


def program_views(program: Path, path_env: str, home: Path) -> ProgramView:
    """What of the host the CLI ``program`` (an absolute path) needs read-only to run: its links, its
    install tree, and those of its interpreter when it is a script (two levels: ``env node`` scripts)."""
    view = ProgramView()
    todo: list[Path] = [program]
    for _ in range(3):
        if not todo:
            break
        current = todo.pop()
        links, real = _link_chain(current)
        for path in [*(link for _, link in links), real]:
            tree = _install_tree(path, home, final=path == real)
            if tree is not None:
                view.add_bind(tree)
        view.add_bind(real)  # (a no-op when a tree or the system covers it)
        view.links += [(t, link) for t, link in links if not view.covers(link)]
        interpreter = _interpreter(real, path_env)
        if interpreter is not None:
            todo.append(interpreter)
    # judgeloop installed in a venv the CLI needs (its bundled sample's labels in site-packages): hidden.
    installed = [
        p for tree in view.binds if tree.is_dir() for p in tree.glob("lib/python*/site-packages/optimizer")
    ]
    view.masks = sorted({p for p in [*installed, *judgeloop_folders()] if p != Path("/") and view.covers(p)})
    return view


def _system_args() -> list[str]:
    args = ["--ro-bind", "/usr", "/usr"]
    for top in SYSTEM_DIRS[1:]:
        path = Path(top)
        if path.is_symlink():
            args += ["--symlink", os.readlink(path), top]
        elif path.is_dir():
            args += ["--ro-bind", top, top]
    for name in ETC_ENTRIES:
        entry = Path("/etc") / name
        if entry.exists():
            args += ["--ro-bind", str(entry), str(entry)]
            real = Path(os.path.realpath(entry))
            if real != entry and not str(real).startswith(("/etc/", "/usr/")):
                # e.g. resolv.conf -> /run/systemd/resolve/stub-resolv.conf: its folder, read-only
                args += ["--ro-bind", str(real.parent), str(real.parent)]
    return args


def bwrap_arguments(
    folder: Path,
    view: ProgramView,
    home: Path,
    config_paths: Sequence[str],
    env: Mapping[str, str],
) -> list[str]:
    """bwrap's options (before ``--`` and the command) for one item: namespaces, the read-only system
    and program views, a private ``HOME`` with ``config_paths`` (relative to it) read-only, ``folder``
    writable at `SANDBOX_MOUNT`, ``env`` as the whole environment."""
    args = [
        "--unshare-pid",
        "--unshare-ipc",
        "--unshare-uts",
        "--hostname",
        "judge",
        "--die-with-parent",
        "--new-session",
        "--cap-drop",
        "ALL",
        "--clearenv",
    ]
    args += _system_args()
    args += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"]
    if len(home.parts) > 1 and not _in_system(home):  # (a HOME of "/" or under /usr: no private home)
        args += ["--tmpfs", str(home)]
        for rel in config_paths:
            path = home / rel
            if path.exists():
                args += ["--ro-bind", str(path), str(path)]
    for bind in view.binds:
        args += ["--ro-bind", str(bind), str(bind)]
    for target, link in view.links:
        args += ["--symlink", target, str(link)]
    for mask in view.masks:
        args += ["--tmpfs", str(mask)]
    args += ["--bind", str(folder), SANDBOX_MOUNT, "--chdir", SANDBOX_MOUNT]
    # The root the binds were made on (a tmpfs) read-only too: only the folder, /tmp and HOME take writes.
    args += ["--remount-ro", "/"]
    for key, value in sorted(env.items()):
        args += ["--setenv", key, value]
    return args


def args_fd(args: Sequence[str]) -> int:
    """A memory file holding ``args`` as bwrap's ``--args FD`` reads them (NUL-terminated), at offset
    0; the caller passes it to bwrap and closes it. Keys never reach a command line this way."""
    fd = os.memfd_create("bwrap-args", 0)  # not CLOEXEC: bwrap inherits it (pass_fds)
    data = b"".join(a.encode() + b"\0" for a in args)
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
    os.lseek(fd, 0, os.SEEK_SET)
    return fd
