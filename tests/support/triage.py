"""A small split with planted label errors and a fake judge that is right where the planted labels are
wrong: the label-triage tests and the suspects screenshot (docs/screenshots/README.md)."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest

from optimizer.cli import main
from optimizer.devset.labels import fingerprint, load_labels
from optimizer.devset.split import open_split
from optimizer.workspace.workspace import Workspace
from tests.support.fakeserver import Behaviour, FakeLLMServer, RecordedRequest, server_error, verdict_reply
from tests.support.loop import BAD_ENTRY, GOOD_ENTRY, FakeJudge, commit_all, request_texts, run_loop
from tests.support.scripted import ScriptedStrategy, install, toggle

SPLIT = "small"


def labels_file(ws: Path) -> Path:
    return ws / "devset" / SPLIT / "labels.jsonl"


def corrections_file(ws: Path) -> Path:
    return ws / "devset" / SPLIT / "corrections.jsonl"


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """``judgeloop ARGV`` in-process: its exit code, stdout and stderr (captured with pytest's capsys)."""
    capsys.readouterr()
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def report_dict(ws: Path, capsys: pytest.CaptureFixture[str], *extra: str) -> dict[str, Any]:
    """``judgeloop report --json`` on ``ws``, parsed; fails the test (with its stderr) if it exits non-zero."""
    code, out, err = run_cli(capsys, "report", "-w", str(ws), "--json", *extra)
    assert code == 0, err
    return dict(json.loads(out))


def flip(line: dict[str, Any]) -> dict[str, Any]:
    if line["label"] == "positive":
        return {
            **line,
            "label": "negative",
            "mistake_type": "Critical Mistake",
            "negative_source": "parent_instruction_child_trajectory",
        }
    return {**line, "label": "positive", "mistake_type": None, "negative_source": None}


class TriageJudge:
    """Knows the true labels (the split's before errors were planted). Right, with high confidence, on
    the planted items (so against their planted label); always wrong with medium confidence on the
    ``medium`` items, always wrong with low confidence on the ``low`` ones; wrong with high confidence
    on the first asking of each ``split`` item's request only (half its judgements); right elsewhere."""

    def __init__(self, ws: Path, planted: set[str], medium: set[str], low: set[str], split: set[str]) -> None:
        self.finder = FakeJudge(ws)  # its labels are read now: the truth
        self.truth = dict(self.finder.labels)
        self.planted, self.medium, self.low, self.split = planted, medium, low, split
        self.asked: dict[str, int] = {}
        self.on_first_call: Any = None
        self.lock = threading.Lock()  # the fake server answers on its own threads

    def __call__(self, request: RecordedRequest) -> Behaviour:
        if not isinstance(request.body, dict):
            return server_error(500)
        with self.lock:
            hook, self.on_first_call = self.on_first_call, None
            if hook is not None:
                hook()
            _system, user = request_texts(request.body)
            tid = self.finder.trajectory_of(user)
            truth = self.truth[tid].is_positive
            key = json.dumps(request.body, sort_keys=True)
            self.asked[key] = self.asked.get(key, 0) + 1
            first = self.asked[key] == 1
        confidence, success = "high", truth
        if tid in self.medium:
            confidence, success = "medium", not truth
        elif tid in self.low:
            confidence, success = "low", not truth
        elif tid in self.split and first:
            success = not truth
        return verdict_reply(
            {
                "success": success,
                "reasoning": "triage fake",
                "confidence": confidence,
                "mistake_type": None if success else "Critical Mistake",
            }
        )


def plant(ws: Path, judge_ids: list[str], n: int = 3) -> list[str]:
    """Flip the labels of ``n`` items (two positives and a negative) in labels.jsonl, committed."""
    lines = [json.loads(x) for x in labels_file(ws).read_text(encoding="utf-8").splitlines() if x.strip()]
    positives = [
        x["trajectory_id"] for x in lines if x["label"] == "positive" and x["trajectory_id"] in judge_ids
    ]
    negatives = [
        x["trajectory_id"] for x in lines if x["label"] == "negative" and x["trajectory_id"] in judge_ids
    ]
    planted = [*positives[: n - 1], negatives[0]]
    labels_file(ws).write_text(
        "".join(json.dumps(flip(x) if x["trajectory_id"] in planted else x) + "\n" for x in lines),
        encoding="utf-8",
    )
    # As if imported so: split.json's fingerprint is over the labels (`judgeloop devset verify` checks it).
    meta_path = ws / "devset" / SPLIT / "split.json"
    meta = json.loads(meta_path.read_text(encoding="utf-8"))
    meta["fingerprint"] = fingerprint(load_labels(open_split(Workspace.open(ws), SPLIT)).values())
    meta_path.write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
    commit_all(ws, "labels with three planted errors")
    return planted


def setup_triage(ws: Path) -> tuple[TriageJudge, list[str], list[str], list[str], list[str]]:
    """The judge (knowing the true labels), then three label errors planted: (judge, planted, medium,
    low, split) — the item sets `TriageJudge` describes."""
    ids = sorted(open_split(Workspace.open(ws), SPLIT).ids)
    medium, low, split = ids[-3:], ids[-5:-3], ids[-7:-5]
    judge = TriageJudge(ws, set(), set(medium), set(low), set(split))
    planted = plant(ws, ids[:-7])
    judge.planted = set(planted)
    return judge, planted, medium, low, split


def triage_runs(ws: Path, server: FakeLLMServer, monkeypatch: pytest.MonkeyPatch, steps: int = 3) -> None:
    """A run of ``steps`` candidates, each another prompt version (toggles of the library)."""
    install(
        monkeypatch, ScriptedStrategy([toggle(GOOD_ENTRY), toggle(BAD_ENTRY), toggle(GOOD_ENTRY, BAD_ENTRY)])
    )
    assert (
        run_loop(
            ws,
            server.openai_base_url,
            "--max-experiments",
            str(steps),
            "--replicates",
            "2",
            "--policy",
            "literal",
        )
        == 0
    )


def build(target: Path) -> list[str]:
    """The suspects screenshot's workspace at ``target``/ws: the small split with three planted errors,
    a run of three candidates judged by `TriageJudge`, and one planted error corrected by hand. Returns
    the planted ids."""
    from optimizer.cli import main
    from tests.support.loop import add_small_dev_split, make_workspace

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("OPENAI_API_KEY", "sk-test-not-a-real-key")
        root = make_workspace(target)
        add_small_dev_split(root)
        judge, planted, *_ = setup_triage(root)
        with FakeLLMServer(default=judge) as server:
            triage_runs(root, server, mp)
        right = "success" if judge.truth[planted[0]].is_positive else "failure"
        assert (
            main(
                [
                    "label-fix",
                    "-w",
                    str(root),
                    planted[0],
                    "--label",
                    right,
                    "--reason",
                    "the last screenshot shows the file saved",
                    "--by",
                    "reviewer",
                ]
            )
            == 0
        )
    return planted


if __name__ == "__main__":  # python -m tests.support.triage DIR
    import sys

    build(Path(sys.argv[1]))
