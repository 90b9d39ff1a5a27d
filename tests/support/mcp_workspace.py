"""The workspace the MCP tests drive (tests/test_mcp.py, tests/test_mcp_refusals.py): an ``init --sample``
workspace with the 32-item dev split ``small`` and a held-out split ``held``, and the helpers that read
its ledger and write its prompts."""

from __future__ import annotations

from pathlib import Path

from optimizer.devset.split import open_split
from optimizer.judge.prompts import LIBRARY_MD, RUBRIC_MD, parse_library
from optimizer.ledger import Experiment, Ledger, Run
from optimizer.workspace.workspace import Workspace
from tests.support.heldout import import_held
from tests.support.loop import add_small_dev_split, make_workspace

OLD = "## Decision rules"
CORRECTIONS = "devset/small/corrections.jsonl"


def make_mcp_template(parent: Path) -> Path:
    """A sample workspace under ``parent``: the 32-item dev split ``small`` and a held-out split ``held`` of
    4 other items."""
    root = make_workspace(parent)
    dev = add_small_dev_split(root)
    rest = [t for t in open_split(Workspace.open(root), "sample").ids if t not in dev][:4]
    import_held(root, rest)
    return root


def ledger_state(root: Path) -> tuple[list[Run], dict[str, list[Experiment]]]:
    with Ledger(root / "experiments" / "ledger.sqlite") as led:
        runs = led.runs()
        return runs, {r.id: led.experiments(r.id) for r in runs}


def rubric_with(root: Path, rule: str) -> str:
    text_ = (root / RUBRIC_MD).read_text(encoding="utf-8")
    assert OLD in text_
    return text_.replace(OLD, f"{OLD}\n\n- {rule}", 1)


def library_text(root: Path, entry: str) -> str:
    return {e.id: e.text for e in parse_library((root / LIBRARY_MD).read_text(encoding="utf-8"))}[entry]
