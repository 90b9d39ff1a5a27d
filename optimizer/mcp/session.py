"""One `judgeloop mcp` session: an optimisation run whose candidates come from an MCP client.

The session is one run in the ledger (strategy ``mcp``), started as `judgeloop run` starts one (clean
tree, the dev split only, held-out splits kept apart, its own branch) under the workspace's loop lock.
The run starts lazily, with the first call that needs one (``disagreements``, ``propose``), and so does
the lock: taken then and held until the session ends (one session, `run`, `decide` or `confirm` per
workspace at a time). A connection that only lists tools or reads ``status``, ``history``, ``report``,
the resources or the dev items leaves no run, branch or checkout and holds no lock (hosts start their
servers at every launch).

Every tool is a method returning a `ToolOutput` (text, an image, a refusal) or, for ``status``,
``history``, ``propose``, ``decide`` and ``report``, a `Structured` record (`optimizer.mcp.results`).
The reading tools and the edit checks are the ``agent`` strategy's own, run through `optimizer.loop.strategies.tools.run_tool` on a `ToolState` of the
incumbent's `ProposalContext` (only dev items, only allowed files). ``propose`` hands the checked files
to `LoopRunner.candidate` (with this call's `Limits`: the run's are never changed), the loop's candidate path: guards (allowed files, diff size, overfit lint),
commit, evaluation on the dev split, decision, keep or roll back, all in the ledger and git.

The budget (US dollars) is the run's judge budget: the evaluator reserves every judge call the session
causes (baseline, candidates, re-judging) against it before making it and refuses one that would cross
it. A killed server leaves a run marked ``running``; the next session (or `judgeloop run`) closes it first
(`optimizer.loop.session.close_unfinished_runs`: its unfinished candidate rolled back and kept under
``refs/judgeloop/rejected/<id>``, what it paid recorded). A ``propose_only`` candidate still waiting when the
client leaves is kept under ``refs/judgeloop/waiting/<id>`` and stays decidable by `judgeloop decide`.

Trust: ``propose`` is refused (one line naming them, no judge call) when the session's branch holds commits
the loop did not make or is not checked out (`optimizer.loop.trust`); ``status`` says so under ``touched``.
``decide keep`` is refused when the policy rolls the candidate back: a keep is the policy's, and only a
person (`judgeloop decide`, the TUI) overrules it.
"""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import Any

import anyio

from optimizer.devset.split import Split
from optimizer.errors import UserError
from optimizer.evaluation.cache import JudgeCache
from optimizer.events import Event, Listener, Message, Progress, ProgressSnapshot, ignore
from optimizer.judge.harness import check_budget, check_confinement
from optimizer.judge.prompts import PromptSet
from optimizer.judge.providers import check_judge_key, make_provider
from optimizer.judge.types import Provider
from optimizer.ledger import Attribution, Experiment, Ledger, Run
from optimizer.loop import trust
from optimizer.loop.attribute import AttributeOptions, attribute_scope, resolve_scope
from optimizer.loop.context import RunContext
from optimizer.loop.costs import estimated_evaluation_usd
from optimizer.loop.decide import decide_waiting
from optimizer.loop.records import fmt3
from optimizer.loop.runner import LoopRunner
from optimizer.loop.session import MCP_PROPOSER, RunOptions, loop_split, open_run
from optimizer.loop.strategies import Proposal, ProposalContext, ProposalError
from optimizer.loop.strategies.tools import MEMORY_TOOL_SPECS, ToolOutput, ToolState, read_item, run_tool
from optimizer.mcp.reading import ContextCache
from optimizer.mcp.results import Structured, experiment_record, history_data, money, report_data
from optimizer.report import attribution_json, export_experiments_tsv, report_text, write_markdown_report
from optimizer.vocab import PolicyName, RunStatus
from optimizer.workspace import gitops
from optimizer.workspace.config import JudgeOverrides
from optimizer.workspace.paths import check_prompts_tree, read_prompt_file
from optimizer.workspace.workspace import Workspace, command_lock

