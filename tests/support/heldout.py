"""Held-out splits for tests: import part of the bundled sample as split ``held`` and list it as held out."""

from __future__ import annotations

from pathlib import Path

from optimizer.cli import main
from optimizer.scaffold import bundled_dir
from tests.support.loop import commit_all, set_toml_key


def import_held(root: Path, ids: list[str], *, hold_out: bool = True) -> None:
    """Import ``ids`` of the bundled sample as split ``held`` (and list it as held out, committed)."""
    manifest = root / "held.txt"
    manifest.write_text("\n".join(ids) + "\n", encoding="utf-8")
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
    if hold_out:
        list_held_out(root, "held")


def list_held_out(root: Path, split: str, message: str = "held-out split") -> None:
    """List ``split`` (alone) under [workspace] heldout_splits and commit it with ``message``."""
    set_toml_key(root, "workspace", "heldout_splits", f'["{split}"]')
    commit_all(root, message)
