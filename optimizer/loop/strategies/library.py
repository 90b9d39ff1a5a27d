"""The ``library`` strategy: switch entries of ``prompts/library.md`` in and out of the rubric.

No LLM and no network: the offline default. A proposal is one toggle (enable or disable one entry;
two toggles once every single one has been tried), chosen deterministically from the run's seed, the
experiment number and the history:

- entries are classified by their text as making the judge *stricter* or *more lenient* (the library
  format has no direction tag, so the wording decides: "is a failure", "answer false" vs "do not
  fail", "is not a side effect");
- when the incumbent's disagreements are mostly missed failures (too lenient), moves that make the
  judge stricter rank first, and the reverse for rejected successes; an entry naming the mistake type
  the judge misses most often ranks higher still;
- a move whose resulting set of enabled entries was already decided in this run (kept, rolled back,
  guard-rejected or waiting for a human), or decided in an earlier run on this split from the same
  incumbent prompts (``ProposalContext.earlier``), or is the incumbent's is never proposed again; one that was
  interrupted or left undecided by errors (a kill between the guards and the commit, a provider
  outage) was never tried and may come again. Each proposal records the set it enables as data,
  ``Proposal.meta["library_enabled"]`` (sorted ids); the ledger keeps it and hands it back in
  ``PastExperiment.meta``, so the history says which sets were tried. (Ledgers written before that
  carried the set in a tag at the end of the rationale; upgrading the ledger reads the tag once.)
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import combinations
from typing import Literal

from optimizer.errors import UserError
from optimizer.judge.prompts import (
    LIBRARY_MD,
    RUBRIC_MD,
    LibraryEntry,
    enabled_entries,
    parse_library,
    with_entries,
)
from optimizer.loop.strategies import (
    IN_WAVE,
    POOLED,
    Disagreement,
    PastExperiment,
    Proposal,
    ProposalContext,
    ProposalError,
)
from optimizer.loop.strategies.common import counts_by_direction, dominant_direction, rng_for
from optimizer.models import MISTAKE_TYPES
from optimizer.structure import current_value, set_key
from optimizer.workspace.paths import JUDGE_TOML

Lean = Literal["stricter", "lenient", "neutral"]

META_KEY = "library_enabled"

# Phrases that make the judge pass more trajectories / fail more of them. Lenient phrases are
# removed from the text before the strict ones are counted ("do not fail" is not a "fail").
_LENIENT = (
    r"\bdo not fail\b",
    r"\bnot a (?:bad )?side effect\b",
    r"\bis not a failure\b",
    r"\bdoes not count as a failure\b",
    r"\bbenefit of the doubt\b",
    r"\bstill (?:a )?success\b",
    r"\bcounts as (?:a )?success\b",
    r"\btolerat\w*",
    r"\bdo not penali[sz]e\b",
    r"\bacceptable\b",
    r"\bharmless\b",
    r"\banswer true\b",
)
_STRICT = (
    r"\bfalse\b",
    r"\bfailure\b",
    r"\bfails?\b",
    r"\bwrong\b",
    r"\brequire\w*",
    r"\bmust\b",
    r"\bdoes not count\b",
    r"\bcheck that\b",
    r"\bas claims\b",
    r"\bonly what\b",
)
_TYPE_WORDS: dict[str, tuple[str, ...]] = {
    "Critical Mistake": ("critical mistake", "wrong parameter", "never confirmed", "incomplete"),
    "Bad Side Effect": ("bad side effect", "side effect", "unrequested", "not ask for", "did not ask"),
    "Misunderstanding of the Instruction": (
        "misunderstanding",
        "different goal",
        "differs from the given",
        "perfect execution of",
        "neighbour",
    ),
}


@dataclass(frozen=True)
class Classified:
    entry: LibraryEntry
    lean: Lean
    types: frozenset[str]  # mistake types the entry addresses


def classify(entry: LibraryEntry) -> Classified:
    """Infer from the entry's wording whether it makes the judge stricter or more lenient, and which types it targets."""
    if entry.structure is not None:  # a structural move: how strict it makes the judge is not in its words
        return Classified(entry, "neutral", frozenset())
    text = entry.text.casefold()
    lenient_hits = 0
    for pattern in _LENIENT:
        text, n = re.subn(pattern, " ", text)
        lenient_hits += n
    strict_hits = sum(len(re.findall(p, text)) for p in _STRICT)
    full = entry.text.casefold()
    types = frozenset(t for t, words in _TYPE_WORDS.items() if any(w in full for w in words))
    lean: Lean = "neutral"
    if sum(t.casefold() in full for t in MISTAKE_TYPES) >= 2:
        pass  # a rule about which type to name, not about whether the trajectory fails
    elif strict_hits > lenient_hits:
        lean = "stricter"
    elif lenient_hits > strict_hits:
        lean = "lenient"
    return Classified(entry, lean, types)