# What each outcome of a proposal means for the client, in its words.
MEANING: dict[str, str] = {
    "kept": "the edit is the new incumbent (a commit on the run branch); the next proposal is judged against it",
    "rolled_back": "the edit did not make the judge reliably better on the dev split; the prompts are back at the "
    "incumbent (the commit is kept under refs/judgeloop/rejected/<experiment>); do not retry the "
    "same idea with small variations",
    "guard_rejected": "refused before any judge call (a file outside the allowed set, a diff too large, a copy of "
    "dev ids, instructions or values, a broken template); nothing was committed; fix the reason",
    "error": "not decided (the budget, or infrastructure errors); rolled back, nothing kept",
    "waiting": "evaluated in full and waiting: call decide with keep or discard",
}
MEMORY_TOOLS: tuple[str, ...] = tuple(t.name for t in MEMORY_TOOL_SPECS)
FLIPS_HELP = (
    "fn_to_tp: successes newly judged right; fp_to_tn: failures newly caught; tp_to_fn: successes "
    "newly rejected; tn_to_fp: failures newly let through (what the FPR guard forbids)"
)


@dataclass(frozen=True)
class SessionOptions:
    """What `judgeloop mcp` was asked: the session's budget (US dollars, every judge call it causes),
    the decision policy and replicates (None: the configuration's), judge overrides."""

    budget_usd: float
    policy: PolicyName | None = None
    replicates: int | None = None
    judge: JudgeOverrides = field(default_factory=JudgeOverrides)


class Submitted:
    """The run's strategy: hands the loop the proposal a ``propose`` call checked (one at a time)."""

    name = MCP_PROPOSER

    def __init__(self) -> None:
        self.next: Proposal | None = None

    async def propose(self, ctx: ProposalContext) -> Proposal:  # noqa: ARG002 - the Strategy protocol
        proposal, self.next = self.next, None
        if proposal is None:
            raise ProposalError("no proposal was submitted")
        return proposal


def _dirty_line(ws: Workspace) -> str | None:
    """The working tree's changes not made through propose, in one line, or None."""
    dirty = gitops.dirty_paths(ws.root)
    if not dirty:
        return None
    return f"the working tree has changes not made through propose: {', '.join(dirty[:5])}" + (
        f" and {len(dirty) - 5} more" if len(dirty) > 5 else ""
    )


def _error(text: str) -> ToolOutput:
    return ToolOutput(text=f"error: {text}", is_error=True)


def _json(data: Any) -> ToolOutput:
    return ToolOutput(text=json.dumps(data, indent=1, ensure_ascii=False))


def roll_back_unfinished(ws: Workspace, ledger: Ledger, run_id: str, reason: str) -> list[int]:
    """Record every ``running`` experiment of the run as an error (``reason``), keep its commit under
    ``refs/judgeloop/rejected/<id>`` and reset the run's branch to its incumbent; the ids rolled back.
    A waiting candidate stays under ``refs/judgeloop/waiting/<id>`` (still decidable). A branch whose tip
    is not a commit the loop made is never reset (that would destroy someone's commits); it is left as it is."""
    run = ledger.get_run(run_id)
    incumbent = ledger.get_experiment(run.incumbent_experiment) if run.incumbent_experiment else None
    base = incumbent.commit_sha if incumbent and incumbent.commit_sha else run.start_rev
    loop_made = {
        e.commit_sha
        for status in ("running", "waiting")
        for e in ledger.experiments_with_status(status, run_id)
        if e.commit_sha
    }
    trusted = trust.tip_problem(ws.root, run.branch, base, also=loop_made) is None
    done = []
    for exp in ledger.experiments_with_status("running", run_id):
        if exp.commit_sha and exp.seq > 0:
            gitops.store_rejected(ws.root, exp.commit_sha, exp.id)
        ledger.record_error(exp.id, reason, cost_usd=exp.cost_usd)
        done.append(exp.id)
    for exp in ledger.experiments_with_status("waiting", run_id):
        if exp.commit_sha:
            gitops.park_waiting(ws.root, exp.commit_sha, exp.id)
    if trusted:
        gitops.restore_tree(ws.root, base)
    return done


