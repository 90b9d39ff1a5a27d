"""Smoke test of benchmarks/throughput.py: the real loop in batch mode with waves of 1 and 2 against the
fake server's time-based batches; the simulated clock and the table. No timing assertion: figures
are compared with each other and with the ledger, not with a clock."""

from __future__ import annotations

import pytest

from benchmarks import throughput as tp


def test_pending_union_counts_overlapping_batches_once() -> None:
    assert tp.pending_union([(0.0, 1.0), (0.5, 1.5), (3.0, 4.0)]) == pytest.approx(2.5)
    assert tp.pending_union([]) == 0.0


@pytest.mark.slow
def test_a_wave_of_two_sends_fewer_batches_than_one_at_a_time_for_the_same_candidates() -> None:
    kinds = ["noop", "noop"]
    one = tp.measure(1, kinds, latency_s=0.05, batch_minutes=10)
    two = tp.measure(2, kinds, latency_s=0.05, batch_minutes=10)
    assert one.decided == two.decided == 2 and one.kept == two.kept == 0
    # One at a time: each candidate's passes are batches of their own; a wave of two shares every pass.
    assert two.batches < one.batches
    assert one.simulated_h > 0 and two.simulated_h > 0
    lines = tp.table([one, two])
    assert lines[2].split()[:4] == ["1", "2", "0", str(one.batches)]
    assert lines[3].split()[:4] == ["2", "2", "0", str(two.batches)] and lines[2].split()[-1] == "1.0x"
