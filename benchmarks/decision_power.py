"""Decision power of the keep/rollback policies: the real loop against a noisy fake judge, beside the
pure simulation of the same judge.

The judge (benchmarks/_judge_model.py) answers through the test suite's fake server, in the OpenAI
wire format, to the real SDK client: 162 items (62 positives, 100 negatives, AH-D's sizes), each
judged correctly with a fixed probability q_i and a fresh draw on every call (30% unstable items,
q ~ U(0.3, 0.7); the rest q = 0.99, or 0.01 for the 20% of them the judge gets wrong). A candidate is
a real rubric edit proposed by a benchmark strategy:

- ``noop``: a new visible line with a unique tag — nothing real changes, the requests differ, so
  every draw is fresh; every keep is a false discovery;
- ``fixD`` (D = 4, 8, 12): a line holding a marker that the judge answers by getting D chosen items
  (among those it tends to get wrong, q < 0.5, not fixed yet) right every time.

Each run is `optimizer.loop.session.start_run` on the workspace — baseline (one full pass), then
``--candidates`` candidates in a shuffled schedule (``--fixes-per-run`` of each D, no-ops for the
rest), the incumbent kept across candidates as in a real run (a keep, real or not, replaces it;
under ``adaptive`` the incumbent's extra judgements are cached and paid once per incumbent). The
rubric gets a fresh salt line before every run so its baseline is a fresh draw too. Each policy runs
in its own workspace and process; ``--workers`` processes at a time.

Figures per policy: share of no-op candidates kept; share of D-item fixes kept; mean judge calls per
decided candidate / 162 (from the ledger's experiment rows; the fake server's count is checked
against the ledger's total). Loop rates carry 95% intervals from a bootstrap over runs (candidates
of one run share incumbents, so they are not independent trials). The simulation replays the same
runs (same item odds, same schedule, same incumbent handling, first pass without early stopping) with
numpy and the real decision functions of `optimizer.stats.decision`; its calls figure has no early stop,
so it is an upper bound for literal and paired. A second simulated row, ``sim1``, gives every
candidate a fresh incumbent, as the issue's table did. The two differ for a reason that matters: in a
run, a kept no-op becomes the incumbent with the lucky first pass that won its comparison, and the
next candidates are compared with that lucky draw (only ``adaptive`` re-judges it, on the items that
disagree), so in-run keep rates sit below the fresh-incumbent ones.

Measured (default run, seed 0, x86_64 Linux, 2 cores shared with other work, load average ~5-6;
774 s wall), adaptive with rejudge = 2 in the loop: no-op kept 1.5% [0%, 4%] (n = 135), fixes of
4 / 8 / 12 items kept 31% / 56% / 87% (n = 45 each), 1.47 judge calls per candidate per full pass;
the in-run simulation says 4.4% / 26% / 62% / 88% and 1.48; with a fresh incumbent per candidate
(the issue's setting) 7.3% / 31% / 68% / 91% and 1.71. Issue 10's targets hold for no-ops, 12-item
fixes and calls in a run, not for 8-item fixes (>= 70%): 20% of fixed items go unseen because the
incumbent's first pass happened to get them right (not re-judged, d = 0), and ~23 noise items are
re-judged beside ~6 visible fixes; most misses are p >= alpha, few are the literal rule.
``--rejudge 4`` reaches 77% on 8-item fixes at 1.95 calls per pass.

Two further sections (issue 19). *Structure moves*: ``--structural-runs`` adaptive loop runs whose
candidates are judge.toml moves (``[optimizer] structure_moves = ["screenshots", "max_images"]``):
``screenshots = "spaced"`` with a fresh ``max_images`` M, which changes the ``{{screenshots}}``
sentence of the instructions; the judge plants the effect on that sentence (``s-fix8``/``s-fix12``:
8 / 12 wrong items made right; ``s-noop``: only the incumbent's own fixes carried). *Cheaper, not
worse*: ``--cheaper-trials`` simulated cheaper candidates per cell, decided by
`optimizer.stats.decision.decide_cheaper` (worse by 2 positives, or equal; noisy and steady judge; margins
1 and 2). Measured (seed 0, 2 loaded cores; 10 structural runs of 4 moves, 236 s): structure
moves: no-op moves kept 5.0% [0%, 15%] (n = 20), 8-item fixes 70% [40%, 90%], 12-item fixes 90%
[70%, 100%] (n = 10 each), 1.54 judge calls per candidate per full pass; cheaper: worse by 2 kept 2.2% / 5.7%
(margin 1 / 2) on the noisy judge, 0.1% / 0.6% on the steady one; equal kept 19% / 30% noisy, 65% /
94% steady (README, "Structure moves and cheaper judges").

Panel rows (issue 19, ``--panel-runs`` adaptive loop runs): each run's candidates are two judge.toml
moves to a unanimous ``[panel]`` of three named members (``structure_moves = ["panel.members",
"panel.vote"]``), against the judge in panel mode (`benchmarks._judge_model`: a prompt answers an
item the same way on every call): ``p-noop``, members x, y, z that err identically (their vote is a
fresh draw beside the single judge, no gain), then ``p-fix12``, members a, b, c that err
independently on 12 planted negatives the single judge tends to get wrong (their unanimous vote gets
them right: a lower FPR). Figures: kept share per kind (no-op keeps are false keeps) and judge calls
per candidate per full pass (every member's call counted).
Measured (``--runs 0 --sim-runs 20 --structural-runs 0 --cheaper-trials 0 --futility-runs 0
--panel-runs 40 --workers 1``, seed 0, 2 loaded cores, 358 s): no-op panels kept 5.0% [0%, 12%],
planted panels 65% [50%, 80%] (n = 40 each), 4.27 / 4.20 judge calls per candidate per full pass.

Futility rows (`simulate_futility`, ``--futility-runs`` simulated runs, 300 by default): the adaptive
runs again, each candidate also screened as the loop screens it (`optimizer.stats.futility.make_looks`,
each look's disagreements re-judged, `p_clear_rejudged` after each look), and by the earlier
first-pass screen (`p_clear`, one look at 30%, no re-judging) for comparison; coupled (the same draws
with and without), so the rows differ by the screen alone: calls per no-op candidate and kept shares
of no-ops and fixes, off and at several thresholds. Measured (``--no-loop --policies adaptive
--sim-runs 20 --futility-runs 300``, seed 0, 511 s for these rows on 2 loaded cores): a no-op costs
1.42 passes off, 1.20 with the first-pass screen at T = 0.02, 0.84 with the looks at T = 0.01; fixes
of 4 / 8 / 12 items kept 32.7% / 75.0% / 95.0% off, 32.0% / 74.3% / 94.7% at T = 0.01. The last
row is the floor: an oracle (`oracle_p_clear`) that draws the unjudged items from the true odds of
both prompts, with the same looks, at T = 0.01: 0.77 of a pass per no-op (432 s for all these rows,
oracle included). The loop variant ``adaptive+futility`` runs the real loop with ``[loop] futility =
true`` (on by default since; the other loop variants pin it off).

Waves (``run --wave K``, `wave_trials`): runs of one wave each through the real loop, adaptive: K
no-ops (the share of waves that keep one must stay <= alpha: Holm per wave) and one 8-item fix
among K-1 no-ops (the share that keeps the fix, and that keeps a no-op instead); beside them
`simulate_wave_null`, the same no-op waves simulated and decided by `optimizer.stats.decision.holm`.
Measured (alpha 0.1; loop no-op waves pooled over seeds 0 and 1, 16 + 40 runs; planted 16 runs;
sim 2,000 waves): no-op waves with a keep 6.2% (n=16) / 8.9% / 8.9% (n=56) for waves of 1 / 4 / 8,
simulated 7.1% / 7.2% / 6.2%; the planted 8-item fix kept 81% / 44% / 19% (Holm's levels alpha/K..alpha
cost power); 1.66 / 1.59 / 1.57 judge calls per candidate per pass; ~400 s each on 2 cores.

Run:  python benchmarks/decision_power.py [--quick] [--runs 45] [--candidates 6] [--sim-runs 3000]
      [--workers 2] [--policies literal paired adaptive adaptive+futility] [--rejudge 2]
      [--fix-pool wrong|wrong-or-unstable] [--structural-runs 10] [--panel-runs 10] [--cheaper-trials 1000]
      [--futility-runs 300] [--waves 1 4 8] [--wave-runs 30] [--waves-only]
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import platform
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any, get_args
from unittest import mock

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._figures import with_docs_figure
from benchmarks._judge_model import STABLE_Q as STABLE_RIGHT_Q
from benchmarks._judge_model import JudgeModel, item_instruction, item_q
from optimizer.devset.importer import import_split
from optimizer.ledger import Ledger
from optimizer.loop import session
from optimizer.loop.strategies import Proposal, ProposalContext
from optimizer.models import Label
from optimizer.scaffold import init_workspace
from optimizer.stats.binomial import clopper_pearson_interval
from optimizer.stats.decision import (
    Counts,
    adaptive_test,
    decide_adaptive,
    decide_cheaper,
    decide_counts,
    holm,
    lord_level,
)
from optimizer.stats.metrics import Answer
from optimizer.structure import current_value, set_key
from optimizer.workspace.config import JudgeOverrides, LoopSection
from optimizer.workspace.workspace import Workspace
from tests.support.data import pair_items, write_release
from tests.support.fakeserver import FakeLLMServer
from tests.support.panel import write_members

RUBRIC = "prompts/rubric.md"
JUDGE_TOML = "prompts/judge.toml"
STRUCTURAL_KINDS = ("s-noop", "s-fix8", "s-fix12")
# The panel rows: a judge.toml move to a unanimous [panel] of three named members, whose members err
# independently on PANEL_PLANTED planted negatives (p-fix) or identically everywhere (p-noop).
PANEL_PLANTED = 12
PANEL_KINDS = ("p-noop", f"p-fix{PANEL_PLANTED}")
EFFECT_MEMBERS, NOOP_MEMBERS = ("a", "b", "c"), ("x", "y", "z")
N_PAIRS, N_DOUBLE = 50, 12  # 50 pairs: 100 negatives; 12 pairs keep both positives, 38 one: 62
FIX_SIZES = (4, 8, 12)
KINDS = ("noop", *(f"fix{d}" for d in FIX_SIZES))
GIT = ["git", "-c", "user.name=bench", "-c", "user.email=bench@localhost"]


def policies_available() -> list[str]:
    """The keep policies `LoopSection` accepts (``adaptive`` once issue 10 has landed)."""
    return list(get_args(LoopSection.model_fields["policy"].annotation))


def parse_policy(name: str) -> tuple[str, float | None]:
    """``adaptive`` → ("adaptive", None); ``adaptive+fdr0.1`` → ("adaptive", 0.1): online FDR on."""
    base, _, extra = name.partition("+")
    if not extra:
        return base, None
    if not extra.startswith("fdr"):
        raise ValueError(f"unknown policy variant {name!r} (use POLICY or POLICY+fdrLEVEL)")
    return base, float(extra[3:])


def rejudge_default() -> int:
    return int(LoopSection.model_fields["rejudge"].default)


# --- the workspace ------------------------------------------------------------------------------


def build_workspace(root: Path) -> tuple[Path, list[bool], list[str | None]]:
    """A fresh workspace whose dev split has 62 positives and 100 negatives (3-step text-only
    trajectories, unique instructions); returns its root and the labels in item-index order."""
    items = []
    for pair in range(N_PAIRS):
        types = (("Critical Mistake", "Bad Side Effect", "Misunderstanding of the Instruction")[pair % 3],
                 ("Misunderstanding of the Instruction", "Critical Mistake", "Bad Side Effect")[pair % 3])
        items += pair_items(pair, positives=(True, pair < N_DOUBLE), types=types, tag="power")
    for index, item in enumerate(items):
        item.instruction = item_instruction(item.instruction.rstrip("."), index)
    ws = init_workspace(root / "ws")
    release = write_release(root / "release", items, markdown=False)
    import_split(ws, release.root, "dev", all_items=True, warn=lambda _m: None)
    cfg = ws.root / "judgeloop.toml"
    text = cfg.read_text(encoding="utf-8").replace('dev_split = "sample"', 'dev_split = "dev"')
    text = text.replace("infra_retry_pause_s = 10", "infra_retry_pause_s = 0.05")
    cfg.write_text(text, encoding="utf-8")
    judge_toml = ws.root / "prompts" / "judge.toml"
    judge_toml.write_text(judge_toml.read_text(encoding="utf-8").replace('screenshots = "all"', 'screenshots = "none"'),
                          encoding="utf-8")
    _git(ws.root, "add", "-A")
    _git(ws.root, "commit", "-q", "-m", "decision-power workspace")
    assert 'dev_split = "dev"' in cfg.read_text(encoding="utf-8"), "the default config changed: update the benchmark"
    return ws.root, [i.label == "positive" for i in items], [i.mistake_type for i in items]


def _git(root: Path, *args: str) -> str:
    return subprocess.run([*GIT, *args], cwd=root, check=True, capture_output=True, text=True).stdout


def set_loop_key(root: Path, key: str, value: str) -> None:
    """Set ``key = value`` in ``[loop]`` of judgeloop.toml (added when absent)."""
    path = root / "judgeloop.toml"
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    start = lines.index("[loop]\n")
    for i in range(start + 1, len(lines)):
        if lines[i].startswith("["):
            lines.insert(i, f"{key} = {value}\n")
            break
        if lines[i].split("=")[0].strip() == key:
            lines[i] = f"{key} = {value}\n"
            break
    else:
        lines.append(f"{key} = {value}\n")
    path.write_text("".join(lines), encoding="utf-8")


# --- the benchmark's optimiser --------------------------------------------------------------------


@dataclass
class BenchStrategy:
    """Proposes exactly the scheduled edits: a no-op line or a fix marker, appended to the rubric."""

    model: JudgeModel
    rng: random.Random
    schedule: list[str] = field(default_factory=list)
    name: str = "bench"
    counter: int = 0
    structure_value: int = 0

    def nonce(self) -> str:
        self.counter += 1
        return f"{self.counter:x}z{self.rng.getrandbits(32):08x}"

    async def propose(self, ctx: ProposalContext) -> Proposal:
        kind = self.schedule.pop(0)
        if kind.startswith("s-"):
            return self.structural(ctx, kind)
        if kind.startswith("p-"):
            return self.panel(ctx, kind)
        text = ctx.current_files[RUBRIC]
        nonce = self.nonce()
        if kind == "noop":
            line, meta = f"Reviewer note ref-{nonce}: read every step.", {"kind": kind}
        else:
            fixed = self.model.fixed_by(text)
            chosen = self.model.choose_fix(int(kind[3:]), fixed, self.rng)
            line = f"Reviewer rule {self.model.register_fix(nonce, chosen)}: check the final state."
            meta = {"kind": kind, "fixed": chosen}
        return Proposal(files={RUBRIC: text.rstrip("\n") + f"\n\n{line}\n"}, rationale=f"benchmark {kind}", meta=meta)

    def structural(self, ctx: ProposalContext, kind: str) -> Proposal:
        """A structure move (``[optimizer] structure_moves``): ``screenshots = "spaced"`` with a fresh
        ``max_images`` M, which puts "Up to M evenly spaced steps" in the instructions. ``s-noop``: M
        carries the incumbent's fixes, nothing else; ``s-fixD``: they and D new items are right."""
        toml = ctx.current_files[JUDGE_TOML]
        sentence = spaced_sentence(current_value(toml, "max_images"))
        carried = self.model.fixed_by(sentence) if current_value(toml, "screenshots") == "spaced" else set()
        already = carried | self.model.fixed_by(ctx.current_files[RUBRIC])
        chosen = [] if kind == "s-noop" else self.model.choose_fix(int(kind[5:]), already, self.rng)
        self.structure_value = self.structure_value % 97 + 1
        m = self.structure_value + 2  # 3..99: every candidate of a run renders new requests
        self.model.sentence_fixes[spaced_sentence(m)] = frozenset(carried | set(chosen))
        new = set_key(set_key(toml, "screenshots", "spaced"), "max_images", m)
        return Proposal(files={JUDGE_TOML: new}, rationale=f"benchmark {kind}", meta={"kind": kind, "fixed": chosen})


    def panel(self, ctx: ProposalContext, kind: str) -> Proposal:
        """A structure move to a unanimous ``[panel]`` (``[optimizer] structure_moves = ["panel.members",
        "panel.vote"]``): members a, b, c (``p-fix``: they err independently on the planted negatives,
        so their unanimous vote gets those right) or x, y, z (``p-noop``: they err identically)."""
        names = list(NOOP_MEMBERS if kind == "p-noop" else EFFECT_MEMBERS)
        toml = set_key(set_key(ctx.current_files[JUDGE_TOML], "panel.members", names), "panel.vote", "unanimous")
        fixed = [] if kind == "p-noop" else list(self.model.panel_planted)
        return Proposal(files={JUDGE_TOML: toml}, rationale=f"benchmark {kind}", meta={"kind": kind, "fixed": fixed})


