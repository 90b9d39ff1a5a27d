"""The structured results of `judgeloop mcp`'s tools: each tool's ``outputSchema`` (JSON Schema) and the
records its ``structuredContent`` is built from, read from the ledger's typed rows (never from display text).

A `Structured` answer goes out as ``structuredContent`` and, as the MCP specification asks for clients that
read only content blocks, as the same object serialised in one text block (`Structured.text`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from optimizer.ledger import Experiment, Ledger
from optimizer.ledger.schema import FLIP_KEYS
from optimizer.vocab import EXPERIMENT_STATUSES


@dataclass(frozen=True)
class Structured:
    """A tool's successful answer as data: ``data`` conforms to the tool's output schema."""

    data: dict[str, Any]

    @property
    def text(self) -> str:
        """``data`` serialised (what a client reading only text content sees)."""
        return json.dumps(self.data, indent=1, ensure_ascii=False)


def money(x: float) -> float:
    """US dollars rounded to a millionth (what every result shows)."""
    return round(x, 6)


# -- schemas ---------------------------------------------------------------------------------------

_NUM = {"type": ["number", "null"]}
_INT = {"type": ["integer", "null"]}
_STR = {"type": ["string", "null"]}
_OUTCOME = {"type": "string", "enum": list(EXPERIMENT_STATUSES)}


def _obj(props: dict[str, Any], *, open_: bool = False) -> dict[str, Any]:
    """An object with every property required (null where unknown); ``open_``: more keys allowed."""
    return {
        "type": "object",
        "properties": props,
        "required": list(props),
        "additionalProperties": open_,
    }


_BEFORE_AFTER = _obj({"incumbent": _NUM, "candidate": _NUM})
_FLIPS = {
    "type": ["object", "null"],
    "description": "items whose correctness changed against the incumbent, by direction (counts)",
    "properties": {k: {"type": "integer", "minimum": 0} for k in FLIP_KEYS},
    "required": list(FLIP_KEYS),
    "additionalProperties": False,
}
# topped_up_usd: what people added to the session's budget when asked (`optimizer.mcp.topup`).
_BUDGET = _obj(
    {"spent_usd": {"type": "number"}, "left_usd": {"type": "number"}, "topped_up_usd": {"type": "number"}}
)

# One candidate as the tools show it: what was decided and on what figures (kappa, FPR: 0..1).
_EXPERIMENT_PROPS: dict[str, Any] = {
    "experiment": {"type": "integer"},
    "outcome": _OUTCOME,
    "reason": _STR,
    "kappa": _BEFORE_AFTER,
    "fpr": _BEFORE_AFTER,
    "p_value": _NUM,
    "alpha": _NUM,
    "early_stopped": {"type": "boolean"},
    "items_evaluated": {"type": "integer"},
    "flips": _FLIPS,
    "commit": _STR,
    "cost_usd": {"type": "number"},
}

OUTCOME_SCHEMA = _obj(
    {
        **_EXPERIMENT_PROPS,
        "meaning": {"type": "string"},
        "budget": _BUDGET,
        "flips_help": _STR,
    }
)
DECIDE_SCHEMA = _obj({**OUTCOME_SCHEMA["properties"], "said": {"type": "array", "items": {"type": "string"}}})
_HISTORY_ENTRY = _obj(
    {
        **_EXPERIMENT_PROPS,
        "rationale": _STR,
        "files_changed": {"type": "array", "items": {"type": "string"}},
        "diff": _STR,
    }
)
HISTORY_SCHEMA = _obj(
    {
        "run": _STR,
        "incumbent": _INT,
        "experiments": {"type": "array", "items": _HISTORY_ENTRY},
    }
)
_FIGURES = {
    "type": ["object", "null"],
    "properties": {
        "experiment": {"type": "integer"},
        "kappa": _NUM,
        "fpr": _NUM,
        "balanced_accuracy": _NUM,
        "commit": {"type": "string"},
    },
    "required": ["experiment", "kappa", "fpr", "balanced_accuracy", "commit"],
    "additionalProperties": False,
}
STATUS_SCHEMA = _obj(
    {
        "run": _STR,
        "branch": _STR,
        "split": {"type": "string"},
        "items": {"type": "integer"},
        "judge": {"type": "string"},
        "replicates": {"type": "integer"},
        "policy": {"type": "string"},
        "alpha": {"type": "number"},
        "budget": _obj(
            {
                "budget_usd": {"type": "number"},
                "spent_usd": {"type": "number"},
                "left_usd": {"type": "number"},
                "stopped": _STR,
                "topped_up_usd": {"type": "number"},
            }
        ),
        "baseline": _FIGURES,
        "incumbent": _FIGURES,
        "candidates": {"type": "object", "additionalProperties": {"type": "integer"}},
        "waiting": _INT,
        "allowed_files": {"type": "array", "items": {"type": "string"}},
        "max_diff_lines": {"type": "integer"},
        "touched": _STR,
        "next": {"type": "string"},
    }
)
REPORT_SCHEMA = _obj(
    {
        "run": _STR,
        "branch": _STR,
        "policy": _STR,
        "status": _STR,
        "experiments": {"type": "array", "items": _obj(_EXPERIMENT_PROPS)},
        "kept": {
            "type": "array",
            "items": {"type": "integer"},
            "description": "the kept chain, oldest first",
        },
        "cost_usd": {"type": "number", "description": "every experiment of the run, judge and optimiser"},
        "budget": _BUDGET,
        "text": {"type": "string", "description": "the audit report as people read it"},
    }
)


# -- records ---------------------------------------------------------------------------------------


def experiment_record(exp: Experiment, parent: Experiment | None) -> dict[str, Any]:
    """``exp`` as the tools show a candidate: outcome, kappa and FPR before (``parent``, its incumbent)
    and after, the p-value, the flips, its cost (US dollars, judge and optimiser)."""
    return {
        "experiment": exp.id,
        "outcome": exp.status,
        "reason": exp.reason,
        "kappa": {"incumbent": parent.kappa if parent else None, "candidate": exp.kappa},
        "fpr": {"incumbent": parent.fpr if parent else None, "candidate": exp.fpr},
        "p_value": exp.p_value,
        "alpha": exp.alpha,
        "early_stopped": exp.early_stopped,
        "items_evaluated": exp.items_evaluated,
        "flips": exp.flip_counts() if exp.flips else None,
        "commit": (exp.commit_sha or "")[:12] or None,
        "cost_usd": money(exp.cost_usd),
    }


def _parents(ledger: Ledger, exps: list[Experiment]) -> dict[int, Experiment]:
    """Each experiment's parent by id (the run's own rows first; a parent outside them read once)."""
    by_id = {e.id: e for e in exps}
    for e in exps:
        if e.parent_id is not None and e.parent_id not in by_id:
            by_id[e.parent_id] = ledger.get_experiment(e.parent_id)
    return by_id


def history_data(ledger: Ledger, run_id: str | None, incumbent: int | None) -> dict[str, Any]:
    """The candidates of run ``run_id`` (None: no run yet, none), oldest first, each with its rationale and diff."""
    exps = [e for e in ledger.experiments(run_id) if e.seq > 0] if run_id else []
    parents = _parents(ledger, exps)
    entries = []
    for listed in exps:
        exp = ledger.get_experiment(listed.id)  # with its diff, which listings leave out
        parent = parents.get(exp.parent_id) if exp.parent_id is not None else None
        entries.append(
            experiment_record(exp, parent)
            | {"rationale": exp.rationale, "files_changed": list(exp.files_changed), "diff": exp.diff_text}
        )
    return {"run": run_id, "incumbent": incumbent, "experiments": entries}


def report_data(ledger: Ledger, run_id: str, text: str, budget: dict[str, float]) -> dict[str, Any]:
    """Run ``run_id``'s report as data: every experiment (baseline first), the kept chain, the spend
    (US dollars), the session's ``budget`` and the audit ``text``."""
    run = ledger.get_run(run_id)
    exps = ledger.experiments(run_id)
    parents = _parents(ledger, exps)
    return {
        "run": run.id,
        "branch": run.branch,
        "policy": run.policy,
        "status": run.status,
        "experiments": [
            experiment_record(e, parents.get(e.parent_id) if e.parent_id is not None else None) for e in exps
        ],
        "kept": [e.id for e in exps if e.status == "kept"],
        "cost_usd": money(sum(e.cost_usd for e in exps)),
        "budget": budget,
        "text": text,
    }


