"""``judgeloop.toml``: the workspace configuration, validated with pydantic.

Every section has defaults, so a workspace file may name only what it changes. Unknown keys are an
error (a typo in a budget or a policy name must not be silently ignored).
"""

from __future__ import annotations

import re
import tomllib
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from optimizer.errors import UserError, first_error
from optimizer.structure import check_moves
from optimizer.vocab import COMMAND, OptimizerProviderName, PolicyName, StrategyName
from optimizer.vocab import ProviderName as ProviderName  # spelled in optimizer.vocab
from optimizer.workspace.paths import JUDGE_TOML, PathRefused, prompt_file

# [judge] harness: the coding-agent CLIs `optimizer.judge.harness` has a non-interactive preset for.
HARNESS_PRESETS = ("codex", "claude", "gemini", "opencode")

# [judge] batch_engine: who runs a --batch pass (the provider's batch API, or `vllm run-batch` over files).
BatchEngine = Literal["provider", "vllm-run-batch"]
RUN_BATCH_DIR = "experiments/run-batch"

# Judge calls in flight at once ([judge] max_concurrency, --concurrency).
MAX_CONCURRENCY = 256
# Endpoints in [judge] base_urls: each holds its own client and connection pool.
MAX_ENDPOINTS = 64
# Judgements per item (prompts/judge.toml's replicates, --replicates; see optimizer.judge.prompts).
MAX_REPLICATES = 15


def _scalar_kinds(annotation: object) -> set[type]:
    """The plain scalar types (bool, int, float) a field's annotation admits: ``float | None`` → {float}."""
    args = (
        typing.get_args(annotation)
        if typing.get_origin(annotation) in (typing.Union, types.UnionType)
        else ()
    )
    return {t for t in (args or (annotation,)) if t in (bool, int, float)}


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")

    @model_validator(mode="before")
    @classmethod
    def _strict_scalars(cls, data: object) -> object:
        """Refuse a number or a truth value written as text or as the other kind (``alpha = "0.1"``,
        ``max_concurrency = true``): pydantic's lax mode would convert it silently, and a quoted number in
        judgeloop.toml is a slip worth one line, not a guess."""
        if not isinstance(data, dict):
            return data
        for name, field in cls.model_fields.items():
            kinds = _scalar_kinds(field.annotation)
            value = data.get(name)
            if not kinds or value is None:
                continue
            ok = (
                isinstance(value, bool)
                if kinds == {bool}
                else (
                    isinstance(value, int | float)
                    and not isinstance(value, bool)
                    and (float in kinds or isinstance(value, int))
                )
            )
            if not ok:
                want = (
                    "true or false"
                    if kinds == {bool}
                    else ("a number" if float in kinds else "a whole number")
                )
                raise ValueError(f"{name} must be {want}, without quotes (got {value!r})")
        return data


class WorkspaceSection(_Section):
    dev_split: str = Field(
        default="sample", description="the split the loop judges on and the only one the optimiser sees"
    )
    # Splits the optimiser must never see; only `judgeloop confirm` may evaluate them.
    heldout_splits: list[str] = Field(
        default_factory=list,
        description="splits the optimiser never sees; only `judgeloop confirm` evaluates them, a capped number of times",
    )


# A header name (RFC 9110's token, kept to what routers accept) and the headers the SDK sends itself.
_HEADER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9-]{0,63}")
RESERVED_HEADERS = frozenset(
    {
        "authorization",
        "api-key",
        "x-api-key",
        "content-type",
        "content-length",
        "host",
        "cookie",
        "user-agent",
        "accept",
        "openai-organization",
        "openai-project",
        "x-stainless-retry-count",
    }
)