def schedule_for(rng: random.Random, candidates: int, fixes_per_run: int) -> list[str]:
    """One run's candidate kinds: ``fixes_per_run`` of each fix size, no-ops for the rest, shuffled."""
    fixes = [f"fix{d}" for d in FIX_SIZES for _ in range(fixes_per_run)]
    if len(fixes) > candidates:
        raise ValueError(f"{candidates} candidates per run cannot hold {len(fixes)} fixes")
    kinds = fixes + ["noop"] * (candidates - len(fixes))
    rng.shuffle(kinds)
    return kinds


# --- trials and their summary -------------------------------------------------------------------


@dataclass(frozen=True)
class Trial:
    """One decided candidate."""

    kind: str
    kept: bool
    calls: int
    run: str = ""  # the run it belongs to: trials of one run share incumbents, so they are not independent


@dataclass
class PolicyResult:
    policy: str
    trials: list[Trial] = field(default_factory=list)
    baseline_calls: int = 0
    server_calls: int = 0
    ledger_calls: int = 0
    undecided: int = 0  # candidates that ended in error (never expected here)
    engine_checked: int = 0  # simulated adaptive decisions replayed with optimizer.stats.decision.decide_adaptive
    wall_s: float = 0.0  # summed over the worker tasks

    def merge(self, other: PolicyResult) -> None:
        self.trials += other.trials
        self.baseline_calls += other.baseline_calls
        self.server_calls += other.server_calls
        self.ledger_calls += other.ledger_calls
        self.undecided += other.undecided
        self.engine_checked += other.engine_checked
        self.wall_s += other.wall_s


