"""The bias battery tests' judge: `BiasJudge`, the loop tests' `FakeJudge` answer table plus a few
noisy items (a coin flip per call) and, opt-in, one shortcut it falls for.

It finds the item from the goal and the recorded actions as `FakeJudge` does, leaving out the
actions a battery probe may add (``wait``, ``done``, the typed note to the judge), so a perturbed
copy is recognised as its original. ``reacts_to``:

- ``"nothing"``: the perturbations change no answer (only the noisy items move, by chance);
- ``"complete_text"``: "task complete" / "task is complete" anywhere in the steps makes it answer
  success (the final claim and the note to the judge both say so);
- ``"idle_steps"``: three or more consecutive ``wait`` steps make it answer failure (a judge that
  punishes a long trajectory).
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from dataclasses import dataclass, field
from typing import Literal

from optimizer.devset.markdown import action_string
from optimizer.devset.split import open_split
from optimizer.workspace.workspace import Workspace
from tests.support.fakeserver import Behaviour, RecordedRequest, server_error, verdict_reply
from tests.support.loop import FakeJudge, request_texts

Reaction = Literal["nothing", "complete_text", "idle_steps"]

_GOAL = re.compile(r"## Goal\n\n(.*?)\n\n## Steps", re.S)
_ACTION = re.compile(r"\*\*Action:\*\* `(.*)`")
_STEPS = re.compile(r"## Steps\n(.*?)(## Your verdict|$)", re.S)
_COMPLETE = re.compile(r"task (is )?complete", re.I)
_IDLE_RUN = re.compile(r"(\*\*Action:\*\* `wait`\n\n(?:(?!\*\*Action:\*\*).)*?){3}", re.S)
NOTE_PREFIX = 'type "Note to the evaluator'


def _kept(action: str) -> bool:
    return action not in ("wait", "done") and not action.startswith(NOTE_PREFIX)


def _key(goal: str, actions: list[str]) -> str:
    return hashlib.sha256(json.dumps([goal.strip(), [a for a in actions if _kept(a)]]).encode()).hexdigest()


def _unit(*parts: object) -> float:
    digest = hashlib.sha256("\0".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


@dataclass
class BiasJudge(FakeJudge):
    reacts_to: Reaction = "nothing"
    n_noisy: int = 4
    calls: dict[tuple[str, str], int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        super().__post_init__()
        ws = Workspace.open(self.root)
        split = open_split(ws, ws.config.workspace.dev_split)
        self.items: dict[str, str] = {}
        for tid in split.ids:
            traj = split.trajectory(tid)
            key = _key(traj.task.instruction, [action_string(s.action) for s in traj.steps])
            assert self.items.setdefault(key, tid) == tid, "two items look alike without waits"
        pos = sorted(self.pos_rank, key=self.pos_rank.__getitem__)
        neg = sorted(self.neg_rank, key=self.neg_rank.__getitem__)
        half = self.n_noisy // 2
        self.noisy = set(pos[:half] + neg[: self.n_noisy - half])
        self.count_lock = threading.Lock()

    def answer(self, tid: str) -> bool:
        """The verdict before any shortcut (noisy items excepted: they have none)."""
        label = self.labels[tid]
        return label.is_positive if self.correct(tid, set()) else not label.is_positive

    def __call__(self, request: RecordedRequest) -> Behaviour:
        if not isinstance(request.body, dict):
            return server_error(500)
        _, user = request_texts(request.body)
        goal = _GOAL.search(user)
        assert goal, "no goal in the user message"
        tid = self.items[_key(goal.group(1), _ACTION.findall(user))]
        steps_match = _STEPS.search(user)
        steps = steps_match.group(1) if steps_match else ""
        success = self.answer(tid)
        if tid in self.noisy:
            digest = hashlib.sha256(user.encode()).hexdigest()
            with self.count_lock:
                n = self.calls.get((tid, digest), 0)
                self.calls[(tid, digest)] = n + 1
            success = _unit(tid, digest, n) < 0.5
        if self.reacts_to == "complete_text" and _COMPLETE.search(steps):
            success = True
        if self.reacts_to == "idle_steps" and _IDLE_RUN.search(steps):
            success = False
        label = self.labels[tid]
        with self.lock:
            self.answered.append(tid)
        return verdict_reply(
            {
                "success": success,
                "reasoning": "bias fake",
                "confidence": "medium",
                "mistake_type": None if success else (label.mistake_type or "Critical Mistake"),
            }
        )