class JudgeSection(_Section):
    provider: ProviderName = Field(
        default="local",
        description="who answers the judge calls: local (the offline demonstration judge), anthropic, openai "
        "(also any OpenAI-compatible server) or command (a harness CLI per item)",
    )
    model: str = Field(  # for `local`: a name of a bundled model or a path to a GGUF file
        default="smollm2-135m",
        description="the judge model: the provider's model id; for local a bundled model's name or a path to a "
        "GGUF file; for command the CLI's --model (absent: the CLI's own default)",
    )
    base_url: str | None = Field(
        default=None,
        description="the judge's API address when not the provider's own, e.g. a vLLM server's /v1",
    )
    # Several OpenAI-compatible replicas of one model: each item goes to one of them by consistent
    # hashing on its trajectory id (optimizer.judge.endpoints); exclusive with base_url.
    base_urls: list[str] | None = Field(
        default=None,
        description=f"several OpenAI-compatible replicas of one model instead of base_url (openai only, at most "
        f"{MAX_ENDPOINTS}): each item sticks to one endpoint by consistent hashing, a failing one is drained",
    )
    # A router in front of several servers (LiteLLM, llm-d, SGLang's router) keeps an item's calls on one
    # replica when each carries a stable per-item key in this header (optimizer.judge.endpoints.affinity_key).
    affinity_header: str | None = Field(
        default=None,
        description="an HTTP header carrying each judge call's per-item affinity key (a hash of the trajectory id) "
        'for a router in front of several servers, e.g. "x-session-affinity" (openai provider; unset: none)',
    )
    max_concurrency: int = Field(
        default=4, ge=1, le=MAX_CONCURRENCY, description="judge calls in flight at once"
    )
    timeout_s: float = Field(
        default=120.0,
        gt=0,
        description="seconds one judge call may take (a harness judge: one item's CLI run)",
    )
    max_retries: int = Field(
        default=4,
        ge=0,
        le=20,
        description="the SDK's retries of a failed call (a harness judge: runs again after a timeout or non-zero exit)",
    )
    # The local judge's inference threads; None = the cores idle when it starts (at most 4).
    local_threads: int | None = Field(
        default=None,
        ge=1,
        le=64,
        description="the local judge's inference threads (unset: the cores idle when it starts, at most 4)",
    )
    # Batch evaluation (--batch): the first wait between status polls, growing 1.5x per poll up to
    # batch_poll_max_s; entries that errored or expired are re-submitted alone up to batch_retry_rounds times.
    batch_poll_s: float = Field(
        default=30.0,
        gt=0,
        le=3600,
        description="--batch: seconds before the first status poll, growing 1.5x per poll",
    )
    batch_poll_max_s: float = Field(
        default=600.0, gt=0, le=3600, description="--batch: the longest wait between polls, seconds"
    )
    batch_retry_rounds: int = Field(
        default=2,
        ge=0,
        le=10,
        description="--batch: times the entries that errored or expired are re-submitted alone before they count "
        "as infrastructure errors",
    )
    # --batch-cold: a batch pass submits without warming its cold items first (optimizer.evaluation.warmup).
    batch_cold: bool = Field(
        default=False,
        description="--batch: submit without first warming each cold item with one direct call (as --batch-cold)",
    )
    # --batch through `vllm run-batch` (optimizer.judge.providers.run_batch): each batch is an OpenAI batch
    # file written into batch_dir, answered by the output file vLLM writes beside it.
    batch_engine: BatchEngine = Field(
        default="provider",
        description='--batch: who runs a batch: "provider" (the provider\'s batch API) or "vllm-run-batch" '
        "(judgeloop writes each batch's input file into batch_dir and waits for the output file `vllm run-batch` "
        "writes beside it; provider openai, with the server's base_url or base_urls)",
    )
    batch_dir: str = Field(
        default=RUN_BATCH_DIR,
        min_length=1,
        description='batch_engine = "vllm-run-batch": the folder of the batch files: under experiments/ (relative '
        "to the workspace) or an absolute path, e.g. storage the vLLM machine shares",
    )
    # provider = "command" (a harness judge, see optimizer.judge.harness): the CLI to run per item,
    # or a preset filling it; the most one call may cost (the budget reserves it, and it is the cost
    # of a call whose CLI reports none); environment variables passed on besides the harness's own.
    command: list[str] = Field(
        default_factory=list,
        description="provider = command: the CLI to run per item, {{PROMPT}} standing for the per-item prompt "
        "(instead of a harness preset)",
    )
    harness: str | None = Field(
        default=None,
        description="provider = command: a preset for that coding-agent CLI's non-interactive JSON invocation: "
        + ", ".join(HARNESS_PRESETS),
    )
    price_per_call_usd: float | None = Field(
        default=None,
        ge=0.0,
        description="provider = command: the most one item's CLI run may cost, US dollars (required with "
        "--budget-usd; the cost of a call whose CLI reports none)",
    )
    pass_env: list[str] = Field(
        default_factory=list,
        description="provider = command: environment variables passed to the CLI besides the harness's own keys",
    )
    # How the CLI is confined (optimizer.judge.sandbox): "bwrap" (bubblewrap namespaces, the default) or
    # "none" (unconfined, said in every result and certificate). The most one call may cost when set
    # (US dollars): a budget reserves it per call instead of the declared price or the highest reported.
    sandbox: Literal["bwrap", "none"] = Field(
        default="bwrap",
        description="provider = command: confine each CLI run with bubblewrap, or none (unconfined: every result "
        "and certificate says so)",
    )
    max_cost_per_call_usd: float | None = Field(
        default=None,
        gt=0.0,
        description="provider = command: a hard per-call ceiling in US dollars the budget reserves instead of the "
        "declared or highest reported price",
    )

    @model_validator(mode="before")
    @classmethod
    def _command_model(cls, data: object) -> object:
        # A harness judge without a model runs the CLI's own default model (no --model flag).
        if isinstance(data, dict) and data.get("provider") == COMMAND and "model" not in data:
            return {**data, "model": ""}
        return data

    @field_validator("harness")
    @classmethod
    def _known_harness(cls, name: str | None) -> str | None:
        if name is not None and name not in HARNESS_PRESETS:
            raise ValueError(
                f"unknown harness {name!r}; use one of {', '.join(HARNESS_PRESETS)}, or set command = [...]"
            )
        return name

    @model_validator(mode="after")
    def _command_judge(self) -> JudgeSection:
        if self.provider == COMMAND:
            if "command" in self.model_fields_set and not self.command and self.harness is None:
                raise ValueError(
                    'command is empty; name the CLI to run, e.g. command = ["codex", "exec", "--json"]'
                )
            if not self.command and self.harness is None:
                raise ValueError(
                    'provider = "command" needs command = [...] or harness = '
                    + " | ".join(f'"{h}"' for h in HARNESS_PRESETS)
                )
            if any(not part for part in self.command[:1]):
                raise ValueError("command starts with an empty program name; name the CLI to run")
        elif self.command or self.harness is not None:
            raise ValueError(
                f'command/harness is set but provider = "{self.provider}"; set provider = "command"'
            )
        return self

    @field_validator("base_urls")
    @classmethod
    def _urls(cls, urls: list[str] | None) -> list[str] | None:
        if urls is None:
            return None
        if not urls:
            raise ValueError("base_urls is empty; name at least one http(s) URL or remove the key")
        if len(urls) > MAX_ENDPOINTS:
            raise ValueError(f"base_urls names {len(urls)} endpoints; at most {MAX_ENDPOINTS} are allowed")
        out: list[str] = []
        for url in urls:
            if not url.startswith(("http://", "https://")) or len(url.split("://", 1)[1].strip("/")) == 0:
                raise ValueError(f"base_urls: {url!r} is not an http(s) URL")
            if url.rstrip("/") in out:
                raise ValueError(f"base_urls: {url!r} is listed twice")
            out.append(url.rstrip("/"))
        return out

    @field_validator("affinity_header")
    @classmethod
    def _header_name(cls, name: str | None) -> str | None:
        if name is None:
            return None
        if not _HEADER_NAME.fullmatch(name):
            raise ValueError(f"affinity_header {name!r} is not an HTTP header name (letters, digits and '-')")
        if name.lower() in RESERVED_HEADERS:  # the key would replace what the SDK sends there
            raise ValueError(f"affinity_header {name!r} is a header the client sends itself; name another")
        return name

    @model_validator(mode="after")
    def _one_kind_of_url(self) -> JudgeSection:
        if self.base_urls is not None and self.base_url is not None:
            raise ValueError("base_url and base_urls are exclusive; keep one")
        if self.base_urls is not None and self.provider != "openai":
            raise ValueError(
                f'base_urls needs provider = "openai" (OpenAI-compatible servers), not {self.provider!r}'
            )
        return self

    @field_validator("batch_dir")
    @classmethod
    def _batch_dir_under_experiments(cls, folder: str) -> str:
        # Under experiments/ the files never dirty the tree a run commits from (nor reach prompts/ or devset/).
        parts = Path(folder).parts
        if not Path(folder).is_absolute() and (".." in parts or len(parts) < 2 or parts[0] != "experiments"):
            raise ValueError(
                f'batch_dir {folder!r} must be a folder under experiments/ (e.g. "{RUN_BATCH_DIR}") or an '
                "absolute path"
            )
        return folder


