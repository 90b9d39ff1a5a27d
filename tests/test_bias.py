"""The bias battery (`judgeloop bias`, `optimizer.trust.bias.run_battery`) through the real openai SDK against
the fake server: `BiasJudge` answers from a fixed table, four noisy items are coin flips per call, and
opt-in it falls for "task complete" text or for idle steps."""

from __future__ import annotations

import hashlib
import json
import math
import os
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest

from optimizer.cli import main
from optimizer.devset.split import open_split
from optimizer.evaluation.cache import JudgeCache
from optimizer.evaluation.scored import EvalOptions, evaluate
from optimizer.judge.estimate import request_input_tokens
from optimizer.judge.prompts import PromptSet
from optimizer.judge.render import RenderOptions, build_request
from optimizer.judge.types import ImagePart
from optimizer.trust.bias import (
    JUDGE_NOTE,
    PROBES,
    PerturbedSplit,
    final_claim,
    idle_count,
    idle_displaces,
    idle_steps,
    judge_note,
    run_battery,
)
from optimizer.workspace.config import JudgeOverrides
from optimizer.workspace.workspace import Workspace
from tests.support.bias import BiasJudge, Reaction
from tests.support.config import bundled_prompts
from tests.support.fakeserver import FakeLLMServer
from tests.support.loop import commit_all, git, labels_of, set_toml_key

FLAGS = ["--provider", "openai", "--model", "fake-judge", "--concurrency", "8"]


def tree_digest(folder: Path) -> str:
    """Every file and link under ``folder``: its path, its bytes (or a link's target) and its mode."""
    h = hashlib.sha256()
    for dirpath, dirnames, filenames in os.walk(folder):
        dirnames.sort()
        for name in sorted(filenames + [d for d in dirnames if (Path(dirpath) / d).is_symlink()]):
            path = Path(dirpath) / name
            st = path.lstat()
            h.update(str(path.relative_to(folder)).encode() + b"\0" + oct(st.st_mode).encode())
            h.update(os.readlink(path).encode() if path.is_symlink() else path.read_bytes())
    return h.hexdigest()


def bias_json(
    root: Path, server: FakeLLMServer, capsys: pytest.CaptureFixture[str], *extra: str
) -> dict[str, Any]:
    capsys.readouterr()
    assert (
        main(["bias", "-w", str(root), "--base-url", server.openai_base_url, *FLAGS, "--json", *extra]) == 0
    )
    return json.loads(capsys.readouterr().out)


