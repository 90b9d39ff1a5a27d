"""Smoke tests of benchmarks/night.py: its world (edits and true metrics) and one ``--quick --json`` run
through the real decision code. Structure and outcomes a broken benchmark would change; no timing."""

from __future__ import annotations

import contextlib
import io
import json
import math
from typing import Any

import numpy as np
import pytest

from benchmarks import night
from benchmarks._night_loop import RULES, loop_for
from benchmarks._night_model import (
    DEFAULT_DISTS,
    DEV_KIND_COUNTS,
    draw_edit,
    make_items,
    parse_dist,
    true_metrics,
)


@pytest.fixture(scope="module")
def quick_run() -> dict[str, Any]:
    """One ``--quick --json`` run (every default distribution, the null nights, every rule)."""
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        assert night.main(["--quick", "--json"]) == 0
    out = buffer.getvalue().splitlines()
    assert len(out) == 1, "--json prints one object on one line"

    def refuse(constant: str) -> None:
        raise AssertionError(f"--json printed {constant}, which is not JSON")

    parsed: dict[str, Any] = json.loads(out[0], parse_constant=refuse)
    return parsed


@pytest.mark.slow
def test_quick_json_has_a_row_per_distribution_and_rule(quick_run: dict[str, Any]) -> None:
    rows = quick_run["rows"]
    assert [(r["dist"], r["rule"]) for r in rows] == [
        (d, rule) for d in (*DEFAULT_DISTS, "null") for rule in RULES
    ]
    for row in rows:
        assert set(row) == set(night.ROW_FIELDS)
        assert row["nights"] == (quick_run["null_nights"] if row["dist"] == "null" else quick_run["nights"])
        assert 0 < row["calls"] <= row["budget"]  # the budget is never overspent
        assert row["decided"] >= 1
        assert row["kept"] == pytest.approx(row["kept_share"] * row["decided"])
        # A merged keep (stacking) is one keep whose K parts are each counted by kind.
        parts = (loop_for(row["rule"]).stack - 1) * row["merged_kept"] if row["merged_kept"] else 0
        assert row["helpful_kept"] + row["harmful_kept"] <= row["kept"] + parts
        assert row["dev_only_kept"] <= row["helpful_kept"]
        assert all(math.isfinite(row[k]) for k in ("dev_kappa_gain", "held_out_kappa_gain"))
        # One night has no standard error: None, never NaN (strict JSON).
        assert row["held_out_kappa_se"] is None if row["nights"] < 2 else row["held_out_kappa_se"] >= 0
        # Only the literal rule has no level; the others test at the [loop] default.
        assert (row["alpha"] is None) == (row["rule"] == "literal")
    null = [r for r in rows if r["dist"] == "null"]
    # Nothing real changes on a null night: the true gains are exactly zero, whatever is kept.
    assert all(r["dev_kappa_gain"] == 0 and r["held_out_fpr_change_pp"] == 0 for r in null)


@pytest.mark.slow
def test_null_nights_keep_no_more_than_alphas_share_of_tests(quick_run: dict[str, Any]) -> None:
    for row in quick_run["rows"]:
        if row["dist"] != "null" or row["alpha"] is None:
            continue
        tests = round(row["decided"] * row["nights"])
        kept = round(row["kept_share"] * tests)
        # A loose bound (few quick nights): alpha's share plus three binomial standard deviations.
        bound = row["alpha"] * tests + 3 * math.sqrt(tests * row["alpha"] * (1 - row["alpha"])) + 1
        assert kept <= bound, f"{row['rule']}: {kept} of {tests} null tests kept (alpha {row['alpha']})"


def test_edits_move_the_true_metrics_the_way_their_kind_says() -> None:
    rng = np.random.default_rng(3)
    dev, held = make_items(rng), make_items(rng, 3)
    assert len(dev.kind) == sum(DEV_KIND_COUNTS) == 162 and int(dev.positive.sum()) == 62
    assert len(held.kind) == 3 * 162
    base_dev, base_held = true_metrics(dev.logit, dev.positive), true_metrics(held.logit, held.positive)
    seen = set()
    for _ in range(300):
        edit = draw_edit(rng, parse_dist("small,transfer=0.5"), (dev, held))
        after_dev = true_metrics(dev.logit + edit.dev, dev.positive)
        after_held = true_metrics(held.logit + edit.held, held.positive)
        if edit.direction == "helpful":
            assert after_dev.kappa > base_dev.kappa and after_dev.fpr <= base_dev.fpr
            if edit.dev_only:
                assert not edit.held.any()  # fits dev items only
            seen.add("dev-only" if edit.dev_only else "transfers")
        elif edit.direction == "harmful" and edit.fpr_raising:
            assert after_dev.fpr > base_dev.fpr and after_held.fpr >= base_held.fpr
            seen.add("fpr")
        elif edit.direction == "neutral":
            assert not edit.dev.any() and not edit.held.any()
            seen.add("neutral")
    assert seen == {"dev-only", "transfers", "fpr", "neutral"}


def test_a_distribution_spec_overrides_a_preset_and_bad_specs_are_refused() -> None:
    dist = parse_dist("large,helpful=0.3,large=10-20")
    assert (dist.helpful, dist.large, dist.harmful) == (0.3, (10, 20), parse_dist("large").harmful)
    for bad in ("nope", "small,colour=1", "small,small=3", "small,helpful=0.8,harmful=0.5"):
        with pytest.raises(ValueError):
            parse_dist(bad)
