"""The report's figures as data: what ``report --json``, the text report and the TUI all read (the
run's record, accounting, attribution, false positives by type, spend). No text is laid out here."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from optimizer.answers.triage import GivenCorrected, Suspect, label_suspects, metrics_given_corrected
from optimizer.devset.split import open_split
from optimizer.errors import UserError
from optimizer.ledger import FLIP_KEYS, Attribution, EditContribution, Experiment, Ledger, Run
from optimizer.runsettings import RunSettings
from optimizer.stats.decision import CHEAPER_TEST_MARK, AdaptiveTest, ItemShares
from optimizer.stats.metrics import Answer
from optimizer.stats.policies import policy_for
from optimizer.vocab import TESTED_STATUSES
from optimizer.workspace.config import Config
from optimizer.workspace.workspace import Workspace

# ``calls`` are the judge's; ``cost_usd`` is the experiment's total (judge + optimiser); the optimiser's
# part follows in its own keys. The judge's tokens are split as billed: uncached input, cache reads,
# cache writes, output; ``judge_cost_usd`` is what they cost.
JSON_EXPERIMENT_KEYS: tuple[str, ...] = (
    "id",
    "parent",
    "commit",
    "decision",
    "reason",
    "early_stopped",
    "kappa",
    "fpr",
    "balanced_accuracy",
    "p_value",
    "calls",
    "cost_usd",
    "optimizer_calls",
    "optimizer_input_tokens",
    "optimizer_output_tokens",
    "optimizer_cost_usd",
    "input_tokens",
    "cache_read_tokens",
    "cache_write_tokens",
    "planned_cache_read_tokens",
    "output_tokens",
    "judge_cost_usd",
    "fp_by_type",
    "incumbent_fp_by_type",
    "alpha",
    "adaptive_keep",
    "rejudge_calls",
    "rejudge_cost_usd",
    "rejudged",
    "test",
    "decided_by",
    "overrule",
)


def delta(value: float | None, parent: float | None) -> float | None:
    return None if value is None or parent is None else value - parent


def short(sha: str | None) -> str:
    return sha[:10] if sha else "-"


def parents_by_id(experiments: Sequence[Experiment]) -> dict[int, Experiment]:
    return {e.id: e for e in experiments}


# The version of the `report --json` object's shape: raised when a key changes meaning or goes away
# (new keys may appear without a raise), so a script reading it can refuse a shape it does not know.
REPORT_FORMAT_VERSION = 1


def report_json(ledger: Ledger, run: Run, ws: Workspace | None = None) -> dict[str, Any]:
    """The ``report --json`` object: ``format_version`` (`REPORT_FORMAT_VERSION`, an integer raised when
    a key changes meaning or goes away), run, branch, policy and one entry per experiment, baseline first.
    ``ws``: the workspace, whose configuration fills what an old run's record lacks (`RunSettings`)."""
    experiments = []
    all_exps = ledger.experiments(run.id)
    fps_of = fp_by_type_all(ledger, run, all_exps)
    for exp in all_exps:
        fps = fps_of[exp.id]
        experiments.append(
            {
                "id": exp.id,
                "parent": exp.parent_id,
                "commit": exp.commit_sha,
                "decision": exp.status,
                "reason": exp.reason,
                "early_stopped": exp.early_stopped,
                "kappa": exp.kappa,
                "fpr": exp.fpr,
                "balanced_accuracy": exp.balanced_accuracy,
                "p_value": exp.p_value,
                "calls": exp.calls,
                "cost_usd": exp.cost_usd,
                "optimizer_calls": exp.optimizer_calls,
                "optimizer_input_tokens": exp.optimizer_input_tokens,
                "optimizer_output_tokens": exp.optimizer_output_tokens,
                "optimizer_cost_usd": exp.optimizer_cost_usd,
                "input_tokens": exp.input_tokens,
                "cache_read_tokens": exp.cache_read_tokens,
                "cache_write_tokens": exp.cache_write_tokens,
                # What the passes planned to read from the prompt cache (billed: cache_read_tokens).
                "planned_cache_read_tokens": exp.planned_cache_read_tokens,
                "output_tokens": exp.output_tokens,
                "judge_cost_usd": exp.judge_cost_usd,
                # On the items this experiment was judged on; the incumbent's is null for the baseline.
                "fp_by_type": fps[0] if fps else None,
                "incumbent_fp_by_type": fps[1] if fps else None,
                # The adaptive policy's record: the level tested at, its outcome, the re-judging pass.
                "alpha": exp.alpha,
                "adaptive_keep": exp.adaptive_keep,
                "rejudge_calls": exp.rejudge_calls,
                "rejudge_cost_usd": exp.rejudge_cost_usd,
                "rejudged": [
                    {"trajectory_id": i.trajectory_id, "draws": i.draws()} for i in rejudged_items(exp)
                ],
                "test": exp.test,
                # Who decided (the policy, a person, an MCP client) and a person's decision against the policy.
                "decided_by": exp.decided_by,
                "overrule": exp.overrule,
                # A panel's cost per verdict, split by member (null: a single judge).
                "panel_cost": pc.to_json() if (pc := panel_cost(ledger, exp.id)) else None,
                # A cascade's escalation share and per-stage cost per verdict (null: no cascade).
                "cascade": cc.to_json() if (cc := cascade_cost(ledger, exp.id)) else None,
            }
        )
    attribution = ledger.latest_attribution(run.id)
    return {
        "format_version": REPORT_FORMAT_VERSION,
        "run": run.id,
        "branch": run.branch,
        "policy": run.policy,
        "experiments": experiments,
        "accounting": accounting(run, all_exps, ws.config if ws else None).to_json(),
        **attribution_json(attribution),
        **triage_json(ledger, run, ws),
    }


