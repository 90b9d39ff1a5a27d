"""The decision policies as objects: what each ``[loop] policy`` is, asked instead of branched on. Pure.

A policy is a `DecisionPolicy` — `Literal`, `Paired` or `Adaptive` (`policy_for` gives the one a name or
a ``[loop]`` section names). The engine (`optimizer.stats.decision`, the loop, the plan, the report, the
self-test) asks it what it does — how many extra judgements it makes per disagreeing item, which keep
flag decides, which best-case flag its early-stopping bound reads, whether its keeps are a test at
alpha, and the few words of a reason that differ between policies — and never compares a policy's
name itself (tests/test_policies.py gates that over the source tree). So a new policy is a new class
here, not a new branch in six modules.

The rules themselves stay in `optimizer.stats.decision` (see its docstring), which computes every policy's
outcome on every candidate; a policy only says which of them is its own. ``Decision.policy`` stays the
name: it is what the ledger stores and the reasons show.

(`Literal` here is the literal policy, not ``typing.Literal``; this module does not use the latter.)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from optimizer.vocab import POLICIES, PolicyName
from optimizer.workspace.config import LoopSection


class KeepFlags(Protocol):
    """The first-pass outcomes every decision carries (a `optimizer.stats.decision.Decision`, or `FirstPass`
    while one is being built): the literal rule's and the paired rule's."""

    @property
    def literal_keep(self) -> bool: ...

    @property
    def paired_keep(self) -> bool: ...


# The words a first-pass reason adds when the other rule's outcome differs (`decide_counts`).
_LITERAL_WOULD_KEEP = "; the literal policy would have kept it"
_PAIRED_WOULD_ROLL_BACK = "; the paired policy would have rolled it back"


def _rules_differ(flags: KeepFlags) -> bool:
    # The paired rule is the literal one and a test: it can only roll back what the literal one keeps.
    return flags.literal_keep and not flags.paired_keep


@dataclass(frozen=True)
class FirstPass:
    """The two first-pass keep flags before a `Decision` holds them (`decide_counts`)."""

    literal_keep: bool
    paired_keep: bool


class DecisionPolicy(Protocol):
    """What a decision policy is, as the engine asks it."""

    @property
    def name(self) -> PolicyName:
        """Its name in ``[loop] policy``, ``--policy``, the ledger and the reasons."""
        ...

    @property
    def tests_at_alpha(self) -> bool:
        """Whether its keeps are a significance test at a level (alpha, an online-FDR level, Holm's in a
        wave): False for the literal rule, which has no level, so no expected false keeps and no wave."""
        ...

    @property
    def rejudges(self) -> bool:
        """Whether it re-judges the items the two prompts disagree on after the first pass and decides
        on every judgement (the sign-flip test on per-item shares); False: it decides on the first
        pass's majorities."""
        ...

    @property
    def items_right(self) -> str:
        """What an item the candidate newly gets right means under it, in `detectable_gain_line`."""
        ...

    def rejudge(self, loop: LoopSection) -> int:
        """Extra judgements per disagreeing item under each prompt (``[loop] rejudge``; 0 if it does not
        re-judge)."""
        ...

    def screens_futility(self, loop: LoopSection) -> bool:
        """Whether futility screening (``[loop] futility``, `optimizer.stats.futility`) applies to its first pass."""
        ...

    def keeps(self, flags: KeepFlags) -> bool:
        """The first-pass keep flag that is its outcome (`decide_counts`' ``keep``; under ``adaptive``
        the paired one, which `decide_adaptive` then replaces with the adaptive rule's)."""
        ...

    def bound_keeps(self, best: KeepFlags) -> bool:
        """Whether the best-case completion is still a keep for its first-pass early-stopping bound
        (`stopped_decision`, `kappa_provably_cannot_beat`): False means the bound fires."""
        ...

    def other_policy_note(self, flags: KeepFlags) -> str:
        """The suffix of `decide_counts`' outcome when the other first-pass rule disagrees ("" if none)."""
        ...

    def open_note(self, best: KeepFlags) -> str:
        """The suffix of an early stop's reason when another rule's outcome was still open ("" if none)."""
        ...