def run_bootstrap(trials: Sequence[Trial], kind: str, draws: int = 2000, seed: int = 0) -> tuple[float, float]:
    """95% interval of the keep rate of ``kind``, resampling whole runs (percentile bootstrap): the
    candidates of one run share incumbents, so a binomial interval would be too narrow."""
    per_run: dict[str, list[int]] = {}
    for t in trials:
        if t.kind == kind:
            k_n = per_run.setdefault(t.run, [0, 0])
            k_n[0] += t.kept
            k_n[1] += 1
    if not per_run:
        return (0.0, 1.0)
    k, n = np.array(list(per_run.values())).T
    picks = np.random.default_rng(seed).integers(0, len(k), (draws, len(k)))
    rates = k[picks].sum(axis=1) / n[picks].sum(axis=1)
    lo, hi = np.percentile(rates, [2.5, 97.5])
    return float(lo), float(hi)


def keep_rate(trials: Sequence[Trial], kind: str) -> tuple[int, int]:
    chosen = [t for t in trials if t.kind == kind]
    return sum(t.kept for t in chosen), len(chosen)


def calls_per_pass(trials: Sequence[Trial], n_items: int, kind: str | None = None) -> float:
    chosen = [t for t in trials if kind is None or t.kind == kind]
    return sum(t.calls for t in chosen) / len(chosen) / n_items if chosen else float("nan")


def spaced_sentence(max_images: object) -> str:
    """The words of the {{screenshots}} sentence that name ``max_images`` under ``screenshots = "spaced"``."""
    return f"Up to {max_images} evenly spaced steps"


# --- the real loop ------------------------------------------------------------------------------


@contextlib.contextmanager
def _strategy_installed(strategy: BenchStrategy) -> Iterator[None]:
    # `start_run` builds its optimiser by name; the benchmark's proposes scheduled edits instead.
    with mock.patch.object(session, "make_strategy", lambda *_a, **_k: strategy):
        yield


def loop_trials(policy: str, runs: int, candidates: int, fixes_per_run: int, seed: int, *,
                concurrency: int = 16, rejudge: int | None = None, fix_pool: str = "wrong",
                item_seed: int = 0, odds: tuple[np.ndarray, np.ndarray] | None = None,
                schedule: Sequence[str] | None = None, wave: int | None = None) -> PolicyResult:
    """``runs`` loop runs of ``candidates`` candidates each under ``policy``; one workspace, one fake
    server. ``item_seed`` fixes the judge's item odds (the same for every policy); ``odds`` (q,
    fixable) replaces them and ``schedule`` the shuffled schedule of every run (tests); ``wave``:
    ``run --wave`` (candidates per round, decided together)."""
    started = time.monotonic()
    result = PolicyResult(policy)
    rng = random.Random(f"{seed}/{policy}")
    # A dummy key for the fake server, for this call only (the caller's environment is left as it was).
    key = {"OPENAI_API_KEY": os.environ.get("OPENAI_API_KEY", "decision-power-bench")}
    with mock.patch.dict(os.environ, key), tempfile.TemporaryDirectory(prefix="decision-power-") as tmp:
        root, positive, types = build_workspace(Path(tmp))
        q, fixable = odds if odds is not None else item_q(len(positive), item_seed, fix_pool=fix_pool)
        model = JudgeModel(positive, types, q, fixable, seed=rng.getrandbits(32))
        futility = policy.endswith(FUTILITY)
        base_policy, fdr = parse_policy(policy.removesuffix(FUTILITY))
        set_loop_key(root, "policy", f'"{base_policy}"')
        # Explicit either way: plain ``adaptive`` rows (and the structural, panel and wave rows) are the
        # policy judged in full, as measured before futility was on by default.
        set_loop_key(root, "futility", "true" if futility else "false")
        if fdr is not None:
            set_loop_key(root, "fdr", str(fdr))
        set_loop_key(root, "patience", "1000000")
        if any(k.startswith("s-") for k in schedule or ()):
            cfg = root / "judgeloop.toml"
            cfg.write_text(cfg.read_text(encoding="utf-8").replace(
                "[optimizer]\n", '[optimizer]\nstructure_moves = ["screenshots", "max_images"]\n', 1), encoding="utf-8")
        if any(k.startswith("p-") for k in schedule or ()):
            setup_panel(root, model, rng)
        if rejudge is not None and "rejudge" in LoopSection.model_fields:
            set_loop_key(root, "rejudge", str(rejudge))
        base_branch = _git(root, "rev-parse", "--abbrev-ref", "HEAD").strip()
        strategy = BenchStrategy(model, rng)
        with FakeLLMServer(default=model, keep_alive=True) as server, _strategy_installed(strategy):
            judge = JudgeOverrides(provider="openai", model="fake-judge", base_url=server.openai_base_url,
                                   concurrency=concurrency)
            for run_no in range(runs):
                _git(root, "checkout", "-q", base_branch)
                # A fresh salt line: this run's baseline is a new draw, not the previous run's cache.
                rubric = root / RUBRIC
                lines = [ln for ln in rubric.read_text(encoding="utf-8").splitlines() if not ln.startswith("Run salt")]
                rubric.write_text("\n".join(lines) + f"\nRun salt s{seed}x{run_no}x{strategy.nonce()}.\n",
                                  encoding="utf-8")
                _git(root, "commit", "-qam", f"salt {run_no}")
                strategy.schedule = list(schedule) if schedule else schedule_for(rng, candidates, fixes_per_run)
                kinds = list(strategy.schedule)
                ws = Workspace.open(root)
                outcome = session.start_run(ws, session.RunOptions(max_experiments=len(kinds), judge=judge, wave=wave))
                with Ledger(ws.ledger_path) as ledger:
                    exps = ledger.experiments(outcome.run_id)
                for exp in exps:
                    result.ledger_calls += exp.calls
                    if exp.seq == 0:
                        result.baseline_calls += exp.calls
                        continue
                    if exp.status not in ("kept", "rolled_back"):
                        result.undecided += 1
                        continue
                    assert exp.proposal_meta["kind"] == kinds[exp.seq - 1], "the schedule and the ledger disagree"
                    result.trials.append(Trial(exp.proposal_meta["kind"], exp.status == "kept", exp.calls,
                                               run=outcome.run_id))
        result.server_calls = model.calls
    result.wall_s = time.monotonic() - started
    return result


def setup_panel(root: Path, model: JudgeModel, rng: random.Random) -> None:
    """The panel rows' workspace and judge: member files for both panels (committed with the baseline,
    unused until judge.toml names them), panel moves on, the judge in panel mode (`JudgeModel.steady`)
    with `PANEL_PLANTED` negatives the single judge tends to get wrong planted."""
    write_members(root, EFFECT_MEMBERS + NOOP_MEMBERS)
    cfg = root / "judgeloop.toml"
    cfg.write_text(cfg.read_text(encoding="utf-8").replace(
        "[optimizer]\n", '[optimizer]\nstructure_moves = ["panel.members", "panel.vote"]\nmax_members = 3\n', 1),
        encoding="utf-8")
    _git(root, "add", "-A")
    _git(root, "commit", "-q", "-m", "panel members")
    negatives = {i for i, p in enumerate(model.positive) if not p}
    pool = sorted(int(i) for i in np.flatnonzero(model.fixable) if int(i) in negatives)
    model.steady, model.independent_members = True, EFFECT_MEMBERS
    model.panel_planted = tuple(sorted(rng.sample(pool, min(PANEL_PLANTED, len(pool)))))


