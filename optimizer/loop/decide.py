"""A person's or an MCP client's decision on a waiting candidate (a --propose-only run's, or one an MCP
session left waiting): keep it (the policy's keep, or a person overruling the policy's roll back) or
discard it, in git and in the ledger. `decide` is `judgeloop decide`'s and the TUI's entry point (it takes
the workspace's loop lock); `decide_waiting` is the step itself, which the MCP server's ``decide`` calls
under its own session's lock.
"""

from __future__ import annotations

from collections.abc import Callable

from optimizer.errors import UserError
from optimizer.events import Listener, Message, ignore
from optimizer.ledger import Experiment, Ledger
from optimizer.ledger.rows import overrule_line
from optimizer.loop import trust
from optimizer.loop.records import decision_trailers
from optimizer.vocab import DecidedBy
from optimizer.workspace import gitops
from optimizer.workspace.workspace import Workspace, command_lock

Say = Callable[[str], None]

# Asked before a person's keep overrules the policy's roll back: gets the question (one line), answers
# whether to go on (`judgeloop decide` asks on a terminal or needs --force; the TUI has its own dialog).
ConfirmOverrule = Callable[[str], bool]


def decide(
    ws: Workspace,
    experiment: int | str,
    keep: bool,
    events: Listener = ignore,
    *,
    confirm_overrule: ConfirmOverrule | None = None,
) -> int:
    """Keep or discard the candidate waiting in --propose-only mode: a person's decision (the CLI and the
    TUI call this), which may overrule the policy (the ledger, the report and the commit say so); returns
    the experiment's id. ``confirm_overrule``: asked before a keep against the policy (None: no question);
    a no leaves the candidate waiting (a `UserError` saying so)."""

    def say(text: str) -> None:
        events(Message(text))

    with command_lock(ws, "decide"), Ledger(ws.ledger_path) as ledger:
        exp = decide_waiting(
            ws, ledger, experiment, keep, say, by="person", confirm_overrule=confirm_overrule
        )
        ledger.set_run_status(exp.run_id, "stopped", stop_reason="propose-only candidate decided by a person")
        say("next candidate: `judgeloop run --resume --propose-only`")
        return exp.id


DECIDERS: dict[DecidedBy, str] = {"person": "a person", "mcp": "the MCP client", "policy": "the policy"}


def decide_waiting(
    ws: Workspace,
    ledger: Ledger,
    experiment: int | str,
    keep: bool,
    say: Say,
    *,
    by: DecidedBy = "person",
    confirm_overrule: ConfirmOverrule | None = None,
) -> Experiment:
    """Keep or discard a waiting candidate (git and ledger), as decided ``by``; the caller holds the loop
    lock and says what comes next (`decide`; the MCP server's ``decide``, whose session goes on).

    A keep is the policy's: an MCP client's keep of a candidate the policy rolls back is refused (a
    `UserError` naming the policy's reason); only a person overrules the policy. The candidate is decided
    only on the loop's own commits: the branch tip must be the candidate's commit or (a session that
    ended, the candidate under ``refs/judgeloop/waiting/<id>``) the incumbent's, and the candidate's
    parent the incumbent's commit."""
    try:
        exp = ledger.get_experiment(int(experiment))
    except ValueError:
        raise UserError(f"experiment ids are numbers (got {experiment!r}); see `judgeloop history`") from None
    if exp.status != "waiting":
        raise UserError(f"experiment {exp.id} is {exp.status}, not waiting for a decision")
    run = ledger.get_run(exp.run_id)
    parent = ledger.get_experiment(exp.parent_id) if exp.parent_id else None
    if parent is None or not parent.commit_sha or not exp.commit_sha or run.incumbent_experiment != parent.id:
        raise UserError(
            f"experiment {exp.id} is not a candidate on run {run.id}'s incumbent; it cannot be decided "
            "any more (start a new run)"
        )
    if keep and by != "person" and exp.policy_keep is False:
        raise UserError(
            f"experiment {exp.id} is not kept: the {run.policy} policy rolls it back "
            f"({exp.policy_reason or 'no reason recorded'}); a keep is the policy's and only a person "
            f"overrules it (`judgeloop decide {exp.id} keep`, or the TUI): decide discard"
        )
    if keep and exp.policy_keep is False and confirm_overrule is not None:
        question = (
            f"the {run.policy} policy rolls experiment {exp.id} back "
            f"({exp.policy_reason or 'no reason recorded'}); keeping it overrules the policy"
        )
        if not confirm_overrule(question):
            raise UserError(
                f"experiment {exp.id} not kept: it still waits (`judgeloop decide {exp.id} discard`, "
                f"or `judgeloop decide {exp.id} keep --force` to overrule the policy)"
            )
    gitops.checkout_branch(ws.root, run.branch)
    problem = trust.tip_problem(ws.root, run.branch, parent.commit_sha, also=[exp.commit_sha])
    if problem is not None:
        back_to = trust.last_trusted(ws.root, run.branch, parent.commit_sha, [exp.commit_sha])
        raise UserError(trust.refusal(problem, run.branch, back_to))
    if gitops.parents(ws.root, exp.commit_sha) != [parent.commit_sha]:
        raise UserError(
            f"experiment {exp.id}'s commit {exp.commit_sha[:12]} is not a child of the incumbent's "
            f"{parent.commit_sha[:12]}; it cannot be decided (start a new run)"
        )
    if gitops.rev_parse(ws.root, "HEAD") != exp.commit_sha:
        # The candidate waits under its ref, the branch at the incumbent: bring it back to decide it.
        gitops.ensure_clean(ws.root, f"judgeloop decide {exp.id}")
        gitops.restore_tree(ws.root, exp.commit_sha)
    tip = exp.commit_sha
    metrics = exp.metrics_model()
    policy_said = exp.reason or ""
    who = DECIDERS[by]
    overrule = (
        overrule_line(keep, exp.policy_keep, exp.policy_reason) if exp.policy_keep is not None else None
    )
    if keep:
        if parent.fpr is not None and exp.fpr is not None and exp.fpr > parent.fpr:
            say(
                f"warning: keeping a candidate that raised FPR {parent.fpr:.3f} → {exp.fpr:.3f} (decided by {who})"
            )
        trailers = decision_trailers(exp.id, metrics, "kept") | (
            {"Judgeloop-Overrule": overrule} if overrule else {}
        )
        sha = gitops.finalize_kept(ws.root, tip, trailers)
        ledger.set_experiment_decision(
            exp.id,
            status="kept",
            commit_sha=sha,
            decided_by=by,
            reason=overrule or f"kept by {who} ({policy_said})",
        )
        say(
            f"experiment {exp.id} kept as {sha[:12]} on {run.branch}" + (f" — {overrule}" if overrule else "")
        )
    else:
        trailers = decision_trailers(exp.id, metrics, "rolled_back") | (
            {"Judgeloop-Overrule": overrule} if overrule else {}
        )
        rejected = gitops.roll_back(ws.root, tip, exp.id, parent.commit_sha, trailers)
        ledger.set_experiment_decision(
            exp.id,
            status="rolled_back",
            commit_sha=rejected,
            decided_by=by,
            reason=overrule or f"discarded by {who} ({policy_said})",
        )
        say(
            f"experiment {exp.id} discarded; kept under refs/judgeloop/rejected/{exp.id}"
            + (f" — {overrule}" if overrule else "")
        )
    gitops.drop_waiting(ws.root, exp.id)
    return ledger.get_experiment(exp.id)
