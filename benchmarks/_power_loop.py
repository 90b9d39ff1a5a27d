"""The decision-power benchmark's real-loop rows (`benchmarks/decision_power.py`): the workspace, the
benchmark's optimiser (`BenchStrategy`), the loop runs through `optimizer.loop.session.start_run`
(`loop_trials`, the structural and panel rows) and the wave rows."""

from __future__ import annotations

import contextlib
import os
import random
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._judge_model import KEYED_DRAWS_ENV, JudgeModel, item_instruction, item_q
from benchmarks._power_common import (
    EFFECT_MEMBERS,
    FUTILITY,
    GIT,
    JUDGE_TOML,
    N_DOUBLE,
    N_PAIRS,
    NOOP_MEMBERS,
    PANEL_KINDS,
    PANEL_PLANTED,
    RUBRIC,
    STRUCTURAL_KINDS,
    PolicyResult,
    RunPlan,
    Trial,
    calls_per_pass,
    confusion_counts,
    keep_rate,
    labels_only,
    parse_policy,
    run_bootstrap,
    spaced_sentence,
)
from optimizer.devset.importer import import_split
from optimizer.ledger import Ledger
from optimizer.loop import session
from optimizer.loop.strategies import Proposal, ProposalContext
from optimizer.scaffold import init_workspace
from optimizer.stats.decision import (
    adaptive_test,
    decide_counts,
    holm,
)
from optimizer.structure import current_value, set_key
from optimizer.workspace.config import JudgeOverrides, LoopSection
from optimizer.workspace.workspace import Workspace
from tests.support.data import pair_items, write_release
from tests.support.fakeserver import FakeLLMServer
from tests.support.panel import write_members

# --- the workspace ------------------------------------------------------------------------------


def build_workspace(root: Path) -> tuple[Path, list[bool], list[str | None]]:
    """A fresh workspace whose dev split has 62 positives and 100 negatives (3-step text-only
    trajectories, unique instructions); returns its root and the labels in item-index order."""
    items = []
    for pair in range(N_PAIRS):
        types = (
            ("Critical Mistake", "Bad Side Effect", "Misunderstanding of the Instruction")[pair % 3],
            ("Misunderstanding of the Instruction", "Critical Mistake", "Bad Side Effect")[pair % 3],
        )
        items += pair_items(pair, positives=(True, pair < N_DOUBLE), types=types, tag="power")
    for index, item in enumerate(items):
        item.instruction = item_instruction(item.instruction.rstrip("."), index)
    ws = init_workspace(root / "ws")
    release = write_release(root / "release", items, markdown=False)
    import_split(ws, release.root, "dev", all_items=True, warn=lambda _m: None)
    cfg = ws.root / "judgeloop.toml"
    text = re.sub(
        r'(?m)^#? ?dev_split = "[^"]*".*$', 'dev_split = "dev"', cfg.read_text(encoding="utf-8"), count=1
    )
    text = text.replace("infra_retry_pause_s = 10", "infra_retry_pause_s = 0.05")
    cfg.write_text(text, encoding="utf-8")
    judge_toml = ws.root / "prompts" / "judge.toml"
    judge_toml.write_text(
        judge_toml.read_text(encoding="utf-8").replace('screenshots = "all"', 'screenshots = "none"'),
        encoding="utf-8",
    )
    _git(ws.root, "add", "-A")
    _git(ws.root, "commit", "-q", "-m", "decision-power workspace")
    assert 'dev_split = "dev"' in cfg.read_text(encoding="utf-8"), (
        "the default config changed: update the benchmark"
    )
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
        return Proposal(
            files={RUBRIC: text.rstrip("\n") + f"\n\n{line}\n"}, rationale=f"benchmark {kind}", meta=meta
        )

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
        return Proposal(
            files={JUDGE_TOML: new}, rationale=f"benchmark {kind}", meta={"kind": kind, "fixed": chosen}
        )

    def panel(self, ctx: ProposalContext, kind: str) -> Proposal:
        """A structure move to a unanimous ``[panel]`` (``[optimizer] structure_moves = ["panel.members",
        "panel.vote"]``): members a, b, c (``p-fix``: they err independently on the planted negatives,
        so their unanimous vote gets those right) or x, y, z (``p-noop``: they err identically)."""
        names = list(NOOP_MEMBERS if kind == "p-noop" else EFFECT_MEMBERS)
        toml = set_key(
            set_key(ctx.current_files[JUDGE_TOML], "panel.members", names), "panel.vote", "unanimous"
        )
        fixed = [] if kind == "p-noop" else list(self.model.panel_planted)
        return Proposal(
            files={JUDGE_TOML: toml}, rationale=f"benchmark {kind}", meta={"kind": kind, "fixed": fixed}
        )