def panel_rows(runs: int, seed: int, *, rejudge: int | None = None, concurrency: int = 16) -> list[str]:
    """The panel rows: adaptive loop runs of two judge.toml moves each, a no-op panel then a panel
    with a planted FPR effect (`BenchStrategy.panel`): kept share per kind, judge calls per
    candidate per full pass (every member's call counted)."""
    res = loop_trials("adaptive", runs, len(PANEL_KINDS), 0, seed, concurrency=concurrency, rejudge=rejudge,
                      schedule=PANEL_KINDS)
    n = len(_labels_only()[1])
    head = (f"{'source':<16} " + " ".join(f"{k + ' kept':>24}" for k in PANEL_KINDS)
            + " " + " ".join(f"{k + ' calls/162':>17}" for k in PANEL_KINDS))
    cells = []
    for kind in PANEL_KINDS:
        k, total = keep_rate(res.trials, kind)
        lo, hi = run_bootstrap(res.trials, kind)
        cells.append(f"{k / total:>6.1%} [{lo:>4.0%},{hi:>4.0%}] n={total:<4}" if total else f"{'—':>24}")
    row = (f"{'loop, panels':<16} " + " ".join(f"{c:>24}" for c in cells) + " "
           + " ".join(f"{calls_per_pass(res.trials, n, kind):>17.2f}" for kind in PANEL_KINDS))
    return [head, "-" * len(head), row,
            f"  undecided {res.undecided}; judge calls at the server {res.server_calls}, in the ledger "
            f"{res.ledger_calls}; {res.wall_s:.0f} s"]


def structural_rows(runs: int, seed: int, *, rejudge: int | None = None, concurrency: int = 16) -> list[str]:
    """The structural rows: the real loop (adaptive) where candidates are judge.toml moves, a planted
    structural effect (`BenchStrategy.structural`): no-op moves and moves that fix 8 or 12 items."""
    schedule = ["s-noop", "s-fix8", "s-noop", "s-fix12"]
    res = loop_trials("adaptive", runs, len(schedule), 0, seed, concurrency=concurrency, rejudge=rejudge,
                      schedule=schedule)
    head = f"{'source':<16} " + " ".join(f"{k + ' kept':>24}" for k in STRUCTURAL_KINDS) + f" {'calls/162':>9}"
    cells = []
    for kind in STRUCTURAL_KINDS:
        k, total = keep_rate(res.trials, kind)
        lo, hi = run_bootstrap(res.trials, kind)
        cells.append(f"{k / total:>6.1%} [{lo:>4.0%},{hi:>4.0%}] n={total:<4}" if total else f"{'—':>24}")
    row = f"{'loop, moves':<16} " + " ".join(f"{c:>24}" for c in cells)
    row += f" {calls_per_pass(res.trials, len(_labels_only()[1])):>9.2f}"
    return [head, "-" * len(head), row, f"  undecided {res.undecided}; {res.wall_s:.0f} s"]


def _loop_task(args: tuple[Any, ...]) -> PolicyResult:
    policy, runs, candidates, fixes_per_run, seed, concurrency, rejudge, fix_pool = args
    return loop_trials(policy, runs, candidates, fixes_per_run, seed, concurrency=concurrency, rejudge=rejudge,
                       fix_pool=fix_pool)


# --- waves ----------------------------------------------------------------------------------------

WAVE_FIX = "fix8"


@dataclass(frozen=True)
class WaveRow:
    """One wave size through the real loop: runs of one wave each (baseline, then K candidates)."""

    wave: int
    null_waves: int  # waves of K no-ops
    null_false_keeps: int  # of them, waves that kept a no-op
    planted_waves: int  # waves of one 8-item fix and K-1 no-ops
    planted_fix_kept: int
    planted_noop_kept: int
    calls_per_candidate: float  # judge calls per decided candidate / 162
    trials: int = 0  # decided candidates


def wave_trials(k: int, runs: int, seed: int, *, concurrency: int = 8, rejudge: int | None = None,
                odds: tuple[np.ndarray, np.ndarray] | None = None,
                cases: Sequence[str] = ("null", "planted"), futility: bool = False) -> WaveRow:
    """``runs`` runs of one wave of ``k`` no-ops (case ``null``) and ``runs`` of one wave of an 8-item
    fix among ``k - 1`` no-ops (``planted``; the fix proposed last: Holm breaks a tie by the earlier
    candidate), each run a fresh baseline, through `session.start_run` with ``wave = k`` under the
    adaptive policy (``futility``: with ``[loop] futility = true``, the default)."""
    policy = "adaptive" + (FUTILITY if futility else "")
    empty = PolicyResult(policy)
    null = loop_trials(policy, runs, k, 0, seed, concurrency=concurrency, rejudge=rejudge, odds=odds,
                       schedule=["noop"] * k, wave=k) if "null" in cases else empty
    planted = loop_trials(policy, runs, k, 0, seed + 1, concurrency=concurrency, rejudge=rejudge, odds=odds,
                          schedule=["noop"] * (k - 1) + [WAVE_FIX], wave=k) if "planted" in cases else empty
    kept_runs = {t.run for t in null.trials if t.kept}
    fix_kept = sum(t.kept for t in planted.trials if t.kind == WAVE_FIX)
    noop_kept = sum(t.kept for t in planted.trials if t.kind == "noop")
    trials = null.trials + planted.trials
    n_items = (null.baseline_calls + planted.baseline_calls) // max(1, runs * len(cases))
    calls = sum(t.calls for t in trials) / len(trials) / n_items if trials and n_items else float("nan")
    return WaveRow(k, len({t.run for t in null.trials}), len(kept_runs), len({t.run for t in planted.trials}),
                   fix_kept, noop_kept, calls, len(trials))


def merge_wave_rows(rows: Sequence[WaveRow]) -> WaveRow:
    """One wave size's rows (tasks of a few runs each) as one."""
    trials = sum(r.trials for r in rows)
    calls = sum(r.calls_per_candidate * r.trials for r in rows) / trials if trials else float("nan")
    return WaveRow(rows[0].wave, sum(r.null_waves for r in rows), sum(r.null_false_keeps for r in rows),
                   sum(r.planted_waves for r in rows), sum(r.planted_fix_kept for r in rows),
                   sum(r.planted_noop_kept for r in rows), calls, trials)


def wave_table(rows: Sequence[WaveRow], alpha: float = 0.1) -> list[str]:
    """Per wave size: the share of no-op waves with a (false) keep, with its 95% Clopper-Pearson interval
    (runs are independent: each has its own baseline), beside alpha; the planted fix's kept share."""
    from optimizer.stats.binomial import clopper_pearson_interval

    head = (f"{'wave':>4} {'no-op waves with a keep':>30} {'<= alpha':>8} {'planted fix8 kept':>26} "
            f"{'a no-op kept instead':>20} {'calls/cand/162':>14}")
    lines = [head, "-" * len(head)]
    for r in rows:
        lo, hi = clopper_pearson_interval(r.null_false_keeps, r.null_waves) if r.null_waves else (0.0, 1.0)
        rate = r.null_false_keeps / r.null_waves if r.null_waves else float("nan")
        fix = r.planted_fix_kept / r.planted_waves if r.planted_waves else float("nan")
        flo, fhi = clopper_pearson_interval(r.planted_fix_kept, r.planted_waves) if r.planted_waves else (0.0, 1.0)
        other = r.planted_noop_kept / r.planted_waves if r.planted_waves else float("nan")
        lines.append(f"{r.wave:>4} {rate:>7.1%} [{lo:>4.0%},{hi:>4.0%}] n={r.null_waves:<8} "
                     f"{'yes' if rate <= alpha else 'NO':>8} {fix:>7.1%} [{flo:>4.0%},{fhi:>4.0%}] n={r.planted_waves:<4} "
                     f"{other:>20.1%} {r.calls_per_candidate:>14.2f}")
    return lines


def simulate_wave_null(q: np.ndarray, positive: np.ndarray, k: int, waves: int, seed: int, *, rejudge: int = 2,
                       alpha: float = 0.1) -> tuple[int, int]:
    """(waves that keep a no-op, waves) for ``waves`` simulated waves of ``k`` no-ops against one fresh
    incumbent each (its re-judgings shared, as the cache shares them), decided as the loop does: each
    candidate's literal rule and sign-flip p-value (`optimizer.stats.decision.adaptive_test`), then Holm
    (`optimizer.stats.decision.holm`)."""
    rng = np.random.default_rng(seed)
    n = len(q)
    loop = LoopSection(policy="literal", alpha=alpha)
    kept = 0
    for _ in range(waves):
        inc_first = rng.random(n) < q
        inc_extra: dict[int, list[bool]] = {}
        ps: list[float | None] = []
        ok: list[bool] = []
        for _c in range(k):
            cand_first = rng.random(n) < q
            judgements = np.ones(n, int)
            inc_total, cand_total = inc_first.astype(int), cand_first.astype(int)
            for i in np.flatnonzero(inc_first != cand_first):
                have = inc_extra.setdefault(int(i), [])
                while len(have) < rejudge:
                    have.append(bool(rng.random() < q[i]))
                inc_total[i] += sum(have[:rejudge])
                cand_total[i] += int((rng.random(rejudge) < q[i]).sum())
                judgements[i] = 1 + rejudge
            tie_ok = ~positive
            maj_i = (inc_total * 2 > judgements) | ((inc_total * 2 == judgements) & tie_ok)
            maj_c = (cand_total * 2 > judgements) | ((cand_total * 2 == judgements) & tie_ok)
            ok.append(decide_counts(_counts(maj_i, positive), _counts(maj_c, positive), int((~maj_i & maj_c).sum()),
                                    int((maj_i & ~maj_c).sum()), loop).literal_keep)
            rejudged = judgements > 1
            diffs = [Fraction(int(d), 1 + rejudge) for d in (cand_total - inc_total)[rejudged] if d]
            ps.append(adaptive_test(diffs).p_value if rejudged.any() else None)
        kept += any(r.rejected and good for r, good in zip(holm(ps, alpha, k), ok, strict=True))
    return kept, waves


