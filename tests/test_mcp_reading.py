"""The session's reading tools build the incumbent's context once and reuse it until what it reads changes
(`optimizer.mcp.reading.ContextCache`), on an in-process session judged through the real OpenAI SDK
against the fake judge server (the MCP client's side of it is tests/test_mcp.py)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import anyio
import pytest

from optimizer.mcp.session import SessionOptions, open_session
from optimizer.workspace.config import JudgeOverrides
from optimizer.workspace.workspace import Workspace
from tests.support.fakeserver import FakeLLMServer
from tests.support.loop import FakeJudge
from tests.support.mcp_client import KEY
from tests.support.mcp_workspace import make_mcp_template


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_mcp_template(tmp_path_factory.mktemp("template"))


@pytest.mark.slow
def test_reading_tools_build_the_incumbents_context_once_and_again_when_it_changes(
    template: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "ws"
    shutil.copytree(template, root, symlinks=True)
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    ws = Workspace.open(root)
    with FakeLLMServer(default=FakeJudge(root)) as server:
        judge = JudgeOverrides(
            provider="openai", model="fake-judge", base_url=server.openai_base_url, concurrency=8
        )
        with open_session(ws, SessionOptions(budget_usd=100, judge=judge)) as session:
            listing = anyio.run(session.disagreements, {})
            assert not listing.is_error, listing.text
            built = session.context_builds
            tid = session.split.ids[0]
            for _ in range(20):
                out = session.read_steps({"trajectory_id": tid, "start": 0, "end": 1})
                assert not out.is_error and "step 0:" in out.text
            assert json.loads(anyio.run(session.disagreements, {}).text) == json.loads(listing.text)
            assert session.context_builds == built  # 21 reading calls, no rebuild
            # A person's guidance (read into the context) changes: the next read rebuilds it, once.
            ws.guidance_path.write_text("Be strict about saved files.\n", encoding="utf-8")
            session.read_steps({"trajectory_id": tid, "start": 0, "end": 1})
            session.read_steps({"trajectory_id": tid, "start": 0, "end": 1})
            assert session.context_builds == built + 1
            anyio.run(session.aclose)
