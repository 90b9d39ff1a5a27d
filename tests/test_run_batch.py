"""``--batch`` through ``vllm run-batch`` files (``[judge] batch_engine = "vllm-run-batch"``), against a
fake that plays run-batch's file contract (tests/support/fake_run_batch.py) and an OpenAI-compatible
fake server for the direct calls: the same verdicts and bill as direct calls, a kill -9 while waiting
collected without a second batch, malformed output lines survived and recorded, hostile ids and folders."""

from __future__ import annotations

import asyncio
import json
import shlex
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from optimizer.cli import main
from optimizer.judge.providers.openai_provider import OpenAIProvider
from optimizer.judge.providers.run_batch import INPUT_SUFFIX, RunBatchFiles, run_batch_command
from optimizer.workspace.config import Config, JudgeSection
from optimizer.workspace.workspace import Workspace
from tests.support.config import write_config
from tests.support.evaluation import SECRET, Data, by_label, make_data, verdict_text
from tests.support.fakeserver import FakeLLMServer
from tests.support.loop import wait_for
from tests.support.processes import killed_cli

MODEL = "gpt-4o-mini"  # a built-in price with a batch discount: run-batch must not take it
FAKE = Path(__file__).parent / "support" / "fake_run_batch.py"


@pytest.fixture(autouse=True)
def keys(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)


def configure(data: Data, **judge: Any) -> Path:
    """The workspace judges "tiny" with the openai provider and batches through run-batch files
    (polled every 10 ms); its batch folder."""
    cfg = Workspace.open(data.ws.root).config
    section = cfg.judge.model_copy(
        update={
            "provider": "openai",
            "model": MODEL,
            "max_retries": 0,
            "batch_poll_s": 0.01,
            "batch_poll_max_s": 0.04,
            "batch_engine": "vllm-run-batch",
            **judge,
        }
    )
    workspace = cfg.workspace.model_copy(update={"dev_split": "tiny"})
    write_config(data.ws.root, cfg.model_copy(update={"judge": section, "workspace": workspace}))
    return data.ws.root / section.batch_dir


def answers_file(data: Data, path: Path) -> Path:
    """What the fake answers: each item's right verdict, keyed by its (unique) instruction."""
    answers = {
        item.instruction: verdict_text(
            item.label == "positive", None if item.label == "positive" else item.mistake_type
        )
        for item in data.items
    }
    path.write_text(json.dumps(answers))
    return path


def inputs(folder: Path) -> list[Path]:
    return sorted(folder.glob(f"*{INPUT_SUFFIX}"))


def run_fake(data: Data, folder: Path, source: Path, *knobs: str) -> None:
    """Run the command judgeloop prints for ``source``'s batch, with the fake in place of ``vllm run-batch``."""
    batch_id = source.name.removesuffix(INPUT_SUFFIX)
    command = run_batch_command(folder, batch_id, MODEL)
    assert command.startswith("vllm run-batch ")
    answers = answers_file(data, folder.parent / "answers.json")
    fake = f"{shlex.quote(sys.executable)} {shlex.quote(str(FAKE))} --answers {shlex.quote(str(answers))} "
    fake += " ".join(knobs) + " "
    subprocess.run(command.replace("vllm run-batch ", fake, 1), shell=True, check=True, timeout=60)


def eval_args(data: Data, server: FakeLLMServer, out: Path, *extra: str) -> list[str]:
    return ["eval", "-w", str(data.ws.root), "--base-url", server.openai_base_url, "--out", str(out), *extra]


def eval_in_thread(args: list[str]) -> tuple[threading.Thread, list[int]]:
    codes: list[int] = []
    thread = threading.Thread(target=lambda: codes.append(main(args)), daemon=True)
    thread.start()
    return thread, codes


def summary(out: Path) -> dict[str, Any]:
    return json.loads((out / "_summary.json").read_text())


