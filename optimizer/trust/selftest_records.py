"""The self-test's result as typed records (`SelftestResult` and its parts), their fields in the order
the result file writes them, and the file's format version. Pure data."""

from __future__ import annotations

from typing import ClassVar

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    model_serializer,
)

SELFTEST_VERSION = 1


# --- the result: typed records, their fields in the order the result file writes them ---------------


class Record(BaseModel):
    """A frozen record of a result file (the self-test's, the certificate's). `to_json` is the JSON
    object the file holds: the fields in declaration order, the keys in `OMITTED_WHEN_NONE` left out
    while None (the files never wrote them as null)."""

    model_config = ConfigDict(frozen=True, populate_by_name=True)
    OMITTED_WHEN_NONE: ClassVar[tuple[str, ...]] = ()

    @model_serializer(mode="wrap")
    def _serialise(self, handler: SerializerFunctionWrapHandler) -> dict[str, object]:
        data: dict[str, object] = handler(self)
        for key in self.OMITTED_WHEN_NONE:
            if data.get(key) is None:
                data.pop(key, None)
        return data

    def to_json(self) -> dict[str, object]:
        """The record as its file's JSON object (same keys, same order, same values)."""
        return self.model_dump(by_alias=True)


class ResultFiles(Record):
    """Where a result was written, relative to the workspace."""

    json_path: str = Field(alias="json")  # (``json`` would shadow a BaseModel method)
    markdown: str


class JudgeRecord(Record):
    provider: str
    model: str
    base_url: str | None


class SplitRecord(Record):
    """The dev split tested: its name, fingerprint and size (items)."""

    name: str
    fingerprint: str
    items: int
    positives: int
    negatives: int


class PolicyRecord(Record):
    """The decision rule tested: ``name`` as the benchmark names it, ``level`` the one a first candidate meets."""

    name: str
    policy: str
    level: float
    alpha: float
    fdr: float | None
    rejudge: int
    replicates: int
    min_kappa_delta: float
    fpr_tolerance: float


class DecisionRow(Record):
    """One A/A repeat's decision (``kept`` None: not decided, ``reason`` then says why); cost in US dollars."""

    repeat: int
    kept: bool | None
    reason: str | None
    p_value: float | None
    early_stopped: bool
    gain_items: float | None
    rejudged: int
    calls: int
    cache_hits: int
    cost_usd: float


class Instability(Record):
    """`instability`'s figures: shares in [0, 1], None when nothing was compared."""

    items_judged_twice: int
    unstable_items: int
    unstable_share: float | None
    unstable_ids: list[str]
    first_pass_flips: int
    first_pass_compared: int
    flip_rate: float | None


class AARecord(Record):
    """The A/A repeats: how many were asked, decided and kept, the keep rate with its exact 95% interval."""

    asked: int
    repeats: int
    kept: int
    keep_rate: float | None
    keep_rate_interval: tuple[float, float] | None
    interval_method: str
    decisions: list[DecisionRow]
    instability: Instability


class PlantedRow(Record):
    """The planted degradation's decision (``rolled_back`` None: not decided) and the FPRs before and after."""

    rule: str
    where: str
    decided: bool
    rolled_back: bool | None
    reason: str | None
    early_stopped: bool
    items_judged: int
    rejudged: int
    fpr_incumbent: float | None
    fpr_planted: float | None
    judge_obeyed: bool
    calls: int
    cache_hits: int
    cost_usd: float


class PowerAtNoise(Record):
    """`power_at_noise`: simulated keep rates by items fixed (keys: the D as text, values in [0, 1])."""

    keep_rate_by_fix: dict[str, float]
    target: float
    smallest_fix: int | None
    trials: int
    fixable_items: int
    method: str


class DetectableGain(Record):
    """`detectable_gain`: the fewest items a kept candidate must fix, and the line that says it."""

    OMITTED_WHEN_NONE = ("at_noise",)

    min_clean_fixes: int
    with_one_broken: int
    with_two_broken: int
    share_of_split: float
    noise_items_per_evaluation: float | None
    line: str
    at_noise: PowerAtNoise | None = None


class BenchmarkReference(Record):
    """One policy's row of `BENCHMARK` (keep rates in [0, 1])."""

    noop_fresh: float
    noop_fresh_n: int
    noop_in_run: float
    fix4: float
    fix8: float
    fix12: float


class BenchmarkBeside(Record):
    """`benchmark_beside`: the benchmark's row for the policy and whether our A/A rate agrees with it
    (``agrees`` and ``interval`` None when there is no row or no repeat)."""

    policy: str
    reference: BenchmarkReference | None
    agrees: bool | None
    source: str
    judge: str
    interval: tuple[float, float] | None = None

    @model_serializer(mode="wrap")
    def _serialise(self, handler: SerializerFunctionWrapHandler) -> dict[str, object]:
        data: dict[str, object] = handler(self)
        if (
            self.interval is None
        ):  # no comparison made: the file has no interval, ``agrees`` after the reference
            del data["interval"]
            return data
        order = ("policy", "reference", "source", "judge", "interval", "agrees")
        return {key: data[key] for key in order}


class SelftestResult(Record):
    """What `selftest` returns and writes (``selftest_version`` `SELFTEST_VERSION`); ``files`` is set
    on the result returned and read back, never in the file itself. Costs in US dollars."""

    OMITTED_WHEN_NONE = ("files",)

    selftest_version: int = SELFTEST_VERSION
    created: str
    judge: JudgeRecord
    split: SplitRecord
    revision: str
    prompt_hash: str
    policy: PolicyRecord
    aa: AARecord
    planted: PlantedRow | None
    detectable: DetectableGain
    benchmark: BenchmarkBeside
    complete: bool
    stopped: str | None
    calls: int
    cache_hits: int
    cost_usd: int | float
    files: ResultFiles | None = None
