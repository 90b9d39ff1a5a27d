"""A wave's candidates judged item by item together share each item's cached trajectory prefix: through
the fake prompt cache with its visibility rule ("an entry is readable only once the writing response
has begun"), the K candidates' calls for one cold item pay one cache write, not K."""

from __future__ import annotations

import pytest

from optimizer.cli import main
from optimizer.devset.importer import import_split
from optimizer.evaluation import warmup
from optimizer.evaluation.judging import ItemJudge
from optimizer.judge.prompts import JUDGE_TOML, RUBRIC_MD
from optimizer.loop.strategies import Proposal, ProposalContext
from optimizer.scaffold import init_workspace
from optimizer.workspace.config import Config
from optimizer.workspace.workspace import Workspace
from tests.support.config import with_layout, write_config
from tests.support.data import make_items, write_release
from tests.support.fakecache import ManualClock, PromptCache
from tests.support.fakeserver import Behaviour, FakeLLMServer, RecordedRequest, verdict_reply
from tests.support.loop import commit_all
from tests.support.scripted import ScriptedStrategy, install, latest, ledger_of

K = 3
DELAY_S = 0.2  # long enough that the K calls of an item would overlap in the server


def slow(_request: RecordedRequest) -> Behaviour:
    return verdict_reply(delay_s=DELAY_S)


def rubric_note(clock: ManualClock, note: str, *, expire: bool) -> object:
    def step(ctx: ProposalContext) -> Proposal:
        if expire:  # the wave starts hours after the baseline: every prefix is cold again
            clock.advance(4 * 3600)
        return Proposal(files={RUBRIC_MD: ctx.current_files[RUBRIC_MD] + f"\n\n{note}\n"}, rationale=note)

    return step


@pytest.mark.slow
@pytest.mark.parametrize("single_flight", [True, False])
def test_a_wave_pays_one_cache_write_per_item_not_k(
    single_flight: bool, tmp_path: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pathlib import Path

    assert isinstance(tmp_path, Path)
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-test-wave-0123456789")
    clock = ManualClock()
    monkeypatch.setattr(warmup.WARM_PREFIXES, "clock", clock)  # the registry and the fake share one clock
    warmup.WARM_PREFIXES.forget()
    if not single_flight:  # the "before": every call goes out at once
        monkeypatch.setattr(ItemJudge, "prefix_key", lambda _self, _request: None)
    ws = init_workspace(tmp_path / "ws")
    items = make_items(4, n_steps=14)
    for i, item in enumerate(items):
        item.instruction = f"{item.instruction} Task number {i:03d}."
    release = write_release(tmp_path / "release", items)
    split = import_split(ws, release.root, "long", all_items=True, warn=lambda _msg: None)
    n = len(split.ids)
    notes = ["Weigh the final screenshot most.", "Check every typed value.", "Ignore harmless scrolling."]
    strategy = ScriptedStrategy([rubric_note(clock, note, expire=i == 0) for i, note in enumerate(notes)])  # type: ignore[misc]
    install(monkeypatch, strategy)
    with FakeLLMServer(slow, prompt_cache=PromptCache(clock=clock)) as server:
        cfg: Config = Workspace.open(ws.root).config
        judge = cfg.judge.model_copy(
            update={
                "provider": "anthropic",
                "model": "claude-sonnet-4-5",
                "max_retries": 0,
                "base_url": server.anthropic_base_url,
                "max_concurrency": 8,
            }
        )
        write_config(
            ws.root,
            cfg.model_copy(
                update={"judge": judge, "workspace": cfg.workspace.model_copy(update={"dev_split": "long"})}
            ),
        )
        toml = ws.prompts_dir / JUDGE_TOML.removeprefix("prompts/")
        toml.write_text(with_layout(toml.read_text(), "trajectory-first"))
        commit_all(ws.root, "judge trajectory-first against the fake")
        assert (
            main(
                [
                    "run",
                    "-w",
                    str(ws.root),
                    "--wave",
                    str(K),
                    "--max-experiments",
                    str(K),
                    "--policy",
                    "paired",
                ]
            )
            == 0
        )
        assert server.prompt_cache is not None
        writes = server.prompt_cache.write_counts()
    _, exps = latest(ws.root)
    assert [e.status for e in exps[1:]] == ["rolled_back"] * K  # the same verdicts: no gain, nothing kept
    # Until their early stops the candidates judge the same items (negatives first, the same answers).
    with ledger_of(ws.root) as led:
        judged = [{row.trajectory_id for row in led.item_verdicts(e.id)} for e in exps[1:]]
    shared = set.intersection(*judged)
    assert len(shared) >= 4  # (a call cut by an early stop is paid but its item not recorded)
    assert len(writes) == n
    if single_flight:
        # Each item's prefix: written once by the baseline and once (not K times) by the cold wave.
        assert max(writes) == 2 and writes.count(2) >= len(set.union(*judged))
    else:
        assert max(writes) > 2