def by_probe(result: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {p["probe"]: p for p in result["probes"]}


def binomial_tail(k: int, n: int) -> float:
    """P(X >= k), X ~ Binomial(n, 1/2), written out here independently of the battery."""
    return float(Fraction(sum(math.comb(n, j) for j in range(k, n + 1)), 2**n)) if n else 1.0


def check_figures(probe: dict[str, Any], judge: BiasJudge) -> None:
    """Counts and p-value agree with each other and with an independent computation."""
    perturbed, placebo = probe["perturbed"], probe["placebo"]
    assert (
        perturbed["flips"]
        == perturbed["fail_to_success"] + perturbed["success_to_fail"]
        == len(probe["flipped"])
    )
    assert perturbed["flip_rate"] == pytest.approx(perturbed["flips"] / probe["items"])
    assert probe["excess_flip_rate"] == pytest.approx(perturbed["flip_rate"] - placebo["flip_rate"])
    tails = []
    for direction in ("fail_to_success", "success_to_fail"):
        d = probe["discordant"][direction]
        tails.append(binomial_tail(d["perturbed_only"], d["perturbed_only"] + d["placebo_only"]))
        assert d["p_value"] == pytest.approx(tails[-1])
        # Discordant items flipped under one arm only: at most that arm's flips in that direction.
        assert d["perturbed_only"] <= perturbed[direction] and d["placebo_only"] <= placebo[direction]
    assert probe["p_value"] == pytest.approx(min(1.0, 2 * min(tails)))
    assert probe["flagged"] == (probe["p_value"] < 0.05)
    # The placebo is the unperturbed request judged again: only the noisy items can move.
    assert placebo["flips"] <= len(judge.noisy)


def expected_flips(judge: BiasJudge, ids: list[str], reacts: Reaction) -> set[str]:
    """The deterministic items the shortcut turns: every failure (complete text) or success (idle steps)."""
    want = reacts == "idle_steps"
    return {t for t in ids if t not in judge.noisy and judge.answer(t) == want}


@pytest.mark.slow
@pytest.mark.parametrize("reacts", ["nothing", "complete_text"])
def test_a_judge_that_flips_on_task_complete_text_is_flagged_and_one_that_ignores_it_is_not(
    ws: Path, capsys: pytest.CaptureFixture[str], reacts: Reaction
) -> None:
    judge = BiasJudge(ws, reacts_to=reacts)
    split = open_split(Workspace.open(ws), "small")
    before = tree_digest(ws / "devset"), split.fingerprint
    with FakeLLMServer(default=judge) as server:
        result = bias_json(ws, server, capsys)
        calls = len(server.inference_requests())
        again = bias_json(ws, server, capsys)
        calls_again = len(server.inference_requests()) - calls
    assert set(result) >= {
        "rev",
        "prompt_hash",
        "split",
        "split_fingerprint",
        "judge",
        "split_items",
        "items",
        "positives",
        "negatives",
        "subset",
        "alpha",
        "test",
        "probes",
        "flagged",
        "cost_usd",
        "calls",
        "cache_hits",
        "budget_usd",
        "complete",
        "notes",
    }
    assert result["items"] == result["split_items"] == 32 and result["subset"] == "all" and result["complete"]
    assert result["rev"] == git(ws, "rev-parse", "HEAD").strip() and result["split"] == "small"
    probes = by_probe(result)
    assert list(probes) == list(PROBES)
    for p in probes.values():
        assert set(p) >= {
            "probe",
            "description",
            "items",
            "excluded",
            "perturbed",
            "placebo",
            "excess_flip_rate",
            "discordant",
            "p_value",
            "flagged",
            "flipped",
        }
        assert p["items"] == 32 and p["excluded"] == 0
        check_figures(p, judge)
    # 32 items x (baseline + 3 perturbed + 3 placebo), every call its own cache entry; a re-run is free.
    assert calls == result["calls"] == 32 * 7 and result["cache_hits"] == 0
    assert calls_again == 0 and again["cache_hits"] == 32 * 7
    assert by_probe(again) == probes
    labels = labels_of(ws)
    if reacts == "nothing":
        assert result["flagged"] == []
        for p in probes.values():
            assert set(p["flipped"]) <= judge.noisy
    else:
        assert result["flagged"] == ["final_claim", "judge_note"]
        turned = expected_flips(judge, split.ids, "complete_text")
        for name in ("final_claim", "judge_note"):
            p = probes[name]
            assert set(p["flipped"]) - judge.noisy == turned
            assert p["perturbed"]["success_to_fail"] <= len(judge.noisy)
            # The dangerous direction: negatives the judge rejected, now accepted.
            negatives = {t for t in turned if not labels[t].is_positive}
            assert len(negatives) >= 5
            assert negatives <= set(p["flipped"])
            assert p["perturbed"]["negatives_fail_to_success"] >= len(negatives)
        assert set(probes["idle_steps"]["flipped"]) <= judge.noisy
    # Perturbed copies never reach the split: its files and fingerprint are byte-identical.
    assert (tree_digest(ws / "devset"), open_split(Workspace.open(ws), "small").fingerprint) == before


@pytest.mark.slow
def test_a_judge_that_flips_on_idle_steps_is_flagged_by_that_probe_only(ws: Path) -> None:
    judge = BiasJudge(ws, reacts_to="idle_steps")
    with FakeLLMServer(default=judge) as server:
        overrides = JudgeOverrides(
            provider="openai", model="fake-judge", base_url=server.openai_base_url, concurrency=8
        )
        seen: list[object] = []
        result = run_battery(Workspace.open(ws), "HEAD", events=seen.append, judge=overrides)
    assert result.flagged == ["idle_steps"]
    idle = next(p for p in result.probes if p.name == "idle_steps")
    turned = expected_flips(judge, open_split(Workspace.open(ws), "small").ids, "idle_steps")
    assert set(idle.flipped) - judge.noisy == turned and len(turned) >= 10
    assert idle.perturbed.fail_to_success <= len(judge.noisy)  # the other direction: success -> fail
    assert idle.perturbed.success_to_fail >= len(turned)
    data = result.to_json()
    assert json.loads(json.dumps(data)) == data  # plain JSON
    lines = result.markdown_lines()
    assert any(line.startswith("| idle_steps |") and "**yes**" in line for line in lines)
    assert any(line.startswith("| final_claim |") and line.endswith("| no |") for line in lines)
    assert seen, "the battery tells its listener what it does"


@pytest.mark.slow
def test_perturbed_calls_never_answer_for_the_unperturbed_item(ws: Path) -> None:
    """After a battery against a judge that says success to every claim, `eval` of the same prompts
    makes no new call and gets the unperturbed answers: the baseline's entries, not the perturbed ones."""
    judge = BiasJudge(ws, reacts_to="complete_text")
    with FakeLLMServer(default=judge) as server:
        overrides = JudgeOverrides(
            provider="openai", model="fake-judge", base_url=server.openai_base_url, concurrency=8
        )
        run_battery(Workspace.open(ws), "HEAD", judge=overrides, probes=["final_claim"])
        calls = len(server.inference_requests())
        outcome = evaluate(Workspace.open(ws), EvalOptions(rev="HEAD", judge=overrides, replicates=1))
        assert len(server.inference_requests()) == calls
    answers = outcome.run.answers()
    for tid, answer in answers.items():
        if tid not in judge.noisy:
            assert answer.success == judge.answer(tid)
    with JudgeCache(Workspace.open(ws).cache_path) as cache:
        assert cache.stats().entries == 32 * 3  # baseline, perturbed, placebo: three keys per item


def test_probes_perturb_the_judge_input_as_documented(ws: Path) -> None:
    split = open_split(Workspace.open(ws), "small")
    traj = split.trajectory(split.ids[0])
    n = len(traj.steps)
    claimed = final_claim(traj)
    assert [s.step_id for s in claimed.steps] == list(range(n + 1))
    assert claimed.steps[-1].thought == "Task completed successfully."
    assert claimed.steps[-1].screenshot == traj.steps[-1].screenshot
    idle = idle_steps(traj)
    added = idle.steps[n // 2 : n // 2 + idle_count(n)]
    assert len(idle.steps) == n + idle_count(n) and {s.action.type for s in added} == {"wait"}
    assert {s.screenshot for s in added} == {traj.steps[n // 2].screenshot}
    noted = judge_note(traj)
    assert (
        noted.steps[-2].action.parameters["text"] == JUDGE_NOTE
        and noted.steps[-1].action == traj.steps[-1].action
    )
    assert split.trajectory(split.ids[0]) == traj  # the original is untouched
    # Rendered as the judge reads it (bundled prompts: every screenshot): the idle steps show the reused
    # screen, and the perturbed split renders what the probe made.
    prompts = bundled_prompts()
    plain = build_request(traj, split, prompts)
    longer = build_request(
        PerturbedSplit(split, PROBES["idle_steps"]).trajectory(split.ids[0]), split, prompts
    )
    images = [p for p in longer.parts if isinstance(p, ImagePart)]
    assert len(images) == len([p for p in plain.parts if isinstance(p, ImagePart)]) + idle_count(n)
    assert len({im.data for im in images[n // 2 : n // 2 + idle_count(n) + 1]}) == 1
    assert longer.fingerprint() != plain.fingerprint()
    # Under a cap on screenshots the idle steps take the places of real ones (the battery notes it):
    # 120 steps + 30 idle ones under max_images = 100 show other real steps; 20 + 5 do not.
    assert idle_displaces(120, prompts.settings) and not idle_displaces(20, prompts.settings)


def test_held_out_split_and_unknown_probe_are_refused_in_one_line(
    ws: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    set_toml_key(ws, "workspace", "heldout_splits", '["sample"]')
    commit_all(ws, "sample held out")
    with FakeLLMServer(default=BiasJudge(ws)) as server:
        capsys.readouterr()
        assert (
            main(["bias", "-w", str(ws), "--split", "sample", "--base-url", server.openai_base_url, *FLAGS])
            == 2
        )
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "held out" in err
        # The dev split holds items of the held-out sample: held out too (by item, not by name).
        assert main(["bias", "-w", str(ws), "--base-url", server.openai_base_url, *FLAGS]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "split 'small' holds held-out items" in err
        set_toml_key(ws, "workspace", "heldout_splits", "[]")
        commit_all(ws, "nothing held out")
        assert (
            main(
                [
                    "bias",
                    "-w",
                    str(ws),
                    "--probes",
                    "final_claim,nope",
                    "--base-url",
                    server.openai_base_url,
                    *FLAGS,
                ]
            )
            == 2
        )
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "'nope'" in err
        assert main(["bias", "no-such-rev", "-w", str(ws), "--base-url", server.openai_base_url, *FLAGS]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "unknown git revision 'no-such-rev'" in err
        assert server.inference_requests() == []


@pytest.mark.slow
def test_budget_picks_a_stratified_subset_and_is_never_crossed(
    ws: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = ws / "judgeloop.toml"
    cfg.write_text(
        cfg.read_text(encoding="utf-8") + '\n[prices."fake-judge"]\ninput = 10.0\noutput = 10.0\n',
        encoding="utf-8",
    )
    commit_all(ws, "prices")
    judge = BiasJudge(ws, reacts_to="complete_text")
    with FakeLLMServer(default=judge) as server:
        capsys.readouterr()
        assert (
            main(
                ["bias", "-w", str(ws), "--base-url", server.openai_base_url, *FLAGS, "--budget-usd", "0.01"]
            )
            == 2
        )
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "buys fewer than 2 items" in err and server.inference_requests() == []
        result = bias_json(ws, server, capsys, "--budget-usd", "1.5")
        paid = len(server.inference_requests())
        # The same battery as a table: every call is cached now, so the same items are chosen and nothing is paid.
        assert (
            main(["bias", "-w", str(ws), "--base-url", server.openai_base_url, *FLAGS, "--budget-usd", "1.5"])
            == 0
        )
        table = capsys.readouterr().out.splitlines()
        assert len(server.inference_requests()) == paid
    assert [line.split(" | ")[0] for line in table if line.startswith("| ") and "---" not in line][1:] == [
        f"| {name}" for name in PROBES
    ]
    assert f"({result['items']} of 32 items; a subset stratified by label" in table[1]
    assert 2 <= result["items"] < 32 and result["subset"].startswith("a subset stratified by label")
    assert result["cost_usd"] <= 1.5 and result["budget_usd"] == 1.5
    assert result["positives"] == round(result["items"] / 2)  # the split is 16 / 16
    assert result["negatives"] == result["items"] - result["positives"]
    assert result["calls"] == result["items"] * 7
    assert all(p["items"] == result["items"] for p in result["probes"])


@pytest.mark.slow
def test_a_perturbed_request_cut_to_fit_the_token_budget_is_noted(ws: Path) -> None:
    """The longest item just fits the token budget; with idle steps it does not, and the battery says so."""
    workspace = Workspace.open(ws)
    split = open_split(workspace, "small")
    prompts = PromptSet.from_dir(workspace.prompts_dir)

    def reduced(tid: str, budget: int, probe: str | None = None) -> bool:
        traj = split.trajectory(tid)
        return bool(
            build_request(
                PROBES[probe].perturb(traj) if probe else traj,
                split,
                prompts,
                options=RenderOptions(token_budget=budget),
            ).notes
        )

    longest = max(
        split.ids, key=lambda t: request_input_tokens(build_request(split.trajectory(t), split, prompts))
    )
    low, high = 256, 100_000
    while low < high:  # the smallest budget the longest item fits unreduced
        mid = (low + high) // 2
        low, high = (low, mid) if not reduced(longest, mid) else (mid + 1, high)
    assert reduced(longest, low, "idle_steps") and not any(reduced(t, low) for t in split.ids)
    toml = ws / "prompts" / "judge.toml"
    toml.write_text(toml.read_text(encoding="utf-8") + f"\ntoken_budget = {low}\n", encoding="utf-8")
    commit_all(ws, "token budget")
    with FakeLLMServer(default=BiasJudge(ws)) as server:
        overrides = JudgeOverrides(provider="openai", model="fake-judge", base_url=server.openai_base_url)
        result = run_battery(Workspace.open(ws), "HEAD", judge=overrides, probes=["idle_steps"])
    noted = [n for n in result.notes if n.startswith("idle_steps: ")]
    assert len(noted) == 1 and "token budget" in noted[0], result.notes
