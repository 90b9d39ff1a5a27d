"""The import contracts in pyproject.toml are total: every module under optimizer/ sits in a floor of a
layers contract, so a new module is checked from the day it exists (`lint-imports` checks the
contracts themselves; this checks that they leave nothing out)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]


def _contracts() -> list[dict[str, Any]]:
    config = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    contracts: list[dict[str, Any]] = config["tool"]["importlinter"]["contracts"]
    return contracts


def _modules(package: str) -> set[str]:
    """Every module of ``package`` on disk, packages included (``a.b`` for ``a/b/__init__.py``)."""
    found = set()
    for path in (REPO / package).rglob("*.py"):
        parts = path.relative_to(REPO).with_suffix("").parts
        found.add(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return found


def _layer_modules(contract: dict[str, Any]) -> set[str]:
    """The modules a layers contract names: each container's child for every name in every floor."""
    tails = {name.strip("() ") for layer in contract["layers"] for name in re.split(r"[|:]", layer)}
    containers = contract.get("containers", [""])
    return {f"{container}.{tail}" if container else tail for container in containers for tail in tails}


def _placed(module: str, named: set[str]) -> bool:
    return any(module == name or module.startswith(name + ".") for name in named)


def test_every_engine_module_sits_in_a_floor_of_an_exhaustive_layers_contract() -> None:
    exhaustive = [c for c in _contracts() if c["type"] == "layers" and c.get("exhaustive")]
    top = [c for c in exhaustive if c.get("containers") == ["optimizer"]]
    assert top, "no exhaustive layers contract over optimizer's children"
    named = set().union(*(_layer_modules(c) for c in exhaustive))
    unplaced = sorted(m for m in _modules("optimizer") if m != "optimizer" and not _placed(m, named))
    assert unplaced == []


def test_the_engine_library_contract_covers_every_floor_but_the_cli() -> None:
    (floors,) = [c for c in _contracts() if c["type"] == "layers" and c.get("containers") == ["optimizer"]]
    (library,) = [c for c in _contracts() if "tui" in c.get("forbidden_modules", [])]
    engine = _layer_modules(floors) - {"optimizer.cli"}
    assert set(library["source_modules"]) == engine
    assert {"optimizer.cli", "tui", "textual", "argparse"} <= set(library["forbidden_modules"])


def test_the_label_firewall_holds_the_judge_and_evaluation_packages_whole() -> None:
    firewall = [c for c in _contracts() if "optimizer.devset.labels" in c.get("forbidden_modules", [])]
    sources = {s for c in firewall for s in c["source_modules"]}
    # Whole packages, so a new module in them is inside the firewall without being named.
    assert {"optimizer.judge", "optimizer.evaluation"} <= sources


def test_the_judge_package_may_import_no_devset_module_that_reads_labels() -> None:
    """The memory's pair-aware folds live in the judge package: every devset module that reads a label file
    (where the release records pairs) is forbidden to it, so folds can only come from judge input."""
    (judge,) = [c for c in _contracts() if c.get("source_modules") == ["optimizer.judge"]]
    readers = {
        ".".join(path.relative_to(REPO).with_suffix("").parts)
        for path in (REPO / "optimizer" / "devset").glob("*.py")
        if path.name != "__init__.py"
        and re.search(r"(?m)^\s*from optimizer\.devset\.labels import|^\s*def load_labels", path.read_text())
    }
    assert "optimizer.devset.heldout" in readers
    assert readers <= set(judge["forbidden_modules"])


@pytest.mark.slow
def test_no_two_project_modules_import_each_other() -> None:
    """No import cycle between modules of optimizer/ and tui/, function-level and type-only imports
    included (criteria <-> verdicts was one, held by a function-level import; the reply-decoding rule now
    lives in optimizer.judge.replies, which both import)."""
    from benchmarks.structure import import_cycles

    assert import_cycles(REPO) == []
