#!/usr/bin/env python3
"""A fake coding-agent CLI for the harness-judge tests: reads its sandbox, writes a verdict.

Run as ``fake_harness_cli.py --state STATE [--format claude|text] [PROMPT]`` (the prompt from the
last argument, else stdin), with the sandbox as its working directory. STATE is a folder, or the URL
of a `tests.support.harness_state.StateServer` serving one (a confined CLI sees no folder of the
test; ``DIR/x`` below is the state's entry ``x``). Standard library only (it starts once per item;
run confined, only its own folder and Python are in view). Deterministic by trajectory id (`kind`):

- ``late``: never answers; spawns a child in its process group (its pid logged) and sleeps until
  killed (bounded: it gives up after `LATE_S`);
- ``malformed``: writes ``<id>.json`` that is not a valid verdict (two variants);
- ``message``: writes no file, answers with the verdict as its final message only;
- ``file``: writes the verdict to ``<id>.json`` (and answers with a short text).

Every invocation appends one JSON line to ``DIR/invocations.jsonl``: the id, cwd, argv, environment,
stdin, every file it can see below its cwd (path, size, sha256, and the text of the text files) and
what it reported (cost). The verdict is a function of the sandbox's Markdown, or, when
``DIR/oracle.json`` exists (the loop test), of the id and of which oracle entries the instruction
file (AGENTS.md) contains. ``DIR/no-late`` turns ``late`` items into ``file`` items,
``DIR/well-formed`` ``malformed`` ones; with ``DIR/fail-first`` each item's first run exits 3. While
``DIR/gate`` exists, the item whose id it holds waits (bounded) before answering: a test kills
judgeloop meanwhile. ``DIR/cost`` holds a cost to report instead of `reported_cost`; ``DIR/flood`` a
number of bytes to print on stdout before the answer; ``DIR/big-verdict`` makes the verdict file 2 MB;
``DIR/daemon`` makes every item double-fork a daemon that keeps stdout open and sleeps (its command
line holds STATE, as every process of the fake's does: the tests find survivors by it).
"""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

LATE_S = 120.0
GATE_S = 120.0  # a bound on a gate the test never lifts; a loaded machine can take a minute to lift it
TEXT_SUFFIXES = (".md", ".json", ".txt", ".jsonl", ".csv", ".toml")


def kind(tid: str) -> str:
    """What the fake does for ``tid`` (pure: the tests compute the same)."""
    h = int(hashlib.sha256(tid.encode()).hexdigest(), 16)
    if h % 43 == 3:
        return "late"
    if h % 9 == 2:
        return "malformed"
    if h % 4 == 1:
        return "message"
    return "file"


def reported_cost(tid: str) -> float:
    """The cost the fake reports for ``tid`` in claude format (US dollars)."""
    return (int(hashlib.sha256(tid.encode()).hexdigest()[:4], 16) % 1000 + 1) / 100_000


def _listing(root: Path) -> list[dict[str, Any]]:
    files = []
    for path in sorted(root.rglob("*")):
        if path.is_dir():
            continue
        data = path.read_bytes()
        entry: dict[str, Any] = {
            "path": path.relative_to(root).as_posix(),
            "size": len(data),
            "sha256": hashlib.sha256(data).hexdigest(),
            "symlink": path.is_symlink(),
        }
        if path.suffix in TEXT_SUFFIXES:
            entry["text"] = data.decode("utf-8", errors="replace")
        files.append(entry)
    return files


def _verdict(tid: str, markdown: str, instructions: str, state: Any) -> dict[str, Any]:
    oracle_text = state.read("oracle.json")
    if oracle_text is not None:
        oracle = json.loads(oracle_text)
        enabled = "+".join(sorted(e for e, text in oracle["entries"].items() if text in instructions))
        success, mistake = oracle["answers"][tid][enabled]
    else:
        success = hashlib.sha256(markdown.encode()).digest()[0] % 2 == 0
        mistake = None if success else "Critical Mistake"
    return {
        "success": success,
        "reasoning": f"fake harness judge, {len(instructions)} chars of instructions",
        "confidence": "medium",
        "mistake_type": mistake,
    }