@dataclass(frozen=True)
class PanelCost:
    """A panel experiment's cost per verdict (US dollars): over its ``verdicts`` replicate verdicts, the
    total per verdict and each member's part by label."""

    verdicts: int
    cost_per_verdict_usd: float
    members: dict[str, float]

    def to_json(self) -> dict[str, Any]:
        """The ``panel_cost`` object of ``report --json``."""
        return {
            "verdicts": self.verdicts,
            "cost_per_verdict_usd": self.cost_per_verdict_usd,
            "members": dict(self.members),
        }


def panel_cost(ledger: Ledger, experiment_id: int) -> PanelCost | None:
    """A panel experiment's cost per verdict, split by member: over the replicate verdicts it recorded
    (re-judging passes are counted in ``rejudge_cost_usd`` instead), what each member's call cost when
    it was made (a cached call at its original price) per verdict. None when no verdict is a panel's."""
    verdicts = 0
    per_member: dict[str, float] = {}
    for item in ledger.item_verdicts(experiment_id):
        for rep in item.replicates:
            if not rep.members:
                continue
            verdicts += 1
            for member in rep.members:
                per_member[member.member] = per_member.get(member.member, 0.0) + member.cost_usd
    if not verdicts:
        return None
    return PanelCost(
        verdicts=verdicts,
        cost_per_verdict_usd=sum(per_member.values()) / verdicts,
        members={name: cost / verdicts for name, cost in per_member.items()},
    )


@dataclass(frozen=True)
class CascadeCost:
    """A cascade experiment's figures over its ``verdicts`` replicate verdicts: how many went on to the
    second judge, and each stage's cost per verdict as made (US dollars)."""

    verdicts: int
    escalated: int
    first_per_verdict_usd: float
    second_per_verdict_usd: float

    def to_json(self) -> dict[str, Any]:
        """The ``cascade`` object of ``report --json``."""
        return {
            "verdicts": self.verdicts,
            "escalated": self.escalated,
            "escalation_share": self.escalated / self.verdicts,
            "first_per_verdict_usd": self.first_per_verdict_usd,
            "second_per_verdict_usd": self.second_per_verdict_usd,
        }


def cascade_cost(ledger: Ledger, experiment_id: int) -> CascadeCost | None:
    """A cascade experiment's escalation share and per-stage cost per verdict (None: not a cascade)."""
    records = [rep.cascade for item in ledger.item_verdicts(experiment_id) for rep in item.replicates]
    found = [r for r in records if r is not None]
    if not found:
        return None
    return CascadeCost(
        verdicts=len(found),
        escalated=sum(1 for r in found if r.escalated),
        first_per_verdict_usd=sum(r.first_cost_usd for r in found) / len(found),
        second_per_verdict_usd=sum(r.second_cost_usd for r in found) / len(found),
    )


