"""Helpers for the auto-research loop tests: fresh sample workspaces and a deterministic fake judge.

The fake judge is a pure function of the request: it finds the trajectory from the user message
(goal + recorded actions) and the enabled library entries from the system prompt, and answers
from a fixed table. The *test* builds that table from the labels (``optimizer.devset.load_labels``);
the loop and the judge code under test never see it, they only see verdicts over HTTP.
"""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from optimizer.cli import main
from optimizer.devset.labels import load_labels
from optimizer.devset.markdown import action_string
from optimizer.devset.split import open_split
from optimizer.judge.prompts import LIBRARY_MD, parse_library
from optimizer.models import Label
from optimizer.workspace.workspace import Workspace
from tests.support.fakeserver import Behaviour, FakeLLMServer, RecordedRequest, server_error, verdict_reply
from tests.support.waits import EVENT_WAIT_S

GIT = ["git", "-c", "user.name=test", "-c", "user.email=test@localhost"]

# Library entries with a scripted effect on the fake judge (see FakeJudge).
GOOD_ENTRY = "lib-typed-text-exact"  # fixes false positives, touches nothing else: must be kept
BAD_ENTRY = "lib-save-and-confirm"  # fixes every false negative, adds false positives: FPR rises


_T = TypeVar("_T")


def present(value: _T | None) -> _T:
    """``value``, which the test expects to be there (a ledger field, a file at a revision): fails if None."""
    assert value is not None
    return value


def git(root: Path, *args: str) -> str:
    """Run git in ``root`` and return stdout (raises on failure)."""
    return subprocess.run([*GIT, *args], cwd=root, check=True, capture_output=True, text=True).stdout


def commit_all(root: Path, message: str) -> None:
    """Commit every change in the workspace (tests only; the workspace is a tmp repo)."""
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", message)


def futility_off(root: Path) -> None:
    """``[loop] futility = false``, committed: for tests of the adaptive policy judging a candidate in full."""
    set_toml_key(root, "loop", "futility", "false")
    commit_all(root, "futility off")


def make_workspace(
    tmp_path: Path, *, toml_extra: str = "", judge_toml: Mapping[str, str] | None = None
) -> Path:
    """``judgeloop init --sample`` in a fresh dir; text-only judge requests (fast); extra TOML appended;
    everything committed so the tree is clean."""
    root = tmp_path / "ws"
    assert main(["init", str(root), "--sample"]) == 0
    settings = {"screenshots": '"none"', **(judge_toml or {})}
    text = (root / "prompts" / "judge.toml").read_text(encoding="utf-8")
    for key, value in settings.items():
        text, n = re.subn(rf"(?m)^{key} = .*$", f"{key} = {value}", text)
        if n == 0:
            text += f"\n{key} = {value}\n"
    (root / "prompts" / "judge.toml").write_text(text, encoding="utf-8")
    if toml_extra:
        cfg = root / "judgeloop.toml"
        cfg.write_text(cfg.read_text(encoding="utf-8") + "\n" + toml_extra, encoding="utf-8")
    # Infrastructure errors are judged again (2 rounds) without the 10 s / 20 s pauses of a real run.
    set_toml_key(root, "loop", "infra_retry_pause_s", "0.01")
    commit_all(root, "test setup")
    return root


def add_small_dev_split(root: Path, per_class: int = 16) -> list[str]:
    """Import ``per_class`` positives and negatives of the sample as split ``small`` and make it the
    dev split (committed). Most loop tests use it: the mechanics are the same, the runs 3x shorter."""
    from optimizer.scaffold import bundled_dir

    labels = load_labels(open_split(Workspace.open(root), "sample"))
    positives = [t for t, lab in labels.items() if lab.is_positive][:per_class]
    negatives = [t for t, lab in labels.items() if not lab.is_positive][:per_class]
    ids = sorted(positives + negatives)
    manifest = root / "small.txt"
    manifest.write_text("\n".join(ids) + "\n", encoding="utf-8")
    assert (
        main(
            [
                "devset",
                "import",
                str(bundled_dir() / "devset" / "sample"),
                "-w",
                str(root),
                "--name",
                "small",
                "--manifest",
                str(manifest),
                "--link",
            ]
        )
        == 0
    )
    manifest.unlink()
    set_toml_key(root, "workspace", "dev_split", '"small"')
    commit_all(root, "small dev split")
    git(root, "gc", "-q")  # hundreds of loose objects -> one pack: every test copies this workspace
    return ids


def set_toml_key(root: Path, section: str, key: str, value: str) -> None:
    """Replace ``key = ...`` inside ``[section]`` of judgeloop.toml (the key must exist there)."""
    path = root / "judgeloop.toml"
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    current = None
    for i, line in enumerate(lines):
        m = re.match(r"^\[([^\]]+)\]", line)
        if m:
            current = m.group(1)
        elif current == section and re.match(rf"^{key}\s*=", line):
            lines[i] = f"{key} = {value}\n"
            path.write_text("".join(lines), encoding="utf-8")
            return
    raise AssertionError(f"no {key} in [{section}]")


