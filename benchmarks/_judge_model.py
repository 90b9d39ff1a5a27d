"""A noisy judge with known per-item odds, for `benchmarks/decision_power.py` (pure model + the fake
server's behaviour).

Null mode: item i is judged correctly with a fixed probability q_i, and every call is a fresh draw
(two calls about the same item under the same prompt can differ; the loop's judge cache makes each
(prompt, item, replicate) one call). Composition (AH-D's sizes, the decision-power issue's model):
30% of items unstable with q ~ U(0.3, 0.7); of the stable 70%, 80% judged right with q = 0.99 and
20% judged wrong with q = 0.01.

Effect mode: a rubric line holding ``FIX-<nonce>`` (registered with `JudgeModel.register_fix`)
makes its chosen items reliably right (q = 1) in every request that carries it. Fixes are chosen
among the items the judge tends to get wrong (q < 0.5: the stably wrong ones and the unstable ones
leaning wrong), as in the issue's simulation.

Panel mode (``steady``, issue 19's panel rows): a request whose instructions start "You are panel
member NAME." is that member's call (tests/support/panel.py's member files). Every draw is then a
hash of (seed, item, the request text without the member line, whether it is a member's call): a
prompt judges an item the same way on every call, and the members of one panel err identically (a
no-op panel: its unanimous vote is one member's verdict, a fresh draw beside the single judge's).
Except on `panel_planted` (negatives): there the members named in `independent_members` err
independently (member k of them only on the planted items of rank ≡ k mod their number), so their
unanimous vote never calls a planted negative a success — a planted FPR effect.

Keyed draws (``keyed``, `decision_power.py --keyed-draws`): null and effect mode's draw for a call is a
hash of (seed, item, the request text, how many calls before it asked the same), not the next number
of one generator shared in arrival order. The odds are the same; what a call draws no longer depends
on which other calls came first or how many calls answered after an early stop (the loop lets a call
in flight finish, even at concurrency 1), so one seed gives the same verdicts on every run.

The behaviour finds the item from the goal line of the request (the benchmark's instructions are
unique, see ``item_instruction``) and knows its label; the loop under test never sees this table.
"""

from __future__ import annotations

import hashlib
import random
import re
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from tests.support.fakeserver import Behaviour, RecordedRequest, server_error, verdict_reply
from tests.support.loop import request_texts

UNSTABLE_SHARE = 0.3
STABLE_RIGHT_SHARE = 0.8
STABLE_Q = 0.99
UNSTABLE_RANGE = (0.3, 0.7)
FIXABLE_BELOW = 0.5

# Set to "1" (by `decision_power.py --keyed-draws`): every loop's judge model draws keyed (worker processes
# inherit the environment, so the flag reaches each of them without a parameter through every task).
KEYED_DRAWS_ENV = "DECISION_POWER_KEYED_DRAWS"

_GOAL_RE = re.compile(r"## Goal\n\n(.*?)\n\n## Steps", re.S)
_FIX_RE = re.compile(r"FIX-([a-z0-9]+)")
_TAG_RE = re.compile(r"\(benchmark item (\d+)\)")
_MEMBER_RE = re.compile(r"You are panel member ([a-z]+)\.\n*")


def item_instruction(base: str, index: int) -> str:
    """The benchmark's instruction for item ``index``: unique, so a request names its item."""
    return f"{base} (benchmark item {index})"


def item_q(n: int, seed: int, *, fix_pool: str = "wrong") -> tuple[np.ndarray, np.ndarray]:
    """Per-item probability of a correct judgement (length ``n``) and the mask of fixable items.

    Exactly round(0.3 n) unstable items, round(0.7 n · 0.2) stably wrong, the rest stably right,
    placed at random (``seed``). ``fix_pool``: ``wrong`` (q < 0.5, the default) or
    ``wrong-or-unstable`` (q < 0.9)."""
    rng = np.random.default_rng(seed)
    n_unstable = round(UNSTABLE_SHARE * n)
    n_wrong = round((n - n_unstable) * (1 - STABLE_RIGHT_SHARE))
    order = rng.permutation(n)
    q = np.full(n, STABLE_Q)
    q[order[:n_unstable]] = rng.uniform(*UNSTABLE_RANGE, n_unstable)
    q[order[n_unstable : n_unstable + n_wrong]] = 1 - STABLE_Q
    if fix_pool == "wrong":
        fixable = q < FIXABLE_BELOW
    elif fix_pool == "wrong-or-unstable":
        fixable = q < 0.9
    else:
        raise ValueError(f"unknown fix pool {fix_pool!r}")
    return q, fixable


