"""Editing ``judgeloop.toml`` as a user would: `set_config` changes a few keys, keeps every comment and
the layout, validates the result before writing it, and commits it alone in the workspace's git
(the loop refuses a tree with uncommitted changes outside its own files)."""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from pathlib import Path

import tomlkit
from pydantic import ValidationError
from tomlkit.exceptions import TOMLKitError
from tomlkit.items import InlineTable, Item, Table

from optimizer.errors import UserError, first_error
from optimizer.workspace.config import Config
from optimizer.workspace.workspace import CONFIG_NAME, JUDGELOOP_ACTOR, repo_at

Scalar = str | int | float | bool


def edited_config(text: str, values: Mapping[tuple[str, str], Scalar]) -> str:
    """``text`` (a judgeloop.toml) with each ``(section, key)`` of ``values`` set, comments and layout kept.

    A missing section is appended, a missing key added to its section. The result must still be a
    valid configuration (unknown keys and out-of-range values are refused in one line, as when
    judgeloop reads the file)."""
    try:
        doc = tomlkit.parse(text)
    except TOMLKitError as exc:
        raise UserError(f"{CONFIG_NAME} is not valid TOML ({exc}); fix the file and retry") from None
    for (section, key), value in values.items():
        table = doc.get(section)
        if table is None:
            table = tomlkit.table()
            doc.add(section, table)
        elif not isinstance(table, Table | InlineTable):
            raise UserError(f"{CONFIG_NAME}: [{section}] is not a table; fix the file and retry")
        item = table.get(key)
        current = item.unwrap() if isinstance(item, Item) else item
        if isinstance(current, dict | list):
            raise UserError(f"{CONFIG_NAME}: [{section}] {key} is not a single value; fix the file and retry")
        if current != value or type(current) is not type(value):
            table[key] = value
            replaced = table.get(key)
            if isinstance(item, Item) and isinstance(replaced, Item) and item.trivia.comment:
                # The comment stays in its column (the default file aligns them).
                width = len(item.trivia.comment_ws) + len(item.as_string()) - len(replaced.as_string())
                replaced.trivia.comment_ws = " " * max(1, width)
    result = tomlkit.dumps(doc)
    try:
        Config.model_validate(tomllib.loads(result))
    except tomllib.TOMLDecodeError as exc:  # tomlkit accepted what the reader refuses
        raise UserError(
            f"{CONFIG_NAME} would not be valid TOML after the edit ({exc}); fix the file and retry"
        ) from None
    except ValidationError as exc:
        first = first_error(exc)
        raise UserError(f"{CONFIG_NAME}: [{first.loc}] {first.reason}; the file was not changed") from None
    return result


def set_config(root: Path, values: Mapping[tuple[str, str], Scalar], *, message: str) -> str | None:
    """Set ``values`` in ``root``'s judgeloop.toml and commit that file alone with ``message``.

    Returns the new commit's sha, or None when every value was already set (nothing written). Refuses,
    before writing, a judgeloop.toml with uncommitted changes (they would be committed unseen) or one
    that is not a regular file."""
    path = root / CONFIG_NAME
    if path.is_symlink() or not path.is_file():
        raise UserError(f"{path} is not a regular file; the configuration must be a plain judgeloop.toml")
    with repo_at(root) as repo:
        if repo.git.status("--porcelain=v1", "--", CONFIG_NAME):
            raise UserError(f"{path} has uncommitted changes; commit or discard them first")
        text = path.read_text(encoding="utf-8")
        new = edited_config(text, values)
        if new == text:
            return None
        tmp = path.with_name(f".{CONFIG_NAME}.tmp")
        tmp.write_text(new, encoding="utf-8")
        os.replace(tmp, path)
        repo.git.add("--", CONFIG_NAME)
        # Only the config goes into this commit, whatever else is staged.
        repo.git.commit(
            "-m",
            message,
            "--only",
            "--",
            CONFIG_NAME,
            author=f"{JUDGELOOP_ACTOR.name} <{JUDGELOOP_ACTOR.email}>",
        )
        return str(repo.head.commit.hexsha)
