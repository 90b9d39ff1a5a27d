"""Shared fixtures. Tests always work in fresh temporary workspaces, never in this repository."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.support.harness_judge import harness_state  # noqa: F401 - the harness-judge tests' fixture
from tests.support.tui_runs import run_ws, ws_copy  # noqa: F401 - the TUI tests' session run and its copies

if TYPE_CHECKING:
    from optimizer.workspace.workspace import Workspace

# The Python the TUI's SVG baselines (tests/__snapshots__/) are made on: another version's Rich and Textual
# wheels may render a few cells differently, and baselines from two versions would fight each other.
SNAPSHOT_PYTHON = (3, 11)


def pytest_configure(config: pytest.Config) -> None:
    """Refuse `--snapshot-update` on another Python than SNAPSHOT_PYTHON (harlequin's guard)."""
    updating = config.getoption("update_snapshots", default=False) or config.getoption(
        "update_new_snapshots_only", default=False
    )
    if updating and sys.version_info[:2] != SNAPSHOT_PYTHON:
        raise pytest.UsageError(
            f"the SVG baselines are made on Python {'.'.join(map(str, SNAPSHOT_PYTHON))}, this is "
            f"{sys.version_info.major}.{sys.version_info.minor}: run --snapshot-update with that version's venv"
        )


# Never let a developer's real keys or git identity leak into a test.
for _var in ("ANTHROPIC_API_KEY", "OPENAI_API_KEY", "ANTHROPIC_BASE_URL", "OPENAI_BASE_URL"):
    os.environ.pop(_var, None)


@pytest.fixture
def empty_workspace(tmp_path: Path) -> Workspace:
    from optimizer.scaffold import init_workspace

    return init_workspace(tmp_path / "ws", sample=False)


# A module's `ws`: a fresh copy of one ``init --sample`` workspace made once per module (its `template`),
# whose dev split is a 32-item subset of the sample (`tests.support.loop.add_small_dev_split`). A module
# that needs another template (other prices, say) defines its own `template`.
@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.support.loop import add_small_dev_split, make_workspace

    root = make_workspace(tmp_path_factory.mktemp("template"))
    add_small_dev_split(root)
    return root


@pytest.fixture
def ws(template: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "ws"
    shutil.copytree(template, root, symlinks=True)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-not-a-real-key")
    return root
