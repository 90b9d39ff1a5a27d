"""Git operations of a run: its branch, candidate commits, keep and roll back.

Every function opens one short-lived ``Repo`` (``workspace.repo_at``) and closes it. Commits use
``JUDGELOOP_ACTOR`` as author and committer and skip the user's hooks (an autonomous loop must not
depend on, or be blocked by, a pre-commit hook).

How a candidate's life maps onto git
------------------------------------
1. The strategy writes the allowed prompt files; ``commit_candidate`` commits exactly those paths
   with the trailers ``Judgeloop-Experiment: N`` and ``Judgeloop-Decision: pending`` — the commit
   exists *before* evaluation, so a crash mid-evaluation leaves an identifiable pending tip.
2. After the decision:
   - kept: ``finalize_kept`` rewrites the tip's message with the final trailers (kappa, FPR,
     decision). The tree and parent are unchanged, so the diff is identical; only the sha changes
     (the ledger stores the returned sha).
   - rolled back: ``roll_back`` makes a commit object with the same tree and parent and the final
     message, stores it under ``refs/judgeloop/rejected/<experiment-id>`` and hard-resets the
     branch to the incumbent. ``git log <branch>`` is then exactly the kept chain, and every
     rejected diff stays readable (``git show refs/judgeloop/rejected/7``).
   - waiting (``--propose-only``, the MCP ``propose_only``): ``park_waiting`` keeps the commit under
     ``refs/judgeloop/waiting/<experiment-id>`` until a decision (``drop_waiting``), so a session that
     ends and resets the branch leaves no orphan.

The loop trusts only the commits it made (`optimizer.loop.trust`): ``commits_between`` names what lies
between the incumbent and the tip, ``tree_changes`` is the whole diff between two commits.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

import git

from optimizer.errors import UserError
from optimizer.workspace.paths import CORRECTIONS_FILE, DEVSET_DIR, WorkspacePaths
from optimizer.workspace.workspace import JUDGELOOP_ACTOR, Workspace, repo_at

BRANCH_PREFIX = "judgeloop/"
REJECTED_PREFIX = "refs/judgeloop/rejected/"
# A wave's candidates wait here (one commit each on the incumbent) while the wave is evaluated.
WAVE_PREFIX = "refs/judgeloop/wave/"
# A propose-only candidate waits here for `judgeloop decide` (never an orphan, whatever moves the branch).
WAITING_PREFIX = "refs/judgeloop/waiting/"
# A pruned run's branch tip (`judgeloop runs prune`): out of `git branch`, never out of git.
PRUNED_PREFIX = "refs/judgeloop/pruned/"
PENDING = "pending"
# Paths the dirty-tree check ignores: run output lives there (and is git-ignored anyway).
IGNORED_DIRTY_PREFIXES: tuple[str, ...] = ("experiments/",)
# Untracked (never committed) data under devset/ does not make the tree dirty: an imported split can
# be gigabytes of screenshots, it is pinned by its fingerprint, and the loop never writes there.
# Edits to *tracked* devset files still do.
UNTRACKED_DATA_PREFIXES: tuple[str, ...] = ("devset/",)
# A person's label corrections (`optimizer.devset.corrections`, written by `judgeloop label-fix` and the
# TUI, mid-run too): they never make the tree dirty, and a rollback's hard reset keeps them as on disk.
PERSON_FILE = CORRECTIONS_FILE


def _is_person_file(path: str) -> bool:
    parts = path.split("/")
    return len(parts) == 3 and parts[0] == DEVSET_DIR and parts[2] == PERSON_FILE


@contextmanager
def _keeping_person_files(root: Path) -> Iterator[None]:
    """Put every ``devset/<split>/corrections.jsonl`` back as it was on disk after the block (a reset)."""
    kept = {p: p.read_bytes() for p in WorkspacePaths(root).devset.glob(f"*/{PERSON_FILE}") if p.is_file()}
    try:
        yield
    finally:
        for path, data in kept.items():
            if not path.is_file() or path.read_bytes() != data:
                path.write_bytes(data)


TRAILER_KEYS: tuple[str, ...] = (
    "Judgeloop-Experiment",
    "Judgeloop-Kappa",
    "Judgeloop-FPR",
    "Judgeloop-Decision",
)
_TRAILER_RE = re.compile(r"^(Judgeloop-[A-Za-z-]+):\s*(.*)$")

Root = Path | str | Workspace


def _root(where: Root) -> Path:
    return where.root if isinstance(where, Workspace) else Path(where)


@dataclass(frozen=True)
class DiffSummary:
    """A diff between two revisions: unified text, line counts and the files it touches."""

    text: str
    insertions: int
    deletions: int
    files_changed: list[str] = field(default_factory=list)


# ---------------------------------------------------------------------------------------------
# Messages and trailers


def format_message(subject: str, body: str = "", trailers: Mapping[str, object] | None = None) -> str:
    """A commit message: subject line, optional body, then ``Key: value`` trailers (one block)."""
    parts = [subject.strip().splitlines()[0] if subject.strip() else "judgeloop candidate"]
    if body.strip():
        parts.append(body.strip())
    if trailers:
        parts.append("\n".join(f"{k}: {_trailer_value(v)}" for k, v in trailers.items()))
    return "\n\n".join(parts) + "\n"


def _trailer_value(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.3f}"
    return "" if value is None else str(value).replace("\n", " ")


def parse_trailers(message: str) -> dict[str, str]:
    """The ``Judgeloop-*`` trailers of a commit message (last occurrence wins)."""
    found: dict[str, str] = {}
    for line in message.splitlines():
        m = _TRAILER_RE.match(line.strip())
        if m:
            found[m.group(1)] = m.group(2).strip()
    return found


def replace_trailers(message: str, trailers: Mapping[str, object]) -> str:
    """``message`` with its Judgeloop trailers replaced by ``trailers`` merged over the old ones."""
    merged: dict[str, object] = dict(parse_trailers(message))
    merged.update(trailers)
    kept_lines = [line for line in message.rstrip("\n").splitlines() if not _TRAILER_RE.match(line.strip())]
    text = "\n".join(kept_lines).rstrip()
    subject, _, body = text.partition("\n")
    return format_message(subject, body, merged)


# ---------------------------------------------------------------------------------------------
# Inspecting the tree


def _status_paths(repo: git.Repo) -> list[tuple[str, str]]:
    """(two-letter status code, path) for every change; untracked folders are listed as folders."""
    out = repo.git.status("--porcelain=v1", "-z", "--untracked-files=normal")
    paths: list[tuple[str, str]] = []
    entries = out.split("\0")
    i = 0
    while i < len(entries):
        entry = entries[i]
        i += 1
        if len(entry) < 4:
            continue
        code, path = entry[:2], entry[3:]
        if "R" in code or "C" in code:
            i += 1  # the rename/copy source follows as its own entry
        paths.append((code, path))
    return paths


def dirty_paths(where: Root) -> list[str]:
    """Tracked changes (staged or not) and untracked files, outside ``experiments/``; untracked
    imported data under ``devset/`` is not counted (see ``UNTRACKED_DATA_PREFIXES``)."""
    with repo_at(_root(where)) as repo:
        entries = _status_paths(repo)
    return [
        path
        for code, path in entries
        if not path.startswith(IGNORED_DIRTY_PREFIXES)
        and not (code == "??" and path.startswith(UNTRACKED_DATA_PREFIXES))
        and not _is_person_file(path)
    ]


def is_dirty(where: Root) -> bool:
    """True when ``dirty_paths`` is not empty."""
    return bool(dirty_paths(where))


def ensure_clean(where: Root, action: str = "judgeloop run") -> None:
    """Refuse a dirty working tree with one line listing up to five paths."""
    paths = dirty_paths(where)
    if paths:
        shown = ", ".join(paths[:5]) + (f" and {len(paths) - 5} more" if len(paths) > 5 else "")
        raise UserError(
            f"the working tree has uncommitted changes ({shown}); commit or discard them before `{action}`"
        )


def current_branch(where: Root) -> str | None:
    """The checked-out branch name, or None when HEAD is detached."""
    with repo_at(_root(where)) as repo:
        return None if repo.head.is_detached else repo.active_branch.name


def prompts_tree(where: Root, sha: str) -> str | None:
    """The git tree id of ``prompts/`` at commit ``sha`` (equal ids: byte-identical prompts), None when
    the commit or the folder is not there."""
    with repo_at(_root(where)) as repo:
        try:
            return str((resolve_commit(repo, sha).tree / "prompts").hexsha)
        except (KeyError, UserError):
            return None


def resolve_commit(repo: git.Repo, rev: str) -> git.Commit:
    """The commit ``rev`` names, as git itself resolves it (``git rev-parse --verify``: every spelling
    git knows, ``main@{yesterday}`` included). A revision git cannot resolve, or resolves only
    approximately (a reflog that does not reach back to the date asked for), is a `UserError` naming it;
    nothing else is raised for a bad revision."""
    why = "git cannot resolve it"
    if rev and "\0" not in rev and "\n" not in rev:
        # --end-of-options: a revision spelled like an option (``--output=x``) stays a revision.
        status, out, err = repo.git.rev_parse(
            "--verify",
            "--end-of-options",
            f"{rev}^{{commit}}",
            with_extended_output=True,
            with_exceptions=False,
        )
        lines = [line.split(": ", 1)[-1] for line in str(err).splitlines() if line.strip()]
        told = [line for line in lines if line != "Needed a single revision"]
        if status == 0 and not told:
            return repo.commit(str(out).strip())
        # git answers "log for 'main' only goes back to <date>" with its oldest entry: not main at the date asked.
        why = told[0] if told else why
    raise UserError(f"unknown git revision {rev!r} ({why}); pass a branch, tag or commit of this workspace")


def rev_parse(where: Root, rev: str = "HEAD") -> str:
    """The full sha of a revision; one git cannot resolve is a UserError (`resolve_commit`)."""
    with repo_at(_root(where)) as repo:
        return resolve_commit(repo, rev).hexsha


def changed_files(where: Root) -> list[str]:
    """Paths that differ between the working tree and HEAD, plus untracked files (outside experiments/)."""
    return sorted(set(dirty_paths(where)))


def worktree_changes(
    where: Root, paths: Iterable[str] | None = None
) -> dict[str, tuple[str | None, str | None]]:
    """For each changed path (default: ``changed_files``): (text at HEAD, text on disk).

    None stands for "absent" (added or deleted). Exactly what ``guards.check_candidate`` takes.
    """
    root = _root(where)
    chosen = sorted(set(paths)) if paths is not None else changed_files(root)
    result: dict[str, tuple[str | None, str | None]] = {}
    with repo_at(root) as repo:
        head = repo.head.commit
        for rel in chosen:
            old = _blob_text(head, rel)
            disk = root / rel
            new = disk.read_text(encoding="utf-8", errors="replace") if disk.is_file() else None
            if old != new:
                result[rel] = (old, new)
    return result


def _blob_text(commit: git.Commit, path: str) -> str | None:
    try:
        blob = commit.tree / PurePosixPath(path).as_posix()
    except KeyError:
        return None
    return bytes(blob.data_stream.read()).decode("utf-8", errors="replace")


def read_file_at(where: Root, rev: str, path: str) -> str | None:
    """The text of ``path`` at ``rev`` (None when the file does not exist there)."""
    with repo_at(_root(where)) as repo:
        return _blob_text(resolve_commit(repo, rev), path)


def commit_message(where: Root, rev: str) -> str:
    """The full message of a commit."""
    with repo_at(_root(where)) as repo:
        message = resolve_commit(repo, rev).message
    return message if isinstance(message, str) else message.decode("utf-8", errors="replace")


def diff_against(where: Root, parent_sha: str, sha: str, paths: Sequence[str] = ()) -> DiffSummary:
    """The diff from ``parent_sha`` to ``sha`` (optionally limited to ``paths``)."""
    with repo_at(_root(where)) as repo:
        text = repo.git.diff(parent_sha, sha, "--", *paths)
        numstat = repo.git.diff(parent_sha, sha, "--numstat", "--", *paths)
    insertions = deletions = 0
    files: list[str] = []
    for line in numstat.splitlines():
        added, removed, name = line.split("\t", 2)
        files.append(name)
        insertions += int(added) if added.isdigit() else 0
        deletions += int(removed) if removed.isdigit() else 0
    return DiffSummary(
        text=text + ("\n" if text else ""), insertions=insertions, deletions=deletions, files_changed=files
    )


def rejected_refs(where: Root) -> dict[int, str]:
    """Experiment id → sha of every ``refs/judgeloop/rejected/<id>``."""
    with repo_at(_root(where)) as repo:
        out = repo.git.for_each_ref("--format=%(refname) %(objectname)", REJECTED_PREFIX)
    refs: dict[int, str] = {}
    for line in out.splitlines():
        name, sha = line.split()
        tail = name[len(REJECTED_PREFIX) :]
        if tail.isdigit():
            refs[int(tail)] = sha
    return refs


def commits_between(where: Root, base: str, tip: str) -> list[tuple[str, str]]:
    """(sha, subject) of every commit reachable from ``tip`` and not from ``base``, newest first."""
    with repo_at(_root(where)) as repo:
        out = repo.git.log("--format=%H%x00%s", f"{base}..{tip}", "--")
    return [(sha, subject) for line in out.splitlines() if line for sha, _, subject in [line.partition("\0")]]


def parents(where: Root, sha: str) -> list[str]:
    """The parent shas of commit ``sha``."""
    with repo_at(_root(where)) as repo:
        return [p.hexsha for p in repo.commit(sha).parents]


def tree_changes(where: Root, base: str, rev: str) -> dict[str, tuple[str | None, str | None]]:
    """Every path whose content differs between commits ``base`` and ``rev``: (text at base, text at rev),
    None for absent; read from git's objects (never the working tree), renames as a deletion and an addition.
    The shape `guards.check_candidate` takes."""
    with repo_at(_root(where)) as repo:
        names = repo.git.diff("--no-renames", "--name-only", "-z", base, rev, "--")
        old, new = repo.commit(base), repo.commit(rev)
        return {path: (_blob_text(old, path), _blob_text(new, path)) for path in names.split("\0") if path}


def branch_log(where: Root, branch: str, since: str | None = None) -> list[tuple[str, str]]:
    """(sha, message) of the commits on ``branch`` newest first, stopping before ``since`` if given."""
    with repo_at(_root(where)) as repo:
        rev = f"{since}..{branch}" if since else branch
        return [(c.hexsha, str(c.message)) for c in repo.iter_commits(rev)]


# ---------------------------------------------------------------------------------------------
# Changing the tree


def run_branch_name(run_id: str) -> str:
    """``judgeloop/<run-id>``."""
    return BRANCH_PREFIX + run_id


def create_run_branch(where: Root, run_id: str, start_rev: str = "HEAD") -> str:
    """Create ``judgeloop/<run-id>`` at ``start_rev`` and check it out; returns the branch name.

    Refuses a dirty tree (one line) and an existing branch of that name.
    """
    root = _root(where)
    ensure_clean(root)
    name = run_branch_name(run_id)
    start_sha = rev_parse(root, start_rev)
    with repo_at(root) as repo:
        if name in repo.heads:
            raise UserError(
                f"branch {name} already exists; resume that run with `judgeloop run --resume` or delete the branch"
            )
        head = repo.create_head(name, start_sha)
        head.checkout()
    return name


def branch_exists(where: Root, branch: str) -> bool:
    """Whether the local branch ``branch`` exists."""
    with repo_at(_root(where)) as repo:
        return branch in repo.heads


def checkout_branch(where: Root, branch: str) -> None:
    """Check out an existing branch (e.g. the run branch on resume)."""
    with repo_at(_root(where)) as repo:
        if branch not in repo.heads:
            raise UserError(
                f"branch {branch} does not exist in this workspace; start a new run with `judgeloop run`"
            )
        repo.heads[branch].checkout()


def commit_candidate(
    where: Root,
    paths: Sequence[str],
    message: str,
    experiment_id: int,
    extra_trailers: Mapping[str, object] | None = None,
) -> str:
    """Commit exactly ``paths`` (edits, additions or deletions) as a pending candidate; returns its sha.

    ``message`` is the subject and body (no trailers); ``Judgeloop-Experiment`` and
    ``Judgeloop-Decision: pending`` are appended. Raises ValueError when ``paths`` holds no change
    and RuntimeError if anything outside ``paths`` is staged (the loop must never commit it).
    """
    if not paths:
        raise ValueError("commit_candidate needs at least one path")
    root = _root(where)
    subject, _, body = message.strip().partition("\n")
    trailers: dict[str, object] = {"Judgeloop-Experiment": experiment_id, "Judgeloop-Decision": PENDING}
    trailers.update(extra_trailers or {})
    full = format_message(subject, body, trailers)
    with repo_at(root) as repo:
        repo.git.add("-A", "--", *paths)
        staged = [path for d in repo.index.diff("HEAD") if (path := d.a_path or d.b_path)]
        if not staged:
            raise ValueError(f"nothing to commit in {', '.join(paths)}")
        stray = sorted(p for p in staged if p not in set(paths))
        if stray:
            raise RuntimeError(f"refusing to commit paths outside the candidate: {', '.join(stray)}")
        commit = repo.index.commit(full, author=JUDGELOOP_ACTOR, committer=JUDGELOOP_ACTOR, skip_hooks=True)
        return commit.hexsha


def _tip_must_be(repo: git.Repo, sha: str) -> git.Commit:
    tip = repo.head.commit
    if tip.hexsha != sha:
        raise RuntimeError(f"expected the branch tip to be the candidate {sha[:12]}, found {tip.hexsha[:12]}")
    return tip


def finalize_kept(where: Root, sha: str, trailers: Mapping[str, object]) -> str:
    """Rewrite the tip candidate's message with the final trailers; returns the new sha.

    The tree and parents are unchanged (so is the diff); the working tree is not touched.
    """
    with repo_at(_root(where)) as repo:
        tip = _tip_must_be(repo, sha)
        new = git.Commit.create_from_tree(
            repo,
            tip.tree,
            replace_trailers(str(tip.message), trailers),
            parent_commits=list(tip.parents),
            head=False,
            author=JUDGELOOP_ACTOR,
            committer=JUDGELOOP_ACTOR,
        )
        repo.head.reference.set_commit(new, logmsg=f"judgeloop: keep {sha[:12]}")
        return new.hexsha


def roll_back(
    where: Root, sha: str, experiment_id: int, incumbent_sha: str, trailers: Mapping[str, object]
) -> str:
    """Preserve the candidate under ``refs/judgeloop/rejected/<experiment_id>`` (final message) and
    hard-reset the branch to ``incumbent_sha``; returns the rejected commit's sha.
    """
    with repo_at(_root(where)) as repo:
        tip = _tip_must_be(repo, sha)
        rejected = git.Commit.create_from_tree(
            repo,
            tip.tree,
            replace_trailers(str(tip.message), trailers),
            parent_commits=list(tip.parents),
            head=False,
            author=JUDGELOOP_ACTOR,
            committer=JUDGELOOP_ACTOR,
        )
        repo.git.update_ref(f"{REJECTED_PREFIX}{experiment_id}", rejected.hexsha)
        with _keeping_person_files(_root(where)):
            repo.head.reset(incumbent_sha, index=True, working_tree=True)
        return rejected.hexsha


def park_candidate(where: Root, sha: str, experiment_id: int, incumbent_sha: str) -> None:
    """Keep the tip candidate ``sha`` under ``refs/judgeloop/wave/<experiment_id>`` and hard-reset the
    branch to ``incumbent_sha``, so the wave's next candidate is proposed on the incumbent too."""
    with repo_at(_root(where)) as repo:
        _tip_must_be(repo, sha)
        repo.git.update_ref(f"{WAVE_PREFIX}{experiment_id}", sha)
        repo.head.reset(incumbent_sha, index=True, working_tree=True)


