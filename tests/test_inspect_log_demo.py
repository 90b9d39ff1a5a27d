"""The log behind docs/integrations/inspect.md's screenshot (tools/inspect_log_demo.py): a real `judgeloop eval
--inspect-log` on the bundled sample against the fake server, read back by Inspect's own reader; the key
it sets is nowhere in the log, and a folder that already holds files is refused in one line."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest
from inspect_ai.log import read_eval_log

from tools import browser_shot
from tools.inspect_log_demo import DEMO_KEY, run, write_demo_log


@pytest.mark.slow
def test_demo_log_reads_back_with_one_scored_sample_per_judged_item_and_no_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    log_path = write_demo_log(tmp_path / "demo", limit=6)
    log = read_eval_log(str(log_path))
    assert log.status == "success" and log.samples is not None
    assert len(log.samples) == 6
    for sample in log.samples:
        assert sample.target in ("positive", "negative")
        assert sample.scores is not None
        score = sample.scores["judgeloop"]
        assert score.value in ("C", "I") and score.answer in ("positive", "negative")
        assert score.explanation
    with zipfile.ZipFile(log_path) as archive:  # a .eval is a zip: look inside every member
        assert not [n for n in archive.namelist() if DEMO_KEY.encode() in archive.read(n)]


def test_demo_refuses_a_folder_that_already_holds_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "keep.txt").write_text("mine", encoding="utf-8")
    assert run([str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "is not empty" in err and len(err.strip().splitlines()) == 1
    assert (tmp_path / "keep.txt").read_text(encoding="utf-8") == "mine"


def test_browser_shot_without_a_browser_says_so_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "shot.png"
    argv = ["http://127.0.0.1:9/", str(out), "--wait-for", "x", "--chromium", str(tmp_path / "no-chromium")]
    assert browser_shot.run(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("browser_shot: no browser at") and len(err.strip().splitlines()) == 1
    assert not out.exists()