# -- non-blocking proposals (`optimizer.mcp.background`) ---------------------------------------------

CANDIDATE_STATES = ("running", "decided", "refused", "failed")
_PROGRESS = {
    "type": ["object", "null"],
    "description": "as the progress notifications carry it: items judged over items planned, over the "
    "whole candidate (never going back), and the current pass's line; null before the first item",
    "properties": {"progress": {"type": "number"}, "total": _NUM, "message": _STR},
    "required": ["progress", "total", "message"],
    "additionalProperties": False,
}
CANDIDATE_STATUS_SCHEMA = _obj(
    {
        "handle": {"type": "string"},
        "state": {
            "type": "string",
            "enum": list(CANDIDATE_STATES),
            "description": "running; decided (result holds the outcome); refused (nothing was proposed: "
            "error says why); failed (the evaluation broke off: rolled back, error says why)",
        },
        "progress": _PROGRESS,
        "result": {"anyOf": [OUTCOME_SCHEMA, {"type": "null"}]},
        "error": _STR,
        "next": {"type": "string"},
    }
)
# ``propose`` answers the decided candidate (waiting for it) or, with ``wait: false``, its handle at once.
PROPOSE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "anyOf": [OUTCOME_SCHEMA, CANDIDATE_STATUS_SCHEMA],
}