def rejudged_items(exp: Experiment) -> list[ItemShares]:
    """The items an adaptive decision re-judged, with their draws (empty for other decisions)."""
    if not exp.test:
        return []
    return [item for item in AdaptiveTest.model_validate(exp.test).items if item.rejudged]


@dataclass(frozen=True)
class KeptEdit:
    """One kept edit in a run's accounting: its experiment, keep kind (``cheaper`` for cheaper-not-worse),
    p-value and the level it was tested at, its re-judging (extra calls, items) and its cost (US dollars)."""

    experiment: int
    kind: str | None
    p_value: float | None
    alpha: float | None
    rejudge_calls: int
    rejudged_items: int
    cost_usd: float


@dataclass(frozen=True)
class Accounting:
    """Run-level accounting of the decisions (`accounting`): candidates tested (and of them tested again
    for cheaper-not-worse), the expected number of false keeps if every one were a no-op (None under the
    literal policy), the online-FDR target (None when not set) and each kept edit."""

    tested: int
    cheaper_tested: int
    expected_false_keeps: float | None
    fdr: float | None
    kept: list[KeptEdit]

    def to_json(self) -> dict[str, Any]:
        """The ``accounting`` object of ``report --json`` (keys in their documented order)."""
        return {
            "tested": self.tested,
            "cheaper_tested": self.cheaper_tested,
            "expected_false_keeps": self.expected_false_keeps,
            "fdr": self.fdr,
            "kept": [
                {
                    "experiment": k.experiment,
                    "kind": k.kind,
                    "p_value": k.p_value,
                    "alpha": k.alpha,
                    "rejudge_calls": k.rejudge_calls,
                    "rejudged_items": k.rejudged_items,
                    "cost_usd": k.cost_usd,
                }
                for k in self.kept
            ],
        }


def cheaper_tested(e: Experiment) -> bool:
    """Whether the cheaper-not-worse test ran on ``e``: read from its policy's typed reason (any rule in
    its chain, `Reason.rules`); a row decided before reasons were typed (ledger schema < 13) is read from
    its reason's text (`CHEAPER_TEST_MARK`)."""
    if e.policy_why is not None:
        return "cheaper" in e.policy_why.rules()
    return CHEAPER_TEST_MARK in (e.reason or "")


def accounting(run: Run, experiments: Sequence[Experiment], current: Config | None = None) -> Accounting:
    """Run-level accounting of the decisions: how many candidates were tested, the expected number of
    false keeps if every one were a no-op (the sum of the levels they were tested at, a wave's K candidates
    alpha / K each; None under the literal policy, which runs no test), the online-FDR target if one was set, and each kept edit's
    p-value, extra judgements and cost. The run's settings are its own (`RunSettings.from_run`;
    ``current`` fills what an old record lacks)."""
    loop_cfg = RunSettings.from_run(run, current).loop
    tests_at_alpha = policy_for(loop_cfg).tests_at_alpha  # False: no level, so no expected false keeps
    # Rows decided before the level was recorded (ledger schema < 4) were tested at the run's alpha.
    default_alpha = loop_cfg.alpha if tests_at_alpha else None

    def level(e: Experiment) -> float | None:
        wave = e.proposal_meta.get("wave")
        if (
            isinstance(wave, dict)
            and isinstance(wave.get("size"), int)
            and isinstance(wave.get("alpha"), int | float)
        ):
            # A wave of K tested at alpha with Holm makes at most one false keep with chance alpha:
            # each of its K tests counts alpha / K.
            return float(wave["alpha"]) / int(wave["size"])
        return e.alpha if e.alpha is not None else default_alpha

    tested = [
        e
        for e in experiments
        if e.seq > 0 and e.status in TESTED_STATUSES and (e.alpha is not None or e.p_value is not None)
    ]
    # A cheaper-not-worse test is a second test at the candidate's level: it adds its level to the bound.
    cheaper = [e for e in tested if cheaper_tested(e)]
    return Accounting(
        tested=len(tested),
        cheaper_tested=len(cheaper),
        expected_false_keeps=round(sum(level(e) or 0.0 for e in [*tested, *cheaper]), 6)
        if tests_at_alpha
        else None,
        fdr=loop_cfg.fdr,
        kept=[
            KeptEdit(
                experiment=e.id,
                kind=e.keep_kind,
                p_value=e.p_value,
                alpha=e.alpha if e.alpha is not None else level(e),
                rejudge_calls=e.rejudge_calls,
                rejudged_items=len(rejudged_items(e)),
                cost_usd=e.cost_usd,
            )
            for e in experiments
            if e.status == "kept"
        ],
    )


