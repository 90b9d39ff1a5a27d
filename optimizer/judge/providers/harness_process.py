"""One run of a harness CLI with bounded output and a bounded life (`run_bounded`).

stdout and stderr go to pipes of our own, read as they come into capped buffers (`CappedBytes`:
stdout keeps its first and last `STDOUT_KEEP` / 2 bytes, stderr its last `STDERR_KEEP`; the rest is
counted and dropped), so 600 MB of output costs no more memory than 1 MB. The run ends when the
process exits or ``timeout_s`` passes; then its whole process group is killed (under bubblewrap that is
bwrap, whose PID namespace dies with it, daemons and grandchildren included). The pipes are drained
for at most `DRAIN_S` after that and closed: a daemon that escaped and still holds them (possible only
unconfined) never keeps the call waiting.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

# Bytes of stdout kept (head and tail halves) and of stderr (the tail).
STDOUT_KEEP = 1_000_000
STDERR_KEEP = 4_000
# Seconds the pipes are still read after the process group was killed (what was written before).
DRAIN_S = 2.0
_CHUNK = 65_536


class CappedBytes:
    """A byte buffer keeping at most ``head`` bytes from the start and ``tail`` from the end of what
    was written; ``dropped`` counts the bytes in between that were thrown away."""

    def __init__(self, head: int, tail: int) -> None:
        self._head_cap, self._tail_cap = head, tail
        self.head = bytearray()
        self.tail = bytearray()
        self.dropped = 0

    def write(self, data: bytes) -> None:
        room = self._head_cap - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        if not data:
            return
        self.tail += data
        over = len(self.tail) - self._tail_cap
        if over > 0:
            self.dropped += over
            del self.tail[:over]

    def value(self) -> bytes:
        return bytes(self.head + self.tail)


@dataclass(frozen=True)
class RunResult:
    """How a run ended: ``returncode`` (None: killed at the timeout), what was kept of stdout and
    stderr and how many bytes of each were dropped."""

    returncode: int | None
    stdout: bytes
    stderr: bytes
    stdout_dropped: int
    stderr_dropped: int


class _PipeReader:
    """Reads one pipe (non-blocking, on the event loop) into a `CappedBytes` until EOF or `close`."""

    def __init__(self, fd: int, sink: CappedBytes) -> None:
        self.fd, self.sink = fd, sink
        self.eof = asyncio.get_running_loop().create_future()
        os.set_blocking(fd, False)
        asyncio.get_running_loop().add_reader(fd, self._readable)

    def _readable(self) -> None:
        try:
            data = os.read(self.fd, _CHUNK)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if data:
            self.sink.write(data)
        else:
            self.close()

    def close(self) -> None:
        if self.fd < 0:
            return
        asyncio.get_running_loop().remove_reader(self.fd)
        os.close(self.fd)
        self.fd = -1
        if not self.eof.done():
            self.eof.set_result(None)


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


async def _feed(stdin: asyncio.StreamWriter | None, data: bytes | None) -> None:
    if stdin is None or data is None:
        return
    with contextlib.suppress(ConnectionError, BrokenPipeError):
        stdin.write(data)
        await stdin.drain()
        stdin.close()


async def run_bounded(
    argv: Sequence[str],
    *,
    cwd: Path,
    env: dict[str, str],
    stdin: bytes | None,
    timeout_s: float,
    pass_fds: Sequence[int] = (),
    preexec_fn: Callable[[], None] | None = None,
) -> RunResult:
    """Run ``argv`` in its own process group (see the module docstring); ``timeout_s`` in seconds.
    Raises OSError when it cannot start; cancelled, it kills the group before it re-raises."""
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv,
            cwd=cwd,
            env=env,
            stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
            stdout=out_w,
            stderr=err_w,
            start_new_session=True,
            pass_fds=tuple(pass_fds),
            preexec_fn=preexec_fn,
        )
    except BaseException:
        for fd in (out_r, err_r):
            os.close(fd)
        raise
    finally:
        os.close(out_w)
        os.close(err_w)
    out = CappedBytes(STDOUT_KEEP // 2, STDOUT_KEEP - STDOUT_KEEP // 2)
    err = CappedBytes(0, STDERR_KEEP)
    readers = [_PipeReader(out_r, out), _PipeReader(err_r, err)]
    feeder = asyncio.ensure_future(_feed(proc.stdin, stdin))
    returncode: int | None = None
    try:
        try:
            returncode = await asyncio.wait_for(proc.wait(), timeout=timeout_s)
        except TimeoutError:
            returncode = None
    finally:
        # Whatever happened (exit, timeout, cancellation): nothing of the run outlives it.
        _kill_group(proc.pid)
        feeder.cancel()
        if proc.stdin is not None:
            proc.stdin.close()
        with contextlib.suppress(Exception):
            await asyncio.shield(proc.wait())
        with contextlib.suppress(TimeoutError, asyncio.CancelledError):
            await asyncio.wait_for(asyncio.gather(*(r.eof for r in readers)), timeout=DRAIN_S)
        for reader in readers:
            reader.close()
    return RunResult(
        returncode=returncode,
        stdout=out.value(),
        stderr=err.value(),
        stdout_dropped=out.dropped,
        stderr_dropped=err.dropped,
    )


def die_with_parent() -> None:
    """In the child, before exec: SIGKILL when the process that started it dies (Linux prctl), so a
    judgeloop killed with -9 leaves no CLI (or bwrap) running. Elsewhere nothing (the timeout still applies)."""
    if sys.platform.startswith("linux"):
        import ctypes

        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