# The judge model used when an override switches providers without naming a model.
DEFAULT_JUDGE_MODELS: dict[str, str] = {
    "local": "smollm2-135m",
    "anthropic": "claude-sonnet-5-5",
    "openai": "gpt-5",
    "command": "",  # the harness CLI's own default model
}


@dataclass(frozen=True)
class JudgeOverrides:
    """What a command asks to change in ``[judge]`` (``--provider/--model/--base-url/--concurrency``)."""

    provider: ProviderName | None = None
    model: str | None = None
    base_url: str | None = None
    concurrency: int | None = None
    batch_cold: bool = False

    def apply(self, judge: JudgeSection) -> JudgeSection:
        """``judge`` with these overrides. Switching providers without a model takes that provider's
        default judge model (the configured one belongs to the configured provider)."""
        update: dict[str, object] = {}
        if self.provider:
            update["provider"] = self.provider
            if self.provider != judge.provider and not self.model:
                update["model"] = DEFAULT_JUDGE_MODELS[self.provider]
            if self.provider != COMMAND:  # the harness settings belong to the command provider
                update.update(command=[], harness=None)
        if self.model:
            update["model"] = self.model
        if self.base_url:
            update["base_url"] = self.base_url
            update["base_urls"] = None  # one server named on the command line replaces the replicas
        if self.provider and self.provider != "openai":
            update["base_urls"] = None
            update["batch_engine"] = "provider"  # vllm-run-batch belongs to an OpenAI-compatible server
        if self.concurrency is not None:
            if not 1 <= self.concurrency <= MAX_CONCURRENCY:
                raise UserError(
                    f"--concurrency must be at least 1 and at most {MAX_CONCURRENCY} (got {self.concurrency})"
                )
            update["max_concurrency"] = self.concurrency
        if self.batch_cold:
            update["batch_cold"] = True
        try:
            return JudgeSection.model_validate({**judge.model_dump(), **update})
        except ValidationError as exc:
            first = first_error(exc)
            raise UserError(
                f"the judge overrides make [judge] {first.loc} invalid ({first.msg}); "
                "fix --provider/--model/--base-url"
            ) from None


