"""The ``manual`` strategy: your own edit, judged like any optimiser's candidate.

``judgeloop run --strategy manual [-m "why"]`` takes the working-tree edits of the allowed prompt
files as one candidate: guards, commit, evaluation on the dev split against the incumbent, the
same kept / rolled-back decision, the same ledger and git audit trail. So a person iterating on a
judge prompt by hand gets the flip table and the McNemar p-value, not just a kappa, and every hand
edit is recorded next to the optimiser's.

`capture_edits` runs before the run starts: it copies the edited files to
``experiments/manual/<stamp>/`` (with the message), then resets them to HEAD so the run starts on
a clean tree. The copy is what the strategy proposes, so a crash or ``kill -9`` at any point loses
nothing (``--resume`` proposes it again); a rolled-back edit also stays under
``refs/judgeloop/rejected/<experiment-id>``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path

from optimizer.errors import UserError
from optimizer.loop.guards import JUDGE_TOML, check_protected
from optimizer.loop.strategies import Proposal, ProposalContext, ProposalError
from optimizer.structure import check_structure
from optimizer.workspace import gitops
from optimizer.workspace.paths import prompt_file_or_none, read_prompt_file, write_prompt_file

MESSAGE_FILE = "_message.json"


def capture_edits(
    root: Path,
    experiments_dir: Path,
    allowed_files: list[str],
    message: str | None,
    *,
    structure: tuple[Sequence[str], int] = ((), 1),
) -> Path:
    """Save the working tree's edits of ``allowed_files`` and reset those files to HEAD; return the folder.

    Refuses (one line each, the edit left in place) a tree with no edit of an allowed file, with changes
    elsewhere, with an edit of a protected region, or with an edit of prompts/judge.toml outside the
    structure moves (``structure``: ``[optimizer] structure_moves`` and ``max_members``): the guards
    would reject it only after the baseline.
    """
    dirty = gitops.dirty_paths(root)
    outside = [p for p in dirty if p not in allowed_files]
    if JUDGE_TOML in outside and not structure[0]:
        raise UserError(
            f"{JUDGE_TOML} is edited but [optimizer] structure_moves is empty (structure moves are "
            "off); undo that edit, or list the judge.toml keys you move in structure_moves"
        )
    if outside:
        raise UserError(
            f"the working tree has changes outside the loop's files ({', '.join(outside[:5])}); "
            "commit or discard them — --strategy manual takes edits of "
            f"{', '.join(allowed_files)} only"
        )
    edited = [p for p in allowed_files if p in dirty]
    if not edited:
        raise UserError(
            f"no edit to judge: change {' or '.join(allowed_files)} in the working tree first "
            "(--strategy manual evaluates your edit as one candidate)"
        )
    missing = [p for p in edited if not (root / p).is_file()]
    if missing:
        raise UserError(f"{missing[0]} was deleted; the loop edits allowed files, it never deletes them")
    texts = {path: read_prompt_file(root, path) or "" for path in edited}  # never through a link
    if JUDGE_TOML in texts:
        refused = check_structure(
            JUDGE_TOML, gitops.read_file_at(root, "HEAD", JUDGE_TOML), texts[JUDGE_TOML], *structure
        )
        if refused is not None:
            raise UserError(f"{refused}; a run never judges such an edit, so none was started")
    for path in edited:
        protected = check_protected(path, gitops.read_file_at(root, "HEAD", path) or "", texts[path])
        if not protected.ok:
            raise UserError(
                f"{protected.reason}; a run never judges such an edit, so none was started: undo that "
                f"part (`git diff {path}` shows it) and run again, or commit a change to protected text "
                "with git yourself first"
            )
    folder = experiments_dir / "manual" / time.strftime("%Y%m%d-%H%M%S")
    n = 1
    while folder.exists():
        n += 1
        folder = folder.with_name(f"{folder.name.split('.')[0]}.{n}")
    for path in edited:
        target = folder / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(texts[path], encoding="utf-8")
    (folder / MESSAGE_FILE).write_text(
        json.dumps({"files": edited, "message": message or ""}), encoding="utf-8"
    )
    gitops.restore_paths(root, edited)
    return folder


def restore_manual_edit(root: Path, folder: Path) -> tuple[list[str], list[str]]:
    """Put an edit saved by `capture_edits` back into the working tree, file by file, where the tree
    still holds the committed text (HEAD). Returns (files restored, files left alone because they
    changed since; the saved copy stays in ``folder`` either way)."""
    try:
        meta = json.loads((folder / MESSAGE_FILE).read_text(encoding="utf-8"))
        files = [str(p) for p in meta["files"]]
    except (OSError, ValueError, KeyError, TypeError):
        return [], []
    restored: list[str] = []
    kept_back: list[str] = []
    for path in files:
        name = prompt_file_or_none(path)
        saved = folder / path
        if name is None or not saved.is_file():
            continue
        text = saved.read_bytes().decode("utf-8", errors="replace")
        try:
            current = read_prompt_file(root, name)
        except UserError:
            kept_back.append(name)
            continue
        if current == text:
            restored.append(name)
        elif current == gitops.read_file_at(root, "HEAD", name):
            write_prompt_file(root, name, text)
            restored.append(name)
        else:
            kept_back.append(name)
    return restored, kept_back


class ManualStrategy:
    """Proposes the edit saved by `capture_edits` (the same edit every time it is asked)."""

    name = "manual"

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    async def propose(self, ctx: ProposalContext) -> Proposal:  # noqa: ARG002 - the edit is already written
        try:
            meta = json.loads((self.folder / MESSAGE_FILE).read_text(encoding="utf-8"))
            files = {p: (self.folder / p).read_text(encoding="utf-8") for p in meta["files"]}
        except (OSError, ValueError, KeyError) as exc:
            raise ProposalError(f"the saved manual edit in {self.folder} cannot be read ({exc})") from None
        rationale = meta.get("message") or f"a hand edit of {', '.join(sorted(files))}"
        return Proposal(files=files, rationale=rationale)
