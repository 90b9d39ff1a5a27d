"""How long `judgeloop mcp`'s reading tools take once the baseline is evaluated (issue 32, point 7).

Builds the MCP tests' workspace (the 32-item dev split ``small``), opens a session in process, evaluates
the baseline through the real OpenAI SDK against the fake judge server (127.0.0.1), then times N
``read_steps`` calls (and a few ``disagreements``) on the session's own methods: the per-call cost the MCP
server adds to the stdio round trip.

Usage: .venv/bin/python benchmarks/mcp_reads.py [--calls 2000]
Prints figures; asserts nothing about time.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

import anyio

from optimizer.mcp.session import SessionOptions, open_session
from optimizer.workspace.config import JudgeOverrides
from optimizer.workspace.workspace import Workspace
from tests.support.fakeserver import FakeLLMServer
from tests.support.loop import FakeJudge
from tests.support.mcp_client import KEY
from tests.support.mcp_workspace import make_mcp_template


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    args = parser.parse_args()
    os.environ["OPENAI_API_KEY"] = KEY
    with tempfile.TemporaryDirectory() as tmp:
        root = make_mcp_template(Path(tmp))
        ws = Workspace.open(root)
        with FakeLLMServer(default=FakeJudge(root)) as server:
            options = SessionOptions(
                budget_usd=100,
                judge=JudgeOverrides(
                    provider="openai", model="fake-judge", base_url=server.openai_base_url, concurrency=8
                ),
            )
            with open_session(ws, options) as session:
                listing = anyio.run(session.disagreements, {})
                assert not listing.is_error, listing.text
                tid = session.split.ids[0]
                per_call: list[float] = []
                started = time.perf_counter()
                for _ in range(args.calls):
                    t0 = time.perf_counter()
                    out = session.read_steps({"trajectory_id": tid, "start": 0, "end": 3})
                    per_call.append(time.perf_counter() - t0)
                    assert not out.is_error, out.text
                total = time.perf_counter() - started
                builds = session.context_builds
                anyio.run(session.aclose)
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}")
    print(
        f"{args.calls} read_steps calls after the baseline: {total:.2f} s in all, "
        f"median {statistics.median(per_call) * 1000:.2f} ms, max {max(per_call) * 1000:.1f} ms per call; "
        f"the reading context was built {builds} time(s)"
    )


if __name__ == "__main__":
    main()