def _wave_task(args: tuple[Any, ...]) -> WaveRow:
    k, runs, seed, concurrency, rejudge, case, futility = args
    return wave_trials(k, runs, seed, concurrency=concurrency, rejudge=rejudge, cases=(case,), futility=futility)


# --- the pure simulation ------------------------------------------------------------------------


def sign_flip_below(diffs: Sequence[int], judgements: int, alpha: float) -> bool:
    """p < alpha for per-item differences ``diffs`` in correct judgements out of ``judgements`` each,
    by `optimizer.stats.signflip` on the exact shares (as the loop decides)."""
    return adaptive_test([Fraction(int(d), judgements) for d in diffs if d]).below(Fraction(repr(float(alpha))))


def _counts(correct: np.ndarray, positive: np.ndarray) -> Counts:
    tp = int((correct & positive).sum())
    tn = int((correct & ~positive).sum())
    n_pos = int(positive.sum())
    return Counts(tp, n_pos - tp, tn, len(positive) - n_pos - tn)


def adaptive_keep(inc_total: np.ndarray, cand_total: np.ndarray, judgements: np.ndarray,
                  positive: np.ndarray, loop: LoopSection) -> bool:
    """The adaptive rule on per-item totals of correct judgements out of ``judgements``: the
    literal rule on per-item majorities, and the sign-flip test on the per-item differences."""
    # A tied majority is "failure" (`metrics.majority_answer`): right on a negative, wrong on a positive.
    tie_ok = ~positive
    maj_i = (inc_total * 2 > judgements) | ((inc_total * 2 == judgements) & tie_ok)
    maj_c = (cand_total * 2 > judgements) | ((cand_total * 2 == judgements) & tie_ok)
    improved, worsened = int((~maj_i & maj_c).sum()), int((maj_i & ~maj_c).sum())
    literal = decide_counts(_counts(maj_i, positive), _counts(maj_c, positive), improved, worsened,
                            loop.model_copy(update={"policy": "literal"}))
    if not literal.literal_keep:
        return False
    # Items judged once were judged alike (d = 0): the test sees the re-judged items, all with the
    # same number of judgements.
    rejudged = judgements > 1
    if not rejudged.any():
        return False
    diffs = (cand_total - inc_total)[rejudged]
    return sign_flip_below([int(x) for x in diffs], int(judgements[rejudged][0]), loop.alpha)


def engine_adaptive_keep(inc_first: np.ndarray, cand_first: np.ndarray, inc_j: dict[int, list[bool]],
                         cand_j: dict[int, list[bool]], positive: np.ndarray, rejudge: int, alpha: float) -> bool:
    """The same decision by `optimizer.stats.decision.decide_adaptive` on labels and answers, as the loop
    makes it. ``inc_j``/``cand_j``: the re-judged items' judgements (correct or not)."""
    labels = {f"i{k:03d}": Label(trajectory_id=f"i{k:03d}", label="positive" if pos else "negative", original_id="r")
              for k, pos in enumerate(positive)}

    def answers(k: int, correct: list[bool]) -> list[Answer]:
        return [Answer(success=bool(positive[k]) if ok else not positive[k]) for ok in correct]

    inc = {f"i{k:03d}": answers(k, inc_j.get(k, [bool(inc_first[k])])) for k in range(len(positive))}
    cand = {f"i{k:03d}": answers(k, cand_j.get(k, [bool(cand_first[k])])) for k in range(len(positive))}
    loop = LoopSection.model_validate({"policy": "adaptive", "alpha": alpha, "rejudge": rejudge})
    decision = decide_adaptive(labels, inc, cand, loop, first_pass=1, rejudged=[f"i{k:03d}" for k in cand_j])
    return bool(decision.keep)


def sim_rejudge(rng: np.random.Generator, disagree: np.ndarray, rejudge: int, q_i: np.ndarray, q_c: np.ndarray,
                inc_extra: dict[int, list[bool]], cand_extra: dict[int, list[bool]], inc_total: np.ndarray,
                cand_total: np.ndarray, judgements: np.ndarray) -> np.ndarray:
    """The adaptive re-judging of the items in ``disagree``, simulated: the incumbent's extra judgements
    drawn once per incumbent (``inc_extra``, reused by its later candidates), ``rejudge`` new ones for
    the candidate (into ``cand_extra``); the totals and judgement counts updated in place. Returns the
    incumbent's new calls per item (the candidate's are ``rejudge`` per item)."""
    new_inc = np.zeros(len(q_i), int)
    for i in disagree:
        have = inc_extra.setdefault(int(i), [])
        while len(have) < rejudge:
            have.append(bool(rng.random() < q_i[i]))
            new_inc[i] += 1
        mine = [bool(x) for x in rng.random(rejudge) < q_c[i]]
        cand_extra[int(i)] = mine
        inc_total[i] += sum(have[:rejudge])
        cand_total[i] += sum(mine)
        judgements[i] = 1 + rejudge
    return new_inc


def simulate(policy: str, q: np.ndarray, fixable: np.ndarray, positive: np.ndarray, runs: int, candidates: int,
             fixes_per_run: int, seed: int, *, rejudge: int = 2, alpha: float = 0.1,
             schedule: Sequence[str] | None = None, check_engine: int = 0) -> PolicyResult:
    """The loop's runs replayed in numpy: same odds, schedule and incumbent handling; the first pass
    is judged in full (no early stopping); decisions by `optimizer.stats.decision`."""
    base_policy, fdr = parse_policy(policy)
    rng = np.random.default_rng(seed)
    sched_rng = random.Random(seed)
    n = len(q)
    loop = LoopSection(policy="literal", alpha=alpha)
    result = PolicyResult(policy)
    fixable_idx = np.flatnonzero(fixable)
    for run_no in range(runs):
        inc_fixed = np.zeros(n, bool)
        inc_first = rng.random(n) < q
        inc_extra: dict[int, list[bool]] = {}
        past_keeps: list[bool] = []
        result.baseline_calls += n
        for kind in list(schedule) if schedule else schedule_for(sched_rng, candidates, fixes_per_run):
            cand_fixed = inc_fixed.copy()
            if kind != "noop":
                pool = [i for i in fixable_idx if not inc_fixed[i]]
                chosen = rng.choice(pool, min(int(kind[3:]), len(pool)), replace=False)
                cand_fixed[chosen] = True
            q_c = np.where(cand_fixed, 1.0, q)
            q_i = np.where(inc_fixed, 1.0, q)
            cand_first = rng.random(n) < q_c
            calls = n
            cand_extra: dict[int, list[bool]] = {}
            level = alpha if fdr is None else lord_level(fdr, past_keeps)
            if base_policy in ("literal", "paired"):
                improved = int((~inc_first & cand_first).sum())
                worsened = int((inc_first & ~cand_first).sum())
                d = decide_counts(_counts(inc_first, positive), _counts(cand_first, positive), improved, worsened,
                                  loop.model_copy(update={"alpha": level}))
                kept = d.literal_keep if base_policy == "literal" else d.paired_keep
            else:
                disagree = np.flatnonzero(inc_first != cand_first)
                judgements = np.ones(n, int)
                inc_total = inc_first.astype(int)
                cand_total = cand_first.astype(int)
                calls += int(sim_rejudge(rng, disagree, rejudge, q_i, q_c, inc_extra, cand_extra, inc_total,
                                         cand_total, judgements).sum()) + rejudge * len(disagree)
                kept = adaptive_keep(inc_total, cand_total, judgements, positive, loop.model_copy(update={"alpha": level}))
                if result.engine_checked < check_engine and fdr is None:
                    inc_j = {int(i): [bool(inc_first[i]), *inc_extra.get(int(i), [])[:rejudge]] for i in disagree}
                    cand_j = {int(i): [bool(cand_first[i])] + cand_extra[int(i)] for i in disagree}
                    engine = engine_adaptive_keep(inc_first, cand_first, inc_j, cand_j, positive, rejudge, alpha)
                    assert engine == kept, "the simulation's adaptive rule and optimizer.stats.decision disagree"
                    result.engine_checked += 1
            result.trials.append(Trial(kind, kept, calls, run=f"sim{seed}-{run_no}"))
            past_keeps.append(kept)
            if kept:
                inc_fixed, inc_first, inc_extra = cand_fixed, cand_first, cand_extra
    return result


def simulate_fresh(policy: str, q: np.ndarray, fixable: np.ndarray, positive: np.ndarray, trials: int, seed: int,
                   *, rejudge: int = 2, alpha: float = 0.1) -> PolicyResult:
    """``trials`` candidates of every kind, each against a fresh incumbent (the issue's simulation)."""
    result = PolicyResult(policy)
    for k, kind in enumerate(KINDS):
        result.merge(simulate(policy, q, fixable, positive, trials, 1, 0, seed * 10 + k, rejudge=rejudge,
                              alpha=alpha, schedule=[kind]))
    return result


