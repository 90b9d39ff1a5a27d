"""Two fake judges of known odds for the cascade's tests (issue 34's "Done means"): a lenient cheap one and
a strict expensive one on one fake server, told apart by the model a request names.

Each judge errs on an item when a uniform draw from a hash of (judge, item) falls under its error rate:
the cheap judge misses a positive with probability ``1 - cheap_tpr`` and passes a negative with ``cheap_fpr``;
the strict one likewise. ``correlated``: the strict judge draws from the cheap judge's hash, so its errors
fall on the items the cheap judge already gets wrong (nested), else from its own (independent)."""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.support.evaluation import Data
from tests.support.fakeserver import Behaviour, RecordedRequest, Usage, reply, server_error
from tests.support.loop import FakeJudge, request_texts

CHEAP, STRICT = "cheap-judge", "strict-judge"
# Scripted usage per call and the prices (US dollars per million tokens) that make each call's cost known.
USAGE = {
    CHEAP: Usage(input_tokens=1000, output_tokens=100),
    STRICT: Usage(input_tokens=4000, output_tokens=400),
}
PRICES = {CHEAP: (1.0, 5.0), STRICT: (10.0, 40.0)}
CALL_USD = {
    m: (USAGE[m].input_tokens * PRICES[m][0] + USAGE[m].output_tokens * PRICES[m][1]) / 1e6 for m in USAGE
}
SECOND_MARK = "You are the second, strict judge."


def draw(judge: str, tid: str) -> float:
    """A uniform draw in [0, 1) fixed by (judge, item)."""
    return int(hashlib.sha256(f"{judge}:{tid}".encode()).hexdigest()[:12], 16) / 16**12


@dataclass
class TwoJudges:
    """The two judges over HTTP: ``positive`` (trajectory id → is a positive) is the answer table's truth,
    ``item_of`` names the item a request judges, ``cheap_model`` the model name the cheap judge answers to."""

    positive: dict[str, bool]
    item_of: Callable[[RecordedRequest], str]
    cheap_model: str = CHEAP
    cheap_tpr: float = 0.94
    cheap_fpr: float = 0.40
    strict_tpr: float = 0.72
    strict_fpr: float = 0.10
    correlated: bool = False
    asked: dict[str, list[str]] = field(default_factory=lambda: {CHEAP: [], STRICT: []})

    def __post_init__(self) -> None:
        self.lock = threading.Lock()

    @classmethod
    def of_data(cls, data: Data, **odds: Any) -> TwoJudges:
        positive = {item.trajectory_id: item.label == "positive" for item in data.items}
        return cls(positive, lambda request: data.recorded_item(request).trajectory_id, **odds)

    @classmethod
    def of_workspace(cls, root: Path, **odds: Any) -> TwoJudges:
        """For a loop's workspace, the cheap judge being the run's ``fake-judge``."""
        table = FakeJudge(root)
        positive = {tid: label.is_positive for tid, label in table.labels.items()}

        def item_of(request: RecordedRequest) -> str:
            return table.trajectory_of(request_texts(request.body)[1])

        return cls(positive, item_of, cheap_model="fake-judge", **odds)

    def says_success(self, judge: str, tid: str) -> bool:
        """The judge's answer on ``tid`` (the answer table; pure)."""
        tpr, fpr = (self.cheap_tpr, self.cheap_fpr) if judge == CHEAP else (self.strict_tpr, self.strict_fpr)
        u = draw(CHEAP if self.correlated else judge, tid)
        return u >= 1 - tpr if self.positive[tid] else u < fpr

    def __call__(self, request: RecordedRequest) -> Behaviour:
        if not isinstance(request.body, dict):  # the client gave up mid-send (an early stop)
            return server_error(500)
        model = CHEAP if request.model == self.cheap_model else (request.model or "")
        assert model in USAGE, f"unexpected model {request.model!r}"
        tid = self.item_of(request)
        assert (SECOND_MARK in json.dumps(request.body)) == (model == STRICT), (
            "each judge reads its own prompts"
        )
        with self.lock:
            self.asked[model].append(tid)
        success = self.says_success(model, tid)
        verdict = {"success": success, "reasoning": model, "confidence": "high", "mistake_type": None}
        return reply(json.dumps(verdict), usage=USAGE[model])


def cascade_toml(base_url: str, escalate: tuple[str, ...] = ("success",), structure: str = "cascade") -> str:
    """The judge.toml lines of a cascade whose second judge is the strict fake judge."""
    listed = ", ".join(json.dumps(e) for e in escalate)
    return (
        f'\nstructure = "{structure}"\n\n[cascade]\nescalate = [{listed}]\n\n[cascade.second]\nprovider = "openai"\n'
        f'model = "{STRICT}"\nbase_url = "{base_url}"\nmax_retries = 0\n\n[cascade.second.prices.{STRICT}]\n'
        f"input = {PRICES[STRICT][0]}\noutput = {PRICES[STRICT][1]}\n"
    )


def write_cascade(
    root: Path, base_url: str, escalate: tuple[str, ...] = ("success",), cheap: str = CHEAP
) -> None:
    """A cascade in the workspace's prompts (judge.toml keys before any table, then the tables; the second
    judge's prompts marked) and the cheap judge's price (model ``cheap``) in judgeloop.toml."""
    toml = root / "prompts" / "judge.toml"
    toml.write_text(toml.read_text(encoding="utf-8") + cascade_toml(base_url, escalate), encoding="utf-8")
    second = root / "prompts" / "second"
    second.mkdir(exist_ok=True)
    judge_md = (root / "prompts" / "judge.md").read_text(encoding="utf-8")
    (second / "judge.md").write_text(f"{SECOND_MARK}\n\n{judge_md}", encoding="utf-8")
    (second / "rubric.md").write_text(
        (root / "prompts" / "rubric.md").read_text(encoding="utf-8"), encoding="utf-8"
    )
    cfg = root / "judgeloop.toml"
    cfg.write_text(
        cfg.read_text(encoding="utf-8")
        + f'\n[prices."{cheap}"]\ninput = {PRICES[CHEAP][0]}\noutput = {PRICES[CHEAP][1]}\n',
        encoding="utf-8",
    )


def expected_odds(judges: TwoJudges, share_positive: float) -> dict[str, Any]:
    """The cascade's (escalate on "success") TPR, FPR, escalation share and cost per verdict from the odds."""
    t1, f1, t2, f2 = judges.cheap_tpr, judges.cheap_fpr, judges.strict_tpr, judges.strict_fpr
    tpr, fpr = (min(t1, t2), min(f1, f2)) if judges.correlated else (t1 * t2, f1 * f2)
    share = share_positive * t1 + (1 - share_positive) * f1
    return {"tpr": tpr, "fpr": fpr, "share": share, "cost": CALL_USD[CHEAP] + share * CALL_USD[STRICT]}
