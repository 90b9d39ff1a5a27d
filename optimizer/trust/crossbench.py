"""A certificate's transfer evidence across benchmarks: the held-out confirmations of a revision on splits
of another benchmark than the dev split's (issue 35). Reads the ledger's records only: `confirm` measures,
rationed like any held-out split; a certificate never runs one.

A confirmation recorded before schema 11 has no benchmark: it is never counted as transfer evidence.
"""

from __future__ import annotations

from typing import Any

from optimizer.ledger import Confirmation, Ledger
from optimizer.stats.binomial import clopper_pearson_lower, clopper_pearson_upper
from optimizer.trust.certify_records import BenchmarkEvidence, BenchmarkTransfer, NotRun
from optimizer.workspace.workspace import Workspace

BOUND_LEVEL = 0.05  # one-sided: 95% confidence, as the certificate's own agreement bounds
BOUND_METHOD = "Clopper-Pearson exact, one-sided 95%"


def _count(metrics: dict[str, Any], key: str) -> int:
    value = metrics.get(key)
    return value if isinstance(value, int) and value >= 0 else 0


def _rate(metrics: dict[str, Any], key: str) -> float | None:
    value = metrics.get(key)
    return float(value) if isinstance(value, int | float) else None


def evidence(c: Confirmation) -> BenchmarkEvidence:
    """One confirmation's figures and bounds (counts as recorded: ``tp``, ``fn``, ``tn``, ``fp``)."""
    m = c.metrics
    tp, fn, tn, fp = (_count(m, k) for k in ("tp", "fn", "tn", "fp"))
    positives, negatives = tp + fn, tn + fp
    n = m.get("n")
    return BenchmarkEvidence(
        split=c.split,
        benchmark=c.benchmark or "",
        fingerprint=c.fingerprint,
        created=c.created.isoformat(timespec="seconds"),
        run=c.run_id,
        n=n if isinstance(n, int) else positives + negatives,
        tp=tp,
        fn=fn,
        tn=tn,
        fp=fp,
        kappa=_rate(m, "kappa"),
        balanced_accuracy=_rate(m, "balanced_accuracy"),
        tpr=_rate(m, "tpr"),
        tpr_lower=clopper_pearson_lower(tp, positives, BOUND_LEVEL) if positives else None,
        tnr=_rate(m, "tnr"),
        tnr_lower=clopper_pearson_lower(tn, negatives, BOUND_LEVEL) if negatives else None,
        fpr=_rate(m, "fpr"),
        fpr_upper=clopper_pearson_upper(fp, negatives, BOUND_LEVEL) if negatives else None,
        bound_method=BOUND_METHOD,
    )


def benchmark_transfer(ws: Workspace, sha: str, dev_benchmark: str) -> BenchmarkTransfer | NotRun:
    """The newest confirmation of ``sha`` on each split whose recorded benchmark is not ``dev_benchmark``."""
    how = (
        "import another benchmark's labelled split (`judgeloop devset import SRC --format F`), list it "
        "under [workspace] heldout_splits and `judgeloop confirm --split NAME`"
    )
    if not ws.ledger_path.is_file():
        return NotRun(status="none", note=f"no ledger yet; {how}")
    with Ledger.open_readonly(ws.ledger_path) as ledger:
        rows = [
            c
            for c in ledger.confirmations()
            if c.revision == sha and c.benchmark is not None and c.benchmark != dev_benchmark
        ]
    if not rows:
        return NotRun(status="none", note=f"no confirmation of this revision on another benchmark; {how}")
    newest = {c.split: c for c in rows}  # oldest first: the last one of a split wins
    return BenchmarkTransfer(dev_benchmark=dev_benchmark, splits=[evidence(c) for c in newest.values()])


def _f(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"


def markdown_lines(bt: BenchmarkTransfer | NotRun) -> list[str]:
    """The certificate's "Transfer to other benchmarks" section."""
    lines = ["", "## Transfer to other benchmarks", ""]
    if isinstance(bt, NotRun):
        return [*lines, f"- benchmark transfer: none ({bt.note})"]
    lines.append(
        f"Tuned on {bt.dev_benchmark}; measured once each by `judgeloop confirm` ({BOUND_METHOD} bounds):"
    )
    lines.append("")
    for e in bt.splits:
        lines.append(
            f"- `{e.split}` ({e.benchmark}, {e.n} items, {e.created}): kappa {_f(e.kappa)}, "
            f"FPR {_f(e.fpr)} (≤ {_f(e.fpr_upper)}), TPR {_f(e.tpr)} (≥ {_f(e.tpr_lower)}), "
            f"TNR {_f(e.tnr)} (≥ {_f(e.tnr_lower)})"
        )
    return lines