def state_client(where: str) -> Any:
    """The `tests.support.harness_state.StateClient` of ``where`` (imported from this file's folder:
    run as a script, confined, the package is not importable)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    return importlib.import_module("harness_state").StateClient(where)


def sleeper(marker: str) -> list[str]:
    """A process that sleeps `LATE_S`, with ``marker`` in its command line."""
    return [sys.executable, "-c", f"import time; time.sleep({LATE_S})", marker]


def daemonize(argv: list[str]) -> None:
    """Start ``argv`` double-forked in a session of its own (a daemon: its parent gone, stdout kept)."""
    pid = os.fork()
    if pid == 0:
        os.setsid()
        if os.fork() == 0:
            os.execv(argv[0], argv)
        os._exit(0)
    os.waitpid(pid, 0)


def main(argv: list[str]) -> int:
    state = state_client(argv[argv.index("--state") + 1])
    fmt = argv[argv.index("--format") + 1] if "--format" in argv else "text"
    last = argv[-1]
    stdin = "" if last.startswith("Judge one") else sys.stdin.read()
    prompt = last if last.startswith("Judge one") else stdin
    cwd = Path.cwd()
    mds = sorted((cwd / "agenthorizon_md").glob("*.md"))
    tid = mds[0].stem if mds else ""
    record: dict[str, Any] = {
        "id": tid,
        "pid": os.getpid(),
        "cwd": str(cwd),
        "argv": argv,
        "env": dict(os.environ),
        "stdin": stdin,
        "prompt": prompt,
        "files": _listing(cwd),
    }
    what = kind(tid)
    if (what == "late" and state.exists("no-late")) or (what == "malformed" and state.exists("well-formed")):
        what = "file"
    record["kind"] = what
    if state.exists("fail-first") and not state.exists(f"failed-{tid}"):
        state.write(f"failed-{tid}", "")
        record["kind"] = "failed"
        state.append("invocations.jsonl", json.dumps(record) + "\n")
        print("transient failure: upstream 503", file=sys.stderr)
        return 3
    if what == "late":
        child = subprocess.Popen(sleeper(state.where))
        record["child_pid"] = child.pid
    if state.exists("daemon"):
        daemonize(sleeper(state.where))
    state.append("invocations.jsonl", json.dumps(record) + "\n")
    if what == "late":
        time.sleep(LATE_S)
        return 0
    gate = state.read("gate")
    if gate is not None and gate.strip() == tid:
        deadline = time.monotonic() + GATE_S
        while state.exists("gate") and time.monotonic() < deadline:
            time.sleep(0.05)
    flood = int(state.read("flood") or 0)
    if flood:
        while flood > 0:  # junk lines, as a chatty CLI prints
            chunk = min(flood, 1 << 20)
            sys.stdout.write(("x" * 1023 + "\n") * (chunk // 1024) + "y" * (chunk % 1024))
            flood -= chunk
        sys.stdout.write("\n")
    markdown = mds[0].read_text(encoding="utf-8") if mds else ""
    instructions = (cwd / "AGENTS.md").read_text(encoding="utf-8") if (cwd / "AGENTS.md").exists() else ""
    verdict = json.dumps(_verdict(tid, markdown, instructions, state))
    final = "verdict written"
    if what == "malformed":
        bad = (
            '{"success": "yes", "reasoning": 1}'
            if int(hashlib.sha256(tid.encode()).hexdigest(), 16) % 2
            else verdict[: len(verdict) // 2]
        )
        (cwd / f"{tid}.json").write_text(bad, encoding="utf-8")
    elif what == "message":
        final = verdict
    elif state.exists("big-verdict"):
        (cwd / f"{tid}.json").write_text(verdict + " " * 2_000_000, encoding="utf-8")
        final = verdict  # a valid final message: the oversized file must not be replaced by it
    else:
        (cwd / f"{tid}.json").write_text(verdict, encoding="utf-8")
    cost = float(state.read("cost") or reported_cost(tid))
    if fmt == "claude":
        print(
            json.dumps(
                {
                    "type": "result",
                    "result": final,
                    "total_cost_usd": cost,
                    "usage": {
                        "input_tokens": len(markdown) // 4,
                        "output_tokens": len(final) // 4,
                        "cache_read_input_tokens": 7,
                        "cache_creation_input_tokens": 0,
                    },
                    "modelUsage": {"fake-opus": {}},
                }
            )
        )
    else:
        print(final)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
