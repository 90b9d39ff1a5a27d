"""judgeloop's engine: data, judge, metrics, ledger and the keep/rollback loop. No Textual here."""

__version__ = "0.1.0"
