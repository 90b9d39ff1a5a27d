"""Tests and benchmarks share code through `tests.support` only: a test module that imports another test
module runs that module's tests' set-up and couples two suites; a helper belongs in tests/support/."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.support.paths import REPO_ROOT


def imported_tests_modules(path: Path) -> list[str]:
    """Every ``tests...`` module the file imports (``import tests.x`` and ``from tests.x import y``)."""
    found: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names if alias.name.split(".")[0] == "tests"]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module is not None:
            if node.module == "tests":
                found += [f"tests.{alias.name}" for alias in node.names]
            elif node.module.split(".")[0] == "tests":
                found.append(node.module)
    return found


def outside_support(module: str) -> bool:
    return module != "tests.support" and not module.startswith("tests.support.")


@pytest.mark.slow
def test_tests_and_benchmarks_import_no_test_module_only_tests_support() -> None:
    files = sorted(REPO_ROOT.glob("tests/**/test_*.py")) + sorted(REPO_ROOT.glob("benchmarks/*.py"))
    files += sorted(REPO_ROOT.glob("tests/**/conftest.py")) + sorted(REPO_ROOT.glob("tests/support/*.py"))
    assert len(files) > 50  # the globs found the suite
    offending = {
        str(f.relative_to(REPO_ROOT)): bad
        for f in files
        if (bad := [m for m in imported_tests_modules(f) if outside_support(m)])
    }
    assert offending == {}


def test_the_check_sees_each_form_of_a_test_to_test_import(tmp_path: Path) -> None:
    source = tmp_path / "test_x.py"
    source.write_text(
        "import tests.test_cli\nfrom tests.loop.test_loop_run import latest\n"
        "from tests import test_evaluate\nfrom tests.support.loop import git\n"
        "def f():\n    from tests.loop import test_attribute\n",
        encoding="utf-8",
    )
    bad = [m for m in imported_tests_modules(source) if outside_support(m)]
    assert bad == ["tests.test_cli", "tests.loop.test_loop_run", "tests.test_evaluate", "tests.loop"]