def labels_of(root: Path) -> dict[str, Label]:
    """The dev split's labels (for the test's expectations and the fake judge's answer table)."""
    ws = Workspace.open(root)
    return load_labels(open_split(ws, ws.config.workspace.dev_split))


def _item_key(goal: str, actions: Iterable[str]) -> str:
    return hashlib.sha256(json.dumps([goal.strip(), list(actions)]).encode()).hexdigest()


_GOAL_RE = re.compile(r"## Goal\n\n(.*?)\n\n## Steps", re.S)
_ACTION_RE = re.compile(r"\*\*Action:\*\* `(.*)`")


def request_texts(body: Any) -> tuple[str, str]:
    """(system prompt, concatenated user text) of an OpenAI chat-completions request body."""
    system = ""
    user: list[str] = []
    for message in body.get("messages", []):
        content = message.get("content")
        parts = [content] if isinstance(content, str) else [p.get("text") or "" for p in content or []]
        if message.get("role") == "system":
            system += "".join(parts)
        elif message.get("role") == "user":
            user.extend(parts)
    return system, "".join(user)


@dataclass
class FakeJudge:
    """A deterministic judge: answers from the trajectory and the enabled library entries.

    Within the dev split, items of each class are ranked by sha256 of their id. Without a scripted
    entry, the first ``base_neg`` (a fraction) of the negatives and the first ``base_pos`` of the
    positives are judged correctly, the rest wrongly. ``GOOD_ENTRY`` in the system prompt makes the
    next ``good_fixes_neg`` of the negatives correct too (FPR falls, nothing else moves).
    ``BAD_ENTRY`` makes every positive correct and turns the last ``bad_breaks_neg`` correctly
    judged negatives into false positives (kappa rises, and so does FPR). Items of other splits
    are answered correctly when their hash is even. Every other entry changes nothing.
    """

    root: Path
    base_neg: float = 0.55
    base_pos: float = 0.7
    good_fixes_neg: float = 0.25
    bad_breaks_neg: float = 0.15
    delay_s: float = 0.0
    answered: list[str] = field(default_factory=list)  # body digests answered (in order)
    fail_after: int | None = None  # answer 500 to every call after this many answers
    gate_after: int | None = None  # block every call after this many answers until `gate` is set
    abandon_gated: bool = False  # calls released from the gate get a 500 and are not recorded

    def __post_init__(self) -> None:
        ws = Workspace.open(self.root)
        self.labels: dict[str, Label] = {}
        self.by_key: dict[str, str] = {}
        for manifest in sorted((self.root / "devset").glob("*/manifest.txt")):
            split = open_split(ws, manifest.parent.name)
            self.labels.update(load_labels(split))
            for tid in split.ids:
                traj = split.trajectory(tid)
                key = _item_key(traj.task.instruction, [action_string(s.action) for s in traj.steps])
                assert self.by_key.setdefault(key, tid) == tid, "two items render identically"
        library = parse_library((self.root / LIBRARY_MD).read_text(encoding="utf-8"))
        self.entry_text = {e.id: e.text for e in library}
        dev = open_split(ws, ws.config.workspace.dev_split).ids
        rank = sorted(dev, key=lambda t: hashlib.sha256(t.encode()).hexdigest())
        negatives = [t for t in rank if not self.labels[t].is_positive]
        positives = [t for t in rank if self.labels[t].is_positive]
        self.neg_rank = {t: i for i, t in enumerate(negatives)}
        self.pos_rank = {t: i for i, t in enumerate(positives)}
        n_neg, n_pos = len(negatives), len(positives)
        self.limits = {
            "base_neg": round(self.base_neg * n_neg),
            "base_pos": round(self.base_pos * n_pos),
            "good": round(self.good_fixes_neg * n_neg),
            "bad": round(self.bad_breaks_neg * n_neg),
        }
        self.lock = threading.Lock()
        self.gate = threading.Event()
        self.admitted = 0

    # -- the answer table (pure) ----------------------------------------------------------------

    def correct(self, tid: str, enabled: set[str]) -> bool:
        """Whether the judge answers ``tid`` correctly with these library entries in its prompt."""
        lim = self.limits
        if tid in self.neg_rank:
            limit = lim["base_neg"] + (lim["good"] if GOOD_ENTRY in enabled else 0)
            if BAD_ENTRY in enabled:
                limit -= lim["bad"]
            return self.neg_rank[tid] < limit
        if tid in self.pos_rank:
            return BAD_ENTRY in enabled or self.pos_rank[tid] < lim["base_pos"]
        return hashlib.sha256(tid.encode()).digest()[0] % 2 == 0

    def enabled_in(self, system: str) -> set[str]:
        return {eid for eid, text in self.entry_text.items() if text in system}

    def trajectory_of(self, user_text: str) -> str:
        m = _GOAL_RE.search(user_text)
        assert m, "no goal in the user message"
        return self.by_key[_item_key(m.group(1), _ACTION_RE.findall(user_text))]

    # -- the server's default behaviour ---------------------------------------------------------

    def __call__(self, request: RecordedRequest) -> Behaviour:
        if not isinstance(request.body, dict):  # the client gave up mid-send (an early stop)
            return server_error(500)
        system, user = request_texts(request.body)
        with self.lock:  # admit atomically, so exactly `gate_after` calls pass the gate
            gated = self.gate_after is not None and self.admitted >= self.gate_after
            self.admitted += 0 if gated else 1
            n = len(self.answered)
        if gated:
            # Held calls belong to a process the test kills; one the test never released (a loaded machine
            # slower than the test's checks) is abandoned too, never answered as if it had been delivered.
            released = self.gate.wait(timeout=60)
            if self.abandon_gated or not released:
                return server_error(500)
        if self.fail_after is not None and n >= self.fail_after:
            return server_error(500)
        if self.delay_s:
            time.sleep(self.delay_s)
        tid = self.trajectory_of(user)
        label = self.labels[tid]
        # The rubric is the system prompt (rubric-first) or follows the trajectory (trajectory-first).
        ok = self.correct(tid, self.enabled_in(system + user))
        success = label.is_positive if ok else not label.is_positive
        verdict = {
            "success": success,
            "reasoning": f"fake judge on {len(system)} chars of rubric",
            "confidence": "medium",
            "mistake_type": None if success else (label.mistake_type or "Critical Mistake"),
        }
        with self.lock:
            self.answered.append(body_digest(request.body))
        return verdict_reply(verdict)


