"""`optimizer.mcp.progress.CallProgress` with an injected clock: one call's progress values strictly increase
over all its passes, and notifications go out at most two a second, the last one always."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from optimizer.events import ProgressSnapshot
from optimizer.mcp.progress import CallProgress, Notice


@dataclass
class Clock:
    now: float = 0.0

    def __call__(self) -> float:
        return self.now


def snap(done: int, total: int) -> ProgressSnapshot:
    return ProgressSnapshot(done, total, 0, 0, done, 0, 0, 0, 0.0, 0.0)


def drive(
    meter: CallProgress, clock: Clock, snaps: list[ProgressSnapshot], step_s: float
) -> list[tuple[float, Notice]]:
    """Offer ``snaps`` ``step_s`` apart as the server does (a held notice released when its time comes), then
    end the call (the held last one waits its turn); every notice sent with its clock time."""
    sent: list[tuple[float, Notice]] = []
    for s in snaps:
        wait = meter.wait_s()
        if wait is not None and wait <= step_s:  # the server's timer fires before the next snapshot
            clock.now += wait
            released = meter.release()
            assert released is not None
            sent.append((clock.now, released))
            clock.now += step_s - wait
        else:
            clock.now += step_s
        notice = meter.offer(s)
        if notice is not None:
            sent.append((clock.now, notice))
    wait = meter.wait_s()
    if wait is not None:
        clock.now += wait
        last = meter.release()
        assert last is not None
        sent.append((clock.now, last))
    return sent


def passes() -> list[ProgressSnapshot]:
    """A candidate as the engine reports it: the first pass to 40 of 88 (a futility look), re-judging 11
    disagreements from 1, then the first pass on from 41 to its end (what the issue saw reset)."""
    return (
        [snap(d, 88) for d in range(1, 41)]
        + [snap(d, 11) for d in range(1, 12)]
        + [snap(d, 88) for d in range(41, 89)]
    )


def test_progress_values_strictly_increase_over_every_pass_of_a_call_never_reset() -> None:
    clock = Clock()
    sent = drive(CallProgress(interval_s=0.0, clock=clock), clock, passes(), step_s=0.01)
    values = [n.progress for _, n in sent]
    assert all(b > a for a, b in itertools.pairwise(values)), values
    # Every judged item counted once: 40 + 11 + 48, over what was planned so far.
    assert values[-1] == 99 and sent[-1][1].total == 99
    assert [n.total for _, n in sent][:40] == [88.0] * 40
    assert (sent[45][1].progress, sent[45][1].total) == (40 + 6, 88 + 11)  # re-judging counted in, then on
    assert (sent[51][1].progress, sent[51][1].total) == (40 + 11 + 1, 88 + 11)


def test_notifications_are_at_most_two_a_second_and_the_last_one_is_always_sent() -> None:
    clock = Clock()
    snaps = passes() * 4  # ~400 snapshots 10 ms apart, as attribute sent them (396 in 3.4 s)
    sent = drive(CallProgress(clock=clock), clock, snaps, step_s=0.0085)
    times = [t for t, _ in sent]
    assert all(b - a >= 0.5 - 1e-9 for a, b in itertools.pairwise(times)), times
    assert all(sum(1 for t in times if start <= t < start + 1.0) <= 2 for start in times)
    assert 5 <= len(sent) <= 2 * (clock.now - times[0]) + 1 + 1e-9
    values = [n.progress for _, n in sent]
    assert all(b > a for a, b in itertools.pairwise(values))
    # The last notice is the call's last snapshot counted in, sent although it came too soon.
    assert values[-1] == 4 * 99


def test_a_snapshot_that_does_not_advance_the_call_is_not_sent() -> None:
    clock = Clock()
    meter = CallProgress(clock=clock)
    assert meter.offer(snap(0, 32)) is None  # nothing judged yet: 0 is not progress
    first = meter.offer(snap(3, 32))
    assert first is not None and first.progress == 3
    clock.now = 1.0
    assert meter.offer(snap(3, 32)) is None and meter.wait_s() is None


def test_the_pace_holds_across_calls_the_next_calls_first_notice_waits_its_turn() -> None:
    clock = Clock()
    first = CallProgress(clock=clock)
    assert first.offer(snap(1, 32)) is not None
    clock.now = 0.2
    following = CallProgress(clock=clock, sent_at=first.sent_at)  # the server's next call
    assert following.offer(snap(1, 32)) is None and following.wait_s() == 0.5 - 0.2
    clock.now = 0.5
    released = following.release()
    assert released is not None and released.progress == 1 and following.sent_at == 0.5


def test_a_silent_call_sends_a_heartbeat_still_increasing_still_paced_and_never_a_whole_item_more() -> None:
    clock = Clock()
    meter = CallProgress(clock=clock)
    assert meter.beat(20.0) is None  # not silent yet
    clock.now = 20.0
    first = meter.beat(20.0)  # nothing judged yet (a slow first judge call): a beat from 0
    assert first is not None and 0 < first.progress < 1 and first.total is None
    assert "still working" in first.message
    clock.now = 21.0
    real = meter.offer(snap(1, 32))
    assert real is not None and real.progress == 1 and real.total == 32
    beats = []
    for n in range(1, 2000):  # silent for a long time: a beat every 20 s, each above the last, below 2
        clock.now = 21.0 + 20.0 * n
        beat = meter.beat(20.0)
        if beat is not None:
            beats.append(beat)
    values = [1.0] + [b.progress for b in beats]
    assert all(b > a for a, b in itertools.pairwise(values)) and values[-1] < 2
    assert beats[0].total == 32 and beats[0].message.startswith("still working")
    clock.now += 1.0
    after = meter.offer(snap(2, 32))  # the next item goes on from the whole count, above every beat
    assert after is not None and after.progress == 2
    # A held notice is what a beat sends (no invented value when a real one waits).
    clock.now += 0.1
    assert meter.offer(snap(3, 32)) is None
    clock.now += 30.0
    held = meter.beat(20.0)
    assert held is not None and held.progress == 3
