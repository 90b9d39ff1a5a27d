"""The ledger's ``items``, ``verdicts`` and ``run_labels`` tables: an experiment's majority answers and
every replicate's verdict, and the labels a run scored with (stored apart; never judge input).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from optimizer.ledger.core import LedgerCore
from optimizer.ledger.rows import (
    ItemVerdict,
    LabelRow,
    MemberVerdict,
    ReplicateVerdict,
    detail_dict,
    opt_bool,
    tool_calls,
)

if TYPE_CHECKING:
    from optimizer.models import Label
    from optimizer.stats.metrics import Answer


class VerdictTables(LedgerCore):
    """Items, verdicts and a run's labels (a part of `optimizer.ledger.Ledger`)."""

    # -- verdicts ---------------------------------------------------------------------------------

    def record_verdicts(self, experiment_id: int, items: Iterable[ItemVerdict]) -> int:
        """Store items (majority answers) and every replicate in one transaction; replaces rows with the
        same keys, so recording an item twice (e.g. after a resume) is harmless. Returns the item count.
        """
        item_rows: list[tuple[Any, ...]] = []
        verdict_rows: list[tuple[Any, ...]] = []
        for item in items:
            item_rows.append(
                (
                    experiment_id,
                    item.trajectory_id,
                    None if item.success is None else int(item.success),
                    item.status,
                    item.mistake_type,
                    int(item.unstable),
                )
            )
            for rep in item.replicates:
                verdict_rows.append(
                    (
                        experiment_id,
                        item.trajectory_id,
                        rep.replicate,
                        None if rep.success is None else int(rep.success),
                        rep.status,
                        rep.reasoning,
                        rep.confidence,
                        rep.mistake_type,
                        rep.raw,
                        int(rep.cached),
                        rep.cost_usd,
                        json.dumps([c.to_json() for c in rep.tools]) if rep.tools else None,
                        json.dumps([m.model_dump(mode="json") for m in rep.members]) if rep.members else None,
                        rep.detail_json(),
                    )
                )
        with self.transaction() as cur:
            cur.executemany("INSERT OR REPLACE INTO items VALUES (?, ?, ?, ?, ?, ?)", item_rows)
            cur.executemany(
                "INSERT OR REPLACE INTO verdicts (experiment_id, trajectory_id, replicate, success, status, reasoning,"
                " confidence, mistake_type, raw, cached, cost_usd, tools, members, detail)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                verdict_rows,
            )
        return len(item_rows)

    def item_verdicts(self, experiment_id: int, trajectory_id: str | None = None) -> list[ItemVerdict]:
        """An experiment's items (in trajectory id order) with their replicates; optionally one item."""
        where = "experiment_id = ?" + (" AND trajectory_id = ?" if trajectory_id else "")
        params: tuple[Any, ...] = (experiment_id, trajectory_id) if trajectory_id else (experiment_id,)
        reps: dict[str, list[ReplicateVerdict]] = {}
        for r in self._query(
            "SELECT trajectory_id, replicate, success, status, reasoning, confidence, mistake_type, raw, cached, "
            f"cost_usd, {'tools' if self.version >= 2 else 'NULL'}, {'members' if self.version >= 9 else 'NULL'}, {'detail' if self.version >= 9 else 'NULL'} "
            f"FROM verdicts WHERE {where} "
            "ORDER BY trajectory_id, replicate",
            params,
        ):
            # model_construct: rows were validated on the way in; this keeps a 162×3 load fast.
            reps.setdefault(r[0], []).append(
                ReplicateVerdict.model_construct(
                    replicate=r[1],
                    success=opt_bool(r[2]),
                    status=r[3],
                    reasoning=r[4] or "",
                    confidence=r[5],
                    mistake_type=r[6],
                    raw=r[7],
                    cached=bool(r[8]),
                    cost_usd=r[9],
                    tools=tool_calls(r[10]),
                    members=[MemberVerdict.model_validate(m) for m in json.loads(r[11])] if r[11] else [],
                    **detail_dict(r[12]),
                )
            )
        return [
            ItemVerdict.model_construct(
                trajectory_id=r[0],
                success=opt_bool(r[1]),
                status=r[2],
                mistake_type=r[3],
                unstable=bool(r[4]),
                replicates=reps.get(r[0], []),
            )
            for r in self._query(
                f"SELECT trajectory_id, success, status, mistake_type, unstable FROM items WHERE {where} "
                "ORDER BY trajectory_id",
                params,
            )
        ]

    def item_judgements(self, experiment_id: int) -> dict[str, list[Answer]]:
        """An experiment's replicate verdicts as ``metrics.Answer`` per item, in replicate order."""
        from optimizer.stats.metrics import Answer

        out: dict[str, list[Answer]] = {}
        for r in self._query(
            "SELECT trajectory_id, success, status, mistake_type FROM verdicts WHERE experiment_id = ? "
            "ORDER BY trajectory_id, replicate",
            (experiment_id,),
        ):
            out.setdefault(r[0], []).append(Answer(success=opt_bool(r[1]), mistake_type=r[3], status=r[2]))
        return out

    def experiments_judging(self, trajectory_id: str) -> list[int]:
        """Every experiment, of every run, with a verdict on ``trajectory_id``, by id (the TUI's ``]``/``[``)."""
        return [
            int(r[0])
            for r in self._query(
                "SELECT DISTINCT experiment_id FROM items WHERE trajectory_id = ? ORDER BY experiment_id",
                (trajectory_id,),
            )
        ]

    def item_answers(self, experiment_id: int) -> dict[str, Answer]:
        """An experiment's majority answers as ``metrics.Answer`` (what ``metrics.score`` takes)."""
        from optimizer.stats.metrics import Answer

        return {
            r[0]: Answer(success=opt_bool(r[1]), mistake_type=r[3], status=r[2])
            for r in self._query(
                "SELECT trajectory_id, success, status, mistake_type FROM items WHERE experiment_id = ?",
                (experiment_id,),
            )
        }

    def split_judgements(self, split: str) -> list[tuple[int, str, str, int, bool | None, str | None]]:
        """Every replicate verdict of every experiment of every run on ``split``, oldest first, as
        ``(experiment_id, version, trajectory_id, replicate, success, confidence)``; ``version`` names
        the prompts judged (the prompt hash, else the commit, else the experiment) — what the label
        suspects queue (`optimizer.answers.triage`) counts."""
        return [
            (int(r[0]), str(r[1]), str(r[2]), int(r[3]), opt_bool(r[4]), r[5])
            for r in self._query(
                "SELECT v.experiment_id, COALESCE(e.prompt_hash, e.commit_sha, 'experiment-' || e.id), "
                "v.trajectory_id, v.replicate, v.success, v.confidence FROM verdicts v "
                "JOIN experiments e ON e.id = v.experiment_id JOIN runs r ON r.id = e.run_id "
                "WHERE r.split = ? ORDER BY v.experiment_id, v.trajectory_id, v.replicate",
                (split,),
            )
        ]

    def split_evidence(self, split: str) -> list[tuple[int, str, str, ReplicateVerdict]]:
        """`split_judgements` with what the structural judges said: ``(experiment_id, version,
        trajectory_id, verdict)``, the verdict holding success, confidence, a panel's members and a
        criteria/review verdict's detail (no reasoning or raw text) — what `optimizer.answers.triage` counts."""
        rows = self._query(
            "SELECT v.experiment_id, COALESCE(e.prompt_hash, e.commit_sha, 'experiment-' || e.id), "
            "v.trajectory_id, v.replicate, v.success, v.confidence, "
            f"{'v.members' if self.version >= 9 else 'NULL'}, {'v.detail' if self.version >= 9 else 'NULL'} "
            "FROM verdicts v JOIN experiments e ON e.id = v.experiment_id JOIN runs r ON r.id = e.run_id "
            "WHERE r.split = ? ORDER BY v.experiment_id, v.trajectory_id, v.replicate",
            (split,),
        )
        return [
            (
                int(r[0]),
                str(r[1]),
                str(r[2]),
                ReplicateVerdict.model_construct(
                    replicate=int(r[3]),
                    success=opt_bool(r[4]),
                    confidence=r[5],
                    members=[MemberVerdict.model_validate(m) for m in json.loads(r[6])] if r[6] else [],
                    **detail_dict(r[7]),
                ),
            )
            for r in rows
        ]

    # -- labels (stored apart from verdicts; never judge input) -----------------------------------

    def set_labels(self, run_id: str, labels: Mapping[str, Label] | Iterable[LabelRow]) -> None:
        """Store the run's split labels (``devset.load_labels`` output or LabelRows), in one transaction."""
        if isinstance(labels, Mapping):
            rows = [(run_id, tid, int(lab.is_positive), lab.mistake_type) for tid, lab in labels.items()]
        else:
            rows = [(run_id, lab.trajectory_id, int(lab.positive), lab.mistake_type) for lab in labels]
        with self.transaction() as cur:
            cur.execute("DELETE FROM run_labels WHERE run_id = ?", (run_id,))
            cur.executemany("INSERT INTO run_labels VALUES (?, ?, ?, ?)", rows)

    def labels(self, run_id: str) -> dict[str, LabelRow]:
        """The labels stored for a run, by trajectory id (empty if none were stored)."""
        return {
            r[0]: LabelRow(trajectory_id=r[0], positive=bool(r[1]), mistake_type=r[2])
            for r in self._query(
                "SELECT trajectory_id, positive, mistake_type FROM run_labels WHERE run_id = ?", (run_id,)
            )
        }
