"""What the session's reading tools read: the incumbent's `ProposalContext`, built once and reused until
something it is made of changes (issue 32, point 7).

Building it reads every verdict of the incumbent, the run's history, the guidance and the reviews, the
prompt files and git (about 150 ms on two busy cores), and an agent calls the reading tools hundreds of
times between two candidates. The cache keys on a stamp of what the context reads, cheap to take: the
incumbent, the run's experiments and their statuses, the guidance file's and the prompt files' stat, the
reviews' ids. The session holds the workspace's loop lock, so no other run can decide anything meanwhile.
"""

from __future__ import annotations

from collections.abc import Hashable
from pathlib import Path

from optimizer.ledger import Experiment
from optimizer.loop.context import RunContext
from optimizer.loop.propose import proposal_context
from optimizer.loop.strategies import ProposalContext


def _stat(path: Path) -> tuple[int, int] | None:
    """``path``'s modification time (ns) and size, None when it is not a file."""
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_mtime_ns, st.st_size


class ContextCache:
    """The incumbent's proposal context, rebuilt only when its stamp changes."""

    def __init__(self) -> None:
        self._stamp: Hashable | None = None
        self._context: ProposalContext | None = None
        self.builds = 0  # how many times it was built (what the benchmark and a test read)

    def stamp(self, ctx: RunContext, incumbent: Experiment) -> Hashable:
        """What the context of ``incumbent`` is made of, as a value that changes when any of it does."""
        cfg = ctx.ws.config
        files = (*cfg.optimizer.editable_files, "prompts/judge.toml")
        return (
            incumbent.id,
            tuple((e.id, e.status) for e in ctx.ledger.experiments(ctx.run.id)),
            _stat(ctx.ws.guidance_path),
            tuple(r.id for r in ctx.ledger.reviews()),
            tuple((p, _stat(ctx.root / p)) for p in files),
        )

    def get(self, ctx: RunContext, incumbent: Experiment) -> ProposalContext:
        """The context a proposal on ``incumbent`` sees now (`optimizer.loop.propose.proposal_context`)."""
        stamp = self.stamp(ctx, incumbent)
        if self._context is None or stamp != self._stamp:
            seq = max((e.seq for e in ctx.ledger.experiments(ctx.run.id)), default=0) + 1
            self._context = proposal_context(ctx, incumbent, seq)
            self._stamp = stamp
            self.builds += 1
        return self._context
