"""No module of the engine (``optimizer/``) or the TUI (``tui/``) uses another module's underscore names:
neither ``from optimizer.x import _name`` nor ``module._name`` through an imported project module. What
one module needs of another is public (renamed, or moved where it belongs); tests may use internals."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TREES = ("optimizer", "tui")


def _module(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_module(name: str) -> bool:
    base = REPO.joinpath(*name.split("."))
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def private_uses(path: Path, module: str | None = None) -> list[str]:
    """Every use in ``path`` (module ``module``, default its name in the repository) of another project
    module's underscore name, as ``line: what``."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    me = module or _module(path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    modules: set[str] = set()  # local names bound to a project module
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parts = parts[: len(parts) - (node.level - 1)]
                base = ".".join([*parts, base] if base else parts)
            if not base.startswith(TREES):
                continue
            for alias in node.names:
                if _is_module(f"{base}.{alias.name}"):
                    modules.add(alias.asname or alias.name)
                elif _private(alias.name) and base != me:
                    found.append(f"{node.lineno}: from {base} import {alias.name}")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith(TREES) and alias.asname:
                    modules.add(alias.asname)
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in modules
            and _private(node.attr)
        ):
            found.append(f"{node.lineno}: {node.value.id}.{node.attr}")
    return found


@pytest.mark.slow
def test_no_module_uses_another_modules_underscore_names() -> None:
    uses = {
        str(path.relative_to(REPO)): found
        for tree in TREES
        for path in sorted((REPO / tree).rglob("*.py"))
        if (found := private_uses(path))
    }
    assert uses == {}


def test_the_gate_sees_both_forms(tmp_path: Path) -> None:
    """The check itself: an underscore name imported from, or read off, another project module is found."""
    probe = tmp_path / "probe.py"
    probe.write_text(
        "from optimizer.loop.records import _hidden\nfrom optimizer.loop import records\n"
        "from . import runner\nx = records._other + runner._loop\n",
        encoding="utf-8",
    )
    assert private_uses(probe, "optimizer.loop.probe") == [
        "1: from optimizer.loop.records import _hidden",
        "4: records._other",
        "4: runner._loop",
    ]