def parked_candidates(where: Root) -> dict[int, str]:
    """Experiment id -> sha of every wave candidate still waiting for its wave's decision."""
    with repo_at(_root(where)) as repo:
        out = repo.git.for_each_ref("--format=%(refname) %(objectname)", WAVE_PREFIX)
    parked: dict[int, str] = {}
    for line in out.splitlines():
        ref, _, sha = line.partition(" ")
        tail = ref.removeprefix(WAVE_PREFIX)
        if tail.isdigit():
            parked[int(tail)] = sha
    return parked


def unpark(where: Root, experiment_id: int) -> None:
    """Drop a decided wave candidate's waiting ref (its final commit is the branch's or a rejected ref)."""
    with repo_at(_root(where)) as repo:
        repo.git.update_ref("-d", f"{WAVE_PREFIX}{experiment_id}")


def check_out_parked(where: Root, sha: str) -> None:
    """Move the branch (index and tree) to a parked wave candidate, to finalise it as kept or roll it back."""
    with repo_at(_root(where)) as repo:
        repo.head.reset(sha, index=True, working_tree=True)


def park_waiting(where: Root, sha: str, experiment_id: int) -> None:
    """Keep a candidate waiting for a decision under ``refs/judgeloop/waiting/<experiment_id>``."""
    with repo_at(_root(where)) as repo:
        repo.git.update_ref(f"{WAITING_PREFIX}{experiment_id}", sha)


