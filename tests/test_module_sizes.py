"""The structure's size gates (issue 30): no git-tracked Python module over 800 lines, at most 12 modules
at ``optimizer/``'s root (its ``__init__.py`` not counted). A module that grows past the limit is split along
its own sections; a new root module goes into the package of its kind."""

from __future__ import annotations

import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MAX_LINES = 800
MAX_ROOT_MODULES = 12


def _tracked_python() -> list[Path]:
    out = subprocess.run(
        ["git", "ls-files", "*.py"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout
    return [REPO / f for f in out.split() if (REPO / f).is_file()]


def oversized(limit: int = MAX_LINES) -> list[tuple[str, int]]:
    """Every tracked *.py file over ``limit`` lines, as (repository path, lines)."""
    sizes = [
        (p.relative_to(REPO).as_posix(), len(p.read_text(encoding="utf-8").splitlines()))
        for p in _tracked_python()
    ]
    return sorted((name, n) for name, n in sizes if n > limit)


def root_modules() -> list[str]:
    """The modules directly under optimizer/ (packages and ``__init__.py`` not counted)."""
    return sorted(p.name for p in (REPO / "optimizer").glob("*.py") if p.name != "__init__.py")


def test_no_tracked_python_module_is_over_800_lines() -> None:
    assert oversized() == []


def test_optimizers_root_holds_at_most_12_modules() -> None:
    assert len(root_modules()) <= MAX_ROOT_MODULES, root_modules()


def test_the_gates_count_what_they_say() -> None:
    """The measures themselves: a known module is found with its real length, the root's list is what is on disk."""
    found = dict(oversized(limit=0))
    known = REPO / "tests" / "test_import_contracts.py"
    assert found["tests/test_import_contracts.py"] == len(known.read_text(encoding="utf-8").splitlines())
    assert "errors.py" in root_modules() and "__init__.py" not in root_modules()
