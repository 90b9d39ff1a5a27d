"""An imported split as judge input: manifest order, trajectories, Markdown and screenshots.

Judge-input side. A `Split` never reads labels: `optimizer.devset.labels` is the only reader of a
split's labels, and nothing that builds judge input may import it (an import-linter contract in
pyproject.toml; tests/test_firewall.py proves it at run time).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from optimizer.devset.ids import OutsideError, check_id, inside, is_remote, relative_link
from optimizer.devset.markdown import action_string, timestamp_ms_text
from optimizer.errors import UserError, first_error
from optimizer.models import Step, Trajectory
from optimizer.workspace.workspace import Workspace

SPLIT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
MD_IMAGE = re.compile(r"!\[[^\]]*\]\(([^)\s]+)\)")


# --------------------------------------------------------------------------------------------
# Labels


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
        # An id names the item's files: one with '/' or '..' would be a path out of the split.
        check_id(tid, "trajectory id", f"{path}:{lineno}", "fix that line of the manifest")
        first_line[tid] = lineno
        ids.append(tid)
    if not ids:
        raise UserError(f"manifest {path} lists no trajectory ids; write one id per line")
    return ids


# --------------------------------------------------------------------------------------------
# Screenshot links


def canonical_screenshot_link(recording_id: str, step_id: int) -> str:
    """The blind projection's link: ``./data/media/images/<recording_id>/step_<step_id+1>.png``."""
    return f"./data/media/images/{recording_id}/step_{step_id + 1}.png"


# --------------------------------------------------------------------------------------------
# Splits


class Split:
    """An imported split: manifest order, judge input files and screenshots. Never reads labels."""

    def __init__(
        self, name: str, root: Path, ids: list[str], fingerprint: str, linked_to: Path | None = None
    ) -> None:
        self.name = name
        self.root = root
        self.ids = ids
        self.fingerprint = fingerprint
        self.linked_to = linked_to  # the release `import --link` symlinked the screenshots to
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

    def _item_file(self, path: Path) -> Path:
        """An item's JSON or Markdown file, resolved; UserError when missing or leading outside the split."""
        try:
            resolved = inside(self.sandbox_root, path.relative_to(self.sandbox_root).as_posix())
        except OutsideError as exc:
            raise UserError(
                f"{path} is not a file of split {self.name!r} ({exc}); re-import the split"
            ) from None
        if not resolved.is_file():
            raise UserError(
                f"{path} is missing; run `judgeloop devset verify {self.name}` and re-import the split"
            )
        return resolved

    def trajectory(self, tid: str) -> Trajectory:
        """The item's trajectory, validated (UserError naming the file when missing or invalid, or
        when a step links a screenshot outside the split)."""
        self._member(tid)
        path = self.json_path(tid)
        data = self._item_file(path).read_bytes()
        try:
            # Python's json, as the official renderer reads it (pydantic's parser differs at the edges).
            traj = Trajectory.model_validate(json.loads(data))
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise UserError(f"{path}: not valid JSON ({exc}); re-import the split from its source") from None
        except ValidationError as exc:
            raise UserError(
                f"{path}: {first_error(exc).line()}; re-import the split from its source"
            ) from None
        for step in traj.steps:
            problem = self.link_problem(step.screenshot)
            if problem is not None:
                raise UserError(f"{path}: step {step.step_id} {problem}; re-import the split from its source")
        return traj

    def markdown_text(self, tid: str) -> str:
        """The item's Markdown as stored (the release text, or rendered from JSON at import)."""
        self._member(tid)
        return self._item_file(self.markdown_path(tid)).read_text(encoding="utf-8")

    def link_problem(self, link: str | None) -> str | None:
        """Why a stored screenshot link is refused (``"links the screenshot X, outside split S"``), or None.
        Lexical (no file is touched): `screenshot_file` resolves."""
        if not link or is_remote(link):
            return None
        try:
            relative_link(link)
        except OutsideError:
            return f"links the screenshot {link!r}, outside split {self.name!r}"
        return None

    def link_file(self, link: str | None) -> Path | None:
        """A stored screenshot link as a file of the split, resolved (symlinks followed); None when
        null, empty or a URL; OutsideError when it leads outside the split's sandbox (or, for a split
        imported with ``--link``, outside the release it links to)."""
        if not link or is_remote(link):
            return None
        return inside(self.sandbox_root, link, also=self.linked_to)

    def screenshot_file(self, step: Step) -> Path | None:
        """The step's screenshot file, resolved and checked by `link_file` (UserError naming the step
        when it leads outside the split); None when null or a URL."""
        try:
            return self.link_file(step.screenshot)
        except OutsideError as exc:
            raise UserError(
                f"split {self.name!r}: the screenshot of step {step.step_id} {exc}; re-import the split from its source"
            ) from None


def list_splits(ws: Workspace) -> list[str]:
    """Names of the workspace's splits (folders of ``devset/`` holding ``split.json``), sorted."""
    if not ws.devset_dir.is_dir():
        return []
    return sorted(
        p.name
        for p in ws.devset_dir.iterdir()
        if p.is_dir() and not p.name.startswith(".") and (p / "split.json").is_file()
    )


@dataclass(frozen=True)
class SplitMeta:
    """A split's ``split.json``: its fingerprint, and what the import recorded (None where a file
    written by an older import, or edited by hand, does not say). ``counts`` is the label counts'
    JSON as written: `optimizer.devset.labels.LabelCounts.from_json` reads it (this module stays on
    the judge-input side of the label firewall)."""

    fingerprint: str
    name: str | None = None
    source: str | None = None
    created: str | None = None
    counts: dict[str, Any] | None = None
    method: str | None = None
    screenshots: str | None = None  # "linked" or "copied"
    format: str | None = (
        None  # the benchmark's format (optimizer.devset.formats); None: AgentHorizon, imported before formats
    )

    @property
    def benchmark(self) -> str:
        """The format the split was imported from ("agenthorizon" when split.json does not say)."""
        return self.format or "agenthorizon"


def split_meta(root: Path) -> SplitMeta:
    """The `SplitMeta` of the split at ``root``; UserError when its ``split.json`` is unreadable or
    has no fingerprint."""
    path = root / "split.json"
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise UserError(f"{path} is unreadable ({exc}); re-import the split") from None
    if not isinstance(meta, dict) or not isinstance(meta.get("fingerprint"), str):
        raise UserError(f"{path} has no fingerprint; re-import the split")

    def text(key: str) -> str | None:
        value = meta.get(key)
        return value if isinstance(value, str) else None

    counts = meta.get("counts")
    return SplitMeta(
        fingerprint=meta["fingerprint"],
        name=text("name"),
        source=text("source"),
        created=text("created"),
        counts=counts if isinstance(counts, dict) else None,
        method=text("method"),
        screenshots=text("screenshots"),
        format=text("format"),
    )


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
    linked = Path(meta.source) if meta.screenshots == "linked" and meta.source is not None else None
    return Split(name=name, root=root, ids=ids, fingerprint=meta.fingerprint, linked_to=linked)


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
        if not step.screenshot:
            lines.append("  screenshot: none recorded")
        elif shot is None:
            lines.append(f"  screenshot: {step.screenshot} (remote)")
        else:
            lines.append(f"  screenshot: {shot}{'' if shot.is_file() else '  [missing]'}")
    return "\n".join(lines) + "\n"