def drop_waiting(where: Root, experiment_id: int) -> None:
    """Drop a decided candidate's waiting ref (its final commit is the branch's or a rejected ref)."""
    with repo_at(_root(where)) as repo, suppress(git.GitCommandError):
        repo.git.update_ref("-d", f"{WAITING_PREFIX}{experiment_id}")


def set_branch(where: Root, branch: str, sha: str) -> None:
    """Point the local branch ``branch`` at ``sha`` without touching the working tree (it must not be
    the checked-out branch: `restore_tree` moves that one)."""
    with repo_at(_root(where)) as repo:
        repo.git.update_ref(f"refs/heads/{branch}", sha)


def is_ancestor(where: Root, ancestor: str, rev: str) -> bool:
    """Whether ``ancestor`` is ``rev`` or reachable from it (git merge-base --is-ancestor)."""
    with repo_at(_root(where)) as repo:
        return repo.is_ancestor(repo.commit(ancestor), repo.commit(rev))


def archive_branch(where: Root, branch: str, ref: str) -> str:
    """Point ``ref`` (e.g. ``refs/judgeloop/pruned/<run>``) at ``branch``'s tip, then delete the branch: its
    commits stay reachable (never garbage-collected) while it leaves `git branch`. Refuses the checked-out
    branch. Returns the tip's sha."""
    root = _root(where)
    if current_branch(root) == branch:
        raise UserError(f"branch {branch} is checked out; switch to another branch before removing it")
    with repo_at(root) as repo:
        sha = repo.heads[branch].commit.hexsha
        repo.git.update_ref(ref, sha)
        repo.git.branch("-D", branch)
    return sha


