"""Editing ``judgeloop.toml`` (and ``prompts/judge.toml``) as a user would: `set_config` changes a few
keys, keeps every comment and the layout, validates the result before writing it, and commits it alone
in the workspace's git (the loop refuses a tree with uncommitted changes outside its own files);
`set_judge_settings` does the same for the judge's settings file."""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Callable, Mapping
from pathlib import Path

import tomlkit
from pydantic import ValidationError
from tomlkit.exceptions import TOMLKitError
from tomlkit.items import InlineTable, Item, Table

from optimizer.errors import UserError, first_error
from optimizer.judge.prompts import parse_settings
from optimizer.structure import current_value, set_key
from optimizer.workspace.config import Config
from optimizer.workspace.paths import JUDGE_TOML
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
    return _edit_and_commit(root, CONFIG_NAME, lambda text: edited_config(text, values), message)


def edited_judge_settings(text: str, values: Mapping[str, Scalar]) -> str:
    """``text`` (a prompts/judge.toml) with each top-level key of ``values`` set, comments kept.

    A key's own line is rewritten; a key that is only present as a comment (``# temperature = 0.0``)
    is written where that comment stands. The result must still read as judge settings."""
    lines = text.splitlines()
    for key, value in values.items():
        commented = re.compile(rf"^#\s*{re.escape(key)}\s*=")
        at = next((i for i, line in enumerate(lines) if commented.match(line)), None)
        if at is not None and current_value("\n".join(lines) + "\n", key) is None:
            lines[at] = f"{key} = {tomlkit.item(value).as_string()}"
        else:
            try:
                lines = set_key("\n".join(lines) + "\n", key, value).splitlines()
            except ValueError:
                raise UserError(f"{JUDGE_TOML}: {key} could not be set; fix the file and retry") from None
    result = "\n".join(lines) + "\n"
    parse_settings(result, JUDGE_TOML)  # one line naming the key when a value is refused
    return result


def set_judge_settings(root: Path, values: Mapping[str, Scalar], *, message: str) -> str | None:
    """Set top-level ``values`` in ``root``'s prompts/judge.toml and commit that file alone with ``message``.

    The same contract as `set_config`: None when nothing changed; uncommitted changes to the file or a
    file that is not a regular one are refused before anything is written."""
    return _edit_and_commit(root, JUDGE_TOML, lambda text: edited_judge_settings(text, values), message)


def _edit_and_commit(root: Path, rel: str, edit: Callable[[str], str], message: str) -> str | None:
    path = root / rel
    if path.is_symlink() or not path.is_file():
        raise UserError(f"{path} is not a regular file; the configuration must be a plain {path.name}")
    with repo_at(root) as repo:
        if repo.git.status("--porcelain=v1", "--", rel):
            raise UserError(f"{path} has uncommitted changes; commit or discard them first")
        text = path.read_text(encoding="utf-8")
        new = edit(text)
        if new == text:
            return None
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(new, encoding="utf-8")
        os.replace(tmp, path)
        repo.git.add("--", rel)
        # Only this file goes into the commit, whatever else is staged.
        repo.git.commit(
            "-m",
            message,
            "--only",
            "--",
            rel,
            author=f"{JUDGELOOP_ACTOR.name} <{JUDGELOOP_ACTOR.email}>",
        )
        return str(repo.head.commit.hexsha)
