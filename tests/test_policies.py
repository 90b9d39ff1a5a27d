"""The decision policies as objects (`optimizer.stats.policies`): each one's answers, and the gate that keeps
the engine asking them instead of branching on a policy's name."""

from __future__ import annotations

import re
from itertools import product
from pathlib import Path

import pytest

from benchmarks.structure import POLICY_BRANCH, POLICY_MODULES
from optimizer.stats.decision import Counts, Decision, decide_counts, detectable_gain_line
from optimizer.stats.policies import (
    ADAPTIVE,
    LITERAL,
    PAIRED,
    Adaptive,
    FirstPass,
    Literal,
    Paired,
    policy_for,
)
from optimizer.vocab import POLICIES
from optimizer.workspace.config import LoopSection

REPO = Path(__file__).resolve().parents[1]
# A comparison with, or a prefix test of, a policy's name spelled out: `x == "literal"`, `.startswith("adaptive")`.
NAME_TEST = re.compile(r"""(==|!=|\bin\b|startswith\()\s*\(?\s*["'](literal|paired|adaptive)["']""")
# Whether a stored name is a policy at all (`run.policy in POLICIES`, runsettings reading the ledger's column):
# config plumbing that asks the vocabulary, not a branch on what one policy does.
KNOWN_NAME = re.compile(r"\bpolicy\s+in\s+POLICIES\b")


def _branches_on_a_name(line: str) -> bool:
    return bool(POLICY_BRANCH.search(KNOWN_NAME.sub("", line)) or NAME_TEST.search(line))


def _engine_sources() -> list[Path]:
    return [
        p
        for tree in ("optimizer", "tui")
        for p in sorted((REPO / tree).rglob("*.py"))
        if not p.relative_to(REPO).as_posix().startswith(POLICY_MODULES)
    ]


def test_no_module_outside_the_policies_module_branches_on_a_policy_name() -> None:
    """benchmarks/structure.py's branches (less runsettings' check that a stored name is a policy), and any
    test of a name spelled out: none outside optimizer/stats/policies.py. A new rule is a class there, asked."""
    found = [
        f"{path.relative_to(REPO)}:{n}: {line.strip()}"
        for path in _engine_sources()
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1)
        if _branches_on_a_name(line)
    ]
    assert found == []


def test_the_gate_sees_the_branches_it_forbids() -> None:
    for line in (
        'keep = a if loop.policy == "literal" else b',
        "if self.loop_cfg.policy != 'adaptive':",
        'if loop.policy in ("paired", "adaptive"):',
        'if policy.startswith("literal"):',
        'if name == "paired":',
        'if run.policy in POLICIES and loop.policy == "literal":',
    ):
        assert _branches_on_a_name(line), line
    for line in (
        'literal_cfg = cfg.model_copy(update={"policy": "literal"})',
        "policy_for(loop).keeps(decision)",
        "if run.policy in POLICIES:",
    ):
        assert not _branches_on_a_name(line), line


def test_policy_for_takes_a_name_a_loop_section_or_a_decision() -> None:
    assert [policy_for(name).name for name in POLICIES] == list(POLICIES)
    assert (
        policy_for("literal") is LITERAL
        and policy_for("paired") is PAIRED
        and policy_for("adaptive") is ADAPTIVE
    )
    assert policy_for(LoopSection(policy="paired")) is PAIRED
    assert policy_for(LoopSection()) is ADAPTIVE  # the default policy
    decision = Decision(
        keep=False, reason="", literal_keep=False, paired_keep=False, p_value=1.0, policy="literal"
    )
    assert policy_for(decision) is LITERAL
    with pytest.raises(ValueError, match="unknown decision policy 'greedy'"):
        policy_for("greedy")


def test_each_policy_says_what_it_re_judges_and_whether_it_tests_at_alpha() -> None:
    loop = LoopSection(rejudge=3, futility=True)
    off = LoopSection(rejudge=0, futility=False)
    assert (LITERAL.tests_at_alpha, PAIRED.tests_at_alpha, ADAPTIVE.tests_at_alpha) == (False, True, True)
    assert (LITERAL.rejudges, PAIRED.rejudges, ADAPTIVE.rejudges) == (False, False, True)
    assert [p.rejudge(loop) for p in (LITERAL, PAIRED, ADAPTIVE)] == [0, 0, 3]
    assert ADAPTIVE.rejudge(off) == 0
    assert [p.screens_futility(loop) for p in (LITERAL, PAIRED, ADAPTIVE)] == [False, False, True]
    assert not ADAPTIVE.screens_futility(off)
    assert (LITERAL.items_right, PAIRED.items_right, ADAPTIVE.items_right) == (
        "items right",
        "items right",
        "items right on every judgement",
    )


@pytest.mark.parametrize(("literal_keep", "paired_keep"), list(product([False, True], repeat=2)))
def test_which_flag_decides_and_which_the_bound_reads(literal_keep: bool, paired_keep: bool) -> None:
    flags = FirstPass(literal_keep, paired_keep)
    assert LITERAL.keeps(flags) is literal_keep and LITERAL.bound_keeps(flags) is literal_keep
    assert PAIRED.keeps(flags) is paired_keep and PAIRED.bound_keeps(flags) is paired_keep
    # Adaptive reports the paired outcome of its first pass; its first-pass bound is the literal rule's.
    assert ADAPTIVE.keeps(flags) is paired_keep and ADAPTIVE.bound_keeps(flags) is literal_keep


@pytest.mark.parametrize(("literal_keep", "paired_keep"), list(product([False, True], repeat=2)))
def test_the_words_each_policy_adds_to_a_reason(literal_keep: bool, paired_keep: bool) -> None:
    flags = FirstPass(literal_keep, paired_keep)
    differ = literal_keep and not paired_keep
    assert LITERAL.other_policy_note(flags) == (
        "; the paired policy would have rolled it back" if differ else ""
    )
    for policy in (PAIRED, ADAPTIVE):
        assert policy.other_policy_note(flags) == (
            "; the literal policy would have kept it" if differ else ""
        )
    assert PAIRED.open_note(flags) == (
        "; the literal policy's outcome was still open when evaluation stopped" if literal_keep else ""
    )
    assert LITERAL.open_note(flags) == ADAPTIVE.open_note(flags) == ""


def test_the_implementations_are_the_module_s_instances() -> None:
    assert isinstance(LITERAL, Literal) and isinstance(PAIRED, Paired) and isinstance(ADAPTIVE, Adaptive)


@pytest.mark.parametrize("name", POLICIES)
def test_decide_counts_keeps_by_the_policy_s_flag_and_stores_its_name(name: str) -> None:
    """Through the real decision: a candidate the literal rule keeps and the paired test does not (one
    item fixed of 20: p = 0.5) is kept only under literal, and each reason says what the other rule does."""
    loop = LoopSection(policy=name)  # type: ignore[arg-type]
    decision = decide_counts(Counts(5, 5, 5, 5), Counts(6, 4, 5, 5), 1, 0, loop)
    assert (decision.literal_keep, decision.paired_keep) == (True, False)
    assert decision.keep is policy_for(name).keeps(decision)
    assert decision.policy == name
    assert decision.reason.endswith(policy_for(name).other_policy_note(decision))
    assert ("the gain is not significant" in decision.reason) is policy_for(name).tests_at_alpha


def test_detectable_gain_line_words_the_items_as_the_policy_counts_them() -> None:
    assert "items right while" in detectable_gain_line(24, 0.1)
    assert "at least 4 items right on every judgement while" in detectable_gain_line(24, 0.1, "adaptive")
