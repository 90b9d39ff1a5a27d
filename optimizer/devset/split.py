"""An imported split as judge input: manifest order, trajectories, Markdown and screenshots.

Judge-input side. A `Split` never reads labels: `optimizer.devset.labels` is the only reader of a
split's labels, and nothing that builds judge input may import it (an import-linter contract in
pyproject.toml; tests/test_firewall.py proves it at run time).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path, PurePosixPath
from typing import Any

from pydantic import ValidationError

from optimizer.devset.markdown import action_string, timestamp_ms_text
from optimizer.errors import UserError
from optimizer.models import Step, Trajectory
from optimizer.workspace import Workspace

SPLIT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
MD_IMAGE = re.compile(r"!\[[^\]]*\]\(([^)\s]+)\)")





# --------------------------------------------------------------------------------------------
# Labels




def first_error(exc: ValidationError) -> str:
    errors = exc.errors()
    first = errors[0]
    loc = ".".join(str(part) for part in first["loc"]) or "row"
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return f"{loc}: {first['msg']}{more}"










# --------------------------------------------------------------------------------------------
# Manifests


def read_manifest(path: Path) -> list[str]:
    """Trajectory ids, one per line, in file order; ``#`` starts a comment; blank lines are skipped."""
    if not path.is_file():
        raise UserError(f"manifest {path} does not exist; pass a file with one trajectory id per line")
    ids: list[str] = []
    first_line: dict[str, int] = {}
    for lineno, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), start=1):
        tid = line.split("#", 1)[0].strip()
        if not tid:
            continue
        if any(ch.isspace() for ch in tid):
            raise UserError(
                f"{path}:{lineno}: more than one word on the line; write one trajectory id per line"
            )
        if tid in first_line:
            raise UserError(
                f"{path}:{lineno}: id {tid} is listed twice (first at line {first_line[tid]}); remove one of the lines"
            )
        first_line[tid] = lineno
        ids.append(tid)
    if not ids:
        raise UserError(f"manifest {path} lists no trajectory ids; write one id per line")
    return ids


# --------------------------------------------------------------------------------------------
# Screenshot links


def is_remote(link: str) -> bool:
    return "://" in link or link.startswith("data:")


def local_relpath(link: str) -> PurePosixPath | None:
    """The link as a clean path relative to the sandbox root, or None (URL, absolute, escaping)."""
    if is_remote(link):
        return None
    path = PurePosixPath(link.replace("\\", "/"))
    if path.is_absolute():
        return None
    parts = [part for part in path.parts if part != "."]
    if not parts or ".." in parts or parts[0].endswith(":"):
        return None
    return PurePosixPath(*parts)


def canonical_screenshot_link(recording_id: str, step_id: int) -> str:
    """The blind projection's link: ``./data/media/images/<recording_id>/step_<step_id+1>.png``."""
    return f"./data/media/images/{recording_id}/step_{step_id + 1}.png"


def resolve_link(sandbox_root: Path, link: str) -> Path | None:
    if is_remote(link):
        return None
    path = Path(link)
    if path.is_absolute():
        return path
    return Path(os.path.normpath(sandbox_root / link))


# --------------------------------------------------------------------------------------------
# Splits


class Split:
    """An imported split: manifest order, judge input files and screenshots. Never reads labels."""

    def __init__(self, name: str, root: Path, ids: list[str], fingerprint: str) -> None:
        self.name = name
        self.root = root
        self.ids = ids
        self.fingerprint = fingerprint
        self._members = frozenset(ids)

    def __repr__(self) -> str:
        return f"Split(name={self.name!r}, items={len(self.ids)}, fingerprint={self.fingerprint[:12]!r})"

    @property
    def sandbox_root(self) -> Path:
        """The folder holding ``data/``; screenshot links are relative to it."""
        return self.root / "sandbox"

    def markdown_path(self, tid: str) -> Path:
        return self.sandbox_root / "data" / "markdowns" / f"{tid}.md"

    def json_path(self, tid: str) -> Path:
        return self.sandbox_root / "data" / "jsons" / f"{tid}.json"

    def _member(self, tid: str) -> None:
        if tid not in self._members:
            raise UserError(
                f"{tid} is not an item of split {self.name!r}; see its manifest {self.root / 'manifest.txt'}"
            )

    def trajectory(self, tid: str) -> Trajectory:
        """The item's trajectory, validated (UserError naming the file when missing or invalid)."""
        self._member(tid)
        path = self.json_path(tid)
        if not path.is_file():
            raise UserError(
                f"{path} is missing; run `judgeloop devset verify {self.name}` and re-import the split"
            )
        try:
            # Python's json, as the official renderer reads it (pydantic's parser differs at the edges).
            return Trajectory.model_validate(json.loads(path.read_bytes()))
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise UserError(f"{path}: not valid JSON ({exc}); re-import the split from its source") from None
        except ValidationError as exc:
            raise UserError(f"{path}: {first_error(exc)}; re-import the split from its source") from None

    def markdown_text(self, tid: str) -> str:
        """The item's Markdown as stored (the release text, or rendered from JSON at import)."""
        self._member(tid)
        path = self.markdown_path(tid)
        if not path.is_file():
            raise UserError(
                f"{path} is missing; run `judgeloop devset verify {self.name}` and re-import the split"
            )
        return path.read_text(encoding="utf-8")

    def screenshot_file(self, step: Step) -> Path | None:
        """The step's screenshot resolved against the sandbox root; None when null or a URL."""
        if step.screenshot is None:
            return None
        return resolve_link(self.sandbox_root, step.screenshot)