@dataclass(frozen=True)
class Move:
    entry_id: str
    enable: bool
    effect: Lean  # what the move does to the judge


# The outcomes that mean a candidate was really tried (`error` covers interrupted and undecided ones), and
# another candidate of the same wave (never proposed twice in one wave).
DECIDED = frozenset({"kept", "rolled_back", "guard_rejected", "waiting", IN_WAVE, POOLED})


def tried_sets(history: Sequence[PastExperiment]) -> set[frozenset[str]]:
    """Enabled-entry sets of earlier library experiments that were decided (their ``meta["library_enabled"]``)."""
    out: set[frozenset[str]] = set()
    for experiment in history:
        if experiment.decision not in DECIDED:
            continue
        enabled = experiment.meta.get(META_KEY)
        if isinstance(enabled, list) and all(isinstance(x, str) for x in enabled):
            out.add(frozenset(enabled))
    return out


def _flip(lean: Lean) -> Lean:
    return {"stricter": "lenient", "lenient": "stricter", "neutral": "neutral"}[lean]  # type: ignore[return-value]


def _missed_type(disagreements: Sequence[Disagreement]) -> str | None:
    counts = Counter(
        d.mistake_type for d in disagreements if d.direction == "missed_failure" and d.mistake_type
    )
    if not counts:
        return None
    return max(sorted(counts), key=lambda t: counts[t])


class LibraryStrategy:
    """Toggle instruction-library entries in the rubric; deterministic, offline, never repeats a set."""

    name = "library"

    def __init__(self, allowed_files: Sequence[str] | None = None) -> None:
        if allowed_files is not None and RUBRIC_MD not in allowed_files:
            raise UserError(
                f"the library strategy edits {RUBRIC_MD} but [optimizer] allowed_files does not include it; "
                "add it or choose --strategy reflect or agent"
            )

    async def propose(self, ctx: ProposalContext) -> Proposal:
        """One toggle (or two, once singles are exhausted) as a new rubric text."""
        return self.propose_sync(ctx)

    def propose_sync(self, ctx: ProposalContext) -> Proposal:
        """The same as `propose`, without an event loop."""
        if RUBRIC_MD not in ctx.allowed_files:
            raise UserError(
                f"the library strategy edits {RUBRIC_MD} but [optimizer] allowed_files does not include it; "
                "add it or choose --strategy reflect or agent"
            )
        rubric = ctx.current_files.get(RUBRIC_MD)
        if rubric is None:
            rubric_path = ctx.workspace_root / RUBRIC_MD
            rubric = rubric_path.read_text(encoding="utf-8") if rubric_path.is_file() else ""
        everything = _read_library(ctx)
        # Structural entries take part only when [optimizer] structure_moves allows every key they set.
        judge_toml = ctx.current_files.get(JUDGE_TOML)
        structural = [
            e
            for e in everything
            if e.structure is not None
            and judge_toml is not None
            and set(e.structure) <= set(ctx.structure_moves)
        ]
        rules = [e for e in everything if e.structure is None]
        library = [*rules, *structural]
        if not library:
            raise ProposalError(
                f"{LIBRARY_MD} has no entries to toggle; add entries or choose another strategy"
            )
        known = {e.id for e in rules}
        enabled = enabled_entries(rubric)
        unknown = [e for e in enabled if e not in known]
        if unknown:
            raise UserError(
                f"{RUBRIC_MD} enables library ids missing from {LIBRARY_MD} ({', '.join(unknown)}); "
                "restore those entries or remove their lines from the rubric's library region"
            )
        current = frozenset(enabled) | {
            e.id for e in structural if judge_toml is not None and _structure_enabled(judge_toml, e)
        }
        avoid = tried_sets(ctx.history) | tried_sets(ctx.earlier) | {current}
        classified = {e.id: classify(e) for e in library}
        direction = dominant_direction(ctx.disagreements)
        leans: dict[str | None, Lean] = {
            "missed_failure": "stricter",
            "rejected_success": "lenient",
            None: "neutral",
        }
        wanted = leans[direction]
        target_type = _missed_type(ctx.disagreements) if wanted == "stricter" else None
        rng = rng_for(ctx.rng_seed, ctx.experiment_seq)

        def score(move: Move) -> float:
            s = 0.0
            if wanted != "neutral":
                s += 2.0 if move.effect == wanted else (-2.0 if move.effect == _flip(wanted) else 0.0)
            if move.enable and target_type is not None and target_type in classified[move.entry_id].types:
                s += 1.0
            return s

        moves = []
        for e in library:
            c = classified[e.id]
            enable = e.id not in current
            moves.append(Move(e.id, enable, c.lean if enable else _flip(c.lean)))
        # Random tie-break drawn once per move, in library order, so the ranking depends only on inputs.
        tie = {m.entry_id: rng.random() for m in moves}
        ranked = sorted(moves, key=lambda m: (-score(m), tie[m.entry_id]))

        chosen: tuple[Move, ...] | None = None
        for move in ranked:
            if _apply(current, (move,)) not in avoid:
                chosen = (move,)
                break
        if chosen is None:
            pairs = sorted(
                combinations(ranked, 2),
                key=lambda p: -(score(p[0]) + score(p[1])),
            )
            for pair in pairs:
                if _apply(current, pair) not in avoid:
                    chosen = pair
                    break
        if chosen is None:
            raise ProposalError(
                "every one- and two-entry toggle of the library has been tried from these prompts (this run and earlier runs on this split)"
            )

        new_set = _apply(current, chosen)
        files: dict[str, str] = {}
        new_rubric = with_entries(rubric, rules, new_set & known)
        if new_rubric != rubric:
            files[RUBRIC_MD] = new_rubric
        if judge_toml is not None:
            new_toml = judge_toml
            for move in chosen:
                entry = next((e for e in structural if e.id == move.entry_id), None)
                for key, value in (entry.structure or {}).items() if entry is not None else ():
                    # Enabling sets the entry's values; disabling puts its keys back to their defaults.
                    new_toml = set_key(new_toml, key, value if move.enable else None)
            if new_toml != judge_toml:
                files[JUDGE_TOML] = new_toml
        return Proposal(
            files=files,
            rationale=_rationale(chosen, ctx.disagreements, direction, target_type),
            meta={META_KEY: sorted(new_set)},
        )


