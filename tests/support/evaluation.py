"""The evaluation tests' workspace and judges: a small split with distinct instructions (`Data`), an
in-process `Provider` (`InTestProvider`), a judge section, a fake-server behaviour answering by label."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from optimizer.devset.importer import import_split
from optimizer.devset.split import Split
from optimizer.judge.prompts import PromptSet
from optimizer.judge.types import JudgeRequest, ProviderReply, ProviderTraits, Sampling, TextPart
from optimizer.scaffold import init_workspace
from optimizer.workspace.config import JudgeSection
from optimizer.workspace.workspace import Workspace
from tests.support.data import FakeItem, make_items, write_release
from tests.support.fakeserver import FakeLLMServer, RecordedRequest, Usage, reply, server_error

SECRET = "sk-test-SECRET-key-0123456789abcdef"
MODEL = "gpt-4o-mini"


def verdict_text(success: bool, mistake: str | None = None) -> str:
    return json.dumps(
        {"success": success, "reasoning": "because", "confidence": "high", "mistake_type": mistake}
    )


class Data:
    """A fresh workspace with a small split whose every item has a distinct instruction."""

    def __init__(self, ws: Workspace, split: Split, items: list[FakeItem]) -> None:
        self.ws = ws
        self.split = split
        self.items = items
        self.by_instruction = {item.instruction: item for item in items}
        self.prompts = PromptSet.from_dir(ws.prompts_dir)

    def item_of(self, text: str) -> FakeItem:
        """The item whose (unique) instruction appears in ``text``."""
        found = [item for instr, item in self.by_instruction.items() if instr in text]
        assert len(found) == 1, "each request must name exactly one item's instruction"
        return found[0]

    def request_item(self, request: JudgeRequest) -> FakeItem:
        return self.item_of("\n".join(p.text for p in request.parts if isinstance(p, TextPart)))

    def recorded_item(self, recorded: RecordedRequest) -> FakeItem:
        return self.item_of(json.dumps(recorded.body))


def make_data(tmp_path: Path, n_pairs: int = 2, name: str = "tiny") -> Data:
    ws = init_workspace(tmp_path / "ws")
    items = make_items(n_pairs)
    for i, item in enumerate(items):
        item.instruction = f"{item.instruction} Task number {i:03d}."
    release = write_release(tmp_path / "release", items)
    split = import_split(ws, release.root, name, all_items=True, warn=lambda _msg: None)
    return Data(ws, split, items)


class InTestProvider:
    """A Provider (judge_types protocol) answering from ``decide(request) -> text | exception``."""

    name = "openai"
    traits = ProviderTraits()

    def __init__(
        self, decide: Callable[[JudgeRequest], str | Exception], *, model: str = MODEL, delay: float = 0.0
    ) -> None:
        self.decide = decide
        self.model = model
        self.delay = delay
        self.calls: list[JudgeRequest] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self.closed = False

    async def complete(
        self, request: JudgeRequest, sampling: Sampling, schema: dict[str, Any]
    ) -> ProviderReply:
        self.calls.append(request)
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            await asyncio.sleep(self.delay)
            outcome = self.decide(request)
        finally:
            self.in_flight -= 1
        if isinstance(outcome, Exception):
            raise outcome
        return ProviderReply(text=outcome, model=self.model, input_tokens=10_000, output_tokens=200)

    async def aclose(self) -> None:
        self.closed = True

    def run_notes(self) -> tuple[str, ...]:
        return ()


def judge(**update: Any) -> JudgeSection:
    return JudgeSection.model_validate({"provider": "openai", "model": MODEL, "max_concurrency": 4, **update})


def by_label(
    data: Data, *, broken: str | None = None, garbled: str | None = None
) -> Callable[[RecordedRequest], Any]:
    """Server behaviour: right verdict by label; ``broken`` always 500s; ``garbled`` is not JSON."""

    def behave(recorded: RecordedRequest) -> Any:
        item = data.recorded_item(recorded)
        if item.trajectory_id == broken:
            return server_error(500)
        usage = Usage(input_tokens=1000, output_tokens=50)
        if item.trajectory_id == garbled:
            return reply("I think it worked, probably.", usage=usage)
        mistake = None if item.label == "positive" else item.mistake_type
        return reply(verdict_text(item.label == "positive", mistake), usage=usage)

    return behave


def write_config(ws: Workspace, server: FakeLLMServer) -> None:
    text = (ws.root / "judgeloop.toml").read_text()
    text = re.sub(r'(?m)^#? ?dev_split = "[^"]*".*$', 'dev_split = "tiny"', text, count=1)
    text = text.replace('provider = "local"          #', 'provider = "openai"         #', 1)
    text = text.replace('model = "smollm2-135m"      #', f'model = "{MODEL}"      #', 1)
    text = text.replace("max_retries = 4", "max_retries = 0")
    (ws.root / "judgeloop.toml").write_text(text)
    assert Workspace.open(ws.root).config.judge.provider == "openai"
