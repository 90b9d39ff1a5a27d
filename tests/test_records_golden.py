"""What `judgeloop selftest`, `certify` and `bias` write stays byte for byte what it was: the result files
(JSON and Markdown), the git note and the ``--json`` output, compared with files recorded from the code
before their results became typed records (issue 30). Through the real CLI and the fake server, one
call at a time (a deterministic judge, so every verdict is the same on every run), the clock frozen; the
commit sha, the fake server's address and the call counts of an A/A repeat that stops early, which differ
between runs, are replaced by placeholders.

``JUDGELOOP_UPDATE_GOLDEN=1`` rewrites the recorded files (only for a change of output made on purpose).
"""

from __future__ import annotations

import json
import os
import re
from datetime import UTC, datetime, tzinfo
from pathlib import Path

import pytest

from optimizer.cli import main
from optimizer.trust import certify as certify_module
from optimizer.trust import selftest as selftest_module
from optimizer.trust.certify import read_note
from optimizer.workspace.workspace import Workspace
from tests.support.fakeserver import FakeLLMServer
from tests.support.loop import git, set_toml_key
from tests.support.trust import GullibleJudge, point_config_at

GOLDEN = Path(__file__).parent / "golden" / "records"
NOW = datetime(2026, 3, 4, 5, 6, 7, tzinfo=UTC)


class FrozenClock(datetime):
    """`datetime` whose ``now`` is always `NOW` (in the zone asked)."""

    @classmethod
    def now(cls, tz: tzinfo | None = None) -> FrozenClock:
        return cls.fromtimestamp(NOW.timestamp(), tz=tz)


def _normalised(text: str, sha: str, base_url: str) -> str:
    text = text.replace(base_url, "<BASE_URL>")
    for prefix in (sha, sha[:12], sha[:10], sha[:8]):
        text = text.replace(prefix, "<REV>")
    # An A/A repeat that stops early judges its two prompts side by side, one call at a time each: how
    # many calls were already out when the stop came depends on which of the two got there first.
    text = re.sub(r'("early_stopped": true,[^{}]*?"calls": )\d+', r"\1<N>", text)
    text = re.sub(r'("stopped": null,\s*"calls": )\d+', r"\1<N>", text)
    text = re.sub(r"\d+( judge calls made)", r"<N>\1", text)
    # The note names the certificate file's sha256, which covers the two values replaced above.
    return re.sub(r"(Judgeloop-Certificate-Sha256: )[0-9a-f]{64}", r"\1<SHA256>", text)


def _check(name: str, text: str) -> None:
    path = GOLDEN / name
    if os.environ.get("JUDGELOOP_UPDATE_GOLDEN") == "1":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    assert text == path.read_text(encoding="utf-8"), name


@pytest.mark.slow
def test_selftest_certify_and_bias_write_exactly_what_they_wrote_before_the_typed_records(
    ws: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(selftest_module, "datetime", FrozenClock)
    monkeypatch.setattr(certify_module, "datetime", FrozenClock)
    judge = GullibleJudge(ws)
    one = ["--concurrency", "1"]  # the planted pass stops early: one call at a time, the same calls every run
    # The fake judge cannot place the bias battery's perturbed trajectories, so every perturbed call fails
    # and is retried: by the SDK (backoff up to seconds a retry) and in the evaluator's rounds (10 s x the
    # round). The same failures with no waits between them: none of the recorded output names either value.
    set_toml_key(ws, "judge", "max_retries", "0")
    set_toml_key(ws, "loop", "infra_retry_pause_s", "0")
    with FakeLLMServer(default=judge) as server:
        point_config_at(ws, server)  # the configured judge: the bias battery judges with it too
        selftest_out = capsys_json(capsys, "selftest", "-w", str(ws), "--repeats", "2", *one)
        certify_out = capsys_json(
            capsys, "certify", "-w", str(ws), "--transfer-model", "fake-judge-2", "--no-bias"
        )
        bias_out = capsys_json(capsys, "bias", "-w", str(ws), "--probes", "final_claim")
        base_url = server.openai_base_url
    sha = git(ws, "rev-parse", "HEAD").strip()
    selftest_result = json.loads(selftest_out)
    cert = json.loads(certify_out)
    files = {
        "selftest.json": ws / selftest_result["files"]["json"],
        "selftest.md": ws / selftest_result["files"]["markdown"],
        "certificate.json": ws / cert["files"]["json"],
        "certificate.md": ws / cert["files"]["markdown"],
    }
    texts = {name: path.read_text(encoding="utf-8") for name, path in files.items()}
    texts["selftest-stdout.json"] = selftest_out
    texts["certify-stdout.json"] = certify_out
    texts["bias-stdout.json"] = bias_out
    note = read_note(Workspace.open(ws), sha)
    assert note is not None
    texts["note.txt"] = note
    for name, text in texts.items():
        _check(name, _normalised(text, sha, base_url))


def capsys_json(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """A command's ``--json`` stdout, exactly as printed (exit code 0 asserted)."""
    capsys.readouterr()
    assert main([*argv, "--json"]) == 0
    return capsys.readouterr().out