def _structure_enabled(judge_toml: str, entry: LibraryEntry) -> bool:
    """Whether judge.toml already holds every value a structural entry sets."""
    return all(current_value(judge_toml, key) == value for key, value in (entry.structure or {}).items())


def _apply(current: frozenset[str], moves: Sequence[Move]) -> frozenset[str]:
    out = set(current)
    for m in moves:
        (out.add if m.enable else out.discard)(m.entry_id)
    return frozenset(out)


def _read_library(ctx: ProposalContext) -> list[LibraryEntry]:
    text = ctx.current_files.get(LIBRARY_MD)
    if text is None:
        path = ctx.workspace_root / LIBRARY_MD
        if not path.is_file():
            raise UserError(
                f"{path} is missing; the library strategy needs it (restore it from a fresh `judgeloop init`)"
            )
        text = path.read_text(encoding="utf-8")
    return parse_library(text, LIBRARY_MD)


def _rationale(
    moves: Sequence[Move],
    disagreements: Sequence[Disagreement],
    direction: str | None,
    target_type: str | None,
) -> str:
    counts = counts_by_direction(disagreements)
    parts = []
    for m in moves:
        verb = "Enabled" if m.enable else "Disabled"
        effect = {
            "stricter": "makes the judge stricter",
            "lenient": "makes the judge more lenient",
            "neutral": "does not change how strict the judge is",
        }[m.effect]
        parts.append(f"{verb} library entry {m.entry_id} (this {effect})")
    why = (
        f"the incumbent's {len(disagreements)} dev disagreements are {counts['missed_failure']} missed failures "
        f"and {counts['rejected_success']} rejected successes"
    )
    if direction == "missed_failure":
        why += ", so the judge is mostly too lenient"
        if target_type in MISTAKE_TYPES:
            why += f", most often on {target_type}"
    elif direction == "rejected_success":
        why += ", so the judge is mostly too strict"
    else:
        why += ", with no dominant direction"
    if len(moves) > 1:
        why += "; every single toggle has already been tried from these prompts"
    return f"{'; '.join(parts)}: {why}."
