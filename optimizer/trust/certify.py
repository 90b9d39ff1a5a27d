"""`judgeloop certify [REV]`: a versioned certificate of a judge — the prompts at a revision, the
workspace's judge, the dev split — written as JSON and Markdown under ``experiments/certificates/``
and referenced from the commit by a git note (``refs/notes/judgeloop``), never by rewriting it.

What it states (``certificate_version`` 1):

- agreement with the labels: Cohen's kappa with a 95% interval (the stratified percentile bootstrap of
  `optimizer.stats.metrics.bootstrap_intervals`, 2,000 draws, seed 0) and its Landis–Koch band; TPR and TNR
  with exact one-sided 95% lower bounds (Clopper–Pearson, `optimizer.stats.binomial`): ``tpr_lower``,
  ``tnr_lower``; FPR per mistake type of the negatives, each with its exact one-sided upper bound;
- test–retest: a second independent pass of the same prompts (replicate indices after the first
  pass's), its agreement and kappa with the first;
- the latest `judgeloop selftest` (and whether it was made on this judge, split and prompts);
- a transfer check with ``--transfer-model M``: the same prompts judged by model M of the same
  provider, kappa / FPR deltas (M minus the judge);
- the held-out ``confirm`` result recorded in the ledger for this revision, if any (never run here);
- transfer evidence across benchmarks (``benchmark_transfer``): of those confirmations, the ones on a
  split of another benchmark than the dev split's (`optimizer.trust.crossbench`), with kappa, FPR and
  TPR/TNR and their exact one-sided 95% bounds;
- the bias battery (``optimizer.trust.bias``, with the same judge; "not run" with ``--no-bias``);
- what invalidates it: judge provider, model and the model versions the provider reported, the
  split's fingerprint, the prompt hash, replicates.

Every judge call goes through the evaluator (cache, replicates): a revision evaluated before costs
nothing, one never evaluated is evaluated now. Nothing is written under ``prompts/`` or ``devset/``;
no branch moves; held-out splits are refused as the dev split.

The certificate is a `Certificate` (frozen pydantic records, fields in the file's key order; a part not
run is a `NotRun`), its records in `optimizer.trust.certify_records`; `to_json` is the file's object.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Protocol

from optimizer import __version__
from optimizer.devset.labels import load_labels
from optimizer.devset.split import Split, open_split, split_meta
from optimizer.errors import UserError
from optimizer.evaluation.cache import JudgeCache
from optimizer.evaluation.evaluator import PassOptions, evaluate_items
from optimizer.evaluation.files import redacted_url
from optimizer.evaluation.results import EvalRun
from optimizer.events import Listener, Message, Progress, ProgressSnapshot, ignore
from optimizer.judge.prompts import PromptSet
from optimizer.judge.providers import make_provider
from optimizer.ledger import Ledger
from optimizer.models import MISTAKE_TYPES, Label
from optimizer.stats.binomial import clopper_pearson_lower, clopper_pearson_upper
from optimizer.stats.metrics import Answer, bootstrap_intervals, cohen_kappa, predicted_success, score
from optimizer.trust.certify_records import (
    CERTIFICATE_VERSION,
    Agreement,
    BatteryRun,
    CascadeStage,
    Certificate,
    CertifiedCascade,
    CertifiedJudge,
    CertifiedSplit,
    CertifyCost,
    CitedAA,
    CitedInstability,
    CitedSelftest,
    Confirmations,
    Confirmed,
    InvalidatedBy,
    NotRun,
    Retest,
    Transfer,
    TypeFpr,
    TypeTransfer,
)
from optimizer.trust.crossbench import benchmark_transfer
from optimizer.trust.crossbench import markdown_lines as benchmark_transfer_lines
from optimizer.trust.selftest import dev_split_for
from optimizer.trust.selftest_files import latest_selftest, result_files, summary_lines
from optimizer.trust.selftest_records import ResultFiles, SelftestResult
from optimizer.vocab import UNTYPED
from optimizer.workspace import gitops
from optimizer.workspace.config import JudgeOverrides, JudgeSection
from optimizer.workspace.paths import unused_path
from optimizer.workspace.workspace import Workspace, repo_at

CERTIFICATE_DIR = "certificates"
NOTES_REF = "judgeloop"  # refs/notes/judgeloop
BOUND_LEVEL = 0.05  # one-sided: 95% confidence
KAPPA_METHOD = (
    "stratified percentile bootstrap (optimizer.stats.metrics.bootstrap_intervals), 2000 draws, seed 0, 95%"
)

# Landis & Koch (1977), "The measurement of observer agreement for categorical data": the bands'
# lower ends.
LANDIS_KOCH: tuple[tuple[float, str], ...] = (
    (0.81, "almost perfect"),
    (0.61, "substantial"),
    (0.41, "moderate"),
    (0.21, "fair"),
    (0.0, "slight"),
)


def landis_koch(kappa: float | None) -> str:
    """The Landis–Koch band of a kappa ("poor" below 0, "undefined" for None)."""
    if kappa is None:
        return "undefined"
    for low, name in LANDIS_KOCH:
        if kappa >= low:
            return name
    return "poor"


# --- the bias battery ------------------------------------------------------------------------------


class BatteryResult(Protocol):
    """What `optimizer.trust.bias.run_battery` returns, as far as a certificate reads it."""

    def to_json(self) -> Mapping[str, object]: ...

    def markdown_lines(self) -> list[str]: ...


class BatteryRunner(Protocol):
    """`optimizer.trust.bias.run_battery`'s signature, as a certificate calls it."""

    def __call__(
        self,
        ws: Workspace,
        rev: str,
        *,
        split: str | None,
        events: Listener,
        budget_usd: float | None,
        judge: JudgeOverrides | None,
    ) -> BatteryResult: ...