def store_rejected(where: Root, sha: str, experiment_id: int) -> None:
    """Point ``refs/judgeloop/rejected/<experiment_id>`` at an existing commit (e.g. a pending one
    found on resume) so it is never garbage-collected."""
    with repo_at(_root(where)) as repo:
        repo.git.update_ref(f"{REJECTED_PREFIX}{experiment_id}", sha)


def restore_paths(where: Root, paths: Sequence[str]) -> None:
    """Put ``paths`` back as they are in HEAD (index and working tree); a path HEAD lacks is removed."""
    root = _root(where)
    with repo_at(root) as repo:
        tracked = [p for p in paths if repo.git.ls_tree("HEAD", "--", p).strip()]
        if tracked:
            repo.git.checkout("HEAD", "--", *tracked)
    for p in paths:
        if p not in tracked:
            (Path(root) / p).unlink(missing_ok=True)


def restore_tree(where: Root, incumbent_sha: str, clean_under: Sequence[str] = ("prompts",)) -> None:
    """Hard-reset the current branch to ``incumbent_sha`` and remove untracked files under
    ``clean_under`` only (the loop's writable area); nothing else untracked is deleted. For resume
    and for discarding a guard-rejected candidate that was never committed."""
    with repo_at(_root(where)) as repo, _keeping_person_files(_root(where)):
        repo.head.reset(incumbent_sha, index=True, working_tree=True)
        if clean_under:
            repo.git.clean("-fd", "--", *clean_under)


