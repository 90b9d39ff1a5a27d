"""Shared by the selftest and certify tests: a judge that obeys the self-test's planted rule, the CLI
calls against the fake server, and a fingerprint of what those commands must never change."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from optimizer.cli import main
from optimizer.trust.selftest import PLANTED_RULE
from tests.support.fakeserver import FakeLLMServer
from tests.support.loop import FakeJudge, commit_all, git

PLANTED = "planted"


@dataclass
class GullibleJudge(FakeJudge):
    """`FakeJudge` (deterministic, from its table) that obeys `PLANTED_RULE`: with the rule in the
    request it calls every trajectory a success (every negative becomes a false positive)."""

    def enabled_in(self, system: str) -> set[str]:
        return super().enabled_in(system) | ({PLANTED} if PLANTED_RULE in system else set())

    def correct(self, tid: str, enabled: set[str]) -> bool:
        if PLANTED in enabled:
            return self.labels[tid].is_positive
        return super().correct(tid, enabled)


def judge_args(server: FakeLLMServer, concurrency: int = 8) -> list[str]:
    return [
        "--provider",
        "openai",
        "--base-url",
        server.openai_base_url,
        "--model",
        "fake-judge",
        "--concurrency",
        str(concurrency),
    ]


def point_config_at(root: Path, server: FakeLLMServer) -> None:
    """Make the fake server the workspace's own judge in judgeloop.toml (committed), so every part of a
    command — the bias battery too, which reads the configured judge — judges with it."""
    path = root / "judgeloop.toml"
    text = path.read_text(encoding="utf-8")
    text = text.replace('provider = "local"', 'provider = "openai"', 1).replace(
        'model = "smollm2-135m"', 'model = "fake-judge"', 1
    )
    text = text.replace(
        '# base_url = "http://127.0.0.1:8000/v1"', f'base_url = "{server.openai_base_url}"', 1
    )
    path.write_text(text, encoding="utf-8")
    commit_all(root, "the fake judge")


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, Any]:
    """A judgeloop command with --json, in-process; its one JSON object (exit code 0 asserted)."""
    capsys.readouterr()
    assert main([*argv, "--json"]) == 0
    out: dict[str, Any] = json.loads(capsys.readouterr().out)
    return out


def untouched_state(root: Path) -> dict[str, str]:
    """What selftest and certify must leave as it was: HEAD, the branch, the status, prompts/ and devset/."""
    digest = hashlib.sha256()
    for folder in ("prompts", "devset"):
        for path in sorted((root / folder).rglob("*")):
            if path.is_file() or path.is_symlink():
                digest.update(str(path.relative_to(root)).encode() + b"\0")
                digest.update(path.read_bytes() if not path.is_symlink() else str(path.readlink()).encode())
    return {
        "head": git(root, "rev-parse", "HEAD").strip(),
        "branch": git(root, "rev-parse", "--abbrev-ref", "HEAD").strip(),
        "status": git(root, "status", "--porcelain"),
        "refs": git(
            root, "for-each-ref", "--format=%(refname) %(objectname)", "refs/heads", "refs/judgeloop"
        ),
        "files": digest.hexdigest(),
    }