# --- the real loop ------------------------------------------------------------------------------


@contextlib.contextmanager
def _strategy_installed(strategy: BenchStrategy) -> Iterator[None]:
    # `start_run` builds its optimiser by name; the benchmark's proposes scheduled edits instead.
    with mock.patch.object(session, "make_strategy", lambda *_a, **_k: strategy):
        yield


def loop_trials(
    policy: str,
    plan: RunPlan,
    *,
    concurrency: int = 16,
    rejudge: int | None = None,
    fix_pool: str = "wrong",
    item_seed: int = 0,
    odds: tuple[np.ndarray, np.ndarray] | None = None,
    wave: int | None = None,
) -> PolicyResult:
    """``plan.runs`` loop runs of ``plan.candidates`` candidates each under ``policy``; one workspace, one
    fake server. ``item_seed`` fixes the judge's item odds (the same for every policy); ``odds`` (q,
    fixable) replaces them and ``plan.schedule`` the shuffled schedule of every run (tests); ``wave``:
    ``run --wave`` (candidates per round, decided together)."""
    seed, schedule = plan.seed, plan.schedule
    started = time.monotonic()
    result = PolicyResult(policy)
    rng = random.Random(f"{seed}/{policy}")
    # A dummy key for the fake server, for this call only (the caller's environment is left as it was).
    key = {"OPENAI_API_KEY": os.environ.get("OPENAI_API_KEY", "decision-power-bench")}
    with mock.patch.dict(os.environ, key), tempfile.TemporaryDirectory(prefix="decision-power-") as tmp:
        root, positive, types = build_workspace(Path(tmp))
        q, fixable = odds if odds is not None else item_q(len(positive), item_seed, fix_pool=fix_pool)
        keyed = os.environ.get(KEYED_DRAWS_ENV) == "1"
        model = JudgeModel(positive, types, q, fixable, seed=rng.getrandbits(32), keyed=keyed)
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
            cfg.write_text(
                cfg.read_text(encoding="utf-8").replace(
                    "[optimizer]\n", '[optimizer]\nstructure_moves = ["screenshots", "max_images"]\n', 1
                ),
                encoding="utf-8",
            )
        if any(k.startswith("p-") for k in schedule or ()):
            setup_panel(root, model, rng)
        if rejudge is not None and "rejudge" in LoopSection.model_fields:
            set_loop_key(root, "rejudge", str(rejudge))
        base_branch = _git(root, "rev-parse", "--abbrev-ref", "HEAD").strip()
        strategy = BenchStrategy(model, rng)
        with FakeLLMServer(default=model, keep_alive=True) as server, _strategy_installed(strategy):
            judge = JudgeOverrides(
                provider="openai",
                model="fake-judge",
                base_url=server.openai_base_url,
                concurrency=concurrency,
            )
            for run_no in range(plan.runs):
                _git(root, "checkout", "-q", base_branch)
                # A fresh salt line: this run's baseline is a new draw, not the previous run's cache.
                rubric = root / RUBRIC
                lines = [
                    ln
                    for ln in rubric.read_text(encoding="utf-8").splitlines()
                    if not ln.startswith("Run salt")
                ]
                rubric.write_text(
                    "\n".join(lines) + f"\nRun salt s{seed}x{run_no}x{strategy.nonce()}.\n", encoding="utf-8"
                )
                _git(root, "commit", "-qam", f"salt {run_no}")
                strategy.schedule = plan.kinds(rng)
                kinds = list(strategy.schedule)
                ws = Workspace.open(root)
                outcome = session.start_run(
                    ws, session.RunOptions(max_experiments=len(kinds), judge=judge, wave=wave)
                )
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
                    assert exp.proposal_meta["kind"] == kinds[exp.seq - 1], (
                        "the schedule and the ledger disagree"
                    )
                    result.trials.append(
                        Trial(exp.proposal_meta["kind"], exp.status == "kept", exp.calls, run=outcome.run_id)
                    )
        result.server_calls = model.calls
    result.wall_s = time.monotonic() - started
    return result


