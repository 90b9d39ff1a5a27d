"""The attribution tests' judge and steps: `MarkerJudge` (a marker phrase in the rubric makes a fixed set
of 10 dev items right, another marker another 10, a few positives are coin flips per call), `add_line`
edits, `run_chain` (one literal-policy run of scripted edits) and `attribute` (`judgeloop attribute --json`)."""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from optimizer.cli import main
from optimizer.judge.prompts import RUBRIC_MD
from optimizer.loop.strategies import Proposal, ProposalContext
from tests.support.fakeserver import FakeLLMServer
from tests.support.loop import FakeJudge, run_loop
from tests.support.scripted import ScriptedStrategy, install, latest

MARKER_A = "Check that every value the instruction names appears in the result, exactly (alpha rule)."
MARKER_B = "Check that nothing outside the request was changed or sent (bravo rule)."
NOOP_NOTES = (
    "Read the whole trajectory before answering.",
    "Weigh the final screens most.",
    "Answer only from what the steps show.",
    "Do not guess what happened off screen.",
    "Prefer the last screenshot over earlier ones.",
    "Name the requirement that failed.",
)


def _unit(*parts: object) -> float:
    digest = hashlib.sha256("\0".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


@dataclass
class MarkerJudge(FakeJudge):
    """``MARKER_A`` makes the A items right, ``MARKER_B`` the B items (with ``b_needs_a``, only when
    ``MARKER_A`` is there too); the noisy positives are right on a coin flip per call; every other dev
    item is always right."""

    b_needs_a: bool = False
    calls: dict[tuple[str, str], int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        super().__post_init__()
        neg = sorted(self.neg_rank, key=self.neg_rank.__getitem__)
        pos = sorted(self.pos_rank, key=self.pos_rank.__getitem__)
        self.a_items = set(neg[:5] + pos[:5])
        self.b_items = set(neg[5:10] + pos[5:10])
        self.noisy = set(pos[10:14])
        self.count_lock = threading.Lock()

    def enabled_in(self, system: str) -> set[str]:
        marks = {"A"} if MARKER_A in system else set()
        marks |= {"B"} if MARKER_B in system else set()
        return marks | {"sys:" + hashlib.sha256(system.encode()).hexdigest()[:16]}

    def correct(self, tid: str, enabled: set[str]) -> bool:
        if tid in self.a_items:
            return "A" in enabled
        if tid in self.b_items:
            return "B" in enabled and ("A" in enabled or not self.b_needs_a)
        if tid in self.noisy:
            prompt = next(e for e in enabled if e.startswith("sys:"))
            with self.count_lock:
                n = self.calls.get((tid, prompt), 0)
                self.calls[(tid, prompt)] = n + 1
            return _unit(tid, prompt, n) < 0.5
        return tid in self.neg_rank or tid in self.pos_rank


def add_line(
    line: str = "", *, at: int = 0, replace: tuple[str, str] | None = None
) -> Callable[[ProposalContext], Proposal]:
    """A proposal that adds the bullet ``line`` under the rubric's ``at``-th heading (edits under different
    headings do not touch each other's lines), or replaces one line's text."""

    def step(ctx: ProposalContext) -> Proposal:
        text = ctx.current_files[RUBRIC_MD]
        if replace is not None:
            assert replace[0] in text
            text = text.replace(replace[0], replace[1])
        else:
            lines = text.split("\n")
            headings = [i for i, t in enumerate(lines) if t.startswith("#")]
            lines.insert(headings[at] + 1, f"\n- {line}")
            text = "\n".join(lines)
        return Proposal(
            files={RUBRIC_MD: text}, rationale=f"rubric: {(line or (replace or ('', ''))[1])[:50]}"
        )

    return step


def attribute(
    root: Path, server: FakeLLMServer, capsys: pytest.CaptureFixture[str], *extra: str
) -> dict[str, Any]:
    capsys.readouterr()
    assert (
        main(
            [
                "attribute",
                "-w",
                str(root),
                "--provider",
                "openai",
                "--base-url",
                server.openai_base_url,
                "--model",
                "fake-judge",
                "--concurrency",
                "8",
                "--json",
                *extra,
            ]
        )
        == 0
    )
    return json.loads(capsys.readouterr().out)


def run_chain(
    ws: Path,
    monkeypatch: pytest.MonkeyPatch,
    judge: MarkerJudge,
    server: FakeLLMServer,
    steps: list[Callable[[ProposalContext], Proposal]],
    *extra: str,
) -> list[Any]:
    install(monkeypatch, ScriptedStrategy(steps))
    assert (
        run_loop(
            ws,
            server.openai_base_url,
            "--policy",
            "literal",
            "--max-experiments",
            str(len(steps)),
            "--patience",
            "50",
            *extra,
        )
        == 0
    )
    return latest(ws)[1]