def verdicts(out: Path) -> dict[str, Any]:
    """Each item's verdict fields (what differs between two evaluations of the same answers dropped)."""
    found = {}
    for path in sorted(out.glob("*.json")):
        if path.name != "_summary.json":
            body = json.loads(path.read_text())
            found[path.name] = {k: body.get(k) for k in ("success", "reasoning", "mistake_type")}
    return found


def direct_eval(data: Data, server: FakeLLMServer, out: Path) -> dict[str, Any]:
    """A direct evaluation (no --batch) into ``out``, then the cache emptied so a batch pays again."""
    assert main(eval_args(data, server, out)) == 0
    (data.ws.root / "experiments" / "cache.sqlite").unlink()
    return summary(out)


@pytest.mark.slow
def test_eval_batch_writes_the_run_batch_file_and_matches_direct_calls_at_the_direct_price(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = make_data(tmp_path)
    folder = configure(data)
    with FakeLLMServer(default=by_label(data)) as server:
        direct = direct_eval(data, server, tmp_path / "direct")
        direct_calls = len(server.inference_requests())
        capsys.readouterr()

        thread, codes = eval_in_thread(eval_args(data, server, tmp_path / "batch", "--batch"))
        wait_for(lambda: len(inputs(folder)) == 1, "the batch's input file")
        [source] = inputs(folder)
        lines = [json.loads(line) for line in source.read_text().splitlines()]
        assert len(lines) == len(data.items)
        assert {line["url"] for line in lines} == {"/v1/chat/completions"}
        assert all(line["body"]["model"] == MODEL and line["method"] == "POST" for line in lines)
        run_fake(data, folder, source)
        thread.join(60)
        assert codes == [0]
        assert server.batch_creations == [] and len(server.inference_requests()) == direct_calls  # files only
        err = capsys.readouterr().err
        assert "run: vllm run-batch -i " in err  # the state line says what to run

        batch = summary(tmp_path / "batch")
        assert verdicts(tmp_path / "batch") == verdicts(tmp_path / "direct")
        assert batch["cost_usd"] == pytest.approx(direct["cost_usd"]) and batch["cost_usd"] > 0
        # One cache: a direct evaluation of the same prompts now makes no call.
        assert main(eval_args(data, server, tmp_path / "again")) == 0
        assert len(server.inference_requests()) == direct_calls
    assert inputs(folder) == [source]
    for path in folder.iterdir():  # the key travels in a header, never into the batch files
        assert SECRET.encode() not in path.read_bytes()


def test_every_call_goes_in_the_file_no_direct_warm_up(tmp_path: Path) -> None:
    data = make_data(tmp_path)
    folder = configure(data)
    with FakeLLMServer(default=by_label(data)) as server:
        thread, codes = eval_in_thread(
            eval_args(data, server, tmp_path / "out", "--batch", "--replicates", "3")
        )
        wait_for(lambda: len(inputs(folder)) == 1, "the batch's input file")
        [source] = inputs(folder)
        assert len(source.read_text().splitlines()) == 3 * len(data.items)
        run_fake(data, folder, source)
        thread.join(60)
        assert codes == [0] and server.inference_requests() == []
    assert summary(tmp_path / "out")["counts"]["calls_made"] == 3 * len(data.items)


@pytest.mark.slow
def test_kill_9_while_waiting_then_the_same_eval_collects_the_output_without_a_second_batch(
    tmp_path: Path,
) -> None:
    data = make_data(tmp_path)
    folder = configure(data)
    with FakeLLMServer(default=by_label(data)) as server:
        direct = direct_eval(data, server, tmp_path / "direct")
        args = eval_args(data, server, tmp_path / "out", "--batch")

        def waiting() -> None:
            wait_for(lambda: len(inputs(folder)) == 1, "the batch's input file", 60)
            wait_for(
                lambda: open_batches(data) == [inputs(folder)[0].name.removesuffix(INPUT_SUFFIX)],
                "its record",
            )

        killed_cli(args, waiting)
        assert not (tmp_path / "out").exists()
        [source] = inputs(folder)
        run_fake(data, folder, source)
        assert main(args) == 0
        assert inputs(folder) == [source]  # collected, not written again
        assert open_batches(data) == []
        assert verdicts(tmp_path / "out") == verdicts(tmp_path / "direct")
        assert summary(tmp_path / "out")["cost_usd"] == pytest.approx(direct["cost_usd"])
        notes = summary(tmp_path / "out")["preprocessing"]["run_notes"]
        assert any("submitted by an earlier process" in note for note in notes)


def open_batches(data: Data) -> list[str]:
    import sqlite3

    conn = sqlite3.connect(data.ws.root / "experiments" / "cache.sqlite")
    try:
        return [
            r[0] for r in conn.execute("SELECT batch_id FROM batches WHERE status = 'submitted' ORDER BY id")
        ]
    except sqlite3.OperationalError:  # not created yet
        return []
    finally:
        conn.close()


def test_malformed_missing_and_errored_output_lines_are_survived_and_recorded(tmp_path: Path) -> None:
    data = make_data(tmp_path)
    folder = configure(data, batch_retry_rounds=0)
    with FakeLLMServer(default=by_label(data)) as server:
        thread, codes = eval_in_thread(eval_args(data, server, tmp_path / "out", "--batch"))
        wait_for(lambda: len(inputs(folder)) == 1, "the batch's input file")
        [source] = inputs(folder)
        run_fake(data, folder, source, "--garble 1", "--drop 2", "--error 3")
        thread.join(60)
        assert codes == [0]
        done = summary(tmp_path / "out")
        lines = [json.loads(line) for line in source.read_text().splitlines()]
        failed = {line["custom_id"] for line in lines[:3]}
        assert done["counts"]["infra_errors"] == 3 and len(verdicts(tmp_path / "out")) == len(data.items) - 3
        [skipped] = [n for n in done["preprocessing"]["run_notes"] if "malformed line" in n]
        assert "line 1 is not JSON" in skipped
        reasons = sorted(done["infra_errors"].values())
        assert sum("no result in batch" in r for r in reasons) == 2  # the garbled line and the dropped one
        assert any("HTTP 400: The model could not answer this request" in r for r in reasons)

        # Nothing failed is cached: the same command sends exactly those calls again, as one new batch.
        thread, codes = eval_in_thread(eval_args(data, server, tmp_path / "again", "--batch"))
        wait_for(lambda: len(inputs(folder)) == 2, "the follow-up batch's input file")
        [follow_up] = [p for p in inputs(folder) if p != source]
        assert {json.loads(line)["custom_id"] for line in follow_up.read_text().splitlines()} == failed
        run_fake(data, folder, follow_up)
        thread.join(60)
        assert codes == [0] and summary(tmp_path / "again")["counts"]["infra_errors"] == 0
        assert server.inference_requests() == []  # one call per item: no warm-up, files only


# --------------------------------------------------------------------------- hostile input


def test_an_id_that_is_not_the_engines_never_becomes_a_path(tmp_path: Path) -> None:
    outside = tmp_path / "secret.output.jsonl"
    outside.write_text('{"custom_id": "k", "response": {"status_code": 200, "body": {}}}\n')
    judge = JudgeSection(
        provider="openai", model=MODEL, base_url="http://127.0.0.1:9/v1", batch_engine="vllm-run-batch"
    )
    engine = RunBatchFiles(OpenAIProvider(judge), tmp_path / "experiments" / "run-batch")
    for hostile in ("../../secret", "../secret", "/etc/passwd", "rb-x"):
        state = asyncio.run(engine.batch_state(hostile))
        assert state.ended and asyncio.run(engine.batch_results(hostile)) == []


def test_output_lines_of_other_shapes_are_errored_or_skipped_never_fatal(tmp_path: Path) -> None:
    judge = JudgeSection(
        provider="openai", model=MODEL, base_url="http://127.0.0.1:9/v1", batch_engine="vllm-run-batch"
    )
    folder = tmp_path / "experiments" / "run-batch"
    folder.mkdir(parents=True)
    engine = RunBatchFiles(OpenAIProvider(judge), folder)
    batch_id = "rb-20260101T000000-0badf00d"
    asked = "".join(
        f'{{"custom_id":"{k}","method":"POST","url":"/v1/chat/completions","body":{{}}}}\n' for k in "abc"
    )
    (folder / f"{batch_id}{INPUT_SUFFIX}").write_text(asked)
    lines = [
        "[1, 2]",
        '{"no": "custom id"}',
        '{"custom_id": "a", "response": {"status_code": 200, "body": {"choices": "nope"}}, "error": null}',
        '{"custom_id": "b", "response": {"status_code": 500}, "error": {"error": {"message": "engine died"}}}',
        '{"custom_id": "c", "response": null, "error": null}',
        "\x00\xff not text",
        '{"custom_id": "not-asked", "response": {"status_code": 200, "body": {}}, "error": null}',
    ]
    (folder / f"{batch_id}.output.jsonl").write_text("\n".join(lines) + "\n", encoding="latin-1")
    assert asyncio.run(engine.batch_state(batch_id)).ended
    entries = {e.custom_id: e for e in asyncio.run(engine.batch_results(batch_id))}
    assert {k: e.outcome for k, e in entries.items()} == {"a": "errored", "b": "errored", "c": "errored"}
    assert "not a chat completion" in (entries["a"].error or "") and "engine died" in (
        entries["b"].error or ""
    )
    foreign, malformed = engine.run_notes()
    assert "1 line(s) of" in foreign and "answer no call of its input file" in foreign
    assert "3 malformed line(s)" in malformed and engine.run_notes() == ()


@pytest.mark.parametrize(
    ("key", "value", "said"),
    [
        ("batch_dir", "prompts/batches", "must be a folder under experiments/"),
        ("batch_dir", "experiments/../devset", "must be a folder under experiments/"),
        ("batch_engine", "vllm", "batch_engine"),
    ],
)
def test_a_bad_batch_setting_is_one_line_and_exit_2(
    key: str, value: str, said: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = make_data(tmp_path)
    config = data.ws.root / "judgeloop.toml"
    text = config.read_text().replace("[judge]\n", f'[judge]\nprovider = "openai"\n{key} = "{value}"\n', 1)
    config.write_text(text.replace('provider = "local"          #', "#", 1))
    assert main(["eval", "-w", str(data.ws.root), "--out", str(tmp_path / "out"), "--batch"]) == 2
    err = capsys.readouterr().err.strip()
    assert said in err and len(err.splitlines()) == 1 and "Traceback" not in err


def test_run_batch_without_a_server_address_is_refused_before_anything_is_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = make_data(tmp_path)
    folder = configure(data)
    assert main(["eval", "-w", str(data.ws.root), "--out", str(tmp_path / "out"), "--batch"]) == 2
    err = capsys.readouterr().err.strip()
    assert "set [judge] base_url or pass --base-url" in err.splitlines()[-1] and "Traceback" not in err
    assert not folder.exists() and not (tmp_path / "out").exists()


def test_switching_provider_on_the_command_line_drops_the_run_batch_engine() -> None:
    from optimizer.workspace.config import JudgeOverrides

    judge = Config().judge.model_copy(
        update={"provider": "openai", "model": MODEL, "batch_engine": "vllm-run-batch"}
    )
    assert JudgeOverrides(provider="anthropic").apply(judge).batch_engine == "provider"


def test_run_batch_with_another_provider_is_refused_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = make_data(tmp_path)
    configure(data, provider="anthropic", model="claude-haiku-4-5")
    assert main(["eval", "-w", str(data.ws.root), "--out", str(tmp_path / "out"), "--batch"]) == 2
    err = capsys.readouterr().err.strip()
    assert 'needs provider = "openai"' in err.splitlines()[-1] and "Traceback" not in err
    assert not (tmp_path / "out").exists()