def setup_panel(root: Path, model: JudgeModel, rng: random.Random) -> None:
    """The panel rows' workspace and judge: member files for both panels (committed with the baseline,
    unused until judge.toml names them), panel moves on, the judge in panel mode (`JudgeModel.steady`)
    with `PANEL_PLANTED` negatives the single judge tends to get wrong planted."""
    write_members(root, EFFECT_MEMBERS + NOOP_MEMBERS)
    cfg = root / "judgeloop.toml"
    cfg.write_text(
        cfg.read_text(encoding="utf-8").replace(
            "[optimizer]\n",
            '[optimizer]\nstructure_moves = ["panel.members", "panel.vote"]\nmax_members = 3\n',
            1,
        ),
        encoding="utf-8",
    )
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
    res = loop_trials(
        "adaptive",
        RunPlan(runs, len(PANEL_KINDS), 0, seed, schedule=PANEL_KINDS),
        concurrency=concurrency,
        rejudge=rejudge,
    )
    n = len(labels_only()[1])
    head = (
        f"{'source':<16} "
        + " ".join(f"{k + ' kept':>24}" for k in PANEL_KINDS)
        + " "
        + " ".join(f"{k + ' calls/162':>17}" for k in PANEL_KINDS)
    )
    cells = []
    for kind in PANEL_KINDS:
        k, total = keep_rate(res.trials, kind)
        lo, hi = run_bootstrap(res.trials, kind)
        cells.append(f"{k / total:>6.1%} [{lo:>4.0%},{hi:>4.0%}] n={total:<4}" if total else f"{'—':>24}")
    row = (
        f"{'loop, panels':<16} "
        + " ".join(f"{c:>24}" for c in cells)
        + " "
        + " ".join(f"{calls_per_pass(res.trials, n, kind):>17.2f}" for kind in PANEL_KINDS)
    )
    return [
        head,
        "-" * len(head),
        row,
        f"  undecided {res.undecided}; judge calls at the server {res.server_calls}, in the ledger "
        f"{res.ledger_calls}; {res.wall_s:.0f} s",
    ]


def structural_rows(runs: int, seed: int, *, rejudge: int | None = None, concurrency: int = 16) -> list[str]:
    """The structural rows: the real loop (adaptive) where candidates are judge.toml moves, a planted
    structural effect (`BenchStrategy.structural`): no-op moves and moves that fix 8 or 12 items."""
    schedule = ["s-noop", "s-fix8", "s-noop", "s-fix12"]
    res = loop_trials(
        "adaptive",
        RunPlan(runs, len(schedule), 0, seed, schedule=schedule),
        concurrency=concurrency,
        rejudge=rejudge,
    )
    head = (
        f"{'source':<16} " + " ".join(f"{k + ' kept':>24}" for k in STRUCTURAL_KINDS) + f" {'calls/162':>9}"
    )
    cells = []
    for kind in STRUCTURAL_KINDS:
        k, total = keep_rate(res.trials, kind)
        lo, hi = run_bootstrap(res.trials, kind)
        cells.append(f"{k / total:>6.1%} [{lo:>4.0%},{hi:>4.0%}] n={total:<4}" if total else f"{'—':>24}")
    row = f"{'loop, moves':<16} " + " ".join(f"{c:>24}" for c in cells)
    row += f" {calls_per_pass(res.trials, len(labels_only()[1])):>9.2f}"
    return [head, "-" * len(head), row, f"  undecided {res.undecided}; {res.wall_s:.0f} s"]


def _loop_task(args: tuple[Any, ...]) -> PolicyResult:
    policy, runs, candidates, fixes_per_run, seed, concurrency, rejudge, fix_pool = args
    return loop_trials(
        policy,
        RunPlan(runs, candidates, fixes_per_run, seed),
        concurrency=concurrency,
        rejudge=rejudge,
        fix_pool=fix_pool,
    )


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


