"""Shared fixtures. Tests always work in fresh temporary workspaces, never in this repository."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from optimizer.workspace import Workspace

# Never let a developer's real keys or git identity leak into a test.
for _var in ("ANTHROPIC_API_KEY", "OPENAI_API_KEY", "ANTHROPIC_BASE_URL", "OPENAI_BASE_URL"):
    os.environ.pop(_var, None)


@pytest.fixture
def empty_workspace(tmp_path: Path) -> Workspace:
    from optimizer.scaffold import init_workspace

    return init_workspace(tmp_path / "ws", sample=False)
