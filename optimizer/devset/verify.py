"""`verify_split`: is every item of a split complete and consistent?

Complete: a label, JSON, Markdown and every screenshot they link. Consistent: each Markdown file is
byte for byte the rendering of its JSON (``optimizer.devset.markdown``, identical with the official
AgentHorizon renderer), so the text a judge reads is the trajectory the JSON holds.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError

from optimizer.devset.corrections import read_corrections
from optimizer.devset.ids import OutsideError, inside, is_remote, relative_link
from optimizer.devset.labels import LabelCounts, count_labels, fingerprint, read_label_file
from optimizer.devset.markdown import first_differing_line, render_markdown
from optimizer.devset.split import MD_IMAGE, Split
from optimizer.errors import UserError, first_error
from optimizer.models import Label, Trajectory
from optimizer.workspace.paths import LABELS_FILE


@dataclass
class VerifyReport:
    """What `verify_split` found: counts over the manifest's labels and every problem, one line each."""

    name: str
    fingerprint: str
    counts: LabelCounts
    problems: list[str]

    @property
    def ok(self) -> bool:
        return not self.problems


def verify_split(split: Split) -> VerifyReport:
    """Check every manifest item has a label, Markdown, JSON and every screenshot it links.

    Problems name the file (relative to the workspace), e.g. ``devset/x/labels.jsonl:3: not valid
    JSON``; a Markdown file that is not the rendering of its JSON is named with the first differing
    line; the fingerprint in ``split.json`` is also checked against the labels.
    """
    base = split.root.parent.parent

    def show(path: Path) -> str:
        try:
            return str(path.relative_to(base))
        except ValueError:
            return str(path)

    problems: list[str] = []
    labels_path = split.root / LABELS_FILE
    by_id: dict[str, Label] = {}
    if labels_path.is_file():
        rows, label_problems = read_label_file(labels_path, display=show(labels_path))
        problems.extend(label_problems)
        first_line: dict[str, int] = {}
        for row in rows:
            tid = row.label.trajectory_id
            if tid in first_line:
                problems.append(
                    f"{show(labels_path)}:{row.line}: id {tid} is already labelled at line {first_line[tid]}"
                )
                continue
            first_line[tid] = row.line
            by_id[tid] = row.label
    else:
        problems.append(f"{show(labels_path)}: missing")

    def readable(path: Path) -> bool:
        """Is the item file there? One that is missing or resolves outside the split is a problem (never read)."""
        try:
            inside(split.sandbox_root, path.relative_to(split.sandbox_root).as_posix())
        except OutsideError as exc:
            problems.append(f"{show(path)}: {exc}; re-import the split")
            return False
        if not path.is_file():
            problems.append(f"{show(path)}: missing")
            return False
        return True

    missing_files: dict[Path, list[str]] = {}
    for tid in split.ids:
        if labels_path.is_file() and tid not in by_id:
            problems.append(f"{show(labels_path)}: no label for manifest item {tid}")
        md_path = split.markdown_path(tid)
        links: list[str] = []
        markdown: str | None = None
        if readable(md_path):
            markdown = md_path.read_bytes().decode("utf-8", errors="replace")
            links.extend(MD_IMAGE.findall(markdown))
        json_path = split.json_path(tid)
        if readable(json_path):
            try:
                # Python's json, as the official renderer reads it (pydantic's parser differs at the edges).
                traj = Trajectory.model_validate(json.loads(json_path.read_bytes()))
            except (json.JSONDecodeError, UnicodeDecodeError) as exc:
                problems.append(f"{show(json_path)}: not valid JSON ({exc})")
            except ValidationError as exc:
                problems.append(f"{show(json_path)}: {first_error(exc).line()}")
            else:
                if traj.trajectory_id != tid:
                    problems.append(f"{show(json_path)}: holds trajectory_id {traj.trajectory_id}, not {tid}")
                links.extend(step.screenshot for step in traj.steps if step.screenshot)
                line = None if markdown is None else first_differing_line(markdown, render_markdown(traj))
                if line is not None:
                    problems.append(
                        f"{show(md_path)}: differs from the rendering of its JSON at line {line}; re-import the split"
                    )
        for link in dict.fromkeys(links):
            if is_remote(link):
                problems.append(
                    f"{show(json_path)}: links the remote screenshot {link}; judgeloop needs local files"
                )
                continue
            try:
                target = split.link_file(link)
            except OutsideError as exc:
                problems.append(
                    f"{show(json_path)}: the screenshot {exc}; re-import the split from its source"
                )
                continue
            if target is not None and not target.is_file():
                # Named as the split's own path (a --link import's target may be elsewhere).
                missing_files.setdefault(split.sandbox_root / relative_link(link), []).append(tid)
    for target, tids in missing_files.items():
        others = f" and {len(tids) - 1} more" if len(tids) > 1 else ""
        problems.append(f"{show(target)}: missing screenshot (linked by {tids[0]}{others})")

    present = [by_id[tid] for tid in split.ids if tid in by_id]
    if len(present) == len(split.ids) and fingerprint(present) != split.fingerprint:
        problems.append(
            f"{show(split.root / 'split.json')}: fingerprint {split.fingerprint[:12]} does not match the labels "
            f"({fingerprint(present)[:12]}); labels.jsonl changed since import — re-import the split"
        )
    if len(present) == len(split.ids):  # a person's corrections, checked as a run deciding with them would
        try:
            read_corrections(split, {lab.trajectory_id: lab for lab in present})
        except UserError as exc:
            problems.append(str(exc))
    return VerifyReport(split.name, split.fingerprint, count_labels(present), problems)
