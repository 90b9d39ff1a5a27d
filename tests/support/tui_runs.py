"""A real short `judgeloop run` against the fake OpenAI server, for the TUI tests and screenshots.

The fake judge is deterministic and prompt-sensitive: each item has a fixed difficulty, each
enabled instruction-library rule moves the judge's skill up or down by a fixed amount, and the
second replicate of a few borderline items disagrees with the first. So the `library` strategy
finds some edits that help (kept) and some that do not (rolled back), and the ledger holds every
status, flips, unstable items and reasoning text a person would see in a real run.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, tzinfo
from pathlib import Path

import pytest

from optimizer.devset.labels import load_labels
from optimizer.devset.markdown import action_string
from optimizer.devset.split import open_split
from optimizer.ledger import Ledger
from optimizer.workspace.workspace import Workspace
from tests.support.fakeserver import Behaviour, FakeLLMServer, RecordedRequest, Usage, reply


def _unit(*parts: object) -> float:
    """A deterministic number in [0, 1) from the parts."""
    digest = hashlib.sha256("\0".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


@dataclass(frozen=True)
class _Item:
    tid: str
    instruction: str
    actions: tuple[str, ...]
    positive: bool
    mistake_type: str | None


def _rules(system: str) -> list[str]:
    """The bullets under the rubric's "## Additional rules" heading (the enabled library entries)."""
    if "## Additional rules" not in system:
        return []
    tail = system.split("## Additional rules", 1)[1]
    rules = []
    for line in tail.splitlines()[1:]:
        if line.startswith("#"):
            break
        if line.startswith("- "):
            rules.append(line)
    return rules


def prompt_sensitive_judge(
    ws_root: Path, split_name: str = "sample"
) -> Callable[[RecordedRequest], Behaviour]:
    """The fake server's behaviour: a verdict that depends on the item and on the enabled rules."""
    ws = Workspace.open(ws_root)
    split = open_split(ws, split_name)
    labels = load_labels(split)
    items: list[_Item] = []
    for tid in split.ids:
        traj = split.trajectory(tid)
        items.append(
            _Item(
                tid,
                traj.task.instruction.strip(),
                tuple(action_string(s.action) for s in traj.steps),
                labels[tid].is_positive,
                labels[tid].mistake_type,
            )
        )
    counter = {"n": 0}

    def find(text: str) -> _Item:
        candidates = [it for it in items if it.instruction in text] or items
        return max(candidates, key=lambda it: (sum(a in text for a in it.actions), len(it.actions)))

    def texts(content: object) -> str:
        if isinstance(content, str):
            return content
        if isinstance(content, list):  # only the text parts: the images are megabytes of base64
            return "\n".join(
                p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text"
            )
        return ""

    def behave(request: RecordedRequest) -> Behaviour:
        messages = request.body.get("messages", []) if isinstance(request.body, dict) else []
        system = "\n".join(texts(m.get("content")) for m in messages if m.get("role") == "system")
        user = "\n".join(texts(m.get("content")) for m in messages if m.get("role") == "user")
        item = find(user)
        # The rules are in the system prompt (rubric-first) or after the trajectory (trajectory-first).
        skill = 0.65 + sum(0.5 * _unit("rule", r) - 0.1 for r in _rules(system + "\n" + user))
        counter["n"] += 1
        difficulty = _unit("item", item.tid)
        # Items near the skill boundary flip between replicates: the unstable ones.
        jitter = 0.05 * (_unit("rep", item.tid, counter["n"]) - 0.5)
        correct = difficulty + jitter < skill
        success = item.positive if correct else not item.positive
        mistake = None if success else (item.mistake_type or "Critical Mistake")
        confidence = (
            "high"
            if abs(difficulty - skill) > 0.3
            else ("medium" if abs(difficulty - skill) > 0.1 else "low")
        )
        reasoning = (
            f"Checklist: the goal asks to {item.instruction[:60].rstrip('.').lower()}. "
            f"The last action was {item.actions[-1] if item.actions else 'none'}; "
            + (
                "the final screen shows the requested end state."
                if success
                else "the final screen does not show the requested end state."
            )
        )
        verdict = {
            "success": success,
            "reasoning": reasoning,
            "confidence": confidence,
            "mistake_type": mistake,
        }
        return reply(json.dumps(verdict), usage=Usage(input_tokens=12_000, output_tokens=120))

    return behave