# --- cheaper, not worse ([loop] cheaper_margin_items) ------------------------------------------
#
# The non-inferiority rule on the same judge: a cheaper candidate that is *worse* by ``worse_by`` items
# (that many positives the judge always got right, q = 0.99, now always wrong: FPR unchanged, so only
# the test can refuse it) or *equal* (worse_by = 0: the same odds, fresh draws). Each trial: a fresh
# incumbent first pass and the candidate's, the items they disagree on re-judged ``rejudge`` more
# times under each (as the loop does for a candidate estimated cheaper), then the engine's own rule,
# `optimizer.stats.decision.decide_cheaper`, with a saving of 50%. A keep of a worse-by-2 candidate at
# margin 1 is a false keep: their share should stay below alpha.


def simulate_cheaper(q: np.ndarray, positive: np.ndarray, worse_by: int, trials: int, seed: int, *,
                     margin: int = 1, rejudge: int = 2, alpha: float = 0.1) -> tuple[int, int, float]:
    """(keeps, trials, judge calls per candidate / items) of cheaper candidates worse by ``worse_by`` items."""
    rng = np.random.default_rng(seed)
    n = len(q)
    labels = {f"i{i}": Label(trajectory_id=f"i{i}", label="positive" if positive[i] else "negative",
                             original_id=f"i{i}") for i in range(n)}
    loop = LoopSection(alpha=alpha, rejudge=rejudge, cheaper_margin_items=margin)
    steady_right = np.flatnonzero(positive & (q >= STABLE_RIGHT_Q))
    kept = calls = 0

    def answers(correct: Sequence[bool], pos: bool) -> list[Answer]:
        return [Answer(success=pos == c, mistake_type=None) for c in correct]

    for _ in range(trials):
        q_c = q.copy()
        q_c[rng.choice(steady_right, worse_by, replace=False)] = 0.0
        inc = [[bool(x)] for x in rng.random(n) < q]
        cand = [[bool(x)] for x in rng.random(n) < q_c]
        calls += n
        for i in range(n):
            if inc[i][0] != cand[i][0]:
                inc[i] += [bool(x) for x in rng.random(rejudge) < q[i]]
                cand[i] += [bool(x) for x in rng.random(rejudge) < q_c[i]]
                calls += 2 * rejudge
        test = decide_cheaper(labels, {f"i{i}": answers(inc[i], bool(positive[i])) for i in range(n)},
                              {f"i{i}": answers(cand[i], bool(positive[i])) for i in range(n)}, loop, saving=0.5)
        kept += test.keep
    return kept, trials, calls / max(1, trials) / n


def cheaper_rows(q: np.ndarray, positive: np.ndarray, trials: int, seed: int, *, rejudge: int = 2,
                 margins: Sequence[int] = (1, 2)) -> list[str]:
    """The non-inferiority table: keep shares of worse-by-2 and equal cheaper candidates, on the
    benchmark's noisy judge and on a steady one (its unstable items made stable, q = 0.99 / 0.01)."""
    steady = np.where(q >= 0.5, STABLE_RIGHT_Q, 1 - STABLE_RIGHT_Q)
    head = f"{'judge':<7} {'margin':>6} {'worse by 2 kept':>26} {'equal kept':>26} {'calls/162':>9}"
    lines = [head, "-" * len(head)]
    for name, odds in (("noisy", q), ("steady", steady)):
        for margin in margins:
            cells = []
            per = 0.0
            for k, worse in enumerate((2, 0)):
                keeps, total, per = simulate_cheaper(odds, positive, worse, trials, seed * 100 + margin * 10 + k,
                                                     margin=margin, rejudge=rejudge)
                lo, hi = clopper_pearson_interval(keeps, total)
                cells.append(f"{keeps / total:>6.1%} [{lo:>5.1%},{hi:>5.1%}] n={total:<5}")
            lines.append(f"{name:<7} {margin:>6} {cells[0]:>26} {cells[1]:>26} {per:>9.2f}")
    return lines

# --- futility screening (optimizer.stats.futility) ----------------------------------------------------

FUTILITY = "+futility"  # a loop policy variant: adaptive with ``[loop] futility = true`` (off by default)
FUTILITY_THRESHOLDS = (0.01, 0.02, 0.05, 0.1)


def oracle_p_clear(inside: np.ndarray, cand_total: np.ndarray, inc_total: np.ndarray, judgements: np.ndarray,
                   inc_first: np.ndarray, q_c: np.ndarray, q_i: np.ndarray, positive: np.ndarray, loop: LoopSection,
                   rng: np.random.Generator, draws: int = 200) -> float:
    """P(clear) as an oracle knows it: the items ``inside`` the look as judged (first pass and re-judging),
    every other item's judgements drawn from the true odds of both prompts (``q_c``, ``q_i``) — the
    candidate's first pass, and where it differs from the incumbent's the re-judging of both. No screen
    that learns the odds from the judged items can do better with the same looks: its row is the floor."""
    from optimizer.stats.decision import exact_fraction
    from optimizer.stats.futility import _clears, _right

    out = np.flatnonzero(~inside)
    negative = ~positive
    alpha = exact_fraction(loop.alpha)
    clears = 0
    for _ in range(draws):
        cc, cn, ic, in_ = cand_total.copy(), judgements.copy(), inc_total.copy(), judgements.copy()
        first = rng.random(len(out)) < q_c[out]
        cc[out], cn[out], ic[out], in_[out] = first, 1, inc_first[out], 1
        d = out[first != inc_first[out]]
        cc[d] += rng.binomial(loop.rejudge, q_c[d])
        ic[d] += rng.binomial(loop.rejudge, q_i[d])
        cn[d] += loop.rejudge
        in_[d] += loop.rejudge
        clears += _clears(cc, cn, ic, in_, _right(cc, cn, negative), _right(ic, in_, negative), positive, loop,
                          alpha) is None
    return clears / draws