def find_battery() -> BatteryRunner:
    """`optimizer.trust.bias.run_battery`, looked up at call time (a test can stand another module in)."""
    from optimizer.trust.bias import run_battery

    return run_battery


# --- figures ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CertifyOptions:
    """What `judgeloop certify` was asked: the revision (None: HEAD), a second judge model for the
    transfer check (same provider), judge overrides, whether to run the bias battery."""

    rev: str | None = None
    transfer_model: str | None = None
    judge: JudgeOverrides = field(default_factory=JudgeOverrides)
    bias: bool = True  # False: --no-bias, the certificate says the battery was not run


def _rate(num: int, den: int) -> float | None:
    return None if den == 0 else num / den


def agreement(labels: Mapping[str, Label], answers: Mapping[str, Answer]) -> Agreement:
    """kappa with its interval and band; TPR, TNR with exact lower bounds; FPR per mistake type."""
    m = score(labels, answers)
    intervals = bootstrap_intervals(labels, answers)
    kappa_interval = intervals.get("kappa")
    per_type: dict[str, TypeFpr] = {}
    for kind in (*MISTAKE_TYPES, UNTYPED):
        ids = [
            t
            for t, lab in labels.items()
            if not lab.is_positive
            and (lab.mistake_type if lab.mistake_type in MISTAKE_TYPES else UNTYPED) == kind
        ]
        if not ids:
            continue
        fp = sum(1 for t in ids if predicted_success(labels[t], answers.get(t)))
        per_type[kind] = TypeFpr(
            negatives=len(ids),
            false_positives=fp,
            fpr=fp / len(ids),
            fpr_upper=clopper_pearson_upper(fp, len(ids), BOUND_LEVEL),
        )
    return Agreement(
        items=m.n,
        positives=m.positives,
        negatives=m.negatives,
        tp=m.tp,
        fn=m.fn,
        tn=m.tn,
        fp=m.fp,
        invalid=m.invalid,
        missing=m.missing,
        kappa=m.kappa,
        kappa_interval=kappa_interval,
        kappa_interval_method=KAPPA_METHOD,
        kappa_band=landis_koch(m.kappa),
        kappa_band_lower=landis_koch(None if kappa_interval is None else kappa_interval[0]),
        kappa_band_scale="Landis-Koch 1977: <0 poor, 0-0.20 slight, 0.21-0.40 fair, 0.41-0.60 moderate, "
        "0.61-0.80 substantial, 0.81-1 almost perfect",
        balanced_accuracy=m.balanced_accuracy,
        tpr=m.tpr,
        tpr_lower=clopper_pearson_lower(m.tp, m.positives, BOUND_LEVEL) if m.positives else None,
        tnr=m.tnr,
        tnr_lower=clopper_pearson_lower(m.tn, m.negatives, BOUND_LEVEL) if m.negatives else None,
        fpr=m.fpr,
        bound_method="Clopper-Pearson exact, one-sided 95%",
        fpr_by_type=per_type,
        mistake_type_recall=m.mistake_type_recall,
    )


