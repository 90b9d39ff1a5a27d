"""The records of a judge certificate (`optimizer.trust.certify`): frozen pydantic records whose fields are
in the order the certificate file writes them (``certificate_version`` `CERTIFICATE_VERSION`); a part not
run is a `NotRun`. Plain data: nothing here runs a judge or reads the workspace."""

from __future__ import annotations

from typing import Any, Literal

from optimizer.trust.selftest_records import Record, ResultFiles

CERTIFICATE_VERSION = 1


class TypeFpr(Record):
    """FPR on the negatives of one mistake type, with its exact one-sided 95% upper bound."""

    negatives: int
    false_positives: int
    fpr: float
    fpr_upper: float


class Agreement(Record):
    """`agreement`: the judge's verdicts against the labels (rates in [0, 1], None when undefined)."""

    items: int
    positives: int
    negatives: int
    tp: int
    fn: int
    tn: int
    fp: int
    invalid: int
    missing: int
    kappa: float | None
    kappa_interval: tuple[float, float] | None
    kappa_interval_method: str
    kappa_band: str
    kappa_band_lower: str
    kappa_band_scale: str
    balanced_accuracy: float | None
    tpr: float | None
    tpr_lower: float | None
    tnr: float | None
    tnr_lower: float | None
    fpr: float | None
    bound_method: str
    fpr_by_type: dict[str, TypeFpr]
    mistake_type_recall: dict[str, float | None]


class Retest(Record):
    """`retest`: how often two independent passes give the same scored verdict, and their kappa."""

    items: int
    same_verdict: int
    agreement: float | None
    kappa: float | None
    second_pass: str


class NotRun(Record):
    """A part of the certificate not run, or with nothing recorded (status "not run" or "none"), and why."""

    status: Literal["not run", "none"]
    note: str


class TypeTransfer(Record):
    fpr: float
    fpr_delta: float | None


class Transfer(Record):
    """`transfer`: the other model's figures and their deltas (the other model minus the judge)."""

    status: Literal["run"] = "run"
    model: str
    kappa: float | None
    kappa_delta: float | None
    fpr: float | None
    fpr_delta: float | None
    tpr: float | None
    tpr_delta: float | None
    fpr_by_type: dict[str, TypeTransfer]


class CitedAA(Record):
    repeats: int
    kept: int
    keep_rate: float | None
    keep_rate_interval: tuple[float, float] | None


class CitedInstability(Record):
    unstable_share: float | None
    flip_rate: float | None


class CitedSelftest(Record):
    """`selftest_status`: the latest self-test as cited, "current" when it tested this judge, split and
    prompts (``differs`` lists what it tested instead)."""

    status: Literal["current", "stale"]
    differs: list[str]
    file: str
    created: str
    revision: str
    aa: CitedAA
    instability: CitedInstability
    planted_rolled_back: bool | None
    detectable: str
    benchmark_agrees: bool | None
    summary: list[str]


class Confirmed(Record):
    """The newest held-out confirmation of one split recorded in the ledger (figures as recorded)."""

    split: str
    created: str
    run: str | None
    n: int | None
    kappa: float | None
    tpr: float | None
    tnr: float | None
    fpr: float | None
    balanced_accuracy: float | None


class Confirmations(Record):
    status: Literal["recorded"] = "recorded"
    splits: list[Confirmed]


class BenchmarkEvidence(Record):
    """The newest held-out confirmation of this revision on one split of another benchmark: its figures
    with exact one-sided 95% bounds (Clopper-Pearson) from the recorded counts."""

    split: str
    benchmark: str
    fingerprint: str | None
    created: str
    run: str | None
    n: int
    tp: int
    fn: int
    tn: int
    fp: int
    kappa: float | None
    balanced_accuracy: float | None
    tpr: float | None
    tpr_lower: float | None
    tnr: float | None
    tnr_lower: float | None
    fpr: float | None
    fpr_upper: float | None
    bound_method: str


class BenchmarkTransfer(Record):
    """`benchmark_transfer`: how the prompts, tuned on the dev split's benchmark, did on other benchmarks'
    held-out splits (`judgeloop confirm --split S` of a split imported with ``devset import --format``)."""

    status: Literal["recorded"] = "recorded"
    dev_benchmark: str
    splits: list[BenchmarkEvidence]


class BatteryRun(Record):
    """The bias battery's result, as its own JSON object (`optimizer.trust.bias.BatteryResult.to_json`)."""

    status: Literal["run"] = "run"
    result: dict[str, Any]


class CertifiedJudge(Record):
    OMITTED_WHEN_NONE = ("base_urls", "confinement")

    provider: str
    model: str
    base_url: str | None
    base_urls: list[str | None] | None = None  # every replica of [judge] base_urls (credentials removed)
    model_versions: list[str]
    replicates: int
    confinement: str | None = None  # a harness judge's sandbox: "bwrap", or "none" (it ran unconfined)


class CertifiedSplit(Record):
    name: str
    fingerprint: str
    items: int


class InvalidatedBy(Record):
    """What makes the certificate void when it changes."""

    OMITTED_WHEN_NONE = ("judge_base_urls",)

    judge_provider: str
    judge_model: str
    judge_base_url: str | None
    judge_base_urls: list[str | None] | None = None
    judge_model_versions: list[str]
    split_fingerprint: str
    prompt_hash: str
    replicates: int
    rule: str


class CascadeStage(Record):
    """One stage of a certified cascade's first pass: the items it judged, the calls it made now and took
    from the cache, what the calls made now cost and what its verdicts cost as made (US dollars)."""

    items: int
    calls: int
    cache_hits: int
    cost_usd: float
    cost_usd_as_made: float


class CertifiedCascade(Record):
    """`cascade`: the certified judge is a cascade (judge.toml ``structure = "cascade"``): its rule, the
    share of the judged items the first pass escalated to the second judge, that judge, and each stage."""

    rule: str
    judged: int
    escalated: int
    escalation_share: float
    second_provider: str | None
    second_model: str | None
    second_base_url: str | None
    first: CascadeStage
    second: CascadeStage


class CertifyCost(Record):
    """The judge calls certify made and took from the cache, and what they cost (US dollars)."""

    calls: int
    cache_hits: int
    usd: float


class Certificate(Record):
    """The certificate (``certificate_version`` `CERTIFICATE_VERSION`) as `certify` returns and writes it;
    ``files`` and ``note_ref`` say where it was written."""

    OMITTED_WHEN_NONE = ("files", "note_ref", "cascade")

    certificate_version: int = CERTIFICATE_VERSION
    created: str
    judgeloop_version: str
    revision: str
    prompt_hash: str
    judge: CertifiedJudge
    split: CertifiedSplit
    agreement: Agreement
    test_retest: Retest
    selftest: CitedSelftest | NotRun
    transfer: Transfer | NotRun
    confirm: Confirmations | NotRun
    benchmark_transfer: BenchmarkTransfer | NotRun
    bias_battery: BatteryRun | NotRun
    invalidated_by: InvalidatedBy
    cost: CertifyCost
    cascade: CertifiedCascade | None = None  # None (left out of the file): a single judge
    files: ResultFiles | None = None
    note_ref: str | None = None