class Literal:
    """``literal``: keep iff kappa rises by more than min_kappa_delta and FPR stays within fpr_tolerance,
    on the first pass. No test, no level."""

    name: PolicyName = "literal"
    tests_at_alpha: bool = False
    rejudges: bool = False
    items_right: str = "items right"

    def rejudge(self, loop: LoopSection) -> int:  # noqa: ARG002 - it never re-judges, whatever [loop] says
        return 0

    def screens_futility(self, loop: LoopSection) -> bool:  # noqa: ARG002 - futility estimates the adaptive test's chance
        return False

    def keeps(self, flags: KeepFlags) -> bool:
        return flags.literal_keep

    def bound_keeps(self, best: KeepFlags) -> bool:
        return best.literal_keep

    def other_policy_note(self, flags: KeepFlags) -> str:
        return _PAIRED_WOULD_ROLL_BACK if _rules_differ(flags) else ""

    def open_note(self, best: KeepFlags) -> str:  # noqa: ARG002 - no other rule's outcome is left open by its bound
        return ""


class Paired:
    """``paired``: the literal rule, and the exact one-sided McNemar test on the first pass's discordant
    items at alpha."""

    name: PolicyName = "paired"
    tests_at_alpha: bool = True
    rejudges: bool = False
    items_right: str = "items right"

    def rejudge(self, loop: LoopSection) -> int:  # noqa: ARG002 - it never re-judges, whatever [loop] says
        return 0

    def screens_futility(self, loop: LoopSection) -> bool:  # noqa: ARG002 - futility estimates the adaptive test's chance
        return False

    def keeps(self, flags: KeepFlags) -> bool:
        return flags.paired_keep

    def bound_keeps(self, best: KeepFlags) -> bool:
        return best.paired_keep

    def other_policy_note(self, flags: KeepFlags) -> str:
        return _LITERAL_WOULD_KEEP if _rules_differ(flags) else ""

    def open_note(self, best: KeepFlags) -> str:
        # In the best case the literal policy keeps it: its outcome was still open when the paired bound fired.
        return (
            "; the literal policy's outcome was still open when evaluation stopped"
            if best.literal_keep
            else ""
        )


class Adaptive:
    """``adaptive``: the disagreeing items re-judged ``[loop] rejudge`` more times under each prompt; the
    literal rule on majorities over all judgements and the sign-flip test at alpha (`decide_adaptive`)."""

    name: PolicyName = "adaptive"
    tests_at_alpha: bool = True
    rejudges: bool = True
    # An item counts in full only when every one of its judgements went the candidate's way (d = 1).
    items_right: str = "items right on every judgement"

    def rejudge(self, loop: LoopSection) -> int:
        return loop.rejudge

    def screens_futility(self, loop: LoopSection) -> bool:
        return loop.futility

    def keeps(self, flags: KeepFlags) -> bool:
        # On the first pass alone it reports the paired outcome; `decide_adaptive` decides.
        return flags.paired_keep

    def bound_keeps(self, best: KeepFlags) -> bool:
        # Its own bound is the adaptive one (`adaptive_stopped_decision`); on first-pass counts only the
        # literal rule is a bound on it (re-judging can lower any first-pass p-value).
        return best.literal_keep

    def other_policy_note(self, flags: KeepFlags) -> str:
        return _LITERAL_WOULD_KEEP if _rules_differ(flags) else ""

    def open_note(self, best: KeepFlags) -> str:  # noqa: ARG002 - no other rule's outcome is left open by its bound
        return ""


LITERAL, PAIRED, ADAPTIVE = Literal(), Paired(), Adaptive()
_BY_NAME: dict[str, DecisionPolicy] = {p.name: p for p in (LITERAL, PAIRED, ADAPTIVE)}


class HasPolicy(Protocol):
    """Anything that names a policy: a ``[loop]`` section, a `Decision`."""

    @property
    def policy(self) -> PolicyName: ...


def policy_for(name_or_loop: str | HasPolicy) -> DecisionPolicy:
    """The policy a name (``"adaptive"``) or a ``[loop]`` section (its ``policy``) names. Names are
    checked where they enter (config, ``--policy``): an unknown one here is a bug, a `ValueError`."""
    name = name_or_loop if isinstance(name_or_loop, str) else name_or_loop.policy
    try:
        return _BY_NAME[name]
    except KeyError:
        raise ValueError(f"unknown decision policy {name!r}; known: {', '.join(POLICIES)}") from None
