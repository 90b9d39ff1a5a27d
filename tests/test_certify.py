"""`judgeloop certify`: exact bounds against an independent computation, the certificate through the real
CLI (both files, every field, the git note), evaluation through the cache, and its refusals."""

from __future__ import annotations

import hashlib
import json
import math
import sys
import types
from collections.abc import Callable
from fractions import Fraction
from pathlib import Path

import pytest

from optimizer.cli import main
from optimizer.stats.binomial import clopper_pearson_interval, clopper_pearson_lower, clopper_pearson_upper
from optimizer.trust.certify import CERTIFICATE_VERSION, landis_koch, read_note
from optimizer.workspace.workspace import Workspace
from tests.support.cascade import CALL_USD, CHEAP, STRICT, TwoJudges, write_cascade
from tests.support.fakeserver import FakeLLMServer
from tests.support.loop import commit_all, git, labels_of, set_toml_key
from tests.support.trust import GullibleJudge, judge_args, point_config_at, run_json, untouched_state

# --- exact bounds ---------------------------------------------------------------------------------


def _upper_tail(x: int, n: int, p: Fraction) -> Fraction:
    """P(X >= x) for X ~ Binomial(n, p), summed exactly in rationals."""
    return sum((math.comb(n, k) * p**k * (1 - p) ** (n - k) for k in range(x, n + 1)), Fraction(0))


def _invert(f: Callable[[Fraction], Fraction], target: Fraction, increasing: bool) -> float:
    """The p in [0, 1] with f(p) = target by exact rational bisection (f monotone)."""
    lo, hi = Fraction(0), Fraction(1)
    for _ in range(56):  # 2^-56 < 1.4e-17
        mid = (lo + hi) / 2
        value = f(mid)
        if (value < target) == increasing:
            lo = mid
        else:
            hi = mid
    return float((lo + hi) / 2)


@pytest.mark.parametrize(
    ("x", "n"), [(1, 1), (3, 10), (38, 62), (50, 62), (62, 62), (72, 100), (99, 100), (0, 40)]
)
def test_clopper_pearson_bounds_equal_brute_force_binomial_tail_inversion(x: int, n: int) -> None:
    alpha = Fraction(1, 20)
    # Lower bound: the p at which P(X >= x) = alpha (the tail grows with p); 0 when x = 0.
    lower = 0.0 if x == 0 else _invert(lambda p: _upper_tail(x, n, p), alpha, increasing=True)
    # Upper bound: the p at which P(X <= x) = alpha (falls with p); 1 when x = n.
    upper = 1.0 if x == n else _invert(lambda p: 1 - _upper_tail(x + 1, n, p), alpha, increasing=False)
    assert clopper_pearson_lower(x, n) == pytest.approx(lower, abs=1e-12)
    assert clopper_pearson_upper(x, n) == pytest.approx(upper, abs=1e-12)
    two_lo, two_hi = clopper_pearson_interval(x, n, level=0.9)  # each side at 5%: the one-sided bounds
    assert (two_lo, two_hi) == pytest.approx((lower, upper), abs=1e-12)


def test_landis_koch_bands_at_their_edges() -> None:
    assert [landis_koch(k) for k in (-0.1, 0.0, 0.2, 0.21, 0.41, 0.61, 0.81, 1.0, None)] == [
        "poor",
        "slight",
        "slight",
        "fair",
        "moderate",
        "substantial",
        "almost perfect",
        "almost perfect",
        "undefined",
    ]


# --- the certificate through the CLI -------------------------------------------------------------


def _expected_counts(judge: GullibleJudge, root: Path) -> tuple[int, int, int, int]:
    """(tp, positives, tn, negatives) of the fake judge's own table on the dev split (no selftest rule)."""
    labels = labels_of(root)
    tp = sum(1 for t, lab in labels.items() if lab.is_positive and judge.correct(t, set()))
    tn = sum(1 for t, lab in labels.items() if not lab.is_positive and judge.correct(t, set()))
    pos = sum(1 for lab in labels.values() if lab.is_positive)
    return tp, pos, tn, len(labels) - pos


