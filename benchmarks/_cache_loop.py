"""Part 2 of `benchmarks/cache_cost.py`, decisions: the real loop (`start_run`, strategy ``library``) run
direct and with ``RunOptions(batch=True)`` per wire on copies of one sample workspace, its decisions and
verdicts compared one for one."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._cache_common import MODELS
from optimizer.ledger import Ledger
from optimizer.loop.session import RunOptions, start_run
from optimizer.workspace.config import JudgeOverrides
from optimizer.workspace.workspace import Workspace
from tests.support.fakecache import PromptCache
from tests.support.fakeserver import Behaviour, FakeLLMServer, RecordedRequest
from tests.support.loop import FakeJudge, add_small_dev_split, commit_all, make_workspace


@dataclass
class BothWiresJudge(FakeJudge):
    """`FakeJudge` (which reads OpenAI chat bodies) for Anthropic requests too: their top-level system
    prompt becomes a system message, so the verdict depends on the same item and rubric text."""

    def __call__(self, request: RecordedRequest) -> Behaviour:
        body = request.body
        if request.wire == "anthropic" and isinstance(body, dict):
            system = body.get("system") or ""
            text = system if isinstance(system, str) else "".join(b.get("text") or "" for b in system)
            body = {**body, "messages": [{"role": "system", "content": text}, *body.get("messages", [])]}
            request = dataclasses.replace(request, body=body)
        return super().__call__(request)


@dataclass(frozen=True)
class Decision:
    """One experiment of a loop run, as its ledger has it."""

    seq: int
    status: str  # baseline | kept | rolled_back | guard_rejected | error
    rationale: str
    items: int  # items evaluated (fewer when a direct candidate stopped early)
    calls: int  # judge calls made (re-judging included)
    cost_usd: float  # the judge's billed dollars
    answers: dict[str, list[tuple[bool | None, str | None, str]]]  # per item, each replicate's verdict


@dataclass
class LoopRun:
    decisions: list[Decision]
    calls_answered: int  # judge calls the fake server answered, batch entries included
    batches: int
    seconds: float


def loop_template(root: Path) -> Path:
    """``judgeloop init --sample`` with the 32-item dev split, batches polled every 10-40 ms, futility off."""
    with contextlib.redirect_stdout(io.StringIO()):
        ws = make_workspace(root)
        add_small_dev_split(ws)
    config = ws / "judgeloop.toml"
    text = config.read_text(encoding="utf-8")
    assert "\n[judge]\n" in text
    text = text.replace("\n[judge]\n", "\n[judge]\nbatch_poll_s = 0.01\nbatch_poll_max_s = 0.04\n", 1)
    # Futility screening runs on direct passes only (a batch pays every call once sent): off, so both
    # runs judge every candidate in full and their decisions can be compared one for one.
    assert "\nfutility = true" in text
    config.write_text(text.replace("\nfutility = true", "\nfutility = false", 1), encoding="utf-8")
    commit_all(ws, "poll batches fast; futility off")
    return ws


def run_loop(template: Path, dest: Path, wire: str, candidates: int, *, batch: bool) -> LoopRun:
    """The real loop (`start_run`, library strategy) on a copy of ``template`` against a fresh fake."""
    shutil.copytree(template, dest, symlinks=True)
    started = time.perf_counter()
    with FakeLLMServer(default=BothWiresJudge(dest), prompt_cache=PromptCache(), batch_polls=1) as server:
        url = server.anthropic_base_url if wire == "anthropic" else server.openai_base_url
        options = RunOptions(
            strategy="library",
            max_experiments=candidates,
            patience=candidates,
            batch=batch,
            judge=JudgeOverrides(
                provider=wire,
                model=MODELS[wire],
                base_url=url,  # type: ignore[arg-type]
                concurrency=8,
            ),
        )
        start_run(Workspace.open(dest), options)
        answered = len(server.inference_requests())
        batches = len(server.batch_creations)
    with Ledger(dest / "experiments" / "ledger.sqlite") as ledger:
        run = ledger.latest_run()
        assert run is not None
        decisions = [
            Decision(
                e.seq,
                e.status,
                e.rationale or "",
                e.items_evaluated,
                e.calls,
                e.judge_cost_usd,
                {
                    tid: [(a.success, a.mistake_type, a.status) for a in answers]
                    for tid, answers in ledger.item_judgements(e.id).items()
                },
            )
            for e in ledger.experiments(run.id)
        ]
    return LoopRun(decisions, answered, batches, time.perf_counter() - started)


def same_decisions(direct: LoopRun, batch: LoopRun) -> bool:
    """Every experiment the same candidate (rationale) with the same decision, in the same order."""

    def key(run: LoopRun) -> list[tuple[int, str, str]]:
        return [(d.seq, d.rationale, d.status) for d in run.decisions]

    return key(direct) == key(batch)


def verdicts_compared(direct: LoopRun, batch: LoopRun) -> tuple[int, int]:
    """(items both runs judged in the same experiment, of which with identical replicate verdicts)."""
    both = same = 0
    for d, b in zip(direct.decisions, batch.decisions, strict=False):
        for tid in d.answers.keys() & b.answers.keys():
            both += 1
            same += d.answers[tid] == b.answers[tid]
    return both, same


def compare_loops(
    root: Path, candidates: int, *, wires: tuple[str, ...] = tuple(MODELS), say: Any = print
) -> dict[str, tuple[LoopRun, LoopRun]]:
    """Per wire: the loop run direct, then the same run with ``batch=True``, on copies of one workspace."""
    template = loop_template(root / "template")
    out: dict[str, tuple[LoopRun, LoopRun]] = {}
    for wire in wires:
        direct = run_loop(template, root / f"{wire}-direct", wire, candidates, batch=False)
        batch = run_loop(template, root / f"{wire}-batch", wire, candidates, batch=True)
        say(f"  loop {wire:9}: direct {direct.seconds:.0f} s, batch {batch.seconds:.0f} s")
        out[wire] = (direct, batch)
    return out


def decision_table(loops: dict[str, tuple[LoopRun, LoopRun]], candidates: int) -> str:
    lines = [
        f"keep/rollback decisions, the real loop (start_run, strategy library) direct vs RunOptions(batch=True), "
        f"{candidates} candidates on the 32-item sample dev split, fake judge keyed by item and rubric"
    ]
    for wire, (direct, batch) in loops.items():
        lines.append(f"{wire} / {MODELS[wire]}")
        lines.append(
            f"  {'seq':>3} {'direct':<15} {'items':>5} {'calls':>5} {'$':>7}   {'batch':<15} {'items':>5}"
            f" {'calls':>5} {'$':>7}   candidate"
        )
        for d, b in zip(direct.decisions, batch.decisions, strict=False):
            mark = "" if (d.rationale, d.status) == (b.rationale, b.status) else "  <- DIFFERENT"
            lines.append(
                f"  {d.seq:>3} {d.status:<15} {d.items:>5} {d.calls:>5} {d.cost_usd:>7.4f}   "
                f"{b.status:<15} {b.items:>5} {b.calls:>5} {b.cost_usd:>7.4f}   {d.rationale.split(' (')[0]}{mark}"
            )
        n = max(len(direct.decisions), len(batch.decisions))
        agree = sum(
            (d.rationale, d.status) == (b.rationale, b.status)
            for d, b in zip(direct.decisions, batch.decisions, strict=False)
        )
        verdict = "identical" if same_decisions(direct, batch) else "DIFFERENT"
        both, same = verdicts_compared(direct, batch)
        lines.append(
            f"  decisions {verdict} ({agree} of {n} experiments); verdicts identical on {same} of {both} "
            "items both judged"
        )
        lines.append(
            f"  judge calls answered by the fake: "
            f"direct {direct.calls_answered}, batch {batch.calls_answered} in {batch.batches} batches; "
            f"judge $ direct {sum(d.cost_usd for d in direct.decisions):.4f}, "
            f"batch {sum(b.cost_usd for b in batch.decisions):.4f}"
        )
    return "\n".join(lines)