class Price(_Section):
    """US dollars per million tokens, and the batch discount as a multiplier.

    ``cache_write`` is a cache write with the 5-minute TTL (unset: the input price), ``cache_write_1h``
    one with the 1-hour TTL (unset: 2x the input price, Anthropic's rule; only Anthropic reports
    writes by TTL); ``cache_read`` unset: the input price. ``batch`` multiplies every token price of a
    call made through the provider's batch API (0.5 on Anthropic and OpenAI; unset: no discount);
    on Anthropic it stacks with the cache prices.
    """

    input: float = Field(default=0.0, ge=0.0, description="uncached input, US dollars per million tokens")
    output: float = Field(default=0.0, ge=0.0, description="output, US dollars per million tokens")
    cache_read: float | None = Field(
        default=None,
        ge=0.0,
        description="a prompt-cache read, US dollars per million tokens (unset: the input price)",
    )
    cache_write: float | None = Field(
        default=None,
        ge=0.0,
        description="a 5-minute prompt-cache write, US dollars per million tokens (unset: the input price)",
    )
    cache_write_1h: float | None = Field(
        default=None,
        ge=0.0,
        description="a 1-hour prompt-cache write, US dollars per million tokens (unset: 2x the input price)",
    )
    batch: float | None = Field(
        default=None,
        gt=0.0,
        le=1.0,
        description="the batch APIs' multiplier on every price of a batched call (0.5 on Anthropic and OpenAI; "
        "unset: 1, no discount)",
    )

    @property
    def cache_read_price(self) -> float:
        return self.input if self.cache_read is None else self.cache_read

    @property
    def cache_write_price(self) -> float:
        """A 5-minute cache write."""
        return self.input if self.cache_write is None else self.cache_write

    @property
    def cache_write_1h_price(self) -> float:
        return 2.0 * self.input if self.cache_write_1h is None else self.cache_write_1h

    @property
    def batch_multiplier(self) -> float:
        return 1.0 if self.batch is None else self.batch


