"""Cross-benchmark confirmation (issue 35, point 3): `confirm --split S` of another benchmark's held-out
split is recorded with its benchmark, rationed by item like any held-out split, and `certify` shows it as
transfer evidence (kappa, FPR, TPR/TNR with exact bounds)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from optimizer.cli import main
from optimizer.devset.split import open_split
from optimizer.ledger import SCHEMA_VERSION, Ledger
from optimizer.stats.binomial import clopper_pearson_lower, clopper_pearson_upper
from optimizer.workspace.workspace import Workspace
from tests.support.benchmarks import arb_items, write_arb
from tests.support.fakeserver import FakeLLMServer
from tests.support.loop import GOOD_ENTRY, FakeJudge, commit_all, run_loop, set_toml_key
from tests.support.scripted import ScriptedStrategy, install, toggle
from tests.support.trust import judge_args, run_json


def confirm(ws: Path, server: FakeLLMServer, split: str) -> int:
    return main(["confirm", "-w", str(ws), "--split", split, *judge_args(server)])


@pytest.mark.slow
def test_confirm_on_another_benchmark_is_recorded_rationed_by_item_and_certified_as_transfer_evidence(
    ws: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    src = write_arb(tmp_path / "arb", arb_items())
    for name in ("arb", "arb-again"):  # the same items under two names
        assert (
            main(
                [
                    "devset",
                    "import",
                    str(src),
                    "-w",
                    str(ws),
                    "--name",
                    name,
                    "--format",
                    "agentrewardbench",
                    "--all",
                ]
            )
            == 0
        )
    set_toml_key(ws, "workspace", "heldout_splits", '["arb", "arb-again"]')
    set_toml_key(ws, "confirm", "max_uses", "1")
    commit_all(ws, "another benchmark, held out")
    ids = open_split(Workspace.open(ws), "arb").ids
    install(monkeypatch, ScriptedStrategy([toggle(GOOD_ENTRY)]))
    with FakeLLMServer(default=FakeJudge(ws)) as server:
        assert run_loop(ws, server.openai_base_url, "--max-experiments", "1") == 0
        capsys.readouterr()
        before = len(server.inference_requests())
        assert confirm(ws, server, "arb") == 0
        out = capsys.readouterr().out
        assert len(server.inference_requests()) == before + len(ids)
        assert (
            "transfer evidence: prompts tuned on agenthorizon, measured on agentrewardbench (split arb)"
            in out
        )

        # Rationed by item: the same items under another name have no use left.
        sent = len(server.inference_requests())
        code = confirm(ws, server, "arb-again")
        err = capsys.readouterr().err.strip()
        assert code == 2 and "\n" not in err and "Traceback" not in err
        assert "split 'arb-again' was already used 1 time(s)" in err and "through split arb" in err
        assert len(server.inference_requests()) == sent

        with Ledger(ws / "experiments" / "ledger.sqlite") as led:
            (row,) = led.confirmations()
        assert (row.split, row.benchmark, row.items) == ("arb", "agentrewardbench", ids)
        assert row.fingerprint == open_split(Workspace.open(ws), "arb").fingerprint

        cert = run_json(capsys, "certify", row.revision, "-w", str(ws), "--no-bias", *judge_args(server))
    bt = cert["benchmark_transfer"]
    assert bt["status"] == "recorded" and bt["dev_benchmark"] == "agenthorizon"
    (ev,) = bt["splits"]
    m = row.metrics
    assert (ev["split"], ev["benchmark"], ev["n"]) == ("arb", "agentrewardbench", len(ids))
    assert (ev["kappa"], ev["fpr"], ev["tpr"], ev["tnr"]) == (m["kappa"], m["fpr"], m["tpr"], m["tnr"])
    pos, neg = m["tp"] + m["fn"], m["tn"] + m["fp"]
    assert ev["tpr_lower"] == clopper_pearson_lower(m["tp"], pos)
    assert ev["tnr_lower"] == clopper_pearson_lower(m["tn"], neg)
    assert ev["fpr_upper"] == clopper_pearson_upper(m["fp"], neg)
    # The certificate's Markdown says it too.
    (md,) = (ws / "experiments" / "certificates").glob("*.md")
    assert "## Transfer to other benchmarks" in md.read_text() and "`arb` (agentrewardbench" in md.read_text()


def test_a_confirmation_on_the_dev_benchmark_is_no_transfer_evidence_and_old_ledgers_read(
    ws: Path, tmp_path: Path
) -> None:
    from optimizer.ledger import MeasuredSplit
    from optimizer.stats.metrics import Metrics
    from optimizer.trust.crossbench import benchmark_transfer

    w = Workspace.open(ws)
    w.experiments_dir.mkdir(exist_ok=True)
    path = w.ledger_path
    with Ledger(path) as ledger:
        ledger.add_confirmation(
            "held", "abc", Metrics.from_counts(10, 2, 9, 3)
        )  # before schema 11: no benchmark
        ledger.add_confirmation(
            "ah",
            "abc",
            Metrics.from_counts(10, 2, 9, 3),
            measured=MeasuredSplit("agenthorizon", "f", ("a", "b")),
        )
        assert ledger.item_uses("held", ["x"]) == (1, ledger.confirmations("held"))
        assert ledger.item_uses("other", ["a", "z"])[0] == 1
    assert benchmark_transfer(w, "abc", "agenthorizon").status == "none"
    conn = sqlite3.connect(path)  # what a schema-10 judgeloop wrote
    for column in ("benchmark", "fingerprint", "items"):
        conn.execute(f"ALTER TABLE confirmations DROP COLUMN {column}")
    conn.execute("PRAGMA user_version = 10")
    conn.commit()
    conn.close()
    with Ledger.open_readonly(path) as ro:
        assert [(c.split, c.benchmark, c.items) for c in ro.confirmations()] == [
            ("held", None, None),
            ("ah", None, None),
        ]
    with Ledger(path) as ledger:
        assert ledger.confirmations()[1].items is None
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 13
    conn.close()
