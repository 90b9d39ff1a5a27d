"""The review -> memory -> keep workflow in the real loop: ``judgeloop run --strategy memory`` against a fake
judge whose answers a case changes for items of the case's *kind*, never for the item it remembers.

The fake judge (OpenAI wire, through the real SDK) knows each dev item's kind: a marker shared by a group
of pairs spread over the folds. It answers an item of kind ALPHA correctly exactly when the request holds
the ALPHA marker (which only a memory case can carry) and every other item correctly always. A person's
review of one ALPHA item names the marker; the memory strategy distils it into a case. Cross-fitting
keeps that case out of its own items' fold, so the candidate's gain must come from ALPHA items of the
other folds alone: the test checks that flip by flip, and that the candidate is kept.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from optimizer.devset.split import open_split
from optimizer.judge.memory import (
    CASES_JSONL,
    PRINCIPLES_MD,
    pair_groups,
    parse_cases,
    recording_of,
    split_folds,
)
from optimizer.ledger import Ledger
from optimizer.loop.strategies import Proposal, ProposalContext
from optimizer.models import Label
from optimizer.workspace import gitops
from optimizer.workspace.workspace import Workspace
from tests.support.attribution import attribute
from tests.support.fakeserver import Behaviour, FakeLLMServer, RecordedRequest
from tests.support.loop import (
    GOOD_ENTRY,
    FakeJudge,
    commit_all,
    git,
    present,
    request_texts,
    run_loop,
    set_toml_key,
)
from tests.support.scripted import (
    ScriptedStrategy,
    Step,
    add_heldout_split,
    assert_clean,
    install,
    latest,
    toggle,
)

FOLDS = 4
MARKER = "mirrored-layout rule"  # what the ALPHA kind's reviews teach; no item's own text holds it
NOTE = f"The judge missed the {MARKER}: the requested layout must be mirrored, not copied."


@dataclass
class KindJudge(FakeJudge):
    """Right on every item but ALPHA ones; right on those only when the request carries the ALPHA marker."""

    alpha: frozenset[str] = frozenset()
    seen: list[tuple[str, bool]] = field(default_factory=list)  # (item, marker in the request) per call

    def correct(self, tid: str, enabled: set[str]) -> bool:
        return tid not in self.alpha or MARKER in enabled

    def enabled_in(self, system: str) -> set[str]:
        return {MARKER} if MARKER in system else set()

    def __call__(self, request: RecordedRequest) -> Behaviour:
        if isinstance(request.body, dict):
            system, user = request_texts(request.body)
            self.seen.append((self.trajectory_of(user), MARKER in system + user))
        return super().__call__(request)


def _memory_workspace(ws: Path) -> None:
    """Judging with memory (k 4, 4 folds) and the memory files allowed to the optimiser, committed."""
    toml = ws / "prompts" / "judge.toml"
    text = toml.read_text(encoding="utf-8")
    for key, value in (("memory", '"retrieve"'), ("memory_k", "4"), ("memory_folds", str(FOLDS))):
        text, n = re.subn(rf"(?m)^{key} = .*$", f"{key} = {value}", text)
        assert n == 1, key
    toml.write_text(text, encoding="utf-8")
    set_toml_key(
        ws,
        "optimizer",
        "allowed_files",
        f'["prompts/judge.md", "prompts/rubric.md", "{PRINCIPLES_MD}", "{CASES_JSONL}"]',
    )
    commit_all(ws, "judge with memory")


@pytest.mark.slow
def test_a_memory_case_helps_its_kind_in_other_folds_and_is_kept(
    ws: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _memory_workspace(ws)
    split = open_split(Workspace.open(ws), "small")
    folds = split_folds(split, FOLDS)
    groups = pair_groups(
        [(t, split.trajectory(t).task.instruction, recording_of(split.trajectory(t))) for t in split.ids]
    )
    # Kind ALPHA: every other pair group of each fold, so the kind spans every fold.
    alpha = frozenset(
        t for f in range(FOLDS) for g in [g for g in groups if folds.of[g[0]] == f][::2] for t in g
    )
    assert len({folds.of[t] for t in alpha}) == FOLDS  # the kind spans every fold
    reviewed = sorted(alpha)[0]
    with Ledger(ws / "experiments" / "ledger.sqlite") as led:
        led.add_review(reviewed, "judge_wrong", NOTE)

    judge = KindJudge(ws, alpha=alpha)
    labels: dict[str, Label] = judge.labels
    with FakeLLMServer(default=judge) as server:
        assert run_loop(ws, server.openai_base_url, "--strategy", "memory", "--max-experiments", "1") == 0
        judged = len(judge.seen)
        attributed = attribute(ws, server, capsys)
    run, exps = latest(ws)
    base, cand = exps
    assert cand.strategy == "memory" and cand.status == "kept", (cand.status, cand.reason)
    assert present(cand.kappa) > present(base.kappa)

    # The kept commit holds one case, distilled from the review, naming the reviewed item's group only.
    (case,) = parse_cases(present(gitops.read_file_at(ws, run.branch, CASES_JSONL)))
    assert reviewed in case.source_items and NOTE in case.text
    source_folds = {folds.of[s] for s in case.source_items}
    assert source_folds == {folds.of[reviewed]}
    assert "memory" in git(ws, "log", "-1", "--format=%B", run.branch)

    # Per-item flips, baseline -> candidate: every one an ALPHA item of another fold, wrong -> right.
    with Ledger(ws / "experiments" / "ledger.sqlite") as led:
        before = {v.trajectory_id: v.success for v in led.item_verdicts(base.id)}
        after = {v.trajectory_id: v.success for v in led.item_verdicts(cand.id)}

    def right(answer: bool | None, tid: str) -> bool:
        return answer is not None and answer == labels[tid].is_positive

    flips = {t for t in after if right(after[t], t) != right(before[t], t)}
    assert flips, "the case changed no verdict"
    assert all(t in alpha and folds.of[t] not in source_folds and right(after[t], t) for t in flips), flips
    # Its own fold never got it: the reviewed item and its fold's ALPHA items are judged as without memory.
    own = [t for t in alpha if folds.of[t] in source_folds and t in after]
    assert own and not any(right(after[t], t) for t in own)
    assert not any(marker for tid, marker in judge.seen[:judged] if folds.of[tid] in source_folds)
    assert any(marker for tid, marker in judge.seen[:judged] if folds.of[tid] not in source_folds)
    # Attribution measures the kept case like any kept edit: what it still fixes at the end is of the same kind.
    (edit,) = attributed["attribution"]
    assert edit["experiment"] == cand.id and present(edit["items"]) > 0 and edit["broken"] == []
    assert edit["fixed"] and all(t in alpha and folds.of[t] not in source_folds for t in edit["fixed"])
    assert_clean(ws)


@pytest.mark.slow
def test_a_review_of_a_heldout_item_never_reaches_the_strategy(
    ws: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The structured reviews a strategy gets are of dev items only (a held-out item's note could carry its answer)."""
    dev, held = add_heldout_split(ws)
    with Ledger(ws / "experiments" / "ledger.sqlite") as led:
        led.add_review(held[0], "judge_wrong", "held-out note")
        led.add_review(dev[0], "judge_wrong", "dev note")
        led.add_review(dev[1], "label_suspect", "looks mislabelled")
    strategy = ScriptedStrategy([toggle(GOOD_ENTRY)])
    install(monkeypatch, strategy)
    with FakeLLMServer(default=FakeJudge(ws)) as server:
        assert run_loop(ws, server.openai_base_url, "--max-experiments", "1") == 0
    (ctx,) = strategy.contexts
    assert [(r.trajectory_id, r.kind, r.note) for r in ctx.reviews] == [
        (dev[0], "judge_wrong", "dev note"),
        (dev[1], "label_suspect", "looks mislabelled"),
    ]
    assert (
        ctx.reviews[0].instruction
        == open_split(Workspace.open(ws), "small").trajectory(dev[0]).task.instruction
    )