def _set_screenshot_policy(ws_root: Path, policy: str) -> None:
    import re

    from optimizer.workspace.workspace import JUDGELOOP_ACTOR, repo_at

    path = ws_root / "prompts" / "judge.toml"
    path.write_text(
        re.sub(r'(?m)^screenshots = "all"$', f'screenshots = "{policy}"', path.read_text()), encoding="utf-8"
    )
    with repo_at(ws_root) as repo:
        repo.index.add(["prompts/judge.toml"])
        repo.index.commit(f"judge: screenshots = {policy}", author=JUDGELOOP_ACTOR, committer=JUDGELOOP_ACTOR)


def _set_loop_futility(ws_root: Path, on: bool) -> None:
    import re

    from optimizer.workspace.workspace import JUDGELOOP_ACTOR, repo_at

    path = ws_root / "judgeloop.toml"
    text, n = re.subn(
        r"(?m)^futility = (true|false)", f"futility = {'true' if on else 'false'}", path.read_text()
    )
    assert n == 1, "judgeloop.toml's [loop] has no futility line"
    path.write_text(text, encoding="utf-8")
    with repo_at(ws_root) as repo:
        if repo.is_dirty(path=str(path)) or str(path.relative_to(ws_root)) in repo.untracked_files:
            repo.index.add([str(path.relative_to(ws_root))])
            repo.index.commit(f"loop: futility = {on}", author=JUDGELOOP_ACTOR, committer=JUDGELOOP_ACTOR)


@dataclass(frozen=True)
class RealRun:
    """How `make_real_run` shapes the workspace and the run (defaults: 3 candidates, 2 replicates, 32 items).

    With ``items``, the run uses split ``mini``: the first ``items`` ids of the sample, imported with
    `judgeloop devset import --manifest` (keeps tests quick; rendering screenshots dominates a run).
    ``screenshots`` other than "all" is committed to the workspace's ``prompts/judge.toml`` first
    (a text-only judge makes the run several times faster; the TUI still shows every screenshot).
    With ``propose_only`` the run is `--propose-only`: it stops with one candidate `waiting` at the
    branch tip for `judgeloop decide`. ``concurrency`` 1 judges one call at a time, in order: the fake
    judge's unstable items depend on the order of calls, so only then are two runs' verdicts the same.
    ``wave`` > 1: `run --wave K`, with patience for every candidate (docs/screenshots/waves.png).
    ``futility``: `[loop] futility` (on by default in a new workspace; off here, so the TUI's fixtures
    show candidates judged in full: tests/loop/test_loop_futility.py covers the screen).
    """

    max_experiments: int = 3
    replicates: int = 2
    items: int | None = 32
    screenshots: str = "all"
    propose_only: bool = False
    concurrency: int = 16
    futility: bool = False
    wave: int = 1