def clear_stale_index_lock(where: Root, min_age_s: float = 10.0) -> bool:
    """Remove ``.git/index.lock`` when it is older than ``min_age_s`` (a process killed mid-commit
    leaves it, and every later commit fails on it); True when one was removed. A fresh one may belong
    to a git command running right now: that is a `UserError` saying to retry. Call only while
    holding the workspace's loop lock, so no judgeloop command can be the one writing it."""
    import time

    lock = Path(_root(where)) / ".git" / "index.lock"
    try:
        age = time.time() - lock.stat().st_mtime
    except FileNotFoundError:
        return False
    if age < min_age_s:
        raise UserError(
            f"{lock} exists: a git command is working in this repository; retry when it is done "
            "(if none is, delete the file)"
        )
    lock.unlink(missing_ok=True)
    return True


# ---------------------------------------------------------------------------------------------
# Attribution: kept commits in a history, three-way reverts in a scratch worktree


@dataclass(frozen=True)
class KeptCommit:
    """A commit whose trailers say ``Judgeloop-Decision: kept`` (``experiment``: its experiment id)."""

    sha: str
    experiment: int


def kept_commits(where: Root, rev: str = "HEAD", since: str | None = None) -> list[KeptCommit]:
    """The kept candidates in ``rev``'s history, newest first, stopping before
    ``since`` when given. A commit counts when its trailers carry an experiment id and ``kept``."""
    out: list[KeptCommit] = []
    for sha, message in branch_log(where, rev, since=since):
        trailers = parse_trailers(message)
        experiment = trailers.get("Judgeloop-Experiment", "")
        if trailers.get("Judgeloop-Decision") == "kept" and experiment.isdigit():
            out.append(KeptCommit(sha, int(experiment)))
    return out


