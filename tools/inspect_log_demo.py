"""Write the Inspect AI log shown on docs/integrations/inspect.md: ``python -m tools.inspect_log_demo DIR``.

In ``DIR/ws``: ``judgeloop init --sample``, a text-only judge (``screenshots = "none"`` committed to
prompts/judge.toml, so the pass takes seconds), then ``judgeloop eval --inspect-log DIR/logs/sample.eval``
on the sample split against the test suite's fake OpenAI server (tests/support/fakeserver.py) playing the
prompt-sensitive judge of tests/support/tui_runs.py: no key, no network, some verdicts agree with their
label and some do not. ``--limit N`` judges only the first N items. Open the log with
``inspect view --log-dir DIR/logs``.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from tools.configedit import set_judge_settings

# Any value: the fake server accepts every key, and nothing is sent beyond 127.0.0.1.
DEMO_KEY = "demo-key-not-a-secret"
LOG_NAME = "sample.eval"


def write_demo_log(out_dir: Path, limit: int | None = None) -> Path:
    """Build the workspace in ``out_dir/ws`` and write the pass's log; returns the log's path."""
    from optimizer.cli import main
    from tests.support.fakeserver import FakeLLMServer
    from tests.support.tui_runs import prompt_sensitive_judge

    ws, log = out_dir / "ws", out_dir / "logs" / LOG_NAME
    if main(["init", str(ws), "--sample"]) != 0:
        raise SystemExit(f"inspect_log_demo: `judgeloop init --sample {ws}` failed (see above)")
    set_judge_settings(
        ws, {"screenshots": "none"}, message="demo: a text-only judge (tools/inspect_log_demo.py)"
    )
    os.environ.setdefault("OPENAI_API_KEY", DEMO_KEY)
    with FakeLLMServer() as server:
        server.default = prompt_sensitive_judge(ws)
        argv = ["eval", "-w", str(ws), "--split", "sample", "--provider", "openai", "--model", "gpt-4o-mini"]
        argv += ["--base-url", server.openai_base_url, "--inspect-log", str(log)]
        argv += ["--limit", str(limit)] if limit is not None else []
        if main(argv) != 0:
            raise SystemExit("inspect_log_demo: `judgeloop eval` failed (see above)")
    return log


def run(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tools.inspect_log_demo", description=__doc__.split("\n")[0]
    )
    parser.add_argument(
        "out_dir", type=Path, help="an empty or missing folder (the workspace and logs/ go here)"
    )
    parser.add_argument("--limit", type=int, default=None, help="judge only the first N items (default: all)")
    args = parser.parse_args(argv)
    if args.out_dir.exists() and any(args.out_dir.iterdir()):
        print(f"inspect_log_demo: {args.out_dir} is not empty; name a new folder", file=sys.stderr)
        return 2
    log = write_demo_log(args.out_dir, args.limit)
    print(f"wrote {log}\nopen it: inspect view --log-dir {log.parent}")
    return 0


if __name__ == "__main__":
    sys.exit(run(sys.argv[1:]))
