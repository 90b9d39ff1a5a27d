"""The workspace the MCP tests drive (tests/test_mcp.py, tests/test_mcp_refusals.py): an ``init --sample``
workspace with the 32-item dev split ``small`` and a held-out split ``held``, and the helpers that read
its ledger and write its prompts."""

from __future__ import annotations

from pathlib import Path

from optimizer.cli import main
from optimizer.devset.split import open_split
from optimizer.judge.prompts import LIBRARY_MD, RUBRIC_MD, parse_library
from optimizer.ledger import Experiment, Ledger, Run
from optimizer.scaffold import bundled_dir
from optimizer.workspace.workspace import Workspace
from tests.support.loop import add_small_dev_split, commit_all, make_workspace, set_toml_key

OLD = "## Decision rules"
CORRECTIONS = "devset/small/corrections.jsonl"


def make_mcp_template(parent: Path) -> Path:
    """A sample workspace under ``parent``: the 32-item dev split ``small`` and a held-out split ``held`` of
    4 other items."""
    root = make_workspace(parent)
    dev = add_small_dev_split(root)
    rest = [t for t in open_split(Workspace.open(root), "sample").ids if t not in dev][:4]
    manifest = root / "held.txt"
    manifest.write_text("\n".join(rest) + "\n", encoding="utf-8")
    assert (
        main(
            [
                "devset",
                "import",
                str(bundled_dir() / "devset" / "sample"),
                "-w",
                str(root),
                "--name",
                "held",
                "--manifest",
                str(manifest),
                "--link",
            ]
        )
        == 0
    )
    manifest.unlink()
    set_toml_key(root, "workspace", "heldout_splits", '["held"]')
    commit_all(root, "held-out split")
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