class McpSession:
    """The engine side of `judgeloop mcp` (see the module docstring). Open it with `open_session`."""

    def __init__(
        self, ws: Workspace, ledger: Ledger, options: SessionOptions, split: Split, events: Listener
    ) -> None:
        self.ws = ws
        self.ledger = ledger
        self.options = options
        self.split = split  # the dev split, checked when the session opened (`loop_split`)
        self.judge_section = options.judge.apply(ws.config.judge)
        self.events = events
        self.strategy = Submitted()
        # The session's run: none until the first call that needs one (`begin`), so a connection that only
        # lists tools or reads status leaves no run, branch or checkout behind.
        self._ctx: RunContext | None = None
        self._runner: LoopRunner | None = None
        self._contexts = ContextCache()  # the incumbent's context, rebuilt only when it changes
        self._provider: Provider | None = None
        self._cache: JudgeCache | None = None
        self._baseline_failed: str | None = None
        self._lock = ExitStack()  # the workspace's loop lock, from `begin` to `release`
        # Where the current call's judging progress goes (the MCP client's progress token), if anywhere.
        self.on_progress: Callable[[ProgressSnapshot], None] | None = None

    def _event(self, event: Event) -> None:
        if isinstance(event, Progress):
            if self.on_progress is not None:
                self.on_progress(event.snapshot)
            return  # the ledger has every progress event already; stderr needs no progress bar
        self.events(event)

    @property
    def started(self) -> bool:
        """Whether the session's run has started (a run row, its branch checked out)."""
        return self._ctx is not None

    @property
    def ctx(self) -> RunContext:
        """The run's context; only once `begin` started it (a bug otherwise)."""
        if self._ctx is None:
            raise RuntimeError("the MCP session's run has not started")
        return self._ctx

    @property
    def runner(self) -> LoopRunner:
        if self._runner is None:
            raise RuntimeError("the MCP session's run has not started")
        return self._runner

    @property
    def run_id(self) -> str:
        return self.ctx.run.id

    @property
    def context_builds(self) -> int:
        """How many times the reading tools' context was built (once per incumbent and change)."""
        return self._contexts.builds

    def begin(self) -> RunContext:
        """Start the session's run if it has none yet (`optimizer.loop.session.open_run`: unfinished runs
        closed, a clean tree, a run row, its branch checked out), as `judgeloop run` starts one; a
        `UserError` (a dirty tree, a candidate waiting from another run, ...) leaves nothing started."""
        if self._ctx is None:
            with ExitStack() as taking:
                # The loop lock first (a `UserError` naming its holder when another command has it).
                taking.enter_context(command_lock(self.ws, "mcp"))
                self._start()
                self._lock = taking.pop_all()  # held from now until `release`
        return self.ctx

    def release(self) -> None:
        """Let go of the workspace's loop lock, if the session took it."""
        self._lock.close()

    def _start(self) -> None:
        """The run itself (the caller holds the loop lock)."""
        if gitops.clear_stale_index_lock(self.ws.root):
            self.say(
                "removed a stale .git/index.lock (left by a process killed in the middle of a git command)"
            )
        options = self.options
        run_options = RunOptions(
            policy=options.policy,
            budget_usd=options.budget_usd,
            replicates=options.replicates,
            judge=options.judge,
        )
        started = open_run(
            self.ws, self.ledger, run_options, self.judge_section, self.say, proposer=MCP_PROPOSER
        )
        self._ctx = started.context(self.ws, self.ledger, self._event)
        self._runner = LoopRunner(self._ctx, self.strategy)

    def say(self, text: str) -> None:
        self.events(Message(text, "note"))

    # -- judge and budget ----------------------------------------------------------------------

    def _judge(self) -> tuple[Provider, JudgeCache]:
        if self._provider is None or self._cache is None:
            self._provider = make_provider(self.ctx.settings.judge, root=self.ws.root)
            self._cache = JudgeCache(self.ws.cache_path)
        return self._provider, self._cache

    async def aclose(self) -> None:
        if self._provider is not None:
            await self._provider.aclose()
        if self._cache is not None:
            self._cache.close()
        self._provider = self._cache = None

    @property
    def spent_usd(self) -> float:
        return self._ctx.spent_usd if self._ctx is not None else 0.0

    @property
    def budget_usd(self) -> float:
        """The session's judge budget now: its run's (`RunContext.raise_budget` changes it), else ``--budget-usd``."""
        limit = self._ctx.limits.budget_usd if self._ctx is not None else None
        return limit if limit is not None else self.options.budget_usd

    @property
    def topped_up_usd(self) -> float:
        """What people added to the session's budget (`optimizer.mcp.topup`), in US dollars."""
        return money(self.budget_usd - self.options.budget_usd)

    def next_candidate_usd(self) -> float | None:
        """The next candidate's estimated cost (`optimizer.loop.costs.estimated_evaluation_usd`), or None."""
        incumbent = self._incumbent()
        return None if incumbent is None else estimated_evaluation_usd(self.ctx, incumbent, self._judge()[0])

    @property
    def left_usd(self) -> float:
        return max(0.0, self.budget_usd - self.spent_usd)

    def budget_line(self) -> str:
        return f"spent ${self.spent_usd:.4f} of the session's ${self.budget_usd:g} budget, ${self.left_usd:.4f} left"

    def budget_refusal(self, what: str) -> ToolOutput | None:
        """The refusal of a tool that would pay judge calls once the budget cannot pay another, or None."""
        stopped = self._ctx.budget_exhausted if self._ctx is not None else None
        if self.left_usd <= 0 or stopped is not None:
            why = f" ({stopped})" if stopped else ""
            return _error(
                f"budget: {what} is refused: {self.budget_line()}{why}; a judge call would cross it. "
                "End the session; a new one (`judgeloop mcp --budget-usd X`) starts with a new budget (a host "
                "with elicitation asks the person to add to this one first)"
            )
        return None

    # -- state -----------------------------------------------------------------------------------

    def _run(self) -> Run:
        return self.ledger.get_run(self.run_id)

    def _incumbent(self) -> Experiment | None:
        if not self.started:
            return None
        run = self._run()
        return self.ledger.get_experiment(run.incumbent_experiment) if run.incumbent_experiment else None

    def has_baseline(self) -> bool:
        """Whether the session's run has an incumbent (its baseline evaluated)."""
        return self._incumbent() is not None

    def reading_state(self) -> ToolState:
        """The reading tools' state (`_state`), for the resources."""
        return self._state()

    def _state(self) -> ToolState:
        """The agent strategy's tool state over the incumbent's context (no disagreements before the baseline)."""
        incumbent = self._incumbent()
        if incumbent is not None:
            return ToolState(self._contexts.get(self.ctx, incumbent))
        exps = self.ledger.experiments(self.run_id) if self.started else []
        seq = max((e.seq for e in exps), default=0) + 1
        allowed = list(self.ws.config.optimizer.allowed_files)
        current = {p: text for p in allowed if (text := read_prompt_file(self.ws.root, p)) is not None}
        return ToolState(
            ProposalContext(
                workspace_root=self.ws.root,
                allowed_files=allowed,
                current_files=current,
                disagreements=[],
                history=[],
                guidance="",
                split=self.split,
                rng_seed=self.ctx.settings.seed if self.started else self.ws.config.optimizer.seed,
                experiment_seq=seq,
            )
        )

    def touched(self) -> str | None:
        """One line when the session's branch is not as the loop left it (not checked out, or commits the
        loop did not make on it, named), else None; the working tree's changes are ``propose``'s own check."""
        if not self.started:
            return None
        run = self._run()
        inc = self._incumbent()
        base = inc.commit_sha if inc is not None and inc.commit_sha else run.start_rev
        waiting = self._waiting()
        also = [waiting.commit_sha] if waiting and waiting.commit_sha else []
        problem = trust.tip_problem(self.ws.root, run.branch, base, also=also)
        if problem is None:
            return None
        return trust.refusal(problem, run.branch, trust.last_trusted(self.ws.root, run.branch, base, also))

    def _waiting(self) -> Experiment | None:
        if not self.started:
            return None
        return next(iter(self.ledger.experiments_with_status("waiting", self.run_id)), None)

    async def _ensure_baseline(self) -> ToolOutput | None:
        """Start the run and evaluate the baseline if the session has none yet; an error output when it
        cannot be."""
        self.begin()
        if self._incumbent() is not None:
            return None
        if self._baseline_failed is not None:
            return _error(self._baseline_failed)
        refused = self.budget_refusal("the baseline evaluation")
        if refused is not None:
            return refused
        touched = self.touched()  # the baseline is the branch's tip: it must be the run's start
        if touched is not None:
            return _error(touched)
        provider, cache = self._judge()
        try:
            await self.runner.baseline(provider, cache)
        except UserError as exc:
            self._baseline_failed = (
                f"the baseline could not be evaluated: {exc} ({self.budget_line()}); end this "
                "session and start a new one"
            )
            roll_back_unfinished(self.ws, self.ledger, self.run_id, "the baseline could not be evaluated")
            return _error(self._baseline_failed)
        return None

    # -- the tools ------------------------------------------------------------------------------

    def _judging(self) -> dict[str, Any]:
        """How the session judges and decides: its run's settings, or before the run starts, what it will
        start with (the configuration and this session's options; the prompts' replicates at HEAD)."""
        if self.started:
            settings = self.ctx.settings
            judge, replicates, loop = settings.judge, settings.replicates, settings.loop
        else:
            judge = self.judge_section
            replicates = self.options.replicates or PromptSet.from_rev(self.ws, "HEAD").settings.replicates
            loop = self.ws.config.loop
        return {
            "split": self.split.name,
            "items": len(self.split.ids),
            "judge": f"{judge.provider}:{judge.model}",
            "replicates": replicates,
            "policy": (self.options.policy or loop.policy) if not self.started else loop.policy,
            "alpha": loop.alpha,
        }

    def status(self) -> Structured:
        """The session at a glance. Reads only: before the run starts it says what the run will be."""
        run = self._run() if self.started else None
        exps = self.ledger.experiments(run.id) if run is not None else []
        base = next((e for e in exps if e.seq == 0 and e.status == "baseline"), None)
        inc = self._incumbent()
        waiting = self._waiting()
        cfg = self.ws.config

        def figures(e: Experiment | None) -> dict[str, Any] | None:
            if e is None:
                return None
            return {
                "experiment": e.id,
                "kappa": e.kappa,
                "fpr": e.fpr,
                "balanced_accuracy": e.balanced_accuracy,
                "commit": (e.commit_sha or "")[:12],
            }

        if run is None:
            step = (
                "call disagreements: it starts the session's run (its own branch) and evaluates the baseline "
                "first (judge calls, counted in the budget)"
            )
        elif inc is None:
            step = "call disagreements: it evaluates the baseline first (judge calls, counted in the budget)"
        elif waiting is not None:
            step = f"experiment {waiting.id} is waiting: call decide"
        else:
            step = "read disagreements, then propose one small, general edit"
        return Structured(
            {
                "run": run.id if run is not None else None,
                "branch": run.branch if run is not None else None,
                **self._judging(),
                "budget": {
                    "budget_usd": self.budget_usd,
                    "spent_usd": money(self.spent_usd),
                    "left_usd": money(self.left_usd),
                    "stopped": self._ctx.budget_exhausted if self._ctx is not None else None,
                    "topped_up_usd": self.topped_up_usd,
                },
                "baseline": figures(base),
                "incumbent": figures(inc),
                "candidates": dict(Counter(e.status for e in exps if e.seq > 0)),
                "waiting": waiting.id if waiting else None,
                "allowed_files": list(cfg.optimizer.allowed_files),
                "max_diff_lines": cfg.optimizer.max_diff_lines,
                "touched": self.touched() or _dirty_line(self.ws),
                "next": step,
            }
        )

    def history(self) -> Structured:
        inc = self._incumbent()
        run_id = self.run_id if self.started else None
        return Structured(history_data(self.ledger, run_id, inc.id if inc else None))

    async def disagreements(self, args: Mapping[str, Any]) -> ToolOutput:
        failed = await self._ensure_baseline()
        if failed is not None:
            return failed
        return run_tool(self._state(), "list_disagreements", dict(args))

    def read_item(self, args: Mapping[str, Any]) -> ToolOutput:
        tid = args.get("trajectory_id")
        if not isinstance(tid, str):
            return _error("trajectory_id must be a string")
        state = self._state()
        out = read_item(state, tid)
        if not out.is_error and self._incumbent() is None:
            return ToolOutput(
                text=out.text + "\n(the baseline is not evaluated yet: no disagreement is known)"
            )
        return out

    def read_steps(self, args: Mapping[str, Any]) -> ToolOutput:
        return run_tool(self._state(), "read_trajectory", dict(args))

    def view_screenshot(self, args: Mapping[str, Any]) -> ToolOutput:
        return run_tool(self._state(), "view_screenshot", dict(args))

    def read_file(self, args: Mapping[str, Any]) -> ToolOutput:
        return run_tool(self._state(), "read_file", dict(args))

    def propose_refusal(self, args: Mapping[str, Any], *, budget: bool = True) -> ToolOutput | None:
        """The refusal of a ``propose`` with ``args`` that needs no judge call and no git write (the
        arguments' shapes, a waiting candidate, the budget unless not ``budget``, a dirty tree), or None; a
        non-blocking propose says it before it answers its handle."""
        files, rationale, propose_only = (
            args.get("files", {}),
            args.get("rationale"),
            args.get("propose_only", False),
        )
        memory = args.get("memory", [])
        if not isinstance(files, dict) or not all(isinstance(v, str) for v in files.values()):
            return _error("files must be an object mapping allowed prompt files to their new full text")
        if not isinstance(memory, list) or not all(isinstance(op, dict) for op in memory):
            return _error(
                'memory must be a list of edits, each {"tool": add_case | edit_case | retire_case | '
                'edit_principles, "arguments": {...}}'
            )
        if not files and not memory:
            return _error(
                "nothing to propose: give files (allowed prompt file -> new full text), memory edits, or both"
            )
        if not isinstance(rationale, str):
            return _error("rationale must be a string")
        if not isinstance(propose_only, bool):
            return _error("propose_only must be true or false")
        waiting = self._waiting()
        if waiting is not None:
            return _error(f"experiment {waiting.id} is waiting for a decision; call decide first")
        refused = self.budget_refusal("a new candidate") if budget else None
        if refused is not None:
            return refused
        dirty = gitops.dirty_paths(self.ws.root)
        if dirty:
            # A rollback resets the tree: an edit made beside the session would be lost, or judged unseen.
            shown = ", ".join(dirty[:5]) + (f" and {len(dirty) - 5} more" if len(dirty) > 5 else "")
            return _error(
                f"the working tree has changes not made through propose ({shown}); the session judges "
                "only what propose sends: put them in a proposal, or discard them (`git checkout -- "
                "<file>`), then propose again"
            )
        return None

    async def propose(self, args: Mapping[str, Any]) -> ToolOutput | Structured:
        """Check the files as the agent's tools do, then the loop's candidate path; answers the decision."""
        refused = self.propose_refusal(args)
        if refused is not None:
            return refused
        files, rationale = args.get("files", {}), str(args.get("rationale"))
        memory, propose_only = args.get("memory", []), bool(args.get("propose_only", False))
        failed = await self._ensure_baseline()
        if failed is not None:
            return failed
        touched = self.touched()
        if touched is not None:
            return _error(touched)
        state = self._state()
        for path, text in files.items():
            out = run_tool(state, "write_file", {"path": path, "text": text})
            if out.is_error:
                return _error(f"nothing was proposed or committed: {out.problem or out.text}")
        for n, op in enumerate(memory, start=1):
            # The agent strategy's own memory tools on the same state: the same checks, the same refusals.
            tool = op.get("tool")
            if tool not in MEMORY_TOOLS:
                return _error(
                    f"nothing was proposed or committed: memory edit {n} names tool {tool!r}; use one of "
                    f"{', '.join(MEMORY_TOOLS)}"
                )
            out = run_tool(state, str(tool), op.get("arguments", {}))
            if out.is_error:
                return _error(
                    f"nothing was proposed or committed: memory edit {n} ({tool}): {out.problem or out.text}"
                )
        out = run_tool(state, "submit", {"rationale": rationale})
        if out.is_error:
            return _error(f"nothing was proposed or committed: {out.problem or out.text}")
        assert state.submitted is not None
        self.strategy.next = Proposal(state.changed_files(), state.submitted, tool_errors=state.errors)
        incumbent = self._incumbent()
        assert incumbent is not None
        # This call's limits: the run's, with the client's propose_only (the run's own are never changed).
        limits = dataclasses.replace(self.ctx.limits, propose_only=propose_only)
        provider, cache = self._judge()
        try:
            exp = await self.runner.candidate(incumbent, provider, cache, limits=limits)
        except BaseException:
            # Never leave a half-made candidate as the branch tip: the next one would build on it.
            roll_back_unfinished(
                self.ws, self.ledger, self.run_id, "the candidate failed before it was decided"
            )
            raise
        finally:
            self.strategy.next = None
        return Structured(self._outcome(exp))

    def _outcome(self, exp: Experiment) -> dict[str, Any]:
        """The decided (or refused, or waiting) candidate ``exp`` as ``propose`` and ``decide`` answer it."""
        exp = self.ledger.get_experiment(exp.id)
        parent = self.ledger.get_experiment(exp.parent_id) if exp.parent_id else None
        return experiment_record(exp, parent) | {
            "meaning": MEANING.get(exp.status, ""),
            "budget": self._budget_left(),
            "flips_help": FLIPS_HELP if exp.flips else None,
        }

    def _budget_left(self) -> dict[str, float]:
        return {
            "spent_usd": money(self.spent_usd),
            "left_usd": money(self.left_usd),
            "topped_up_usd": self.topped_up_usd,
        }

    def decide(self, args: Mapping[str, Any]) -> ToolOutput | Structured:
        experiment, decision = args.get("experiment"), args.get("decision")
        if isinstance(experiment, bool) or not isinstance(experiment, int):
            return _error("experiment must be an experiment id (a whole number)")
        if decision not in ("keep", "discard"):
            return _error("decision must be 'keep' or 'discard'")
        waiting = self._waiting()
        if waiting is None or waiting.id != experiment:
            which = f"experiment {waiting.id} is" if waiting else "no experiment of this session is"
            return _error(
                f"experiment {experiment} is not waiting for a decision in this session ({which} waiting)"
            )
        lines: list[str] = []
        exp = decide_waiting(self.ws, self.ledger, experiment, decision == "keep", lines.append, by="mcp")
        return Structured(self._outcome(exp) | {"said": lines})

    def decide_asked(self, experiment: int, keep: bool) -> ToolOutput | Structured:
        """A person's answer to the keep question (`optimizer.mcp.elicit`), recorded as theirs; a keep the
        policy rolls back is refused as the client's would be (the server cannot tell a form's answer from
        the client's own): the candidate still waits for `judgeloop decide` or the TUI."""
        overrules = keep and self.ledger.get_experiment(experiment).policy_keep is False
        lines: list[str] = []
        try:
            exp = decide_waiting(
                self.ws, self.ledger, experiment, keep, lines.append, by="mcp" if overrules else "person"
            )
        except UserError as exc:
            return _error(str(exc))
        return Structured(self._outcome(exp) | {"said": lines})

    async def attribute(self) -> ToolOutput:
        """What each kept edit of the session still contributes, and the final prompts against the baseline
        (`optimizer.loop.attribute`), paid from the session's budget."""
        if not self.started:
            return _error("this session kept no edit; nothing to attribute")
        waiting = self._waiting()
        if waiting is not None:
            return _error(f"experiment {waiting.id} is waiting for a decision; call decide first")
        refused = self.budget_refusal("attribute")
        if refused is not None:
            return refused
        budget = self.ctx.budget()
        assert budget is not None  # a session always has one
        before = budget.spent_usd
        ws, run_id, events = self.ws, self.run_id, self._event

        def work() -> Attribution:
            # A thread of its own: attribution runs its own event loop, and a SQLite connection of its own.
            with Ledger(ws.ledger_path) as ledger:
                scope = resolve_scope(ws, ledger, run_id)
                gitops.prune_scratch_worktrees(ws)
                try:
                    return attribute_scope(
                        ws, ledger, scope, AttributeOptions(run=run_id, budget=budget), events
                    )
                finally:
                    gitops.prune_scratch_worktrees(ws)

        try:
            done = await anyio.to_thread.run_sync(work)
        finally:
            self.runner.record_spend(
                budget.spent_usd - before
            )  # the run's spend, as its evaluations count it
        return _json(
            {
                "attribution": done.id,
                "status": done.status,
                "note": done.note,
                "cost_usd": money(budget.spent_usd - before),
                **attribution_json(done),
                "budget": self._budget_left(),
            }
        )

    def report(self) -> Structured:
        if not self.started:
            return Structured(
                {
                    "run": None,
                    "branch": None,
                    "policy": None,
                    "status": None,
                    "experiments": [],
                    "kept": [],
                    "cost_usd": 0.0,
                    "budget": self._budget_left(),
                    "text": "the session has no run yet: disagreements or propose starts it",
                }
            )
        # The agent proposing candidates must not see the corrections or the label-suspects queue.
        text = report_text(self.ledger, self._run(), self.ws, with_triage=False)
        return Structured(report_data(self.ledger, self.run_id, text, self._budget_left()))

    # -- the end -----------------------------------------------------------------------------

    def finish(self, crashed: str | None = None) -> None:
        """Record how the session ended and write its report files (as a run's end writes them); a session
        whose run never started leaves nothing to record."""
        if not self.started:
            self.say(
                f"MCP session ended before its run started: nothing recorded ({crashed or 'no run needed'})"
            )
            return
        if crashed is not None:
            roll_back_unfinished(self.ws, self.ledger, self.run_id, f"the MCP session crashed: {crashed}")
            self.ledger.set_run_status(self.run_id, "crashed", stop_reason=crashed)
        else:
            roll_back_unfinished(
                self.ws, self.ledger, self.run_id, "the MCP session ended before it was decided"
            )
            waiting = self._waiting()
            status: RunStatus = "waiting" if waiting else "finished"
            why = (
                f"the MCP session ended; experiment {waiting.id} waits for `judgeloop decide {waiting.id} "
                "keep|discard`"
                if waiting
                else f"the MCP session ended; {self.budget_line()}"
            )
            self.ledger.set_run_status(self.run_id, status, stop_reason=why)
        inc = self._incumbent()
        out = self.ws.experiments_dir / "runs" / self.run_id
        write_markdown_report(self.ledger, self.run_id, out / "report.md", self.ws)
        export_experiments_tsv(self.ledger, self.run_id, out / "experiments.tsv")
        self.say(
            f"MCP session {self.run_id} ended: incumbent experiment {inc.id if inc else 'none'} "
            f"(kappa {fmt3(inc.kappa if inc else None)}); {self.budget_line()}; "
            f"`judgeloop report --run {self.run_id}`"
        )


@contextmanager
def open_session(ws: Workspace, options: SessionOptions, events: Listener = ignore) -> Iterator[McpSession]:
    """Yield the session; its run (and the workspace's loop lock) starts with the first call that needs
    one (`McpSession.begin`), and on the way out the session records how it ended and lets the lock go.
    A `UserError` before the yield means no session (a missing key, a held-out split as the dev split, ...)."""
    check_prompts_tree(ws.root)
    # What would refuse the run, checked now (reading only), so a session that cannot run says so at once.
    judge = options.judge.apply(ws.config.judge)
    check_budget(judge, options.budget_usd)
    check_confinement(judge)
    check_judge_key(judge)
    split = loop_split(ws)
    with Ledger(ws.ledger_path) as ledger:
        session = McpSession(ws, ledger, options, split, events)
        try:
            yield session
        except Exception as exc:
            session.finish(crashed=f"{type(exc).__name__}: {exc}")
            raise
        except BaseException:  # Ctrl-C, a cancelled server: the session ends as if its client left
            session.finish()
            raise
        else:
            session.finish()
        finally:
            session.release()