def wave_trials(
    k: int,
    runs: int,
    seed: int,
    *,
    concurrency: int = 8,
    rejudge: int | None = None,
    odds: tuple[np.ndarray, np.ndarray] | None = None,
    cases: Sequence[str] = ("null", "planted"),
    futility: bool = False,
) -> WaveRow:
    """``runs`` runs of one wave of ``k`` no-ops (case ``null``) and ``runs`` of one wave of an 8-item
    fix among ``k - 1`` no-ops (``planted``; the fix proposed last: Holm breaks a tie by the earlier
    candidate), each run a fresh baseline, through `session.start_run` with ``wave = k`` under the
    adaptive policy (``futility``: with ``[loop] futility = true``, the default)."""
    policy = "adaptive" + (FUTILITY if futility else "")
    empty = PolicyResult(policy)
    null = (
        loop_trials(
            policy,
            RunPlan(runs, k, 0, seed, schedule=["noop"] * k),
            concurrency=concurrency,
            rejudge=rejudge,
            odds=odds,
            wave=k,
        )
        if "null" in cases
        else empty
    )
    planted = (
        loop_trials(
            policy,
            RunPlan(runs, k, 0, seed + 1, schedule=["noop"] * (k - 1) + [WAVE_FIX]),
            concurrency=concurrency,
            rejudge=rejudge,
            odds=odds,
            wave=k,
        )
        if "planted" in cases
        else empty
    )
    kept_runs = {t.run for t in null.trials if t.kept}
    fix_kept = sum(t.kept for t in planted.trials if t.kind == WAVE_FIX)
    noop_kept = sum(t.kept for t in planted.trials if t.kind == "noop")
    trials = null.trials + planted.trials
    n_items = (null.baseline_calls + planted.baseline_calls) // max(1, runs * len(cases))
    calls = sum(t.calls for t in trials) / len(trials) / n_items if trials and n_items else float("nan")
    return WaveRow(
        k,
        len({t.run for t in null.trials}),
        len(kept_runs),
        len({t.run for t in planted.trials}),
        fix_kept,
        noop_kept,
        calls,
        len(trials),
    )


def merge_wave_rows(rows: Sequence[WaveRow]) -> WaveRow:
    """One wave size's rows (tasks of a few runs each) as one."""
    trials = sum(r.trials for r in rows)
    calls = sum(r.calls_per_candidate * r.trials for r in rows) / trials if trials else float("nan")
    return WaveRow(
        rows[0].wave,
        sum(r.null_waves for r in rows),
        sum(r.null_false_keeps for r in rows),
        sum(r.planted_waves for r in rows),
        sum(r.planted_fix_kept for r in rows),
        sum(r.planted_noop_kept for r in rows),
        calls,
        trials,
    )


def wave_table(rows: Sequence[WaveRow], alpha: float = 0.1) -> list[str]:
    """Per wave size: the share of no-op waves with a (false) keep, with its 95% Clopper-Pearson interval
    (runs are independent: each has its own baseline), beside alpha; the planted fix's kept share."""
    from optimizer.stats.binomial import clopper_pearson_interval

    head = (
        f"{'wave':>4} {'no-op waves with a keep':>30} {'<= alpha':>8} {'planted fix8 kept':>26} "
        f"{'a no-op kept instead':>20} {'calls/cand/162':>14}"
    )
    lines = [head, "-" * len(head)]
    for r in rows:
        lo, hi = clopper_pearson_interval(r.null_false_keeps, r.null_waves) if r.null_waves else (0.0, 1.0)
        rate = r.null_false_keeps / r.null_waves if r.null_waves else float("nan")
        fix = r.planted_fix_kept / r.planted_waves if r.planted_waves else float("nan")
        flo, fhi = (
            clopper_pearson_interval(r.planted_fix_kept, r.planted_waves) if r.planted_waves else (0.0, 1.0)
        )
        other = r.planted_noop_kept / r.planted_waves if r.planted_waves else float("nan")
        lines.append(
            f"{r.wave:>4} {rate:>7.1%} [{lo:>4.0%},{hi:>4.0%}] n={r.null_waves:<8} "
            f"{'yes' if rate <= alpha else 'NO':>8} {fix:>7.1%} [{flo:>4.0%},{fhi:>4.0%}] n={r.planted_waves:<4} "
            f"{other:>20.1%} {r.calls_per_candidate:>14.2f}"
        )
    return lines


def simulate_wave_null(
    q: np.ndarray,
    positive: np.ndarray,
    k: int,
    waves: int,
    seed: int,
    *,
    rejudge: int = 2,
    alpha: float = 0.1,
) -> tuple[int, int]:
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
            ok.append(
                decide_counts(
                    confusion_counts(maj_i, positive),
                    confusion_counts(maj_c, positive),
                    int((~maj_i & maj_c).sum()),
                    int((maj_i & ~maj_c).sum()),
                    loop,
                ).literal_keep
            )
            rejudged = judgements > 1
            diffs = [Fraction(int(d), 1 + rejudge) for d in (cand_total - inc_total)[rejudged] if d]
            ps.append(adaptive_test(diffs).p_value if rejudged.any() else None)
        kept += any(r.rejected and good for r, good in zip(holm(ps, alpha, k), ok, strict=True))
    return kept, waves


def _wave_task(args: tuple[Any, ...]) -> WaveRow:
    k, runs, seed, concurrency, rejudge, case, futility = args
    return wave_trials(
        k, runs, seed, concurrency=concurrency, rejudge=rejudge, cases=(case,), futility=futility
    )