def body_digest(body: Any) -> str:
    """A stable digest of a request body (what the cache keys a call by, plus the wire details)."""
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def stop_after_baseline() -> Any:
    """A context manager: while it is active, a run creates ``experiments/STOP`` right after its baseline,
    as a person would during the run (a STOP older than the run is removed, not obeyed)."""
    from unittest import mock

    from optimizer.loop.runner import LoopRunner

    original = LoopRunner.baseline

    async def baseline(self: LoopRunner, *args: Any, **kwargs: Any) -> Any:
        exp = await original(self, *args, **kwargs)
        self.ws.stop_path.write_text("", encoding="utf-8")
        return exp

    return mock.patch.object(LoopRunner, "baseline", baseline)


def judge_args(command: str, root: Path, server_url: str, *extra: str) -> list[str]:
    """The arguments of ``judgeloop COMMAND`` on workspace ``root`` judged by the fake server (OpenAI wire,
    fake-judge), then ``extra``."""
    return [
        command,
        "-w",
        str(root),
        "--provider",
        "openai",
        "--base-url",
        server_url,
        "--model",
        "fake-judge",
        *extra,
    ]


def run_args(root: Path, server_url: str, *extra: str, concurrency: str | None = "8") -> list[str]:
    """`judge_args` of ``judgeloop run`` (with ``--concurrency`` unless None), then ``extra``: for
    `run_loop` and for a run in a child process (`killed_cli`)."""
    parallel = ["--concurrency", concurrency] if concurrency is not None else []
    return judge_args("run", root, server_url, *parallel, *extra)


def run_loop(root: Path, server_url: str, *extra: str) -> int:
    """``judgeloop run`` in-process against the fake server (OpenAI wire, fake-judge, concurrency 8)."""
    return main(run_args(root, server_url, *extra))


def judge_eval(root: Path, out: Path, *extra: str) -> tuple[int, list[RecordedRequest]]:
    """``judgeloop eval`` in-process against a fresh fake server answering as `FakeJudge` (OpenAI wire,
    fake-judge), verdicts to ``out``: its exit code and the inference requests it sent."""
    with FakeLLMServer(default=FakeJudge(root)) as server:
        code = main(judge_args("eval", root, server.openai_base_url, "--out", str(out), *extra))
        return code, server.inference_requests()


def report_json(root: Path, capsys: Any, *extra: str) -> dict[str, Any]:
    """``judgeloop report --json`` parsed (stdout captured with pytest's capsys)."""
    capsys.readouterr()
    assert main(["report", "-w", str(root), "--json", *extra]) == 0
    return json.loads(capsys.readouterr().out)


def wait_for(condition: Callable[[], bool], what: str, timeout_s: float = EVENT_WAIT_S) -> None:
    """Poll ``condition`` every 20 ms, returning as soon as it holds; fail naming ``what`` if it still does
    not after ``timeout_s`` seconds (`EVENT_WAIT_S`: an upper bound for a loaded machine, not an expectation)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")