# [optimizer] seed is mixed with an experiment's number so each experiment draws from its own seed.
SEED_STRIDE = 1_000_003


def experiment_seed(run_seed: int, experiment: int, *, wrap: bool = True) -> int:
    """The seed of a run's experiment ``experiment`` (its ledger id, or its sequence number for a
    strategy; 0 for the run's own final-vs-baseline draw): ``run_seed * 1_000_003 + experiment``, reduced
    modulo 2**32 as a decision stores and replays it. ``wrap=False`` leaves it unreduced, as the
    strategies' ``random.Random`` has always taken it (reducing it would change a run's proposals once
    the seed is above 4294)."""
    mixed = run_seed * SEED_STRIDE + experiment
    return mixed % 2**32 if wrap else mixed


class OptimizerSection(_Section):
    strategy: StrategyName = Field(
        default="library",
        description="who proposes candidates: library (offline), memory (offline, prompts/memory/), reflect (one "
        "LLM call), agent (an LLM with tools over the dev split), manual (your own edit)",
    )
    provider: OptimizerProviderName = Field(
        default="anthropic", description="the optimiser model's provider (reflect, agent)"
    )
    model: str = Field(default="claude-sonnet-5-5", description="the optimiser's model (reflect, agent)")
    base_url: str | None = Field(
        default=None, description="the optimiser's API address when not the provider's own"
    )
    # The SDK's own timeout and retries for the optimiser's calls (a proposal can be a long reply).
    timeout_s: float = Field(default=300.0, gt=0, description="seconds one optimiser call may take")
    max_retries: int = Field(
        default=4, ge=0, le=20, description="the SDK's retries of a failed optimiser call"
    )
    allowed_files: list[str] = Field(
        default_factory=lambda: ["prompts/judge.md", "prompts/rubric.md"],
        description="the files a candidate may change, inside prompts/ only (add prompts/memory/principles.md and "
        "cases.jsonl to let the loop edit the judge's memory)",
    )
    max_diff_lines: int = Field(
        default=200, ge=1, description="the largest diff a candidate may make, in lines"
    )
    max_agent_turns: int = Field(
        default=30, ge=1, description="the agent strategy's model calls per proposal"
    )
    seed: int = Field(
        default=0, description="the run's seed: proposals, shuffles and sign draws replay from it"
    )
    # Structure moves (`optimizer.structure`): the prompts/judge.toml keys the optimiser may change, within
    # their bounds; [] = none (a candidate that edits judge.toml is refused). A panel has at most
    # max_members members; max_cost_ratio: a candidate's cost per verdict may be at most this multiple of
    # the incumbent's (estimated before evaluation, checked on the billed cost after; None = no cap).
    structure_moves: list[str] = Field(
        default_factory=list,
        description="the prompts/judge.toml keys the optimiser may change, within their bounds "
        "(optimizer.structure; [] = none: a candidate editing judge.toml is refused)",
    )
    max_members: int = Field(default=3, ge=1, le=15, description="the largest panel a structure move may set")
    max_cost_ratio: float | None = Field(
        default=None,
        gt=0,
        description="a candidate may cost at most this multiple of the incumbent per verdict, estimated before "
        "and billed after evaluation (unset: no cap)",
    )

    @field_validator("structure_moves")
    @classmethod
    def _movable(cls, names: list[str]) -> list[str]:
        return check_moves(names)

    @property
    def editable_files(self) -> list[str]:
        """The files a candidate may change: allowed_files, and prompts/judge.toml when structure moves are
        on (only its movable keys, the guards check)."""
        if self.structure_moves and JUDGE_TOML not in self.allowed_files:
            return [*self.allowed_files, JUDGE_TOML]
        return list(self.allowed_files)

    @field_validator("allowed_files")
    @classmethod
    def _inside_prompts(cls, files: list[str]) -> list[str]:
        # One spelling per file (`optimizer.workspace.paths.prompt_file`): the guards, runner and tools compare these.
        out: list[str] = []
        for name in files:
            try:
                canonical = prompt_file(name)
            except PathRefused as exc:
                raise ValueError(f"allowed_files: {exc}") from None
            if canonical not in out:
                out.append(canonical)
        if not out:
            raise ValueError("allowed_files is empty; name at least one file inside prompts/")
        return out