@dataclass
class JudgeModel:
    """The judge as the fake server plays it. ``positive[i]``: item i's label; ``q[i]``: its odds."""

    positive: Sequence[bool]
    mistake_types: Sequence[str | None]
    q: np.ndarray
    fixable: np.ndarray
    seed: int = 0
    fixes: dict[str, frozenset[int]] = field(default_factory=dict)  # nonce -> items made right
    # A planted structural effect: a text the request carries (e.g. the screenshot sentence a judge.toml
    # move writes into the instructions) -> items made right.
    sentence_fixes: dict[str, frozenset[int]] = field(default_factory=dict)
    calls: int = 0  # verdicts answered
    # Panel mode (see the module docstring): hashed draws, members, the planted negatives.
    steady: bool = False
    independent_members: tuple[str, ...] = ()
    panel_planted: tuple[int, ...] = ()
    member_calls: dict[str | None, int] = field(default_factory=dict)
    keyed: bool = False  # keyed draws (see the module docstring)
    asked: dict[tuple[int, str], int] = field(default_factory=dict)  # keyed: (item, text) -> calls so far

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)
        self._lock = threading.Lock()

    # -- effect mode -----------------------------------------------------------------------------

    def fixed_by(self, text: str) -> set[int]:
        """The items made right by the fix markers in ``text``."""
        out: set[int] = set()
        for nonce in _FIX_RE.findall(text):
            out |= self.fixes.get(nonce, frozenset())
        for sentence, items in list(self.sentence_fixes.items()):
            if sentence in text:
                out |= items
        return out

    def register_fix(self, nonce: str, items: Iterable[int]) -> str:
        """Register a fix and return the marker text that switches it on."""
        with self._lock:
            self.fixes[nonce] = frozenset(items)
        return f"FIX-{nonce}"

    def choose_fix(self, d: int, already_fixed: set[int], rng: random.Random) -> list[int]:
        """``d`` fixable items not fixed yet (fewer if the pool is smaller)."""
        pool = [i for i in np.flatnonzero(self.fixable) if int(i) not in already_fixed]
        return sorted(int(i) for i in rng.sample(pool, min(d, len(pool))))

    # -- the server's behaviour ------------------------------------------------------------------

    def steady_draw(self, item: int, text: str, member: bool) -> float:
        """A uniform draw in [0, 1) fixed by the seed, the item, the request text and whether a member asks."""
        digest = hashlib.sha256(f"{self.seed}|{item}|{int(member)}|{text}".encode()).digest()
        return int.from_bytes(digest[:8], "big") / 2**64

    def correct_probability(self, item: int, fixed: set[int]) -> float:
        return 1.0 if item in fixed else float(self.q[item])

    def __call__(self, request: RecordedRequest) -> Behaviour:
        body = request.body
        if not isinstance(body, dict):  # the client gave up mid-send (an early stop)
            return server_error(500)
        system, user = request_texts(body)
        goal = _GOAL_RE.search(user)
        tag = _TAG_RE.search(goal.group(1)) if goal else None
        if tag is None:
            raise AssertionError("a judge request without a benchmark item in its goal")
        item = int(tag.group(1))
        # The rubric is in the system prompt (rubric-first) or after the trajectory (trajectory-first).
        text = system + "\n" + user
        p = self.correct_probability(item, self.fixed_by(text))
        marker = _MEMBER_RE.search(text)
        member = marker.group(1) if marker else None
        if self.steady:
            right = self.steady_draw(item, _MEMBER_RE.sub("", text), member is not None) < p
            if member in self.independent_members and item in self.panel_planted:
                right = self.panel_planted.index(item) % len(
                    self.independent_members
                ) != self.independent_members.index(member)
        with self._lock:
            if self.keyed and not self.steady:
                seen = self.asked.get((item, text), 0)
                self.asked[(item, text)] = seen + 1
                right = self.steady_draw(item, f"{seen}|{text}", member is not None) < p
            elif not self.steady:
                right = self._rng.random() < p
            self.calls += 1
            self.member_calls[member] = self.member_calls.get(member, 0) + 1
        success = self.positive[item] if right else not self.positive[item]
        verdict = {
            "success": success,
            "reasoning": "decision-power benchmark judge",
            "confidence": "medium",
            "mistake_type": None if success else (self.mistake_types[item] or "Critical Mistake"),
        }
        return verdict_reply(verdict)
