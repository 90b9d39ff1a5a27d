"""The project's names, spelled once: strategies, policies, providers, statuses, event and stage kinds,
review kinds, mistake types.

Each set is a ``Literal`` type (what mypy and pydantic check) and the tuple of its values taken from
it with ``get_args`` (what argparse's ``choices``, the ledger's SQL ``CHECK``s, the TUI's lists and the
error messages use), so adding a name is one edit here. The order of a tuple is the order users see
(``--help``, pydantic's "Input should be ..."). Pure: imports nothing of the project, so every layer
may use it.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Literal, get_args

# -- the loop's settings ---------------------------------------------------------------------------

# Strategies that propose a candidate (`optimizer.loop.strategies.make_strategy`; [optimizer] strategy).
StrategyName = Literal["agent", "reflect", "library", "memory"]
STRATEGIES: tuple[StrategyName, ...] = get_args(StrategyName)
# `judgeloop run --strategy manual`: judge the prompts as edited in the working tree (no optimiser).
MANUAL: Literal["manual"] = "manual"
RunStrategyName = Literal[StrategyName, "manual"]
RUN_STRATEGIES: tuple[RunStrategyName, ...] = (*STRATEGIES, MANUAL)

# Decision policies (`optimizer.stats.decision`; [loop] policy, --policy).
PolicyName = Literal["adaptive", "paired", "literal"]
POLICIES: tuple[PolicyName, ...] = get_args(PolicyName)

# Judge providers (`optimizer.judge.providers.make_provider`; [judge] provider).
ProviderName = Literal["anthropic", "openai", "local", "command"]
PROVIDERS: tuple[ProviderName, ...] = get_args(ProviderName)
# The offline judge, which needs no key.
LOCAL: Literal["local"] = "local"
# A harness judge: a coding-agent CLI named by [judge] command or harness, which no flag sets, so it is
# chosen in judgeloop.toml only.
COMMAND: Literal["command"] = "command"
# `--provider`'s names (run, eval, attribute, ...; the TUI's start-run form offers the same): every provider
# but the harness one, the offline one first as --help shows them.
FLAG_PROVIDERS: tuple[ProviderName, ...] = (LOCAL, *(p for p in PROVIDERS if p not in (LOCAL, COMMAND)))
# The optimiser's own model ([optimizer] provider): a conversing API provider.
OptimizerProviderName = Literal["anthropic", "openai"]
OPTIMIZER_PROVIDERS: tuple[OptimizerProviderName, ...] = get_args(OptimizerProviderName)

# -- the ledger's states ---------------------------------------------------------------------------

RunStatus = Literal["running", "finished", "stopped", "crashed", "waiting"]
RUN_STATUSES: tuple[RunStatus, ...] = get_args(RunStatus)
# A run in one of these has ended (the ledger stamps ``finished``).
TERMINAL_RUN_STATUSES: tuple[RunStatus, ...] = ("finished", "stopped", "crashed")

ExperimentStatus = Literal["running", "kept", "rolled_back", "guard_rejected", "waiting", "baseline", "error"]
EXPERIMENT_STATUSES: tuple[ExperimentStatus, ...] = get_args(ExperimentStatus)
# Statuses that make an experiment the run's incumbent when they are recorded.
INCUMBENT_STATUSES: tuple[ExperimentStatus, ...] = ("baseline", "kept")
# Statuses of a candidate that was tested (at a level): what online FDR control and the report count.
TESTED_STATUSES: tuple[ExperimentStatus, ...] = ("kept", "rolled_back", "waiting")

# Who made an experiment's keep or roll back: its decision policy, a person (`judgeloop decide`, the TUI),
# or an MCP client (`judgeloop mcp`'s decide, which may never keep what the policy rolls back).
DecidedBy = Literal["policy", "person", "mcp"]
DECIDED_BY: tuple[DecidedBy, ...] = get_args(DecidedBy)

# What the ledger's event feed carries (each kind is written by the ledger or the loop).
EventKind = Literal["stage", "progress", "decision", "run_status"]
EVENT_KINDS: tuple[EventKind, ...] = get_args(EventKind)

ReviewKind = Literal["judge_wrong", "label_suspect", "rubric_ambiguous"]
REVIEW_KINDS: tuple[ReviewKind, ...] = get_args(ReviewKind)

# An item's majority answer as scored (`optimizer.stats.metrics`, the ledger's ``items.status``).
AnswerStatus = Literal["ok", "missing", "invalid", "infra_error"]
ANSWER_STATUSES: tuple[AnswerStatus, ...] = get_args(AnswerStatus)

# -- the data ----------------------------------------------------------------------------------------

MistakeType = Literal["Critical Mistake", "Bad Side Effect", "Misunderstanding of the Instruction"]
MISTAKE_TYPES: tuple[MistakeType, ...] = get_args(MistakeType)
# How counts and filters name a negative label without a mistake type.
UNTYPED = "untyped"


class StageKind(StrEnum):
    """What a ``stage`` event says the loop is doing (its payload's ``stage``). Display text, such as a
    batch's state line, travels in the payload's ``text``, never in the kind."""

    EXPERIMENT_STARTED = "experiment_started"  # the ledger recorded a new experiment row
    BASELINE = "baseline"  # evaluating the baseline (payload: started_at)
    PROPOSING = "proposing"  # the strategy is proposing (payload: seq, strategy)
    GUARDS = "guards"  # the candidate's edit is checked
    EVALUATING = "evaluating"  # evaluating a candidate (payload: started_at)
    REJUDGING = "rejudging"  # adaptive: re-judging the disagreeing items (payload: items)
    BATCH = "batch"  # a batch pass changed state (payload: text, the batch's state line)
    RESUMING = (
        "resuming"  # a resumed run counted what the crash left unrecorded (payload: paid_before_crash_usd)
    )
    ENDPOINT_DRAINED = "endpoint_drained"  # a [judge] base_urls endpoint failed; its items went to the others (payload: text)


# `devset import --format`'s names: AgentHorizon's own release, then the benchmarks converted by
# optimizer.devset.formats (its registry holds one converter per name after the first).
IMPORT_FORMATS: tuple[str, ...] = ("agenthorizon", "agentrewardbench", "osreward")