# The most candidates one wave may hold (`[loop] wave`, `run --wave`).
MAX_WAVE = 16


class LoopSection(_Section):
    policy: PolicyName = Field(
        default="adaptive",
        description="how a candidate is decided: adaptive (re-judge disagreements, sign-flip test), paired "
        "(McNemar) or literal (kappa up, FPR not up)",
    )
    alpha: float = Field(
        default=0.1, gt=0, le=1, description="the level a candidate's test must clear (paired, adaptive)"
    )
    # adaptive: each item whose incumbent and candidate verdicts differ after the first pass is judged
    # this many more times under each prompt (see optimizer.stats.decision).
    rejudge: int = Field(
        default=2,
        ge=0,
        le=20,
        description="adaptive: extra judgements under each prompt per item the two disagree on",
    )
    # Online false-discovery control (LORD++): each candidate is tested at a level that spends this
    # target FDR over the run instead of at alpha. None: off, every candidate tested at alpha.
    fdr: float | None = Field(
        default=None,
        gt=0,
        lt=1,
        description="online false-discovery control (LORD++) at this target over the run (unset: off, every "
        "candidate at alpha)",
    )
    min_kappa_delta: float = Field(
        default=0.0, description="the gain in kappa a keep needs above the incumbent's"
    )
    fpr_tolerance: float = Field(
        default=0.0, description="how far FPR may rise above the incumbent's and still keep"
    )
    patience: int = Field(
        default=5, ge=1, description="stop after this many candidates in a row without a keep"
    )
    # Items that still hit infrastructure errors after the SDK's retries are judged again this many
    # more times, after a pause of infra_retry_pause_s x the round number, before an evaluation is
    # given up as incomplete (an unattended run should outlast a provider's bad minute).
    infra_retry_rounds: int = Field(
        default=2,
        ge=0,
        le=10,
        description="rounds of judging again the items still failing after the SDK's retries, before a candidate "
        "counts as incomplete",
    )
    infra_retry_pause_s: float = Field(
        default=10.0,
        ge=0.0,
        le=600.0,
        description="seconds of pause before such a round, times the round's number",
    )
    # The labels a run decides with: the split's labels.jsonl as given, or with the person's corrections
    # (devset/<split>/corrections.jsonl) applied; read and fingerprinted once, at the run's start.
    labels: Literal["given", "corrected"] = Field(
        default="given",
        description="the labels a run decides with: labels.jsonl as given, or with devset/<split>/corrections.jsonl "
        "applied; fixed and fingerprinted at the run's start",
    )
    # Cheaper, not worse: a candidate that does not improve kappa but costs at least cheaper_min_saving
    # less per verdict is kept when an exact one-sided test shows it is not worse than the incumbent by
    # more than cheaper_margin_items items (the FPR veto unchanged). 0 = off.
    cheaper_margin_items: int = Field(
        default=0,
        ge=0,
        description="keep a cheaper candidate shown not worse than the incumbent by this many items (0 = off)",
    )
    cheaper_min_saving: float = Field(
        default=0.2, gt=0, lt=1, description="... when it costs at least this share less per verdict"
    )
    # adaptive: after each look (the incumbent's wrong items and growing stratified parts of the rest, their
    # disagreements re-judged), roll back a candidate whose chance of clearing the full test is below
    # futility_threshold (optimizer.stats.futility).
    futility: bool = Field(
        default=True,
        description="adaptive: screen a candidate at nested looks and roll it back when it is unlikely to clear",
    )
    futility_threshold: float = Field(
        default=0.01,
        gt=0,
        lt=1,
        description="the chance of clearing the full test below which futility rolls back",
    )
    # Candidates proposed per round against one incumbent, evaluated item by item together and decided
    # together (Holm over their p-values, at most one keep per wave); 1: one candidate at a time.
    wave: int = Field(
        default=1,
        ge=1,
        le=MAX_WAVE,
        description="candidates per round against one incumbent, judged together and decided with Holm (at most "
        "one keep); 1: one at a time",
    )
    # Stacking sub-threshold candidates (optimizer.loop.stack): a rolled-back candidate that points the right way
    # (optimizer.stats.pooling) joins a pool on its incumbent; when the pool holds `stack` of them their edits
    # are merged onto the incumbent (git's three-way merge) and tested as one candidate. 0 = off.
    stack: int = Field(
        default=0,
        ge=0,
        le=MAX_WAVE,
        strict=True,
        description="pool this many rolled-back candidates that point the right way (kappa up, FPR not up), then "
        "merge their edits and test them as one candidate; 0: off",
    )
    # Each candidate's first pass as an Inspect AI log, for `inspect view` and the tools that read Inspect
    # logs (optimizer.evaluation.inspect_log; needs the `inspect` extra).
    inspect_logs: bool = Field(
        default=False,
        description="write each candidate's first pass as an Inspect AI log, experiments/runs/<run>/inspect/"
        "experiment-<id>.eval (needs pip install 'judgeloop[inspect]')",
    )


