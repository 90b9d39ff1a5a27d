"""``judgeloop.toml``: the file `judgeloop init` writes is the default configuration, key for key."""

from __future__ import annotations

from pathlib import Path

from optimizer.workspace.config import DEFAULT_CONFIG_TOML, Config, load_config


def test_the_default_judgeloop_toml_parses_to_the_default_config(tmp_path: Path) -> None:
    path = tmp_path / "judgeloop.toml"
    path.write_text(DEFAULT_CONFIG_TOML, encoding="utf-8")
    assert load_config(path) == Config()