# Scratch worktrees live in the repository's own git folder (``.git/judgeloop-scratch/<folder>/tree``),
# so the leftovers of a killed process are found from the repository and never looked for elsewhere.
SCRATCH_DIRNAME = "judgeloop-scratch"
_IN_USE = "in-use"  # flock'ed by the process using the folder; the kernel drops it when that process dies
_GUARD = ".lock"  # held while a scratch folder is made or the stale ones are pruned


def _flock() -> Any:
    """The ``fcntl`` module, or None where it does not exist (Windows: scratch folders are then not
    locked, and none is ever pruned as stale)."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not on the platforms judgeloop is tested on
        return None
    return fcntl


def _scratch_base(root: Path) -> Path:
    with repo_at(root) as repo:
        return Path(repo.common_dir).resolve() / SCRATCH_DIRNAME


@contextmanager
def _guarded(base: Path) -> Iterator[None]:
    base.mkdir(parents=True, exist_ok=True)
    with (base / _GUARD).open("a") as guard:
        fcntl = _flock()
        if fcntl is not None:
            fcntl.flock(guard, fcntl.LOCK_EX)
        yield


def _stale(folder: Path) -> bool:
    """Whether no live process holds ``folder`` (its in-use lock is free, or it never got one)."""
    fcntl = _flock()
    if fcntl is None:  # pragma: no cover
        return False
    try:
        handle = (folder / _IN_USE).open("r")
    except FileNotFoundError:
        return True  # made but never taken: its process died before (folders are made under the guard)
    with handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        return True


def _prune(root: Path, base: Path) -> list[Path]:
    import shutil

    removed = []
    for folder in sorted(base.iterdir()):
        if folder.is_dir() and _stale(folder):
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
    with repo_at(root) as repo:
        repo.git.worktree("prune")  # drops the records of worktrees whose folders are gone
    return removed


def prune_scratch_worktrees(where: Root) -> list[Path]:
    """Remove the scratch worktrees (see `scratch_worktree`) no live process is using — what a killed
    one left — and git's records of them; the folders removed. One in use is never touched."""
    root = _root(where)
    base = _scratch_base(root)
    if not base.is_dir():
        with repo_at(root) as repo:
            repo.git.worktree("prune")
        return []
    with _guarded(base):
        return _prune(root, base)


