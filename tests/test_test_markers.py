"""The lanes' markers: `bash scripts/test` (CI) runs every test but those marked ``slow``; the confinement core
is marked ``boundary`` so that it always runs, however slow it is. A test marked both would silently leave
CI, so no test is, and the core stays where the docs say it is."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.support.paths import REPO_ROOT

# The confinement core (docs/development.md): a hostile harness judge, MCP client and optimiser agent, the
# label firewall and the held-out wall.
CORE = {
    "test_harness_sandbox.py": "test_a_hostile_judge_finds_no_label_no_workspace_no_other_key_and_writes_nothing",
    "test_mcp_refusals.py": "test_hostile_calls_are_refused_and_nothing_reaches_git_or_the_held_out_split",
    "test_loop_hostile_agent.py": "test_a_hostile_agent_is_refused_rejected_and_recorded_and_the_run_goes_on",
    "test_firewall.py": "test_judging_a_split_never_imports_or_opens_the_labels",
    "test_loop_run.py": "test_optimiser_never_sees_heldout_data_and_confirm_is_capped",
}


def marks(node: ast.AST) -> set[str]:
    """The ``pytest.mark.X`` names on a decorator list or in a ``pytestmark = ...`` value."""
    return {
        n.attr
        for n in ast.walk(node)
        if isinstance(n, ast.Attribute)
        and isinstance(n.value, ast.Attribute)
        and n.value.attr == "mark"
        and isinstance(n.value.value, ast.Name)
        and n.value.value.id == "pytest"
    }


def marks_of(path: Path) -> dict[str, set[str]]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    module = set().union(
        *(
            marks(n.value)
            for n in tree.body
            if isinstance(n, ast.Assign) and any(getattr(t, "id", "") == "pytestmark" for t in n.targets)
        )
    )
    found: dict[str, set[str]] = {}
    for n in ast.walk(tree):
        if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) and n.name.startswith("test_"):
            found[n.name] = module | set().union(*(marks(d) for d in n.decorator_list))
    return found


def all_marks() -> dict[tuple[str, str], set[str]]:
    return {
        (path.name, name): found
        for path in sorted((REPO_ROOT / "tests").rglob("test_*.py"))
        for name, found in marks_of(path).items()
    }


def test_no_test_is_both_slow_and_boundary() -> None:
    both = [f"{file}::{name}" for (file, name), found in all_marks().items() if {"slow", "boundary"} <= found]
    assert both == []


def test_the_confinement_core_is_marked_boundary_so_ci_runs_it() -> None:
    found = all_marks()
    for file, name in CORE.items():
        assert "boundary" in found[(file, name)], f"{file}::{name}"


def test_the_reader_sees_a_function_mark_and_a_module_mark(tmp_path: Path) -> None:
    path = tmp_path / "test_x.py"
    path.write_text(
        "import pytest\npytestmark = [pytest.mark.slow]\n\n@pytest.mark.boundary\ndef test_a():\n    assert 1\n",
        encoding="utf-8",
    )
    assert marks_of(path) == {"test_a": {"slow", "boundary"}}
