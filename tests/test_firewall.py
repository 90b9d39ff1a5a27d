"""The label firewall at run time: judging a split never imports the labels module, the ledger or
the scorer, and never opens a labels file. (The import-linter contract in pyproject.toml proves the
same statically for every import path; this proves it for what actually runs, paths included.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.evaluation import MODEL, make_data
from tests.support.fakeserver import FakeLLMServer

REPO = Path(__file__).resolve().parents[1]

# Runs in a fresh interpreter: an audit hook records every file opened while the judge-input side
# is imported and a whole split is judged through the real OpenAI SDK against the fake server.
JUDGE_A_SPLIT = r"""
import asyncio, json, sys
opened = []
sys.addaudithook(lambda event, args: opened.append(str(args[0])) if event == "open" and args and isinstance(args[0], (str, bytes, __import__("os").PathLike)) else None)

from optimizer.workspace.config import JudgeSection
from optimizer.devset.split import open_split
from optimizer.evaluation.evaluator import evaluate_items
from optimizer.judge.prompts import PromptSet
from optimizer.workspace.workspace import Workspace

root, base_url, model = sys.argv[1:4]
ws = Workspace.open(root)
split = open_split(ws, "tiny")
judge = JudgeSection(provider="openai", model=model, base_url=base_url, max_retries=0, timeout_s=10)
run = asyncio.run(evaluate_items(ws, split, PromptSet.from_dir(ws.prompts_dir), judge,
                                 item_ids=split.ids, replicates=2))
print(json.dumps({
    "answered": sum(1 for item in run.items if item.answer.status == "ok"),
    "items": len(split.ids),
    "labels_files_opened": [p for p in opened if p.endswith(".jsonl")],
    "files_opened": len(opened),
    "modules": sorted(m for m in sys.modules if m.startswith("optimizer.")),
}))
"""


@pytest.mark.boundary
def test_judging_a_split_never_imports_or_opens_the_labels(tmp_path: Path) -> None:
    data = make_data(tmp_path)
    assert (data.split.root / "labels.jsonl").is_file()  # the labels are there to be (not) read
    env = {**os.environ, "OPENAI_API_KEY": "sk-test-firewall"}
    with FakeLLMServer() as server:
        done = subprocess.run(
            [sys.executable, "-c", JUDGE_A_SPLIT, str(data.ws.root), server.openai_base_url, MODEL],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        calls = len(server.inference_requests())
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["answered"] == seen["items"] == len(data.split.ids) and calls == 2 * len(data.split.ids)
    assert seen["files_opened"] > len(data.split.ids)  # the hook saw the judge input being read
    assert seen["labels_files_opened"] == []
    assert "optimizer.devset.split" in seen["modules"] and "optimizer.judge.render" in seen["modules"]
    for forbidden in (
        "optimizer.devset.labels",
        "optimizer.devset.corrections",
        "optimizer.answers.triage",
        "optimizer.ledger",
        "optimizer.answers.scoring",
        "optimizer.cli",
    ):
        assert forbidden not in seen["modules"]


@pytest.mark.boundary
def test_judging_with_memory_and_folds_never_imports_or_opens_the_labels(tmp_path: Path) -> None:
    """The memory's folds pair items from ids, instructions and screenshot folders, never from the labels
    (which is where the release records pairs): the same audit, with memory = "retrieve" and a case per item."""
    from tests.support.config import write_config

    data = make_data(tmp_path)
    cfg = data.ws.config
    write_config(
        data.ws.root,
        cfg.model_copy(update={"workspace": cfg.workspace.model_copy(update={"dev_split": "tiny"})}),
    )
    prompts = data.ws.prompts_dir
    (prompts / "judge.toml").write_text(
        (prompts / "judge.toml")
        .read_text()
        .replace('memory = "off"', 'memory = "retrieve"')
        .replace("memory_folds = 5", "memory_folds = 2")
    )
    (prompts / "memory").mkdir()
    (prompts / "memory" / "cases.jsonl").write_text(
        "".join(
            json.dumps({"id": f"c{i}", "text": "Save the report of the pair", "source_items": [tid]}) + "\n"
            for i, tid in enumerate(data.split.ids)
        )
    )
    env = {**os.environ, "OPENAI_API_KEY": "sk-test-firewall"}
    with FakeLLMServer() as server:
        done = subprocess.run(
            [sys.executable, "-c", JUDGE_A_SPLIT, str(data.ws.root), server.openai_base_url, MODEL],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        bodies = [json.dumps(r.body) for r in server.inference_requests()]
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["answered"] == seen["items"] == len(data.split.ids)
    assert sum("Case c" in body for body in bodies) == len(bodies)  # memory was sent
    assert [p for p in seen["labels_files_opened"] if not p.endswith("cases.jsonl")] == []
    assert "optimizer.judge.memory" in seen["modules"]
    for forbidden in (
        "optimizer.devset.labels",
        "optimizer.ledger",
        "optimizer.answers.scoring",
        "optimizer.cli",
    ):
        assert forbidden not in seen["modules"]