@pytest.mark.slow
def test_certify_through_the_cli_writes_both_files_with_every_field_and_a_git_note(
    ws: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    judge = GullibleJudge(ws)
    with FakeLLMServer(default=judge) as server:
        point_config_at(ws, server)  # the configured judge: what the bias battery (when present) uses too
        before = untouched_state(ws)
        run_json(capsys, "selftest", "-w", str(ws), "--repeats", "1")
        cert = run_json(capsys, "certify", "-w", str(ws), "--transfer-model", "fake-judge-2", "--no-bias")
    assert cert["certificate_version"] == CERTIFICATE_VERSION == 1
    head = git(ws, "rev-parse", "HEAD").strip()
    assert cert["revision"] == head
    fig = cert["agreement"]
    tp, pos, tn, neg = _expected_counts(judge, ws)
    assert (fig["tp"], fig["positives"], fig["tn"], fig["negatives"]) == (tp, pos, tn, neg)
    assert fig["tpr_lower"] == clopper_pearson_lower(tp, pos) and fig["tnr_lower"] == clopper_pearson_lower(
        tn, neg
    )
    assert fig["tpr_lower"] < fig["tpr"] and fig["tnr_lower"] < fig["tnr"]
    lo, hi = fig["kappa_interval"]
    assert lo <= fig["kappa"] <= hi and fig["kappa_band"] == landis_koch(fig["kappa"])
    assert "bootstrap" in fig["kappa_interval_method"]
    by_type = fig["fpr_by_type"]
    assert sum(t["negatives"] for t in by_type.values()) == neg
    assert sum(t["false_positives"] for t in by_type.values()) == fig["fp"] == neg - tn
    # A deterministic judge: the retest agrees on every item; the same judge under another model name too.
    assert cert["test_retest"]["agreement"] == 1.0 and cert["test_retest"]["items"] == pos + neg
    assert cert["transfer"]["status"] == "run" and cert["transfer"]["model"] == "fake-judge-2"
    assert cert["transfer"]["kappa_delta"] == 0.0 and cert["transfer"]["fpr_delta"] == 0.0
    st = cert["selftest"]
    assert st["status"] == "current" and st["planted_rolled_back"] is True and st["aa"]["kept"] == 0
    assert cert["confirm"]["status"] == "none"
    assert cert["bias_battery"] == {"status": "not run", "note": "--no-bias"}  # the battery: the test below
    inv = cert["invalidated_by"]
    assert inv["judge_model"] == "fake-judge" and inv["judge_model_versions"] == ["fake-judge"]
    assert (
        inv["split_fingerprint"] == cert["split"]["fingerprint"] and inv["prompt_hash"] == cert["prompt_hash"]
    )
    # Both files, under experiments/certificates/, the JSON exactly what was printed.
    path = ws / cert["files"]["json"]
    assert path.parent == ws / "experiments" / "certificates"
    assert json.loads(path.read_text(encoding="utf-8")) == cert
    markdown = (ws / cert["files"]["markdown"]).read_text(encoding="utf-8")
    for needle in (
        "certificate_version 1",
        "`tpr_lower`",
        "`tnr_lower`",
        "Landis–Koch",
        "Test–retest",
        "Self-test",
        "fake-judge-2",
        "Held-out confirmation",
        "Bias battery",
        "What invalidates it",
    ):
        assert needle in markdown, needle
    # Referenced from the commit by a note (refs/notes/judgeloop): the commit itself is not rewritten.
    note = read_note(Workspace.open(ws), head)
    assert note is not None
    assert f"Judgeloop-Certificate: {cert['files']['json']}" in note
    assert f"Judgeloop-Certificate-Sha256: {hashlib.sha256(path.read_bytes()).hexdigest()}" in note
    assert untouched_state(ws) == before  # HEAD, branch, status, refs, prompts/ and devset/ as they were


@pytest.mark.slow
def test_certify_evaluates_a_revision_never_evaluated_and_a_second_certify_is_served_by_the_cache(
    ws: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    rubric = ws / "prompts" / "rubric.md"
    rubric.write_text(
        rubric.read_text(encoding="utf-8") + "\n- Read every step before answering.\n", encoding="utf-8"
    )
    commit_all(ws, "a rubric line")
    rev = git(ws, "rev-parse", "HEAD").strip()
    git(ws, "checkout", "-q", "HEAD~1")  # the certified revision is not the checked-out one
    judge = GullibleJudge(ws)
    with FakeLLMServer(default=judge) as server:
        first = run_json(capsys, "certify", rev[:12], "-w", str(ws), "--no-bias", *judge_args(server))
        n = len(judge.answered)
        again = run_json(capsys, "certify", rev[:12], "-w", str(ws), "--no-bias", *judge_args(server))
    assert first["revision"] == rev and first["cost"]["calls"] == n == 2 * 32  # first pass and retest
    assert again["cost"]["calls"] == 0 and again["cost"]["cache_hits"] == 2 * 32 and len(judge.answered) == n
    assert again["agreement"] == first["agreement"]
    assert first["selftest"]["status"] == "not run"
    assert git(ws, "rev-parse", "HEAD").strip() == git(ws, "rev-parse", f"{rev}~1").strip()


@pytest.mark.slow
def test_certify_cites_a_held_out_confirmation_from_the_ledger_without_running_one(
    ws: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from optimizer.ledger import Ledger
    from optimizer.stats.metrics import Metrics

    head = git(ws, "rev-parse", "HEAD").strip()
    w = Workspace.open(ws)
    w.experiments_dir.mkdir(exist_ok=True)
    with Ledger(w.ledger_path) as ledger:
        ledger.add_confirmation("ah", head, Metrics.from_counts(40, 10, 80, 20))
    judge = GullibleJudge(ws)
    with FakeLLMServer(default=judge) as server:
        cert = run_json(capsys, "certify", "-w", str(ws), "--no-bias", *judge_args(server))
    assert cert["confirm"]["status"] == "recorded"
    (row,) = cert["confirm"]["splits"]
    assert row["split"] == "ah" and row["n"] == 150 and row["fpr"] == pytest.approx(0.2)
    assert cert["cost"]["calls"] == 2 * 32  # the dev split only: nothing judged on "ah"


def test_certify_refuses_a_held_out_dev_split_and_a_bad_revision_and_writes_nothing(
    ws: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    judge = GullibleJudge(ws)
    before = untouched_state(ws)
    with FakeLLMServer(default=judge) as server:
        for rev in ("../../etc/passwd", "HEAD:prompts/rubric.md", "no-such-branch", "HEAD~99"):
            capsys.readouterr()
            assert main(["certify", rev, "-w", str(ws), "--no-bias", *judge_args(server)]) == 2, rev
            err = capsys.readouterr().err.strip()
            assert err.startswith("judgeloop") and "\n" not in err, rev
        set_toml_key(ws, "workspace", "heldout_splits", '["small"]')
        capsys.readouterr()
        assert main(["certify", "-w", str(ws), "--no-bias", *judge_args(server)]) == 2
        err = capsys.readouterr().err.strip()
        assert "held" in err and "'small'" in err and "\n" not in err
        assert server.requests == []
    assert not (ws / "experiments" / "certificates").exists()
    assert read_note(Workspace.open(ws), before["head"]) is None
    assert {k: v for k, v in untouched_state(ws).items() if k != "status"} == {
        k: v for k, v in before.items() if k != "status"
    }


@pytest.mark.slow
def test_certify_includes_the_bias_battery_when_optimizer_bias_is_there(
    ws: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The battery (optimizer.trust.bias, tested in test_bias.py) is looked up at call time; this one stands in for it
    # with its interface: run_battery(ws, rev, *, split, events, budget_usd) -> to_json(), markdown_lines().
    asked: list[tuple[str, str | None, float | None]] = []

    class Result:
        def to_json(self) -> dict[str, object]:
            return {"probes": [{"name": "claims-complete", "flip_rate": 0.25, "flagged": True}]}

        def markdown_lines(self) -> list[str]:
            return ["- claims-complete: flips 25% of verdicts (placebo 0%): flagged"]

    def run_battery(
        ws_: Workspace,
        rev: str,
        *,
        split: str | None,
        events: object,
        budget_usd: float | None,
        judge: object,
    ) -> Result:
        asked.append((rev, split, budget_usd))
        return Result()

    module = types.ModuleType("optimizer.trust.bias")
    module.run_battery = run_battery  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "optimizer.trust.bias", module)
    with FakeLLMServer(default=GullibleJudge(ws)) as server:
        cert = run_json(capsys, "certify", "-w", str(ws), *judge_args(server))
    assert asked == [(cert["revision"], None, None)]
    assert cert["bias_battery"] == {
        "status": "run",
        "result": {"probes": [{"name": "claims-complete", "flip_rate": 0.25, "flagged": True}]},
    }
    markdown = (ws / cert["files"]["markdown"]).read_text(encoding="utf-8")
    assert "- claims-complete: flips 25% of verdicts (placebo 0%): flagged" in markdown


@pytest.mark.slow
def test_certify_skips_a_crafted_or_truncated_selftest_file_and_cites_the_last_good_one(
    ws: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    with FakeLLMServer(default=GullibleJudge(ws)) as server:
        good = run_json(capsys, "selftest", "-w", str(ws), "--repeats", "1", *judge_args(server))
        folder = ws / "experiments" / "selftest"
        newer = {**good, "created": "2999-01-01T00:00:00+00:00"}
        (folder / "29990101-000000-aaaaaaaa.json").write_text(
            json.dumps({**newer, "aa": {"repeats": "many"}})
        )
        (folder / "29990101-000001-bbbbbbbb.json").write_text(json.dumps(newer)[:200])  # cut short
        (folder / "29990101-000002-cccccccc.json").write_text(
            json.dumps({**newer, "planted": {"rolled_back": "yes"}})
        )
        (folder / "29990101-000003-dddddddd.json").write_text("[1, 2, 3]")
        cert = run_json(capsys, "certify", "-w", str(ws), "--no-bias", *judge_args(server))
    assert cert["selftest"]["status"] == "current" and cert["selftest"]["file"] == good["files"]["json"]


@pytest.mark.slow
def test_a_cascades_certificate_records_each_stages_calls_and_cost_and_the_escalation_share(
    ws: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    judges = TwoJudges.of_workspace(ws, correlated=True)
    with FakeLLMServer(default=judges) as server:
        write_cascade(ws, server.openai_base_url, ("success",), cheap="fake-judge")
        commit_all(ws, "a cascade")
        cert = run_json(capsys, "certify", "-w", str(ws), "--no-bias", *judge_args(server))
    cascade = cert["cascade"]
    ids = list(labels_of(ws))  # the dev split (the answer table holds every split)
    escalated = [t for t in ids if judges.says_success(CHEAP, t)]
    # The first pass's record: the first judge on every item, the strict one on the cheap one's successes.
    assert (cascade["rule"], cascade["judged"]) == ("success", len(ids))
    assert cascade["escalated"] == len(escalated) and cascade["escalation_share"] == pytest.approx(
        len(escalated) / len(ids), abs=1e-4
    )
    assert cascade["second_model"] == STRICT and no_credentials(cascade["second_base_url"])
    first, second = cascade["first"], cascade["second"]
    assert (first["items"], first["calls"]) == (len(ids), len(ids))
    assert (second["items"], second["calls"]) == (len(escalated), len(escalated))
    assert first["cost_usd"] == pytest.approx(len(ids) * CALL_USD[CHEAP], abs=1e-5)
    assert second["cost_usd"] == pytest.approx(len(escalated) * CALL_USD[STRICT], abs=1e-5)
    # The JSON file holds it as printed; the Markdown has its section.
    assert json.loads((ws / cert["files"]["json"]).read_text(encoding="utf-8"))["cascade"] == cascade
    markdown = (ws / cert["files"]["markdown"]).read_text(encoding="utf-8")
    assert "## Cascade" in markdown
    assert f"{len(escalated)} of {len(ids)} items escalated" in markdown and f"`openai:{STRICT}`" in markdown


def no_credentials(url: str | None) -> bool:
    return url is not None and "@" not in url and "key" not in url.lower()


def test_a_single_judges_certificate_has_no_cascade_key(ws: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with FakeLLMServer(default=GullibleJudge(ws)) as server:
        cert = run_json(capsys, "certify", "-w", str(ws), "--no-bias", *judge_args(server))
    assert "cascade" not in cert
    assert "## Cascade" not in (ws / cert["files"]["markdown"]).read_text(encoding="utf-8")
