"""The settings a run decides with, read from the run's own record: `RunSettings.from_run`.

`judgeloop run` records them when the run starts (the ledger's ``runs.config`` snapshot of
``judgeloop.toml`` with the judge it was started with, ``runs.policy``, and ``runs.budgets``: limits,
replicates, batch mode). Every later reader — the run's own first segment, ``run --resume``,
``attribute``, ``confirm``, the end-of-run summary and ``report`` — takes them from there through
`RunSettings.from_run`, so a ``judgeloop.toml`` edited mid-run cannot change a decision rule halfway,
and the report states the rule the decisions used. Below ``optimizer.loop`` (the report reads it too).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from optimizer.errors import UserError, first_error
from optimizer.ledger import Run
from optimizer.vocab import POLICIES
from optimizer.workspace.config import Config, JudgeOverrides, JudgeSection, LoopSection

_Section = TypeVar("_Section", bound=BaseModel)


@dataclass(frozen=True)
class Limits:
    max_experiments: int | None = None  # candidates, not counting the baseline
    budget_usd: float | None = None
    hours: float | None = None
    patience: int = 5
    propose_only: bool = False

    def as_dict(self) -> dict[str, Any]:
        return {
            "max_experiments": self.max_experiments,
            "budget_usd": self.budget_usd,
            "hours": self.hours,
            "patience": self.patience,
            "propose_only": self.propose_only,
        }


@dataclass(frozen=True)
class RunOverrides:
    """What a command asks on top of a run's own settings; None (False) means "not asked". What
    each may change is said once, in `RunSettings.from_run`."""

    judge: JudgeOverrides = field(default_factory=JudgeOverrides)
    policy: str | None = None
    replicates: int | None = None
    batch: bool = False
    max_experiments: int | None = None
    budget_usd: float | None = None
    hours: float | None = None
    patience: int | None = None
    propose_only: bool = False
    wave: int | None = None


@dataclass(frozen=True)
class RunSettings:
    """The judge, decision settings (``[loop]``, with the run's policy), replicates per item, batch
    mode, the seed of its Monte Carlo p-values and proposals, and the limits a run decides with."""

    judge: JudgeSection
    loop: LoopSection
    replicates: int
    batch: bool
    seed: int
    limits: Limits
    # "judgeloop.toml [loop] changed since run R started (...); ignored ..." when it did, else None.
    loop_note: str | None = None

    @classmethod
    def from_run(
        cls, run: Run, current: Config | None = None, asked: RunOverrides | None = None
    ) -> RunSettings:
        """The settings ``run`` decides with: its snapshot, plus what ``asked`` may change.

        The rules (the only place they are stated):

        - Kept from the run; asking for another value is a `UserError` (one line, "drop it, or start
          a new run"), as it would compare different judges or change the decision rule mid-run:
          the judge's ``provider`` and ``model``, the ``policy``, the ``replicates`` per item, the
          ``wave`` size (``--wave``, kept in ``runs.budgets`` when given).
          Asking for the run's own value is no change and is accepted.
        - ``judgeloop.toml`` ``[loop]`` (alpha, fdr, rejudge, min_kappa_delta, fpr_tolerance,
          patience, infra_retry_*) and ``[judge]`` are the run's own, whatever the file says now:
          an edit made mid-run is *ignored* — not refused, so an overnight run stopped and resumed
          after a config edit goes on as it started — and ``loop_note`` says which ``[loop]``
          settings differ, for the command to show (none for ``[judge]``: the run's judge includes
          the flags it started with, so it differs from the file by design). So is ``[optimizer]
          seed``. New settings need a new run. The rest of the file (the optimiser's model, its
          allowed files and diff limit, prices, held-out splits, ``[confirm]``) is read as it is now.
        - May change on any command: the judge's ``base_url`` (where the same model is served: the
          judge-call cache does not key on it) and ``max_concurrency`` (``--concurrency``); the
          limits ``--max-experiments``, ``--budget-usd``, ``--hours``, ``--patience`` (a limit not
          given keeps the run's own); ``--propose-only`` is per invocation (never kept); ``--batch``
          turns batch mode on (a run started with it stays in it: batch changes what a pass
          costs, never a decision).
        - A snapshot written by an older judgeloop lacks the settings added since: each missing
          key takes ``current``'s value (what a resume did before they were recorded), and a key
          this version no longer has is dropped; a record with no judge at all takes the
          command's (its judge flags on ``current``'s ``[judge]``). ``current`` is the workspace's
          configuration now; None (a reader with no workspace at hand) takes the defaults.
        """
        current = current if current is not None else Config()
        asked = asked if asked is not None else RunOverrides()
        snapshot = run.config or {}
        if snapshot.get("judge"):
            judge = _recorded(run, snapshot, "judge", JudgeSection, current.judge)
            for flag, wanted in (("provider", asked.judge.provider), ("model", asked.judge.model)):
                if wanted is not None and wanted != getattr(judge, flag):
                    raise UserError(
                        f"run {run.id} was judged by {flag} {getattr(judge, flag)!r}; --{flag} "
                        f"{wanted!r} would be another judge — drop it, or start a new run"
                    )
            judge = JudgeOverrides(base_url=asked.judge.base_url, concurrency=asked.judge.concurrency).apply(
                judge
            )
        else:  # a run recorded without its judge (none since the first release): the command's
            judge = asked.judge.apply(current.judge)
        loop = _recorded(run, snapshot, "loop", LoopSection, current.loop)
        if run.policy in POLICIES:  # the column: the run's --policy, if given
            loop = loop.model_copy(update={"policy": run.policy})
        if isinstance(budgets_wave := (run.budgets or {}).get("wave"), int):  # `run --wave K` at its start
            loop = loop.model_copy(update={"wave": budgets_wave})
        if asked.wave is not None and asked.wave != loop.wave:
            raise UserError(
                f"run {run.id} proposes {loop.wave} candidate(s) per wave; --wave {asked.wave} would "
                "change how its candidates are decided mid-run — drop it, or start a new run"
            )
        if asked.policy is not None and asked.policy != loop.policy:
            raise UserError(
                f"run {run.id} decides with policy {loop.policy!r}; --policy {asked.policy!r} would "
                "change its decision rule mid-run — drop it, or start a new run"
            )
        budgets = run.budgets or {}
        replicates = int(budgets.get("replicates") or 1)
        if asked.replicates is not None and asked.replicates != replicates:
            raise UserError(
                f"run {run.id} judges each item {replicates} time(s); --replicates {asked.replicates} "
                "would compare candidates judged differently — drop it, or start a new run"
            )
        optimizer = snapshot.get("optimizer")
        seed = (
            optimizer.get("seed", current.optimizer.seed)
            if isinstance(optimizer, Mapping)
            else current.optimizer.seed
        )
        return cls(
            judge=judge,
            loop=loop,
            replicates=replicates,
            batch=asked.batch or bool(budgets.get("batch")),
            seed=int(seed),
            limits=_limits(budgets, asked, current),
            loop_note=_loop_note(run, snapshot, current),
        )


def _recorded(
    run: Run, snapshot: Mapping[str, Any], name: str, section: type[_Section], current: _Section
) -> _Section:
    """Section ``name`` of the snapshot, its missing keys from ``current``, keys no longer known dropped."""
    stored = snapshot.get(name)
    known = (
        {k: v for k, v in stored.items() if k in section.model_fields} if isinstance(stored, Mapping) else {}
    )
    try:
        return section.model_validate({**current.model_dump(), **known})
    except ValidationError as exc:
        first = first_error(exc)
        raise UserError(
            f"run {run.id}'s recorded [{name}] {first.loc} is not valid any "
            f"more ({first.msg}); start a new run"
        ) from None


def _limits(budgets: Mapping[str, Any], asked: RunOverrides, current: Config) -> Limits:
    def limit(name: str, wanted: Any, default: Any = None) -> Any:
        return wanted if wanted is not None else budgets.get(name, default)

    return Limits(
        max_experiments=limit("max_experiments", asked.max_experiments),
        budget_usd=limit("budget_usd", asked.budget_usd),
        hours=limit("hours", asked.hours),
        patience=limit("patience", asked.patience, current.loop.patience),
        propose_only=asked.propose_only,
    )


def _loop_note(run: Run, snapshot: Mapping[str, Any], current: Config) -> str | None:
    """Which ``[loop]`` settings ``judgeloop.toml`` says now that differ from what it said when the run
    started (keys the snapshot lacks took the current value, so they never differ)."""
    stored = snapshot.get("loop")
    if not isinstance(stored, Mapping):
        return None
    now = current.loop.model_dump(mode="json")
    changed = [
        f"{key} {_shown(stored[key])} → {_shown(value)}"
        for key, value in now.items()
        if key in stored and stored[key] != value
    ]
    if not changed:
        return None
    return (
        f"judgeloop.toml [loop] changed since run {run.id} started ({', '.join(changed)}); ignored: the run "
        "keeps the settings it started with (start a new run to use the new ones)"
    )


def _shown(value: Any) -> str:
    return "unset" if value is None else str(value)