def attribution_json(attribution: Attribution | None) -> dict[str, Any]:
    """``attribution`` (one entry per kept edit in scope, newest first; ``items`` null when it was not
    measured), ``final_vs_baseline`` and ``attribution_meta``; all null before `attribute` ran."""
    if attribution is None:
        return {"attribution": None, "final_vs_baseline": None, "attribution_meta": None}
    fvb = attribution.final_vs_baseline
    return {
        "attribution": [e.public() for e in attribution.edits],
        "final_vs_baseline": fvb.public() if fvb is not None else None,
        "attribution_meta": {
            "id": attribution.id,
            "scope": attribution.scope,
            "final_commit": attribution.final_commit,
            "baseline_commit": attribution.baseline_commit,
            "split": attribution.split,
            "judge": attribution.judge,
            "replicates": attribution.replicates,
            "rejudge": attribution.rejudge,
            "alpha": attribution.alpha,
            "status": attribution.status,
            "note": attribution.note,
            "cost_usd": attribution.cost_usd,
            "not_measured": [e.experiment for e in attribution.edits if e.items is None]
            + (["final_vs_baseline"] if fvb is None or fvb.items is None else []),
        },
    }


def significant(edit: EditContribution, alpha: float) -> bool | None:
    """Whether an edit's contribution at the end is significant at ``alpha`` (None: not measured)."""
    return None if edit.p_value is None or edit.items is None else edit.p_value < alpha


def gain_when_kept(exp: Experiment) -> float | None:
    """A kept experiment's gain in items when it was kept: the adaptive test's statistic, else its net
    flips against its incumbent (newly right minus newly wrong); None when neither was recorded."""
    if exp.test and isinstance(exp.test.get("statistic"), int | float):
        return float(exp.test["statistic"])
    if exp.flips is not None:
        c = exp.flip_counts()
        return float(c["fn_to_tp"] + c["fp_to_tn"] - c["tp_to_fn"] - c["tn_to_fp"])
    return None


def gain_of(ledger: Ledger, experiment_id: int | None) -> float | None:
    if experiment_id is None:
        return None
    try:
        return gain_when_kept(ledger.get_experiment(experiment_id))
    except Exception:  # noqa: BLE001 - an edit from another ledger: no gain on record here
        return None


FpByType = tuple[dict[str, int], dict[str, int] | None]


def fp_by_type_all(ledger: Ledger, run: Run, experiments: Sequence[Experiment]) -> dict[int, FpByType | None]:
    """`fp_by_type` for each of ``experiments``, reading the run's labels once and each experiment's
    answers once (an incumbent's answers serve all the candidates compared with it)."""
    from optimizer.stats.metrics import false_positives_by_type

    labels = ledger.labels(run.id)
    answers: dict[int, dict[str, Answer]] = {}

    def answers_of(experiment_id: int) -> dict[str, Answer]:
        if experiment_id not in answers:
            answers[experiment_id] = ledger.item_answers(experiment_id)
        return answers[experiment_id]

    out: dict[int, FpByType | None] = {}
    for exp in experiments:
        mine = answers_of(exp.id) if labels else {}
        if not mine:
            out[exp.id] = None
            continue
        judged = {tid: labels[tid] for tid in mine if tid in labels}
        theirs = None if exp.parent_id is None else false_positives_by_type(judged, answers_of(exp.parent_id))
        out[exp.id] = (false_positives_by_type(judged, mine), theirs)
    return out


def fp_by_type(ledger: Ledger, run: Run, exp: Experiment) -> FpByType | None:
    """False positives per mistake type of ``exp`` and of its incumbent (its parent) on the items
    ``exp`` was judged on, so a candidate stopped early is compared on the same items; None when the
    run stored no labels or the experiment has no verdicts. The incumbent's side is None for the baseline."""
    return fp_by_type_all(ledger, run, [exp])[exp.id]