def simulate_futility(q: np.ndarray, fixable: np.ndarray, positive: np.ndarray, runs: int, candidates: int,
                      fixes_per_run: int, seed: int, *, rejudge: int = 2, alpha: float = 0.1,
                      thresholds: Sequence[float] = FUTILITY_THRESHOLDS,
                      first_pass_threshold: float = 0.02,
                      oracle: bool = True) -> tuple[PolicyResult, dict[str, PolicyResult]]:
    """The adaptive runs of `simulate`, each candidate also screened as the loop screens it: the
    looks of `optimizer.stats.futility.make_looks` (the incumbent's wrong items and growing stratified
    shares of the rest), each look's disagreements re-judged, `optimizer.stats.futility.p_clear_rejudged`
    checked after each look. Coupled: one set of draws per candidate; "with futility at T" keeps a
    candidate iff the full decision keeps it and no look's P(clear) is below T, and pays, when a look
    stops it, that look's first-pass and re-judging calls (the incumbent's counted where this
    candidate is the first to need them). The incumbent follows the decisions without futility (so
    the rows differ only by the screen; a blocked keep changes no later incumbent). One more row,
    "first pass only", is the earlier screen: one look at 30%, no re-judging (`p_clear`); ``oracle``
    adds the floor (`oracle_p_clear`: the same looks, the unjudged items drawn from the true odds) at
    the first threshold."""
    from optimizer.stats.futility import SCREEN_SHARE, make_looks, make_screen, p_clear, p_clear_rejudged

    ids = [f"i{k:03d}" for k in range(len(positive))]
    labels = {t: Label(trajectory_id=t, label="positive" if pos else "negative", original_id="r")
              for t, pos in zip(ids, positive, strict=True)}
    loop = LoopSection.model_validate({"policy": "adaptive", "alpha": alpha, "rejudge": rejudge})
    right_answer = {t: Answer(success=bool(pos)) for t, pos in zip(ids, positive, strict=True)}
    wrong_answer = {t: Answer(success=not pos) for t, pos in zip(ids, positive, strict=True)}

    def answers(t: str, correct: Sequence[bool]) -> list[Answer]:
        return [right_answer[t] if ok else wrong_answer[t] for ok in correct]

    rng = np.random.default_rng(seed)
    sched_rng = random.Random(seed)
    n = len(q)
    base = PolicyResult("adaptive")
    first_name = f"first pass only, T = {first_pass_threshold:g}"
    screened = {first_name: PolicyResult("adaptive+futility-first-pass")}
    screened |= {f"on, T = {t:g}": PolicyResult(f"adaptive+futility{t:g}") for t in thresholds}
    oracle_name = f"oracle (true odds), T = {thresholds[0]:g}"
    if oracle:
        screened[oracle_name] = PolicyResult("adaptive+futility-oracle")
    oracle_rng = np.random.default_rng(seed + 17)
    fixable_idx = np.flatnonzero(fixable)
    n_cand = 0
    for run_no in range(runs):
        inc_fixed = np.zeros(n, bool)
        inc_first = rng.random(n) < q
        inc_extra: dict[int, list[bool]] = {}
        for kind in schedule_for(sched_rng, candidates, fixes_per_run):
            n_cand += 1
            cand_fixed = inc_fixed.copy()
            if kind != "noop":
                pool = [i for i in fixable_idx if not inc_fixed[i]]
                cand_fixed[rng.choice(pool, min(int(kind[3:]), len(pool)), replace=False)] = True
            q_c, q_i = np.where(cand_fixed, 1.0, q), np.where(inc_fixed, 1.0, q)
            cand_first = rng.random(n) < q_c
            calls = n
            judgements = np.ones(n, int)
            inc_total, cand_total = inc_first.astype(int), cand_first.astype(int)
            cand_extra: dict[int, list[bool]] = {}
            disagree = np.flatnonzero(inc_first != cand_first)
            new_inc_calls = sim_rejudge(rng, disagree, rejudge, q_i, q_c, inc_extra, cand_extra, inc_total,
                                        cand_total, judgements)
            calls += int(new_inc_calls.sum()) + rejudge * len(disagree)
            kept = adaptive_keep(inc_total, cand_total, judgements, positive, loop)
            run = f"fut{seed}-{run_no}"
            base.trials.append(Trial(kind, kept, calls, run=run))
            inc_j = {t: answers(t, [bool(inc_first[k])]) for k, t in enumerate(ids)}
            decision_seed = seed * 100_003 + n_cand
            # The earlier screen: first pass only, one look.
            screen = make_screen(labels, {t: js[0] for t, js in inc_j.items()}, decision_seed, SCREEN_SHARE)
            first_j = {t: answers(t, [bool(cand_first[k])]) for k, t in enumerate(ids) if t in screen.ids}
            est = p_clear(labels, screen, inc_j, first_j, loop, level=alpha, seed=seed * 7 + n_cand)
            stopped = est is not None and est.p_clear < first_pass_threshold
            screened[first_name].trials.append(
                Trial(kind, kept and not stopped, len(first_j) if stopped else calls, run=run))
            # The looks, each one's disagreements re-judged (the same draws the full decision used).
            inc_now = {t: answers(t, [bool(inc_first[k]), *(inc_extra[k][:rejudge] if judgements[k] > 1 else [])])
                       for k, t in enumerate(ids)}
            stop_at: list[tuple[float, int]] = []  # per look: P(clear), the calls paid by then
            oracle_stop: int | None = None
            for look in make_looks(labels, {t: js[0] for t, js in inc_j.items()}, decision_seed):
                inside = [k for k, t in enumerate(ids) if t in look.ids]
                cand_j = {ids[k]: answers(ids[k], [bool(cand_first[k]), *cand_extra.get(k, [])]) for k in inside}
                inc_look = {t: (inc_now[t] if t in look.ids else inc_j[t]) for t in ids}
                est = p_clear_rejudged(labels, look, inc_look, cand_j, loop, level=alpha, seed=seed * 7 + n_cand)
                paid = len(inside) + sum(rejudge + int(new_inc_calls[k]) for k in inside if judgements[k] > 1)
                stop_at.append((1.0 if est is None else est.p_clear, paid))
                if oracle and oracle_stop is None:
                    mask = np.zeros(n, bool)
                    mask[inside] = True
                    if oracle_p_clear(mask, cand_total, inc_total, judgements, inc_first, q_c, q_i, positive, loop,
                                      oracle_rng) < thresholds[0]:
                        oracle_stop = paid
            if oracle:
                screened[oracle_name].trials.append(
                    Trial(kind, kept and oracle_stop is None, calls if oracle_stop is None else oracle_stop, run=run))
            for t in thresholds:
                first_stop = next((paid for p, paid in stop_at if p < t), None)
                screened[f"on, T = {t:g}"].trials.append(
                    Trial(kind, kept and first_stop is None, calls if first_stop is None else first_stop, run=run))
            if kept:
                inc_fixed, inc_first, inc_extra = cand_fixed, cand_first, cand_extra
    return base, screened


def futility_table(base: PolicyResult, screened: dict[str, PolicyResult], n_items: int) -> list[str]:
    """Calls per no-op candidate (in full passes) and kept shares, without and with futility."""
    head = (f"{'futility':<28} {'no-op calls/162':>15} {'no-op kept':>10} "
            + " ".join(f"{f'fix {d} kept':>11}" for d in FIX_SIZES) + f" {'fix calls/162':>13}")
    lines = [head, "-" * len(head)]
    for name, res in [("off", base), *screened.items()]:
        cells = []
        for kind in KINDS:
            k, total = keep_rate(res.trials, kind)
            cells.append(f"{k / total:>10.1%}" if total else f"{'—':>10}")
        fixes = [t for t in res.trials if t.kind != "noop"]
        lines.append(f"{name:<28} {calls_per_pass(res.trials, n_items, 'noop'):>15.2f} {cells[0]} "
                     + " ".join(f"{c:>11}" for c in cells[1:]) + f" {calls_per_pass(fixes, n_items):>13.2f}")
    return lines


# --- the table ----------------------------------------------------------------------------------


