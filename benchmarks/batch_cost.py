"""Direct calls vs batch evaluation (`--batch`) on a 162-item split through the fake server, both wires.

For each wire (Anthropic Messages + Message Batches; OpenAI Chat Completions + Batch API with a JSONL
input file), through the real SDKs against tests/fakeserver.py in this process:

1. a direct evaluation of 162 items (one replicate), from an empty judge cache;
2. the same evaluation with the cache emptied again, as one batch (`evaluate_items(batch=...)`);
3. a direct evaluation after the batch: every call must come from the cache (same cache keys).

The fake judge's verdict is a deterministic function of the request body, and every call reports the
same usage (33,000 uncached input tokens and 150 output tokens: a 100-screenshot AH-D item), so the
billed figures are the price table's: a batch bills every token at half price. Prints, per wire: calls
sent, batches created, billed dollars and whether the verdict files are identical.

Run:  .venv/bin/python benchmarks/batch_cost.py [--n 162]
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import math
import os
import platform
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from optimizer.config import JudgeSection  # noqa: E402
from optimizer.devset.importer import import_split  # noqa: E402
from optimizer.evaluation.batch import BatchOptions  # noqa: E402
from optimizer.evaluation.evaluator import evaluate_items  # noqa: E402
from optimizer.evaluation.files import write_results  # noqa: E402
from optimizer.evaluation.results import EvalRun  # noqa: E402
from optimizer.judge.prompts import PromptSet  # noqa: E402
from optimizer.scaffold import init_workspace  # noqa: E402
from optimizer.workspace import Workspace  # noqa: E402
from tests.data_helpers import make_items, write_release  # noqa: E402
from tests.fakeserver import FakeLLMServer, RecordedRequest, Usage, reply  # noqa: E402

MODELS = {"anthropic": "claude-sonnet-4-5", "openai": "gpt-4o"}
USAGE = Usage(input_tokens=33_000, output_tokens=150)


def fake_judge(request: RecordedRequest) -> Any:
    """A verdict that depends only on the request body (so direct and batch calls agree)."""
    digest = hashlib.sha256(json.dumps(request.body, sort_keys=True).encode()).digest()
    success = digest[0] % 2 == 0
    verdict = {"success": success, "reasoning": f"fake verdict {digest[:4].hex()}", "confidence": "medium",
               "mistake_type": None if success else "Critical Mistake"}
    return reply(json.dumps(verdict), usage=USAGE)


def verdicts(out: Path) -> dict[str, Any]:
    """The verdict files without what differs by design (cost, duration, cached flags)."""
    found = {}
    for path in sorted(out.glob("*.json")):
        if path.name == "_summary.json":
            continue
        body = json.loads(path.read_text())
        for meta in (body["_meta"], *body["_meta"]["replicates"]):
            for key in ("cost_usd", "duration_s", "cached"):
                meta.pop(key, None)
        found[path.name] = body
    return found


def evaluate(ws: Workspace, wire: str, server: FakeLLMServer, ids: list[str], *, batch: bool) -> EvalRun:
    url = server.anthropic_base_url if wire == "anthropic" else server.openai_base_url
    judge = JudgeSection(provider=wire, model=MODELS[wire], base_url=url, max_concurrency=16)  # type: ignore[arg-type]
    from optimizer.devset.split import open_split

    split = open_split(ws, "bench")
    return asyncio.run(evaluate_items(
        ws, split, PromptSet.from_dir(ws.prompts_dir), judge, item_ids=ids, replicates=1,
        batch=BatchOptions(poll_s=0.02, poll_max_s=0.1) if batch else None,
    ))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=162)
    args = parser.parse_args()
    os.environ.setdefault("ANTHROPIC_API_KEY", "sk-bench-not-a-key")
    os.environ.setdefault("OPENAI_API_KEY", "sk-bench-not-a-key")
    print(f"machine: {platform.machine()} {platform.system()}, nproc={os.cpu_count()}, "
          f"Python {platform.python_version()}; load average {[round(x, 2) for x in os.getloadavg()]}")
    print(f"{args.n} items x 1 replicate; every call billed as {USAGE.input_tokens:,} input + "
          f"{USAGE.output_tokens} output tokens\n")
    header = f"{'wire':<10} {'mode':<7} {'calls':>6} {'batches':>8} {'billed $':>10} {'then direct: calls':>19}  verdicts"
    print(header)
    print("-" * len(header))
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        items = make_items(math.ceil(args.n / 4))
        for i, item in enumerate(items):
            item.instruction = f"{item.instruction} (benchmark task {i})"
        release = write_release(tmp / "release", items)
        for wire in ("anthropic", "openai"):
            ws = init_workspace(tmp / f"ws-{wire}")
            split = import_split(ws, release.root, "bench", all_items=True, warn=lambda _msg: None)
            ids = list(split.ids)[: args.n]
            with FakeLLMServer(default=fake_judge, batch_polls=2, keep_alive=True) as server:
                direct = evaluate(ws, wire, server, ids, batch=False)
                direct_calls = len(server.inference_requests())
                write_results(tmp / f"{wire}-direct", direct)
                ws.cache_path.unlink()
                batched = evaluate(ws, wire, server, ids, batch=True)
                batch_calls = len(server.inference_requests()) - direct_calls
                write_results(tmp / f"{wire}-batch", batched)
                after = evaluate(ws, wire, server, ids, batch=False)
                same = verdicts(tmp / f"{wire}-direct") == verdicts(tmp / f"{wire}-batch")
                print(f"{wire:<10} {'direct':<7} {direct_calls:>6} {'-':>8} {direct.cost_usd:>10.4f} {'':>19}")
                print(f"{wire:<10} {'batch':<7} {batch_calls:>6} {len(server.batch_creations):>8} "
                      f"{batched.cost_usd:>10.4f} {after.calls_made:>19}  {'identical' if same else 'DIFFERENT'}")
                print(f"{'':<10} batch / direct billed: {batched.cost_usd / direct.cost_usd:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