def overall_flips(ledger: Ledger, run: Run) -> dict[str, list[str]] | None:
    """Items whose correctness changed between the baseline and the final incumbent, by direction.

    None when the run has no stored labels, no baseline verdicts, or no incumbent yet.
    """
    from optimizer.stats.metrics import flip_table

    chain = ledger.kept_chain(run.id)
    labels = ledger.labels(run.id)
    if not chain or not labels:
        return None
    baseline, final = ledger.item_answers(chain[0].id), ledger.item_answers(chain[-1].id)
    if not baseline or not final:
        return None
    known = set(labels)
    table = flip_table(
        labels,
        {k: v for k, v in baseline.items() if k in known},
        {k: v for k, v in final.items() if k in known},
    )
    return {k: list(getattr(table, k)) for k in FLIP_KEYS}


def spend(experiments: Sequence[Experiment]) -> dict[str, float | int]:
    """Totals over experiments: the judge's calls, cache hits, tokens (uncached input, prompt-cache reads
    and writes, output) and seconds, the optimiser's calls and tokens, and dollars (``cost_usd`` = judge
    + optimiser, and each part)."""
    return {
        "calls": sum(e.calls for e in experiments),
        "cache_hits": sum(e.cache_hits for e in experiments),
        "input_tokens": sum(e.input_tokens for e in experiments),
        "output_tokens": sum(e.output_tokens for e in experiments),
        "cache_read_tokens": sum(e.cache_read_tokens for e in experiments),
        "cache_write_tokens": sum(e.cache_write_tokens for e in experiments),
        "cost_usd": sum(e.cost_usd for e in experiments),
        "duration_s": sum(e.duration_s or 0.0 for e in experiments),
        "judge_cost_usd": sum(e.judge_cost_usd for e in experiments),
        "optimizer_calls": sum(e.optimizer_calls for e in experiments),
        "optimizer_input_tokens": sum(e.optimizer_input_tokens for e in experiments),
        "optimizer_output_tokens": sum(e.optimizer_output_tokens for e in experiments),
        "optimizer_cost_usd": sum(e.optimizer_cost_usd for e in experiments),
    }


# The suspects the report lists (the TUI's queue shows them all).
REPORT_SUSPECTS = 10


@dataclass(frozen=True)
class Triage:
    """The report's label-triage figures for a run's split: the ranked suspects (`optimizer.answers.triage`),
    the corrections, each experiment under both label sets, the label set the run decided with and
    its fingerprint; ``problem``: why none could be computed (a broken corrections file, a missing split)."""

    suspects: list[Suspect]
    corrections: int
    given_corrected: list[GivenCorrected]
    label_set: str
    labels_fingerprint: str | None
    problem: str | None = None


def triage(ledger: Ledger, run: Run, ws: Workspace | None) -> Triage | None:
    """The run's triage figures (None without a workspace: the split is read from it)."""
    if ws is None:
        return None
    label_set = str(((run.config or {}).get("loop") or {}).get("labels", "given"))
    fingerprint = run.labels_fingerprint
    try:
        split = open_split(ws, run.split)
        suspects = label_suspects(ledger, split)
        fixes, rows = metrics_given_corrected(ledger, run, split)
    except UserError as exc:
        return Triage([], 0, [], label_set, fingerprint, problem=str(exc))
    return Triage(suspects, len(fixes), rows, label_set, fingerprint)


def triage_json(ledger: Ledger, run: Run, ws: Workspace | None) -> dict[str, Any]:
    """``label_suspects`` (every suspect of the run's split, ranked), ``labels`` (the set the run decided
    with, its fingerprint, the corrections count, and per experiment kappa/FPR given and corrected)."""
    t = triage(ledger, run, ws)
    if t is None:
        return {}
    return {
        "label_suspects": [s.as_json() for s in t.suspects],
        "labels": {
            "decided_with": t.label_set,
            "fingerprint": t.labels_fingerprint,
            "corrections": t.corrections,
            "problem": t.problem,
            "experiments": [
                {
                    "id": r.experiment_id,
                    "given": {"kappa": r.given.kappa, "fpr": r.given.fpr},
                    "corrected": {"kappa": r.corrected.kappa, "fpr": r.corrected.fpr},
                }
                for r in t.given_corrected
            ],
        },
    }
