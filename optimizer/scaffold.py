"""Creating a workspace: `init_workspace` (a git repository with the bundled prompts, optionally the sample split)."""

from __future__ import annotations

import shutil
from pathlib import Path

import git

from optimizer.errors import UserError
from optimizer.workspace.config import DEFAULT_CONFIG_TOML
from optimizer.workspace.workspace import CONFIG_NAME, JUDGELOOP_ACTOR, Workspace, repo_at

_GITIGNORE = """\
/experiments/*
!/experiments/README.md
__pycache__/
"""


_EXPERIMENTS_README = """\
# experiments/

What runs produce: the ledger (`ledger.sqlite`), the judge-call cache (`cache.sqlite`), per-run
folders of verdict files, `guidance.md` (human guidance the optimiser reads; edit it while a run
is going) and the `STOP` file (create it to stop a run after its current step).
Everything here except this README is ignored by git.
"""


def bundled_dir() -> Path:
    """Where the bundled prompts and sample set live: inside a wheel, or the source checkout."""
    here = Path(__file__).resolve().parent
    for candidate in (here / "_bundled", here.parent):
        if (candidate / "prompts").is_dir() and (candidate / "devset" / "sample").is_dir():
            return candidate
    raise UserError("the bundled prompts and sample set are missing from this install; reinstall judgeloop")


# What `init` without --sample writes for [workspace] dev_split: no split named until one is imported.
NO_SPLIT_LINE = (
    '# dev_split = "dev"        # the only split the optimiser ever sees: import it first with\n'
    "                            #   `judgeloop devset import SRC --name dev --all`, then uncomment"
)


def config_without_sample() -> str:
    """The default judgeloop.toml with its ``dev_split`` line commented out (`init` without --sample): the
    config names no split that does not exist."""
    line = next(x for x in DEFAULT_CONFIG_TOML.splitlines() if x.startswith("dev_split = "))
    return DEFAULT_CONFIG_TOML.replace(line, NO_SPLIT_LINE, 1)


def init_workspace(target: Path, *, sample: bool = False) -> Workspace:
    """Create a workspace at ``target`` (a new or empty folder) and make its initial commit."""
    target = target.resolve()
    if target.exists() and any(target.iterdir()):
        raise UserError(f"{target} exists and is not empty; choose a new folder for the workspace")
    bundle = bundled_dir()
    target.mkdir(parents=True, exist_ok=True)
    (target / CONFIG_NAME).write_text(
        DEFAULT_CONFIG_TOML if sample else config_without_sample(), encoding="utf-8"
    )
    shutil.copytree(bundle / "prompts", target / "prompts")
    (target / "devset").mkdir()
    (target / "devset" / ".gitkeep").write_text("", encoding="utf-8")
    (target / "experiments").mkdir()
    (target / "experiments" / "README.md").write_text(_EXPERIMENTS_README, encoding="utf-8")
    (target / ".gitignore").write_text(_GITIGNORE, encoding="utf-8")

    repo = git.Repo.init(target, initial_branch="main")
    try:
        with repo.config_writer() as cw:
            # Local identity so commits work on machines with no global git config.
            cw.set_value("user", "name", JUDGELOOP_ACTOR.name)
            cw.set_value("user", "email", JUDGELOOP_ACTOR.email)
        repo.git.add(A=True)
        repo.index.commit("judgeloop: new workspace", author=JUDGELOOP_ACTOR, committer=JUDGELOOP_ACTOR)
    finally:
        repo.close()

    ws = Workspace.open(target)
    if sample:
        from optimizer.devset.importer import import_split

        import_split(ws, bundle / "devset" / "sample", "sample", all_items=True)
        with repo_at(ws.root) as repo:
            repo.git.add("devset")
            repo.index.commit(
                "judgeloop: import the bundled sample split",
                author=JUDGELOOP_ACTOR,
                committer=JUDGELOOP_ACTOR,
            )
    return ws