def table(loop_results: dict[str, PolicyResult], sim_results: dict[str, PolicyResult], n_items: int,
          fresh_results: dict[str, PolicyResult] | None = None) -> list[str]:
    """The side-by-side table: one row per policy and source (``loop``, ``sim``, and ``sim1``: the
    simulation with a fresh incumbent for every candidate, as in the issue's table)."""
    every = set(loop_results) | set(sim_results) | set(fresh_results or {})
    w = max([9, *map(len, every)])
    head = (f"{'policy':<{w}} {'source':<6} {'no-op kept':>22} "
            + " ".join(f"{f'fix {d} kept':>22}" for d in FIX_SIZES)
            + f" {'calls/162 all':>13} {'no-op':>6} {'fixes':>6}")
    lines = [head, "-" * len(head)]
    for policy in sorted(every, key=lambda p: (p != "literal", p != "paired", p)):
        for source, res in (("loop", loop_results.get(policy)), ("sim", sim_results.get(policy)),
                            ("sim1", (fresh_results or {}).get(policy))):
            if res is None:
                continue
            cells = []
            for kind in KINDS:
                k, total = keep_rate(res.trials, kind)
                if total == 0:
                    cells.append(f"{'—':>22}")
                elif source == "loop":
                    lo, hi = run_bootstrap(res.trials, kind)
                    cells.append(f"{k / total:>6.1%} [{lo:>4.0%},{hi:>4.0%}] n={total:<4}")
                else:
                    cells.append(f"{k / total:>6.1%} {'':>10}n={total:<4}")
            fixes = [t for t in res.trials if t.kind != "noop"]
            lines.append(
                f"{policy:<{w}} {source:<6} " + " ".join(cells)
                + f" {calls_per_pass(res.trials, n_items):>13.2f} {calls_per_pass(res.trials, n_items, 'noop'):>6.2f}"
                + f" {calls_per_pass(fixes, n_items):>6.2f}"
            )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run: 2 runs of 4 candidates per policy")
    parser.add_argument("--runs", type=int, default=45, help="loop runs per policy (each: baseline + candidates)")
    parser.add_argument("--candidates", type=int, default=6, help="candidates per run")
    parser.add_argument("--fixes-per-run", type=int, default=1, help="fixes of each size D per run")
    parser.add_argument("--sim-runs", type=int, default=3000, help="simulated runs per policy")
    parser.add_argument("--policies", nargs="+", default=None,
                        help="default: every policy LoopSection accepts; POLICY+fdr0.1 adds online FDR (LORD++)")
    parser.add_argument("--workers", type=int, default=2, help="loop processes at a time")
    parser.add_argument("--runs-per-task", type=int, default=5, help="loop runs per worker task")
    parser.add_argument("--concurrency", type=int, default=8, help="judge calls in flight per loop")
    parser.add_argument("--rejudge", type=int, default=None, help="adaptive: extra judgements (default: config's)")
    parser.add_argument("--fix-pool", choices=["wrong", "wrong-or-unstable"], default="wrong")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-loop", action="store_true", help="the simulation only")
    parser.add_argument("--structural-runs", type=int, default=10,
                        help="loop runs of the structural rows (judge.toml moves; 0: none)")
    parser.add_argument("--panel-runs", type=int, default=10,
                        help="loop runs of the panel rows (a no-op panel, a panel with a planted effect; 0: none)")
    parser.add_argument("--cheaper-trials", type=int, default=1000,
                        help="simulated cheaper candidates per row of the non-inferiority table (0: none)")
    parser.add_argument("--futility-runs", type=int, default=300,
                        help="simulated adaptive runs screened by optimizer.stats.futility (0: no futility rows)")
    parser.add_argument("--waves", type=int, nargs="*", default=[1, 4, 8],
                        help="wave sizes of the wave rows (`run --wave K`; none: skip them)")
    parser.add_argument("--wave-runs", type=int, default=30, help="loop runs of one wave per wave size and case")
    parser.add_argument("--waves-only", action="store_true", help="the wave rows only")
    parser.add_argument("--wave-sim-runs", type=int, default=2000, help="simulated no-op waves per wave size")
    parser.add_argument("--wave-cases", nargs="+", choices=["null", "planted"], default=["null", "planted"],
                        help="which wave rows to run (null: K no-ops; planted: a fix among K-1 no-ops)")
    parser.add_argument("--wave-futility", action="store_true",
                        help="the wave rows with [loop] futility = true (the default since; off: judged in full)")
    args = parser.parse_args(argv)
    if args.quick:
        args.runs, args.candidates, args.sim_runs, args.cheaper_trials, args.structural_runs = 2, 4, 200, 100, 1
        args.panel_runs = min(args.panel_runs, 1)
        args.futility_runs = min(args.futility_runs, 20)
        args.wave_runs, args.wave_sim_runs = 2, 100
    if args.waves_only:
        return waves_main(args)
    policies = args.policies or policies_available()
    rejudge = args.rejudge if args.rejudge is not None else rejudge_default()
    started = time.monotonic()
    print("decision power: keep rates of no-op edits and of real D-item fixes, real loop vs simulation")
    print(f"machine: {platform.machine()} {platform.system()}, {os.cpu_count()} cores, Python {platform.python_version()}"
          f"; policies {', '.join(policies)}; adaptive re-judges {rejudge}x; alpha 0.1")
    print(f"judge: 162 items (62 pos / 100 neg), 30% unstable q~U(0.3,0.7), stable q=0.99 (80%) / 0.01 (20%); "
          f"fixes chosen among {'q < 0.5' if args.fix_pool == 'wrong' else 'q < 0.9'}")
    print(f"runs: baseline + {args.candidates} candidates ({args.fixes_per_run} fix of each D per run, the rest "
          f"no-ops), {args.runs} loop runs / {args.sim_runs} simulated runs per policy")

    positive = np.array(_labels_only()[1])
    q, fixable = item_q(len(positive), 0, fix_pool=args.fix_pool)
    t_sim = time.monotonic()
    # The simulation also shows online FDR (LORD++ at 0.1) beside the plain adaptive policy.
    sim_policies = sorted({p for p in policies if not p.endswith(FUTILITY)}
                          | {"literal", "paired", "adaptive", "adaptive+fdr0.1"})
    sim_results = {p: simulate(p, q, fixable, positive, args.sim_runs, args.candidates, args.fixes_per_run,
                               args.seed + 1, rejudge=rejudge, check_engine=200) for p in sim_policies}
    fresh_results = {p: simulate_fresh(p, q, fixable, positive, args.sim_runs, args.seed + 2, rejudge=rejudge)
                     for p in sim_policies}
    sim_s = time.monotonic() - t_sim

    loop_results: dict[str, PolicyResult] = {}
    if not args.no_loop:
        # Tasks of a few runs each (one workspace and server per task) keep both workers busy to the end.
        chunks = max(1, math.ceil(args.runs / args.runs_per_task))
        tasks = []
        for p in sorted(policies, key=lambda p: p != "adaptive"):  # the slowest first
            per = [args.runs // chunks + (1 if i < args.runs % chunks else 0) for i in range(chunks)]
            tasks += [(p, r, args.candidates, args.fixes_per_run, args.seed * 1000 + i, args.concurrency, rejudge,
                       args.fix_pool) for i, r in enumerate(per) if r]
        with ProcessPoolExecutor(max_workers=args.workers) as pool:
            for res in pool.map(_loop_task, tasks):
                loop_results.setdefault(res.policy, PolicyResult(res.policy)).merge(res)
    print()
    for line in table(loop_results, sim_results, len(positive), fresh_results):
        print(line)
    print()
    for p, res in loop_results.items():
        print(f"{p}: loop worker time {res.wall_s:.0f} s; judge calls at the fake server {res.server_calls}, "
              f"in the ledger {res.ledger_calls} (baselines {res.baseline_calls}); undecided candidates {res.undecided}")
    if args.structural_runs and not args.no_loop:
        print()
        print("structure moves: adaptive loop runs whose candidates are judge.toml moves (screenshots = \"spaced\", "
              "a fresh max_images), no-ops or planted fixes of 8 / 12 items")
        for line in structural_rows(args.structural_runs, args.seed + 4, rejudge=rejudge, concurrency=args.concurrency):
            print(line)
    if args.panel_runs and not args.no_loop:
        print()
        print(f"panels: adaptive loop runs of two judge.toml moves to a unanimous panel of 3 (no-op: members err "
              f"identically; p-fix: they err independently on {PANEL_PLANTED} planted negatives)")
        for line in panel_rows(args.panel_runs, args.seed + 5, rejudge=rejudge, concurrency=args.concurrency):
            print(line)
    if args.cheaper_trials:
        t_cheap = time.monotonic()
        print()
        print("cheaper, not worse: keeps of cheaper candidates (50% saving) decided by optimizer.stats.decision."
              "decide_cheaper, re-judging disagreements")
        for line in cheaper_rows(q, positive, args.cheaper_trials, args.seed + 3, rejudge=rejudge):
            print(line)
        print(f"  ({time.monotonic() - t_cheap:.0f} s)")
    if args.futility_runs:
        t_fut = time.monotonic()
        base, screened = simulate_futility(q, fixable, positive, args.futility_runs, args.candidates,
                                           args.fixes_per_run, args.seed + 3, rejudge=rejudge)
        print()
        print(f"futility screening (simulated, {args.futility_runs} runs, coupled: the same draws with and "
              f"without; screen = the incumbent's wrong items + a stratified share of the rest), "
              f"{time.monotonic() - t_fut:.0f} s:")
        for line in futility_table(base, screened, len(positive)):
            print(line)
    for p, res in sorted(loop_results.items()):
        if p.endswith(FUTILITY) or f"{p}{FUTILITY}" in loop_results:
            print(f"{p} (loop): no-op calls/162 {calls_per_pass(res.trials, len(positive), 'noop'):.2f}, kept "
                  + ", ".join(f"{kind} {keep_rate(res.trials, kind)[0]}/{keep_rate(res.trials, kind)[1]}"
                              for kind in KINDS))
    print(f"simulated adaptive decisions replayed by optimizer.stats.decision.decide_adaptive: "
          f"{sim_results['adaptive'].engine_checked}, all agree")
    load = " / ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"simulation {sim_s:.1f} s; total wall time {time.monotonic() - started:.0f} s; load average at the end "
          f"{load} (1 / 5 / 15 min) on {os.cpu_count()} cores")
    if args.waves and not args.no_loop:
        print()
        waves_main(args)
    return 0


def waves_main(args: argparse.Namespace) -> int:
    """The wave rows: per wave size, no-op waves' false keeps (<= alpha per wave, Holm) and a planted fix's share."""
    started = time.monotonic()
    rejudge = args.rejudge if args.rejudge is not None else rejudge_default()
    print(f"waves (adaptive{', futility on' if args.wave_futility else ''}, alpha 0.1, Holm per wave): "
          f"{args.wave_runs} runs of one wave per size and case; "
          f"no-op waves: K no-ops; planted: one {WAVE_FIX[3:]}-item fix among K-1 no-ops")
    # Tasks of a few runs each, the largest waves first, keep every worker busy to the end.
    chunks = max(1, math.ceil(args.wave_runs / args.runs_per_task))
    per = [args.wave_runs // chunks + (1 if i < args.wave_runs % chunks else 0) for i in range(chunks)]
    tasks = [(k, r, args.seed * 1000 + 17 * k + 101 * i, args.concurrency, rejudge, case, args.wave_futility)
             for k in sorted(args.waves, reverse=True) for case in args.wave_cases for i, r in enumerate(per) if r]
    with ProcessPoolExecutor(max_workers=args.workers) as pool:
        done = list(pool.map(_wave_task, tasks))
    rows = [merge_wave_rows([r for r in done if r.wave == k]) for k in args.waves]
    for line in wave_table(rows):
        print(line)
    positive = np.array(_labels_only()[1])
    q, _ = item_q(len(positive), 0, fix_pool=args.fix_pool)
    sims = [(k, *simulate_wave_null(q, positive, k, args.wave_sim_runs, args.seed + k, rejudge=rejudge))
            for k in args.waves]
    print("simulated no-op waves with a keep (same judge, Holm by optimizer.stats.decision): "
          + ", ".join(f"wave {k}: {kept / n:.1%} of {n}" for k, kept, n in sims))
    print(f"wave rows wall time {time.monotonic() - started:.0f} s")
    return 0


def _labels_only() -> tuple[list[str | None], list[bool]]:
    """The benchmark split's labels in item-index order, without building a workspace."""
    items = []
    for pair in range(N_PAIRS):
        items += pair_items(pair, positives=(True, pair < N_DOUBLE), tag="power")
    return [i.mistake_type for i in items], [i.label == "positive" for i in items]


if __name__ == "__main__":
    sys.exit(with_docs_figure(main))