@contextmanager
def scratch_worktree(where: Root, rev: str) -> Iterator[Path]:
    """A detached git worktree at ``rev`` in a scratch folder of the repository's git folder, removed
    (and pruned) afterwards.

    The user's working tree, index and branch are never touched: everything happens in the scratch
    folder, which shares only the object database. The folder is locked (flock) while in use, so the
    worktrees a killed process left are told apart and pruned (`prune_scratch_worktrees`) the next
    time one is made.
    """
    import shutil
    import tempfile

    root = _root(where)
    base = _scratch_base(root)
    fcntl = _flock()
    with _guarded(base):
        _prune(root, base)
        folder = Path(tempfile.mkdtemp(prefix="tree-", dir=base))
        in_use = (folder / _IN_USE).open("w")
        if fcntl is not None:
            fcntl.flock(in_use, fcntl.LOCK_EX)
    target = folder / "tree"
    try:
        with repo_at(root) as repo:
            repo.git.worktree("add", "--detach", "--quiet", str(target), rev)
        yield target
    finally:
        with repo_at(root) as repo:
            # Already gone, or never added: the prune below drops any record.
            with suppress(git.GitCommandError):
                repo.git.worktree("remove", "--force", str(target))
            shutil.rmtree(folder, ignore_errors=True)
            repo.git.worktree("prune")
        in_use.close()


def revert_in(worktree: Path, shas: Sequence[str], start: str) -> bool:
    """Reset ``worktree`` to ``start``, then three-way revert ``shas`` in the order given (without
    committing). True when every revert applied cleanly; on a conflict the worktree is reset to
    ``start`` and False is returned."""
    with repo_at(worktree) as repo:
        repo.git.reset("--hard", "--quiet", start)
        for sha in shas:
            try:
                repo.git.revert("--no-commit", "--no-edit", sha)
            except git.GitCommandError:
                repo.git.reset("--hard", "--quiet", start)
                repo.git.revert("--quit")
                return False
    return True
