"""Writing a workspace's ``judgeloop.toml`` from the project's config model, for tests.

Tests change the config through `optimizer.workspace.config.Config` (``model_copy``) and write it whole with
`write_config`, instead of editing the TOML text: a renamed key or section then fails loudly here.
There is no TOML writer among the dependencies; `dumps_toml` covers what a `Config` holds (tables of
strings, numbers, booleans and lists of those, nested tables such as ``[prices."<model>"]``).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from optimizer.workspace.config import Config, load_config
from optimizer.workspace.workspace import CONFIG_NAME
from tests.support.paths import REPO_ROOT

_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")


def _key(key: str) -> str:
    return key if _BARE_KEY.fullmatch(key) else json.dumps(key)


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"no TOML for {value!r} in a config")
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # a JSON string is a TOML basic string
    if isinstance(value, list):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    raise TypeError(f"no TOML for {type(value).__name__} values")


def dumps_toml(data: Mapping[str, Any]) -> str:
    """TOML text for ``data``: scalars first, then one ``[table]`` per nested mapping (None is left out)."""
    lines: list[str] = []

    def table(path: list[str], values: Mapping[str, Any]) -> None:
        scalars = {k: v for k, v in values.items() if v is not None and not isinstance(v, Mapping)}
        if path and (scalars or not any(isinstance(v, Mapping) for v in values.values())):
            lines.append(f"\n[{'.'.join(_key(p) for p in path)}]")
        lines.extend(f"{_key(k)} = {_value(v)}" for k, v in scalars.items())
        for k, v in values.items():
            if isinstance(v, Mapping):
                table([*path, k], v)

    table([], data)
    return "\n".join(lines).lstrip("\n") + "\n"


def write_config(ws_root: Path, config: Config) -> Path:
    """Write ``config`` as the workspace's ``judgeloop.toml``; checks it reads back as the same config."""
    path = Path(ws_root) / CONFIG_NAME
    path.write_text(dumps_toml(config.model_dump(mode="json")), encoding="utf-8")
    assert load_config(path) == config, "the written judgeloop.toml does not read back as the config"
    return path


def with_layout(judge_toml: str, layout: str) -> str:
    """``judge_toml`` text with its ``layout`` key set to ``layout`` (added when absent)."""
    line = f'layout = "{layout}"'
    if re.search(r"(?m)^layout\s*=", judge_toml):
        return re.sub(r"(?m)^layout\s*=.*$", line, judge_toml)
    return line + "\n" + judge_toml


def bundled_prompts(layout: str = "rubric-first") -> Any:
    """The bundled prompts (``prompts/`` of this checkout) as a `PromptSet` with ``layout`` set."""
    from optimizer.judge.prompts import JUDGE_TOML, PromptSet

    folder = REPO_ROOT / "prompts"
    files = {f"prompts/{p.name}": p.read_text(encoding="utf-8") for p in folder.iterdir() if p.is_file()}
    files[JUDGE_TOML] = with_layout(files[JUDGE_TOML], layout)
    return PromptSet.from_files(files, source=str(folder))
