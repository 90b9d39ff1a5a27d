"""Fixtures shared by the loop tests: fresh copies of one ``init --sample`` workspace per module,
whose dev split is a 32-item subset of the sample (see `tests.support.loop.add_small_dev_split`)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.support.loop import add_small_dev_split, make_workspace


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = make_workspace(tmp_path_factory.mktemp("template"))
    add_small_dev_split(root)
    return root


@pytest.fixture
def ws(template: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "ws"
    shutil.copytree(template, root, symlinks=True)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-not-a-real-key")
    return root