def make_real_run(ws_root: Path, shape: RealRun | None = None) -> int:
    """`judgeloop init --sample` at ``ws_root``, then a real `judgeloop run` against the fake server, shaped
    by ``shape`` (`RealRun`'s defaults when None). Needs OPENAI_API_KEY set (any value). Returns the run's
    exit code.
    """
    from optimizer.cli import main

    s = shape or RealRun()
    assert main(["init", str(ws_root), "--sample"]) == 0
    _set_loop_futility(ws_root, s.futility)
    if s.screenshots != "all":
        _set_screenshot_policy(ws_root, s.screenshots)
    split = "sample"
    if s.items is not None:
        split = "mini"
        ids = (ws_root / "devset" / "sample" / "manifest.txt").read_text().split()[: s.items]
        manifest = ws_root / "experiments" / "mini-manifest.txt"
        manifest.write_text("\n".join(ids) + "\n", encoding="utf-8")
        assert (
            main(
                [
                    "devset",
                    "import",
                    str(ws_root / "devset" / "sample"),
                    "-w",
                    str(ws_root),
                    "--name",
                    split,
                    "--manifest",
                    str(manifest),
                ]
            )
            == 0
        )
    with FakeLLMServer() as server:
        server.default = prompt_sensitive_judge(ws_root, split)
        return main(
            [
                "run",
                "-w",
                str(ws_root),
                "--split",
                split,
                "--provider",
                "openai",
                "--base-url",
                server.openai_base_url,
                "--model",
                "fake-judge",
                "--strategy",
                "library",
                "--max-experiments",
                str(s.max_experiments),
                "--replicates",
                str(s.replicates),
                "--concurrency",
                str(s.concurrency),
                *(["--propose-only"] if s.propose_only else []),
                *(["--wave", str(s.wave), "--patience", str(s.max_experiments)] if s.wave > 1 else []),
            ]
        )


# ---------------------------------------------------------------------------------------------
# The TUI tests' session run (registered in tests/conftest.py): one real short run (init --sample, a 32-item
# split, the library strategy, 5 candidates, 2 replicates) feeds every read-only test; tests that write
# (reviews, runs, STOP) work on a copy.


