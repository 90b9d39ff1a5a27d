"""Non-blocking proposals (issue 32, point 2): ``propose`` with ``wait: false`` answers a server-minted
handle at once and the candidate is evaluated in the server's background task; ``candidate_status``
answers the same progress the notifications carry and, once decided, the structured result.

Hosts move long calls to client-side background tasks, do not all surface progress and kill silent calls:
a handle the agent polls works in every one of them. One candidate at a time: a second ``propose`` while
one runs is refused in one line naming the handle, and so is every tool that judges or reads the prompt
files (the working tree holds the candidate until it is decided). A client that leaves while a candidate
runs stops it (the server's task group is cancelled): it is rolled back as a blocking ``propose`` is, and
a ``propose_only`` candidate already waiting stays decidable (`optimizer.mcp.session.McpSession.finish`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from optimizer.errors import UserError
from optimizer.events import ProgressSnapshot
from optimizer.loop.strategies.tools import ToolOutput
from optimizer.mcp.progress import CallProgress
from optimizer.mcp.results import Structured

# The tools refused while a background candidate runs: they judge, decide, or read the prompt files (the
# working tree holds the candidate's text until it is decided).
BUSY_TOOLS = frozenset({"propose", "decide", "attribute", "disagreements", "read_file"})

Evaluate = Callable[[], Awaitable[ToolOutput | Structured]]


@dataclass
class Candidate:
    """One non-blocking proposal: its handle, its progress over the whole candidate (as the notifications
    count it, unthrottled), and once it ends, its outcome or why it has none."""

    handle: str
    meter: CallProgress = field(default_factory=lambda: CallProgress(interval_s=0.0))
    state: str = "running"
    result: dict[str, Any] | None = None
    error: str | None = None

    def offer(self, snap: ProgressSnapshot) -> None:
        self.meter.offer(snap)

    def record(self) -> dict[str, Any]:
        """The candidate as ``candidate_status`` answers it (`optimizer.mcp.results.CANDIDATE_STATUS_SCHEMA`)."""
        notice = self.meter.latest()
        progress = (
            {"progress": notice.progress, "total": notice.total, "message": notice.message}
            if notice is not None
            else None
        )
        return {
            "handle": self.handle,
            "state": self.state,
            "progress": progress,
            "result": self.result,
            "error": self.error,
            "next": _NEXT[self.state](self),
        }


def _next_decided(c: Candidate) -> str:
    outcome = (c.result or {}).get("outcome")
    if outcome == "waiting":
        return f"experiment {(c.result or {}).get('experiment')} is waiting: call decide (or answer the person's question)"
    return "read the outcome; propose the next small, general edit"


_NEXT: dict[str, Callable[[Candidate], str]] = {
    "running": lambda c: f"being evaluated: call candidate_status with handle {c.handle!r} again later",
    "decided": _next_decided,
    "refused": lambda _c: "nothing was proposed or committed: fix what error says and propose again",
    "failed": lambda _c: "the candidate was rolled back; see error, then status",
}


class Candidates:
    """The session's non-blocking candidates by handle, and the one running, if any."""

    def __init__(self) -> None:
        self._by_handle: dict[str, Candidate] = {}
        self.running: Candidate | None = None

    def busy(self, tool: str) -> str | None:
        """Why ``tool`` is refused now (a candidate runs and ``tool`` judges or reads its files), or None."""
        running = self.running
        if running is None or tool not in BUSY_TOOLS:
            return None
        return (
            f"{tool} is refused while candidate {running.handle} is being evaluated (one candidate at a "
            f"time); call candidate_status with handle {running.handle!r} until it is decided"
        )

    def start(self) -> Candidate:
        """A new candidate, the running one; `run` it in a background task."""
        assert self.running is None, "one candidate at a time (`busy` refuses a second)"
        candidate = Candidate(handle=f"c{len(self._by_handle) + 1}")
        self._by_handle[candidate.handle] = candidate
        self.running = candidate
        return candidate

    def get(self, handle: str) -> Candidate | None:
        return self._by_handle.get(handle)

    def known(self) -> list[str]:
        return list(self._by_handle)

    async def run(self, candidate: Candidate, evaluate: Evaluate) -> None:
        """Evaluate ``candidate`` (``evaluate``: the session's propose, its progress sent to the
        candidate) and record how it ended. A cancellation (the client left) is not caught: the session's
        propose rolls the candidate back on its way out, as a blocking one's does."""
        try:
            out = await evaluate()
        except UserError as exc:
            candidate.state, candidate.error = "failed", str(exc)
        except Exception as exc:  # noqa: BLE001 - the server goes on; propose rolled the candidate back
            candidate.state, candidate.error = "failed", f"{type(exc).__name__}: {exc}"
        else:
            if isinstance(out, Structured):
                candidate.state, candidate.result = "decided", out.data
            else:
                candidate.state, candidate.error = "refused", out.problem or out.text.removeprefix("error: ")
        finally:
            self.running = None
