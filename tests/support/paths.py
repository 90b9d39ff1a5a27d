"""Where the checkout is: the subprocesses the tests start import this repository's code."""

from __future__ import annotations

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
SAMPLE_DIR = REPO_ROOT / "devset" / "sample"
