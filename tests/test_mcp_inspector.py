"""The MCP Inspector CLI (npm) drives `judgeloop mcp` through scripts/mcp-inspector-check: a client judgeloop
did not write sees the same tool order twice, structured results valid against their output schemas, the
resources, a non-blocking propose's handle and a blocking propose's decision. Skipped only where npx is
missing (CI has Node.js); the first run downloads the Inspector from the npm registry.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.fakeserver import FakeLLMServer
from tests.support.loop import FakeJudge
from tests.support.mcp_client import KEY
from tests.support.mcp_workspace import ledger_state, make_mcp_template
from tests.support.paths import REPO_ROOT
from tests.support.scripted import assert_clean

SCRIPT = REPO_ROOT / "scripts" / "mcp-inspector-check"


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("npx") is None, reason="npx (Node.js) is not installed")
def test_the_mcp_inspector_cli_sees_valid_structured_results_and_a_stable_tool_order(tmp_path: Path) -> None:
    ws = make_mcp_template(tmp_path)
    with FakeLLMServer(default=FakeJudge(ws)) as server:
        done = subprocess.run(
            [sys.executable, str(SCRIPT), str(ws), "--base-url", server.openai_base_url],
            capture_output=True,
            text=True,
            timeout=1500,
            check=False,
            env={"OPENAI_API_KEY": KEY, "PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/")},
        )
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout)
    assert summary["failures"] == []
    assert summary["tools"][:2] == ["status", "history"] and "candidate_status" in summary["structured_tools"]
    assert summary["nonblocking_propose"]["state"] == "running"
    outcome = summary["blocking_propose"]["outcome"]
    runs, exps = ledger_state(ws)
    statuses = sorted(e.status for r in runs for e in exps[r.id] if e.seq > 0)
    # The non-blocking candidate ended with its connection: stopped before it started (nothing recorded) or
    # rolled back (an error on record); the blocking one was decided.
    assert statuses in ([outcome], sorted(["error", outcome])), statuses
    assert_clean(ws)
