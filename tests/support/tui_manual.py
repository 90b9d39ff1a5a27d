"""A workspace with several runs, as the one-run-per-edit manual workflow leaves it, for the run picker tests.

One `library` run on a 32-item split (its candidates stop early, each with other partial figures), then a hand
edit of the rubric judged by `judgeloop run --strategy manual -m …` per edit, all against the fake
OpenAI server's prompt-sensitive judge; ``[workspace] dev_split = "mini"``, a second dev split and a
held-out split the start-run form must never offer.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.support.fakeserver import FakeLLMServer
from tests.support.tui_runs import RealRun, make_real_run, prompt_sensitive_judge

# The hand edits, in order: (rubric line appended, the run's -m message).
MANUAL_EDITS = (
    ("- Check that every typed value matches the instruction exactly.", "typed values must match exactly"),
    ("- A task is done only when its final screen shows the result.", "final screen must show the result"),
)
HELDOUT = "held"
SMALL = "mini8"  # a second dev split (the first 8 items of mini) for a run started with another split


def commit_all(ws_root: Path, message: str) -> None:
    from optimizer.workspace.workspace import JUDGELOOP_ACTOR, repo_at

    with repo_at(ws_root) as repo:
        repo.git.add("-A", "--", "judgeloop.toml")
        repo.index.commit(message, author=JUDGELOOP_ACTOR, committer=JUDGELOOP_ACTOR)


def make_manual_runs(ws_root: Path) -> None:
    """`make_real_run` (library strategy, split ``mini`` of 32 items, 2 replicates), a held-out split
    ``held`` of 8 other sample items, a dev split ``mini8`` (mini's first 8), then one
    `run --strategy manual` per entry of ``MANUAL_EDITS``."""
    from optimizer.cli import main

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("OPENAI_API_KEY", "dummy-key-for-the-fake-server")
        assert (
            make_real_run(
                ws_root, RealRun(max_experiments=3, replicates=2, items=32, screenshots="none", concurrency=1)
            )
            == 0
        )
        toml = ws_root / "judgeloop.toml"
        text = re.sub(r"(?m)^heldout_splits = \[\]", f'heldout_splits = ["{HELDOUT}"]', toml.read_text())
        toml.write_text(
            re.sub(r'(?m)^#? ?dev_split = "[^"]*".*$', 'dev_split = "mini"', text, count=1), encoding="utf-8"
        )
        commit_all(ws_root, f"test: dev split mini, {HELDOUT} held out")
        ids = (ws_root / "devset" / "sample" / "manifest.txt").read_text().split()
        for name, chosen in ((HELDOUT, ids[40:48]), (SMALL, ids[:8])):
            manifest = ws_root / "experiments" / f"{name}-manifest.txt"
            manifest.write_text("\n".join(chosen) + "\n", encoding="utf-8")
            assert (
                main(
                    [
                        "devset",
                        "import",
                        str(ws_root / "devset" / "sample"),
                        "-w",
                        str(ws_root),
                        "--name",
                        name,
                        "--manifest",
                        str(manifest),
                    ]
                )
                == 0
            )
        for line, message in MANUAL_EDITS:
            rubric = ws_root / "prompts" / "rubric.md"
            rubric.write_text(rubric.read_text(encoding="utf-8") + f"\n{line}\n", encoding="utf-8")
            with FakeLLMServer() as server:
                server.default = prompt_sensitive_judge(ws_root, "mini")
                assert (
                    main(
                        [
                            "run",
                            "-w",
                            str(ws_root),
                            "--split",
                            "mini",
                            "--provider",
                            "openai",
                            "--base-url",
                            server.openai_base_url,
                            "--model",
                            "fake-judge",
                            "--strategy",
                            "manual",
                            "-m",
                            message,
                            "--replicates",
                            "1",
                            "--concurrency",
                            "1",
                        ]
                    )
                    == 0
                )