class ConfirmSection(_Section):
    max_uses: int = Field(
        default=3, ge=0, description="how many times `judgeloop confirm` may evaluate a held-out split"
    )


class Config(_Section):
    workspace: WorkspaceSection = Field(
        default_factory=WorkspaceSection, description="Which splits are which."
    )
    judge: JudgeSection = Field(
        default_factory=JudgeSection,
        description="The judge: who answers, the model, concurrency, retries, batch polling and harness settings. "
        "eval, run and confirm override some with --provider, --model, --base-url and --concurrency.",
    )
    prices: dict[str, Price] = Field(
        default_factory=dict, description="Prices per model, overriding the built-in table (see Price)."
    )
    optimizer: OptimizerSection = Field(
        default_factory=OptimizerSection,
        description="Who proposes candidates, with which model, and what a candidate may change.",
    )
    loop: LoopSection = Field(
        default_factory=LoopSection,
        description="How candidates are decided and when a run stops (see How the loop decides).",
    )
    confirm: ConfirmSection = Field(default_factory=ConfirmSection, description="The held-out check.")


def load_config(path: Path) -> Config:
    """Read and validate a ``judgeloop.toml``; any problem is one `UserError` line naming the file."""
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise UserError(f"{path}: cannot read the config ({exc.strerror})") from None
    except UnicodeDecodeError as exc:
        raise UserError(
            f"{path}: not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at offset {exc.start}); "
            "save it as UTF-8 and retry"
        ) from None
    except tomllib.TOMLDecodeError as exc:
        raise UserError(f"{path}: not valid TOML ({exc}); fix the file and retry") from None
    try:
        return Config.model_validate(data)
    except ValidationError as exc:
        first = first_error(exc)
        raise UserError(f"{path}: [{first.loc}] {first.reason}; fix the file and retry") from None