def test_strategy_memory_without_the_memory_allowed_is_one_line(
    ws: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    set_toml_key(ws, "optimizer", "strategy", '"memory"')  # judgeloop.toml's key, as `--strategy memory`
    commit_all(ws, "the memory strategy")
    with FakeLLMServer(default=FakeJudge(ws)) as server:
        assert run_loop(ws, server.openai_base_url) == 2
        assert server.inference_requests() == []  # refused before the baseline
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert "the memory strategy edits prompts/memory/cases.jsonl" in err and "allowed_files" in err


@pytest.mark.slow
def test_a_candidate_pasting_a_case_into_the_rubric_is_refused_whoever_made_it(
    ws: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The memory tools refuse a prompt file that copies a case; the loop refuses it too, for any strategy
    (here a scripted one writing files directly): a case states a dev item's verdict, and the rubric, judge.md
    and principles.md reach that item's own fold."""
    _memory_workspace(ws)
    dev = open_split(Workspace.open(ws), "small").ids
    verdict = "the run saved the wrong spreadsheet so the verdict for this task is a clear failure"
    case = {"id": "c1", "text": f"When asked to save a report: {verdict}.", "source_items": [dev[0]]}
    (ws / CASES_JSONL).parent.mkdir(parents=True, exist_ok=True)
    (ws / CASES_JSONL).write_text(json.dumps(case) + "\n", encoding="utf-8")
    commit_all(ws, "one case")
    rubric = (ws / "prompts" / "rubric.md").read_text(encoding="utf-8")

    def into_rubric(ctx: ProposalContext) -> Proposal:
        return Proposal(files={"prompts/rubric.md": rubric + f"\n- {verdict}.\n"}, rationale="paste")

    def into_principles(ctx: ProposalContext) -> Proposal:
        return Proposal(files={PRINCIPLES_MD: f"- {verdict}\n"}, rationale="paste into the principles")

    def general_rule(ctx: ProposalContext) -> Proposal:
        return Proposal(
            files={"prompts/rubric.md": rubric + "\n- Check the saved file's name.\n"},
            rationale="a general rule",
        )

    install(monkeypatch, ScriptedStrategy([into_rubric, into_principles, general_rule]))
    with FakeLLMServer(default=FakeJudge(ws)) as server:
        assert run_loop(ws, server.openai_base_url, "--max-experiments", "3") == 0
    _, exps = latest(ws)
    assert [e.status for e in exps][:3] == ["baseline", "guard_rejected", "guard_rejected"]
    assert "copy" in (exps[1].reason or "") and "case c1" in (exps[1].reason or "")
    assert "case c1" in (exps[2].reason or "")
    assert exps[3].status != "guard_rejected"  # a general rule is not a copy
    assert verdict not in (ws / "prompts" / "rubric.md").read_text(encoding="utf-8")
    assert_clean(ws)


@pytest.mark.slow
def test_a_case_about_another_folds_item_is_guard_rejected_naming_the_case_and_the_item(
    ws: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The red team's candidate through the real loop: a case whose text carries item B's instruction, what B's
    agent typed and B's label, declared as distilled from an item A of another fold. Cross-fitting by the
    declared source alone would send it to B; the guard rejects it, naming the case and the item, and nothing is
    committed. A general lesson from the same source is a candidate like any other."""
    _memory_workspace(ws)
    split = open_split(Workspace.open(ws), "small")
    folds = split_folds(split, FOLDS)
    b = next(t for t in split.ids if "memo.md" in split.trajectory(t).task.instruction)
    instruction = split.trajectory(b).task.instruction
    same_instruction = {t for t in split.ids if split.trajectory(t).task.instruction == instruction}
    a = next(t for t in split.ids if folds.of[t] != folds.of[b])
    typed = next(
        str(s.action.parameters["text"]) for s in split.trajectory(b).steps if s.action.type == "type"
    )
    evil: dict[str, object] = {
        "id": "c-evil",
        "source_items": [a],
        "text": f"Task: {instruction} The agent typed {typed!r}. Label: negative; the verdict is success false.",
    }
    lesson: dict[str, object] = {
        "id": "c-lesson",
        "source_items": [a],
        "text": "A note must be saved under the requested name and format; an unsaved editor is a failure.",
    }

    def cases(*objs: dict[str, object]) -> Step:
        def step(ctx: ProposalContext) -> Proposal:
            return Proposal(
                files={CASES_JSONL: "".join(json.dumps(o) + "\n" for o in objs)}, rationale="remember a case"
            )

        return step

    install(monkeypatch, ScriptedStrategy([cases(evil), cases(lesson, evil), cases(lesson)]))
    with FakeLLMServer(default=FakeJudge(ws)) as server:
        assert run_loop(ws, server.openai_base_url, "--max-experiments", "3") == 0
    run, exps = latest(ws)
    assert [e.status for e in exps][:3] == ["baseline", "guard_rejected", "guard_rejected"], [
        (e.status, e.reason) for e in exps
    ]
    for exp in exps[1:3]:
        reason = exp.reason or ""
        assert "case c-evil" in reason and "source_items" in reason, reason
        assert any(f"item {t}" in reason for t in same_instruction), reason
        assert exp.commit_sha is None
    assert exps[3].status != "guard_rejected", exps[3].reason  # a general lesson is no item's answer
    for ref in (run.branch, *gitops.rejected_refs(ws).values()):
        assert "c-evil" not in (gitops.read_file_at(ws, ref, CASES_JSONL) or "")
    assert_clean(ws)
