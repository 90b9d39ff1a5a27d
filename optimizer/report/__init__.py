"""Audit commands over the ledger: ``judgeloop report``, ``history`` and ``reviews``, plus the exports
(TSV of experiments, markdown report) the loop writes at the end of a run.

Everything here reads the ledger only (``Ledger.open_readonly``), so it works on a finished run, a
running one in another process, or a ledger copied from another machine. ``report`` additionally
cross-checks git when the run's branch exists in the workspace.

The package: `data` (the figures), `lines` (one-line renderings shared with the TUI), `text` (the
full renderings and exports).
"""

from __future__ import annotations

from optimizer.report.data import (
    JSON_EXPERIMENT_KEYS,
    REPORT_FORMAT_VERSION,
    FpByType,
    accounting,
    attribution_json,
    fp_by_type,
    fp_by_type_all,
    gain_when_kept,
    overall_flips,
    rejudged_items,
    report_json,
    significant,
    spend,
)
from optimizer.report.lines import (
    accounting_line,
    endpoint_lines,
    fp_by_type_line,
    git_audit,
    history_lines,
    one_line,
    test_line,
    token_split,
)
from optimizer.report.text import (
    ATTRIBUTION_TSV_COLUMNS,
    TSV_COLUMNS,
    attribution_lines,
    attribution_markdown,
    export_attribution_tsv,
    export_experiments_tsv,
    report_text,
    write_markdown_report,
)

__all__ = [
    "ATTRIBUTION_TSV_COLUMNS",
    "JSON_EXPERIMENT_KEYS",
    "REPORT_FORMAT_VERSION",
    "TSV_COLUMNS",
    "FpByType",
    "accounting",
    "accounting_line",
    "attribution_json",
    "attribution_lines",
    "attribution_markdown",
    "endpoint_lines",
    "export_attribution_tsv",
    "export_experiments_tsv",
    "fp_by_type",
    "fp_by_type_all",
    "fp_by_type_line",
    "gain_when_kept",
    "git_audit",
    "history_lines",
    "one_line",
    "overall_flips",
    "rejudged_items",
    "report_json",
    "report_text",
    "significant",
    "spend",
    "test_line",
    "token_split",
    "write_markdown_report",
]