def list_splits(ws: Workspace) -> list[str]:
    """Names of the workspace's splits (folders of ``devset/`` holding ``split.json``), sorted."""
    if not ws.devset_dir.is_dir():
        return []
    return sorted(
        p.name
        for p in ws.devset_dir.iterdir()
        if p.is_dir() and not p.name.startswith(".") and (p / "split.json").is_file()
    )


def split_meta(root: Path) -> dict[str, Any]:
    path = root / "split.json"
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise UserError(f"{path} is unreadable ({exc}); re-import the split") from None
    if not isinstance(meta, dict) or not isinstance(meta.get("fingerprint"), str):
        raise UserError(f"{path} has no fingerprint; re-import the split")
    return meta


def open_split(ws: Workspace, name: str) -> Split:
    """Open ``devset/NAME``; an unknown name is refused with the list of known splits."""
    root = ws.split_dir(name)
    if not SPLIT_NAME.match(name) or not (root / "split.json").is_file():
        known = ", ".join(list_splits(ws)) or "none"
        raise UserError(
            f"no split named {name!r} in {ws.devset_dir} (known: {known}); "
            f"import one with `judgeloop devset import SRC --name {name} --manifest FILE`"
        )
    meta = split_meta(root)
    ids = read_manifest(root / "manifest.txt")
    return Split(name=name, root=root, ids=ids, fingerprint=meta["fingerprint"])




# --------------------------------------------------------------------------------------------
# Reading a source folder


















# --------------------------------------------------------------------------------------------
# AH-D reconstruction






# --------------------------------------------------------------------------------------------
# Import








# --------------------------------------------------------------------------------------------
# Verify






# --------------------------------------------------------------------------------------------
# Command handlers










def format_trajectory(split: Split, tid: str) -> str:
    """One trajectory as a person reads it: goal, then each step's action, thought and screenshot.

    Shows no label (this text is safe to put in front of a reviewer or a judge).
    """
    traj = split.trajectory(tid)
    lines = [f"trajectory {traj.trajectory_id}  (split {split.name}, {len(traj.steps)} steps)", ""]
    lines.append("Goal:")
    lines.extend(f"  {line}" for line in traj.task.instruction.strip().splitlines())
    if traj.task.applications:
        lines.append(f"Applications: {', '.join(traj.task.applications)}")
    env = traj.environment
    if env is not None and (env.os or env.screen_resolution):
        res = "x".join(str(v) for v in env.screen_resolution) if env.screen_resolution else "unknown size"
        lines.append(f"Environment: {env.os or 'unknown os'}, {res}")
    for step in traj.steps:
        lines.append("")
        ms = timestamp_ms_text(step.timestamp_us)
        when = f"  at {ms} ms" if ms is not None else ""
        lines.append(f"Step {step.step_id}{when}")
        lines.append(f"  action: {action_string(step.action)}")
        if step.thought:
            lines.append(f"  thought: {step.thought.strip()}")
        if step.action_description:
            lines.append(f"  description: {step.action_description.strip()}")
        shot = split.screenshot_file(step)
        if step.screenshot is None:
            lines.append("  screenshot: none recorded")
        elif shot is None:
            lines.append(f"  screenshot: {step.screenshot} (remote)")
        else:
            lines.append(f"  screenshot: {shot}{'' if shot.is_file() else '  [missing]'}")
    return "\n".join(lines) + "\n"