DEFAULT_CONFIG_TOML = """\
# judgeloop workspace configuration. Every key has a default; see docs/reference/config.md.

[workspace]
dev_split = "sample"        # the only split the optimiser ever sees
heldout_splits = []         # evaluated only by `judgeloop confirm`, a capped number of times

[judge]
provider = "local"          # local (offline demo, SmolLM2-135M) | anthropic | openai | command
model = "smollm2-135m"      # local: bundled name or a path to a .gguf; otherwise the provider's model id
# base_url = "http://127.0.0.1:8000/v1"   # any OpenAI-compatible server (vLLM, llama.cpp, Ollama)
# base_urls = ["http://a:8000/v1", "http://b:8000/v1"]  # replicas: each item sticks to one (openai only)
max_concurrency = 4
timeout_s = 120
max_retries = 4
# local_threads = 2         # local judge threads (default: the cores idle when it starts, at most 4)
# harness = "codex"         # provider = "command": codex | claude | gemini | opencode, or command = [...]
# price_per_call_usd = 0.5  # command: the most one call may cost (needed with --budget-usd)
# batch_engine = "vllm-run-batch"  # --batch via `vllm run-batch` files in batch_dir (openai + base_url)
# batch_dir = "experiments/run-batch"

# Prices in US dollars per million tokens; these override the built-in table.
# [prices."claude-sonnet-5-5"]
# input = 3.0
# output = 15.0
# cache_read = 0.3          # default: input
# cache_write = 3.75        # a 5-minute cache write; default: input
# cache_write_1h = 6.0      # a 1-hour cache write; default: 2 x input
# batch = 0.5               # the batch API's multiplier on every price; default: 1 (no discount)

[optimizer]
strategy = "library"        # library (offline) | memory (offline: prompts/memory/) | reflect | agent
provider = "anthropic"      # the optimiser's own model, for reflect and agent
model = "claude-sonnet-5-5"
# base_url, timeout_s = 300, max_retries = 4 as in [judge]
allowed_files = ["prompts/judge.md", "prompts/rubric.md"]  # add "prompts/memory/principles.md" and
                            #   "prompts/memory/cases.jsonl" to let the loop edit the judge's memory
max_diff_lines = 200
# structure_moves = ["screenshots", "tiling", "max_images"]  # judge.toml keys the optimiser may move ([] = none)
# max_members = 3           # a panel's largest size a move may set
# max_cost_ratio = 1.5      # a candidate may cost at most 1.5x the incumbent per verdict (default: no cap)

[loop]
policy = "adaptive"         # adaptive (default): re-judge the items the two prompts disagree on, then a
                            #   sign-flip test on the shares judged right | paired (McNemar) | literal
alpha = 0.1
rejudge = 2                 # adaptive: extra judgements per disagreeing item under each prompt
# fdr = 0.1                 # online false-discovery control over the run (LORD++); off by default
min_kappa_delta = 0.0
fpr_tolerance = 0.0
patience = 5               # (replicates per item: prompts/judge.toml, or --replicates)
infra_retry_rounds = 2     # judge items that hit infrastructure errors again, up to this many rounds,
infra_retry_pause_s = 10   # after pausing this long x the round, before a candidate counts as incomplete
labels = "given"           # given | corrected: labels.jsonl, or with devset/<split>/corrections.jsonl applied
                           #   (a person's `judgeloop label-fix`); fixed and fingerprinted at a run's start
stack = 0                  # K > 0: pool rolled-back candidates that point the right way (kappa up, FPR
                           #   not up) and test each K of them merged as one candidate; 0: off
# cheaper_margin_items = 1  # keep a cheaper candidate not worse by more than this many items (0 = off)
# cheaper_min_saving = 0.2  # ... if it costs at least 20% less per verdict
futility = true            # adaptive: after the incumbent's wrong items and a random part of the rest, roll
futility_threshold = 0.01  #   back a candidate whose chance of clearing the test is below this
wave = 1                   # candidates per round, judged together and decided with Holm (at most one keep)
inspect_logs = false       # each candidate's first pass as an Inspect AI log under experiments/runs/<run>/
                           #   inspect/ (needs pip install 'judgeloop[inspect]'; `inspect view` opens it)

[confirm]
max_uses = 3
"""