@pytest.fixture(scope="session")
def run_ws(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A workspace whose ledger holds one real finished run (baseline, rolled-back and kept candidates)."""
    ws = tmp_path_factory.mktemp("tui") / "ws"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("OPENAI_API_KEY", "dummy-key-for-the-fake-server")
        assert make_real_run(ws, RealRun(max_experiments=5, replicates=2, items=32, screenshots="none")) == 0
    return ws


@pytest.fixture
def ws_copy(run_ws: Path, tmp_path: Path) -> Path:
    """A private copy of the run workspace for tests that write (reviews, STOP, runs)."""
    target = tmp_path / "ws"
    shutil.copytree(run_ws, target, symlinks=True)
    return target


def ledger_of(ws: Path) -> Ledger:
    """The workspace's ledger, read-only."""
    return Ledger.open_readonly(ws / "experiments" / "ledger.sqlite")


# ---------------------------------------------------------------------------------------------
# A workspace whose screens are the same on every build (the SVG snapshot tests)

SNAPSHOT_RUN_ID = "20250101-090000-5eed"
SNAPSHOT_CLOCK = datetime(2025, 1, 1, 9, 0, tzinfo=UTC)


def make_snapshot_workspace(ws_root: Path, *, wave: int = 1) -> None:
    """A real run (baseline, kept and rolled-back candidates) and its attribution, built so that every
    screen of it is the same on every machine and every build: judged one call at a time by a fake
    judge whose verdicts depend on the request and not on the calls before it, a fixed run id and git
    dates (so the commits, their ids and the diffs are the same), then the values that come from the
    clock pinned in the ledger (`pin_clock`).

    Why the judge is keyed by request: when an early stop ends an experiment, the next item's first
    call is already in flight or not depending on whether its rendering (a thread) finished before
    the last call returned (`optimizer/evaluation/evaluator.py`, `_Scheduler._worker`: calls in flight
    are not cancelled). `prompt_sensitive_judge` numbers its calls across the whole server, so that
    one call more or less shifted every later replicate's jitter: other verdicts, another rationale,
    another commit id, another attribution, whenever the machine was loaded (as under -n 2).

    ``wave`` > 1: the run judges its candidates in waves of ``wave`` (`run --wave`; the waves' screens)."""
    import sys
    import threading
    from typing import Any

    from optimizer.cli import main
    from optimizer.devset import importer
    from optimizer.ledger import runs as ledger_runs

    module = sys.modules[__name__]
    sensitive = prompt_sensitive_judge  # the module's own, before it is replaced below

    def request_keyed_judge(root: Path, split_name: str = "sample") -> Callable[[RecordedRequest], Behaviour]:
        """`prompt_sensitive_judge` with one call counter per distinct request body: the n-th asking of
        the same request (replicate n of an item under one prompt) gets the same verdict whatever
        was asked before it, so an extra call to another request changes nothing."""
        judges: dict[str, Callable[[RecordedRequest], Any]] = {}
        lock = threading.Lock()  # the fake server answers on its own threads

        def behave(request: RecordedRequest) -> Behaviour:
            key = hashlib.sha256(json.dumps(request.body, sort_keys=True).encode()).hexdigest()
            with lock:
                if key not in judges:
                    judges[key] = sensitive(root, split_name)
                return judges[key](request)

        return behave

    class Frozen(datetime):
        @classmethod
        def now(cls, tz: tzinfo | None = None) -> Frozen:
            return cls.fromtimestamp(SNAPSHOT_CLOCK.timestamp(), tz)

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("OPENAI_API_KEY", "dummy-key-for-the-fake-server")
        for variable in ("GIT_AUTHOR_DATE", "GIT_COMMITTER_DATE"):
            mp.setenv(variable, f"{int(SNAPSHOT_CLOCK.timestamp())} +0000")  # git's own format
        mp.setattr(ledger_runs, "new_run_id", lambda now=None: SNAPSHOT_RUN_ID)  # where start_run looks it up
        mp.setattr(importer, "datetime", Frozen)  # split.json records when it was imported (committed)
        mp.setattr(module, "prompt_sensitive_judge", request_keyed_judge)  # the judge make_real_run serves
        assert (
            make_real_run(
                ws_root,
                RealRun(
                    max_experiments=5, replicates=2, items=32, screenshots="none", concurrency=1, wave=wave
                ),
            )
            == 0
        )
        with FakeLLMServer() as server:
            server.default = request_keyed_judge(ws_root, "mini")
            assert (
                main(
                    [
                        "attribute",
                        "-w",
                        str(ws_root),
                        "--provider",
                        "openai",
                        "--base-url",
                        server.openai_base_url,
                        "--model",
                        "fake-judge",
                        "--concurrency",
                        "1",
                    ]
                )
                == 0
            )
    pin_clock(ws_root / "experiments" / "ledger.sqlite")


def pin_clock(ledger_path: Path) -> None:
    """Replace what the clock put in the ledger: every timestamp (experiment n at 09:0n), every
    duration and the elapsed seconds of the progress events."""
    conn = sqlite3.connect(ledger_path)
    try:
        with conn:
            tables = [row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
            for table in tables:
                columns = {row[1] for row in conn.execute(f"PRAGMA table_info({table})")}
                for column in ("created", "finished", "updated"):
                    if column in columns:
                        minutes = "id" if table == "experiments" else "0"
                        conn.execute(
                            f"UPDATE {table} SET {column} = strftime('%Y-%m-%dT%H:%M:%S+00:00', ?, "
                            f"'+' || {minutes} || ' minutes') WHERE {column} IS NOT NULL",
                            (SNAPSHOT_CLOCK.strftime("%Y-%m-%d %H:%M:%S"),),
                        )
            conn.execute("UPDATE experiments SET duration_s = 42 WHERE duration_s IS NOT NULL")
            conn.execute(
                "UPDATE events SET payload = json_set(payload, '$.elapsed_s', 42) "
                "WHERE json_extract(payload, '$.elapsed_s') IS NOT NULL"
            )
    finally:
        conn.close()  # the last connection checkpoints the WAL: the copy a test makes is whole


if __name__ == "__main__":  # build a demo workspace: python -m tests.support.tui_runs DIR [N]
    import sys

    os.environ.setdefault("OPENAI_API_KEY", "dummy-key-for-the-fake-server")
    sys.exit(
        make_real_run(
            Path(sys.argv[1]), RealRun(max_experiments=int(sys.argv[2]) if len(sys.argv) > 2 else 3)
        )
    )