def retest(labels: Mapping[str, Label], first: Mapping[str, Answer], second: Mapping[str, Answer]) -> Retest:
    """Test–retest: the share of items whose scored verdict is the same in two independent passes, and
    Cohen's kappa between the passes' verdicts (one pass taken as the rater, the other as the reference)."""
    yy = yn = ny = nn = 0
    for tid, label in labels.items():
        a, b = predicted_success(label, first.get(tid)), predicted_success(label, second.get(tid))
        if a and b:
            yy += 1
        elif a:
            yn += 1
        elif b:
            ny += 1
        else:
            nn += 1
    n = yy + yn + ny + nn
    # cohen_kappa(tp, fn, tn, fp) with the second pass as the "labels".
    return Retest(
        items=n,
        same_verdict=yy + nn,
        agreement=_rate(yy + nn, n),
        kappa=cohen_kappa(yy, ny, nn, yn),
        second_pass="replicate indices after the first pass's",
    )


def _delta(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else b - a


def transfer(primary: Agreement, other: Agreement, model: str) -> Transfer:
    """The transfer check's figures: the other model's kappa, FPR (overall and per type) and the deltas."""

    def primary_fpr(kind: str) -> float | None:
        fig = primary.fpr_by_type.get(kind)
        return None if fig is None else fig.fpr

    per_type = {
        kind: TypeTransfer(fpr=fig.fpr, fpr_delta=_delta(primary_fpr(kind), fig.fpr))
        for kind, fig in other.fpr_by_type.items()
    }
    return Transfer(
        model=model,
        kappa=other.kappa,
        kappa_delta=_delta(primary.kappa, other.kappa),
        fpr=other.fpr,
        fpr_delta=_delta(primary.fpr, other.fpr),
        tpr=other.tpr,
        tpr_delta=_delta(primary.tpr, other.tpr),
        fpr_by_type=per_type,
    )


def selftest_status(
    found: SelftestResult | None, judge: JudgeSection, split: Split, prompt_hash: str
) -> CitedSelftest | NotRun:
    """The latest self-test as the certificate cites it, and whether it tested this judge, split, prompts."""
    if found is None or found.files is None:  # (a self-test read from its file always names it)
        return NotRun(status="not run", note="run `judgeloop selftest`; it never changes prompts or branches")
    differs = []
    if (found.judge.provider, found.judge.model) != (judge.provider, judge.model):
        differs.append(f"judge {found.judge.provider}:{found.judge.model}")
    if found.split.fingerprint != split.fingerprint:
        differs.append("split fingerprint")
    if found.prompt_hash != prompt_hash:
        differs.append(f"prompts (hash {found.prompt_hash[:8]}, revision {found.revision[:10]})")
    aa = found.aa
    return CitedSelftest(
        status="current" if not differs else "stale",
        differs=differs,
        file=found.files.json_path,
        created=found.created,
        revision=found.revision,
        aa=CitedAA(
            repeats=aa.repeats, kept=aa.kept, keep_rate=aa.keep_rate, keep_rate_interval=aa.keep_rate_interval
        ),
        instability=CitedInstability(
            unstable_share=aa.instability.unstable_share, flip_rate=aa.instability.flip_rate
        ),
        planted_rolled_back=None if found.planted is None else found.planted.rolled_back,
        detectable=found.detectable.line,
        benchmark_agrees=found.benchmark.agrees,
        summary=summary_lines(found),
    )


def confirmations_for(ws: Workspace, sha: str) -> Confirmations | NotRun:
    """The held-out confirmations the ledger records for ``sha`` (the newest per split); never runs one."""
    if not ws.ledger_path.is_file():
        return NotRun(
            status="none", note="no ledger yet; `judgeloop confirm --split N` measures a held-out split"
        )
    with Ledger.open_readonly(ws.ledger_path) as ledger:
        rows = [c for c in ledger.confirmations() if c.revision == sha]
    if not rows:
        return NotRun(
            status="none",
            note="no confirmation recorded for this revision; `judgeloop confirm --split N` "
            "measures a held-out split (certify never does)",
        )
    newest: dict[str, Confirmed] = {}
    for c in rows:
        newest[c.split] = Confirmed(
            split=c.split,
            created=c.created.isoformat(timespec="seconds"),
            run=c.run_id,
            **{k: c.metrics.get(k) for k in ("n", "kappa", "tpr", "tnr", "fpr", "balanced_accuracy")},
        )
    return Confirmations(splits=list(newest.values()))


# --- the certificate -------------------------------------------------------------------------------


def _complete(run: EvalRun, what: str) -> None:
    if run.infra_error_ids:
        raise UserError(
            f"{what}: {len(run.infra_error_ids)} item(s) hit infrastructure errors after every retry "
            f"(e.g. {run.infra_error_ids[0]}); nothing is certified on partial data — re-run "
            "`judgeloop certify` when the provider is healthy (what was judged is cached)"
        )
    if run.stop is not None or run.not_evaluated:
        raise UserError(
            f"{what}: evaluation incomplete ({run.stop_reason or 'items not evaluated'}); re-run certify"
        )


def _replicas(judge: JudgeSection) -> list[str | None] | None:
    """The replicas of ``[judge] base_urls`` that judged (without credentials), else None (left out of the
    file): a certificate is void once any of them changes, not only the first."""
    return [redacted_url(url) for url in judge.base_urls] if judge.base_urls else None


def _models_seen(runs: Sequence[EvalRun]) -> list[str]:
    return sorted({r.model for run in runs for item in run.items for r in item.replicates if r.model})


def certify(ws: Workspace, options: CertifyOptions, events: Listener = ignore) -> Certificate:
    """Certify the prompts at ``options.rev`` (module docstring); writes the JSON and Markdown, adds the
    git note and returns the certificate."""

    def tell(text: str) -> None:
        events(Message(text))

    split = open_split(ws, dev_split_for(ws, "certify"))
    labels = load_labels(split)
    sha = gitops.rev_parse(ws, options.rev or "HEAD")
    prompts = PromptSet.from_rev(ws, sha)
    judge = options.judge.apply(ws.config.judge)
    k = prompts.settings.replicates
    ids = list(split.ids)
    tell(
        f"certify: prompts at {sha[:10]} [{prompts.prompt_hash()[:8]}], judge {judge.provider}:{judge.model}, "
        f"dev split {split.name} ({len(ids)} items), {k} judgement(s) per item; every call through the judge cache"
    )

    def progress(snap: ProgressSnapshot) -> None:
        events(Progress(snap))

    async def judge_all() -> tuple[EvalRun, EvalRun, EvalRun | None]:
        cache = JudgeCache(ws.cache_path)
        try:
            provider = make_provider(judge)
            try:
                first = await evaluate_items(
                    ws,
                    split,
                    prompts,
                    judge,
                    item_ids=ids,
                    replicates=k,
                    options=PassOptions(provider=provider, cache=cache, progress=progress),
                )
                _complete(first, "the first pass")
                second = await evaluate_items(
                    ws,
                    split,
                    prompts,
                    judge,
                    item_ids=ids,
                    replicates=k,
                    first_replicate=k,
                    options=PassOptions(provider=provider, cache=cache, progress=progress),
                )
                _complete(second, "the test-retest pass")
            finally:
                await provider.aclose()
            other: EvalRun | None = None
            if options.transfer_model:
                other_judge = judge.model_copy(update={"model": options.transfer_model})
                other = await evaluate_items(
                    ws,
                    split,
                    prompts,
                    other_judge,
                    item_ids=ids,
                    replicates=k,
                    options=PassOptions(cache=cache, progress=progress),
                )
                _complete(other, f"the transfer pass ({options.transfer_model})")
            return first, second, other
        finally:
            cache.close()

    first, second, other = asyncio.run(judge_all())
    passes = [first, second, *([other] if other else [])]
    tell(
        f"  judged: {sum(r.calls_made for r in passes)} call(s) made, {sum(r.cache_hits for r in passes)} from the "
        f"cache, ${sum(r.cost_usd for r in passes):.4f}"
    )
    figures = agreement(labels, first.answers())
    if not options.bias:
        bias: BatteryRun | NotRun = NotRun(status="not run", note="--no-bias")
        bias_md = ["bias battery: not run (--no-bias)"]
    else:
        tell("  bias battery: running (judgeloop bias)")
        outcome = find_battery()(ws, sha, split=None, events=events, budget_usd=None, judge=options.judge)
        bias = BatteryRun(result=dict(outcome.to_json()))
        bias_md = list(outcome.markdown_lines())
    cert = Certificate(
        certificate_version=CERTIFICATE_VERSION,
        created=datetime.now(UTC).isoformat(timespec="seconds"),
        judgeloop_version=__version__,
        revision=sha,
        prompt_hash=prompts.prompt_hash(),
        judge=CertifiedJudge(
            provider=judge.provider,
            model=judge.model,
            base_url=judge.base_url,
            base_urls=_replicas(judge),
            model_versions=_models_seen([first, second]),
            replicates=k,
            # A harness judge: "bwrap", or "none" (it ran unconfined: it could have read the labels).
            confinement=first.meta.judge_confinement or None,
        ),
        split=CertifiedSplit(name=split.name, fingerprint=split.fingerprint, items=len(ids)),
        agreement=figures,
        test_retest=retest(labels, first.answers(), second.answers()),
        selftest=selftest_status(latest_selftest(ws), judge, split, prompts.prompt_hash()),
        transfer=(
            transfer(figures, agreement(labels, other.answers()), str(options.transfer_model))
            if other is not None
            else NotRun(status="not run", note="pass --transfer-model M")
        ),
        confirm=confirmations_for(ws, sha),
        benchmark_transfer=benchmark_transfer(ws, sha, split_meta(split.root).benchmark),
        bias_battery=bias,
        invalidated_by=InvalidatedBy(
            judge_provider=judge.provider,
            judge_model=judge.model,
            judge_base_url=judge.base_url,
            judge_base_urls=_replicas(judge),
            judge_model_versions=_models_seen([first, second]),
            split_fingerprint=split.fingerprint,
            prompt_hash=prompts.prompt_hash(),
            replicates=k,
            rule="any change of these makes this certificate void: certify again",
        ),
        cost=CertifyCost(
            calls=sum(r.calls_made for r in passes),
            cache_hits=sum(r.cache_hits for r in passes),
            usd=round(sum(r.cost_usd for r in passes), 6),
        ),
        cascade=certified_cascade(first),
    )
    path = write_certificate(ws, cert, bias_md)
    cert = _placed(ws, cert, path)
    files = _files_of(cert)
    add_note(ws, sha, cert, path)
    for line in markdown_lines(cert, bias_md):
        if line.startswith("- "):
            tell("  " + line[2:])
    tell(
        f"  wrote {files.json_path} and {files.markdown}; git note on {sha[:10]} under "
        f"refs/notes/{NOTES_REF} (`git log --notes={NOTES_REF}`)"
    )
    return cert


def certified_cascade(run: EvalRun) -> CertifiedCascade | None:
    """A cascade pass's record (`optimizer.evaluation.cascade`'s ``meta.cascade``) as the certificate's
    typed part; None for a single judge."""
    record = run.meta.cascade
    if record is None:
        return None
    second, stages = record["second"], record["stages"]
    return CertifiedCascade(
        rule=record["rule"],
        judged=record["judged"],
        escalated=record["escalated"],
        escalation_share=record["escalation_share"],
        second_provider=second["provider"],
        second_model=second["model"],
        second_base_url=second["base_url"],
        first=CascadeStage.model_validate(stages["first"]),
        second=CascadeStage.model_validate(stages["second"]),
    )


def _cascade_lines(cascade: CertifiedCascade | None) -> list[str]:
    if cascade is None:
        return []
    first, second = cascade.first, cascade.second
    return [
        "",
        "## Cascade",
        "",
        f"- rule `{cascade.rule}`: {cascade.escalated} of {cascade.judged} items escalated "
        f"({cascade.escalation_share:.1%}) to `{cascade.second_provider}:{cascade.second_model}`",
        f"- first judge: {first.items} items, {first.calls} call(s) made, {first.cache_hits} from the cache, "
        f"${first.cost_usd:.4f} now (${first.cost_usd_as_made:.4f} as made)",
        f"- second judge: {second.items} items, {second.calls} call(s) made, {second.cache_hits} from the cache, "
        f"${second.cost_usd:.4f} now (${second.cost_usd_as_made:.4f} as made)",
    ]


def _placed(ws: Workspace, cert: Certificate, path: Path) -> Certificate:
    """``cert`` naming its JSON file ``path``, the Markdown beside it and the notes ref."""
    return cert.model_copy(update={"files": result_files(ws, path), "note_ref": f"refs/notes/{NOTES_REF}"})


def _files_of(cert: Certificate) -> ResultFiles:
    if cert.files is None:
        raise ValueError("the certificate has not been written yet: it names no file")
    return cert.files


def write_certificate(ws: Workspace, cert: Certificate, bias_md: Sequence[str]) -> Path:
    """``experiments/certificates/<sha>-<stamp>.json`` and ``.md``; returns the JSON's path."""
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    path = unused_path(ws.experiments_dir / CERTIFICATE_DIR, f"{cert.revision[:12]}-{stamp}")
    body = _placed(ws, cert, path)
    path.write_text(json.dumps(body.to_json(), indent=2) + "\n", encoding="utf-8")
    path.with_suffix(".md").write_text("\n".join(markdown_lines(body, bias_md)) + "\n", encoding="utf-8")
    return path


def note_text(cert: Certificate, path: Path) -> str:
    """The git note: trailers naming the certificate file, its sha256 and its headline figures."""
    fig = cert.agreement
    interval = fig.kappa_interval
    kappa = "n/a" if fig.kappa is None else f"{fig.kappa:.3f}"
    if interval is not None:
        kappa += f" [{interval[0]:.3f}, {interval[1]:.3f}] {fig.kappa_band}"
    trailers = {
        "Judgeloop-Certificate": _files_of(cert).json_path,
        "Judgeloop-Certificate-Version": cert.certificate_version,
        "Judgeloop-Certificate-Sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
        "Judgeloop-Certificate-Judge": f"{cert.judge.provider}:{cert.judge.model}",
        "Judgeloop-Certificate-Split": f"{cert.split.name} {cert.split.fingerprint[:12]}",
        "Judgeloop-Certificate-Kappa": kappa,
        "Judgeloop-Certificate-TPR-Lower": "n/a" if fig.tpr_lower is None else f"{fig.tpr_lower:.3f}",
        "Judgeloop-Certificate-TNR-Lower": "n/a" if fig.tnr_lower is None else f"{fig.tnr_lower:.3f}",
    }
    return gitops.format_message(
        f"judgeloop certificate {cert.created}", trailers={k: str(v) for k, v in trailers.items()}
    )


def add_note(ws: Workspace, sha: str, cert: Certificate, path: Path) -> None:
    """Append the certificate's note to ``sha`` under refs/notes/judgeloop (the commit is not rewritten)."""
    with repo_at(ws.root) as repo:
        repo.git.execute(
            [
                "git",
                "-c",
                "user.name=judgeloop",
                "-c",
                "user.email=judgeloop@localhost",
                "notes",
                f"--ref={NOTES_REF}",
                "append",
                "-m",
                note_text(cert, path),
                sha,
            ]
        )


def read_note(ws: Workspace, sha: str) -> str | None:
    """The judgeloop note on ``sha``, or None."""
    import git

    with repo_at(ws.root) as repo:
        try:
            return str(repo.git.notes(f"--ref={NOTES_REF}", "show", sha))
        except git.GitCommandError:
            return None


# --- Markdown --------------------------------------------------------------------------------------


def _f(x: float | None, digits: int = 3) -> str:
    return "n/a" if x is None else f"{x:.{digits}f}"


def _signed(x: float | None) -> str:
    return "n/a" if x is None else f"{x:+.3f}"


def _confinement_lines(judge: CertifiedJudge) -> list[str]:
    """What the certificate says of a harness judge's confinement (nothing for other judges)."""
    if judge.confinement == "none":
        return [
            "",
            '**The harness judge ran unconfined** (`[judge] sandbox = "none"`): its CLI could read the '
            "workspace and the labels, so these figures do not show what the judge can do blind.",
        ]
    if judge.confinement:
        return [
            "",
            f"The harness judge ran confined ({judge.confinement}: no workspace, labels or other keys in view).",
        ]
    return []


def markdown_lines(cert: Certificate, bias_md: Sequence[str] = ()) -> list[str]:
    """The certificate as a Markdown document."""
    fig, judge, split = cert.agreement, cert.judge, cert.split
    ki = fig.kappa_interval
    lines = [
        f"# Judge certificate — `{cert.revision[:10]}`",
        "",
        f"certificate_version {cert.certificate_version}, created {cert.created}, judgeloop "
        f"{cert.judgeloop_version}. Judge `{judge.provider}:{judge.model}` (model versions reported: "
        f"{', '.join(judge.model_versions) or 'none'}; {judge.replicates} judgement(s) per item), dev split "
        f"`{split.name}` ({split.items} items: {fig.positives} positive / {fig.negatives} negative), "
        f"prompt hash `{cert.prompt_hash[:12]}`.",
        *_confinement_lines(judge),
        "",
        "## Agreement with the labels",
        "",
        f"- Cohen's kappa {_f(fig.kappa)}"
        + (
            ""
            if ki is None
            else f", 95% interval [{ki[0]:.3f}, {ki[1]:.3f}] (stratified percentile bootstrap)"
        )
        + f": **{fig.kappa_band}** (Landis–Koch; the interval's lower end: {fig.kappa_band_lower})",
        f"- TPR {_f(fig.tpr)} ({fig.tp}/{fig.positives}), `tpr_lower` = **{_f(fig.tpr_lower)}** "
        "(Clopper–Pearson, one-sided 95%)",
        f"- TNR {_f(fig.tnr)} ({fig.tn}/{fig.negatives}), `tnr_lower` = **{_f(fig.tnr_lower)}**; "
        f"FPR {_f(fig.fpr)}",
    ]
    for kind, t in fig.fpr_by_type.items():
        lines.append(
            f"- FPR on {kind}: {t.false_positives}/{t.negatives} = {t.fpr:.3f} "
            f"(at most {t.fpr_upper:.3f} at 95%)"
        )
    rt = cert.test_retest
    lines += [
        "",
        "## Test–retest",
        "",
        f"- two independent passes of the same prompts agree on {rt.same_verdict} of {rt.items} items "
        f"({_f(rt.agreement)}); kappa between them {_f(rt.kappa)}",
    ]
    st = cert.selftest
    lines += ["", "## Self-test", ""]
    if isinstance(st, NotRun):
        lines.append(f"- selftest: not run ({st.note})")
    else:
        lines.append(
            f"- latest selftest ({st.file}, {st.created}): **{st.status}**"
            + (f" (made with another {', '.join(st.differs)})" if st.differs else "")
        )
        lines += st.summary
    tr = cert.transfer
    lines += ["", "## Transfer to another judge model", ""]
    if isinstance(tr, NotRun):
        lines.append(f"- transfer: not run ({tr.note})")
    else:
        lines.append(
            f"- `{tr.model}`: kappa {_f(tr.kappa)} ({_signed(tr.kappa_delta)}), FPR {_f(tr.fpr)} "
            f"({_signed(tr.fpr_delta)}), TPR {_f(tr.tpr)} ({_signed(tr.tpr_delta)})"
        )
        for kind, tt in tr.fpr_by_type.items():
            lines.append(f"- `{tr.model}` FPR on {kind}: {tt.fpr:.3f} ({_signed(tt.fpr_delta)})")
    cf = cert.confirm
    lines += ["", "## Held-out confirmation", ""]
    if isinstance(cf, NotRun):
        lines.append(f"- confirm: none ({cf.note})")
    else:
        for row in cf.splits:
            lines.append(
                f"- `{row.split}` ({row.created}): kappa {_f(row.kappa)}, TPR {_f(row.tpr)}, "
                f"TNR {_f(row.tnr)}, FPR {_f(row.fpr)} on {row.n} items"
            )
    lines += _cascade_lines(cert.cascade)
    lines += benchmark_transfer_lines(cert.benchmark_transfer)
    lines += ["", "## Bias battery", ""]
    lines += [line if line.startswith(("-", "|", "#")) or not line else f"- {line}" for line in bias_md] or [
        "- bias battery: not run"
    ]
    inv = cert.invalidated_by
    lines += [
        "",
        "## What invalidates it",
        "",
        f"- judge `{inv.judge_provider}:{inv.judge_model}`"
        + (f" at `{inv.judge_base_url}`" if inv.judge_base_url else "")
        + f", model versions {', '.join(inv.judge_model_versions) or 'none reported'}",
        f"- split fingerprint `{inv.split_fingerprint}`",
        f"- prompt hash `{inv.prompt_hash}`, {inv.replicates} judgement(s) per item",
        f"- {inv.rule}",
    ]
    return lines
