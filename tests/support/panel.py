"""A panel for the tests: member files that differ only in one marker line, and a fake judge whose
members err independently on negatives (issue 19's "Done means").

`PanelJudge` extends the loop's deterministic `FakeJudge`: positives are always judged right; on
the negatives (ranked by hash, as `FakeJudge` ranks them) the single judge and member ``a`` err on
rank ≡ 0 (mod 3), member ``b`` on rank ≡ 1 and member ``c`` on rank ≡ 2. So each member alone has
the single judge's false-positive rate, and a unanimous panel of the three has none.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from optimizer.judge.prompts import JUDGE_MD
from tests.support.fakeserver import Behaviour, RecordedRequest, server_error, verdict_reply
from tests.support.loop import FakeJudge, request_texts

MEMBERS = ("a", "b", "c")
_MARK_RE = re.compile(r"You are panel member ([a-z]+)\.")
PANEL_TOML = '\n[panel]\nmembers = ["a", "b", "c"]\nvote = "unanimous"\n'


def member_text(judge_md: str, name: str) -> str:
    """A member's instructions: judge.md with one line naming the member first."""
    return f"You are panel member {name}.\n\n{judge_md}"


def write_members(root: Path, names: tuple[str, ...] = MEMBERS) -> None:
    """prompts/members/<name>.md for each name, from the workspace's judge.md."""
    judge_md = (root / JUDGE_MD).read_text(encoding="utf-8")
    folder = root / "prompts" / "members"
    folder.mkdir(parents=True, exist_ok=True)
    for name in names:
        (folder / f"{name}.md").write_text(member_text(judge_md, name), encoding="utf-8")


def member_of(text: str) -> str | None:
    """The member a request's text names (None: the single judge)."""
    m = _MARK_RE.search(text)
    return None if m is None else m.group(1)


@dataclass
class PanelJudge(FakeJudge):
    """See the module docstring; ``calls`` counts the answers per member (None: the single judge)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.calls: dict[str | None, int] = {}

    def errs(self, tid: str, member: str | None) -> bool:
        if tid not in self.neg_rank:
            return False
        k = MEMBERS.index(member) if member in MEMBERS else 0
        return self.neg_rank[tid] % 3 == k

    def __call__(self, request: RecordedRequest) -> Behaviour:
        if not isinstance(request.body, dict):
            return server_error(500)
        system, user = request_texts(request.body)
        tid = self.trajectory_of(user)
        member = member_of(system + user)
        label = self.labels[tid]
        success = label.is_positive != self.errs(tid, member)
        with self.lock:
            self.calls[member] = self.calls.get(member, 0) + 1
        return verdict_reply(
            {
                "success": success,
                "reasoning": f"member {member or 'single'} on {tid}",
                "confidence": "medium",
                "mistake_type": None if success else (label.mistake_type or "Critical Mistake"),
            }
        )
