"""Guards: pure checks every candidate passes before any judge call is spent on it.

``check_candidate`` takes the candidate's changed files as ``{path: (old_text, new_text)}``
(``None`` = absent; ``gitops.worktree_changes`` builds it) and returns the first failing guard:

1. ``empty`` — the candidate must change something.
2. ``allowed_files`` — only the files ``[optimizer] allowed_files`` names may change, and none may
   be deleted. ``prompts/judge.toml`` is the exception: its edits are *structure moves*
   (`optimizer.structure`), allowed whatever allowed_files says when every key they change is named in
   ``[optimizer] structure_moves`` and takes a value within its bounds (a panel of at most
   ``max_members``); with structure_moves empty any edit of it is refused (guard ``structure``).
3. ``protected`` — every region between ``<!-- judgeloop:protected:begin -->`` and
   ``<!-- judgeloop:protected:end -->`` is byte-identical and in the same order, and no marker
   is added or removed.
4. ``diff_size`` — changed lines (added + removed, counted with difflib over whole lines, the same
   total as ``git diff --numstat``) at most ``max_diff_lines`` over all files.
5. ``overfit_id`` — no dev trajectory id or recording id appears more often in the new text than in
   the old one, compared on *compact* forms: the normalised text (see below) and the id lower-cased
   with everything but letters and digits removed, so hyphens, underscores, dots, spaces and line
   breaks inside an id do not hide it. A *prefix* of an id counts too, by this rule: a run of words
   of the text (words = letters and digits; any punctuation or white space between them is dropped)
   whose concatenation is a prefix of an id's compact form, is at least 5 characters long and
   contains a digit (``3f2b9``, ``3F2B-9C1E``, ``3f2b 9c1e``, ``decade1f``). The digit keeps words
   out: ``decade`` or ``faded cafe`` never match an id that starts ``decade1f`` or ``fadedcafe0``.
6. ``overfit_copy`` — no run of 8+ consecutive words of a dev instruction (normalised, lower-cased,
   punctuation dropped) is *new* in the candidate. Only n-grams absent from the old text count, so a
   phrase that was already in the prompt (e.g. a generic "open the file and save it ...") does not
   block every later edit of that file; the guard stops the optimiser from pasting instructions in,
   not the prompt from ever resembling one.
7. ``overfit_value`` — no distinctive value of a dev instruction or trajectory appears more often in
   the new text than in the old one. An instruction's values: a file name, path, e-mail address,
   date, time or any other token with a digit or an inner ``. @ _ / \\ :`` (at least 4 characters,
   e.g. ``report_q3.xlsx``, ``14:30``, ``2024-05-01``), or a quoted name of 2+ words
   (``"Project Alpha"``). A trajectory's values (``trajectory_values``): what its ``type`` actions
   typed and the string arguments of other actions, by the same token rule, plus the whole text when
   it has 2+ words (``Call the plumber before Friday``, matched as words); and its click, move,
   scroll and drag targets as coordinate pairs of 5+ digits in all (``(243, 58)``, ``243,58`` and
   ``x=243, y=58`` all name ``243 58``). Key names, buttons and directions are never values. Short
   paraphrases slip past the 8-word copy lint; the concrete values an answer key would need do not.
   Plain words are never values (an agent that typed ``Dentist`` blocks no rule about dentists), so
   general rules ("check every file name") always pass.

Before all of them, ``rationale`` (`check_rationale`): the proposal's rationale is at most
`MAX_RATIONALE_CHARS` characters. It is stored with the experiment, written into the candidate's commit
message and shown in every later history, so one oversized rationale would grow the ledger, git and every
optimiser prompt after it; a rejected one is kept clipped (`clipped_rationale`).

Guards 5-7 skip ``prompts/memory/cases.jsonl`` (``LINT_EXEMPT``): a case names its dev items and
describes them by design, and cross-fitting keeps it out of its own items' fold; whether its
``source_items`` are dev items is checked when the candidate is validated (`optimizer.loop.validate`).
``prompts/memory/principles.md`` is linted like any prompt.

Guards 5-7 compare *normalised* text, old and new alike: NFKC; format characters (zero-width
spaces and joiners, soft hyphens, BOMs, tags), combining marks, private-use, unassigned and control
characters (but white space) dropped; Cyrillic, Greek and Armenian look-alikes of Latin letters
folded to Latin; every decimal digit to ASCII. Runs that look like base64 (8+ characters of the
standard or URL-safe alphabet) or hex (4+ bytes, plain or as ``\\x..``, ``0x..``, ``%..``, spaced
or colon-separated) are decoded, and the decoded text, when it is printable UTF-8, is linted with
the rest (two levels deep).

Reasons name the file and exactly what tripped, e.g.
``prompts/rubric.md copies 9 words from a dev instruction: 'open the settings page and turn on ...'``.
"""

from __future__ import annotations

import base64
import binascii
import bisect
import difflib
import re
import unicodedata
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, cast, overload

if TYPE_CHECKING:
    from optimizer.models import Trajectory

from optimizer.paths import prompt_file_or_none
from optimizer.structure import check_structure

JUDGE_TOML = "prompts/judge.toml"

# Files guards 5-7 do not lint (see check_candidate).
LINT_EXEMPT = frozenset({"prompts/memory/cases.jsonl"})
PROTECTED_BEGIN = "<!-- judgeloop:protected:begin -->"
PROTECTED_END = "<!-- judgeloop:protected:end -->"
COPY_NGRAM = 8
# Ids shorter than this (compact form) are not searched for: they would match ordinary words (real ids are UUIDs).
MIN_ID_LENGTH = 6
# A prefix of an id counts from this length, and only with a digit in it (see guard 5).
MIN_ID_PREFIX = 5

# A rationale is one paragraph; this is several pages (see check_rationale).
MAX_RATIONALE_CHARS = 4_000

GuardName = Literal[
    "ok", "rationale", "empty", "allowed_files", "structure", "protected", "diff_size", "overfit_id", "overfit_copy",
    "overfit_value",
]
Changes = Mapping[str, tuple[str | None, str | None]]

_WORD_RE = re.compile(r"[^\W_]+", re.UNICODE)
MIN_VALUE_LENGTH = 4
_VALUE_STRIP = " \t\"'`()[]{}<>,;:!?.\u201c\u201d\u2018\u2019"
_INNER_SEPARATOR_RE = re.compile(r"[^\W_][.@_/\\:][^\W_]", re.UNICODE)
_QUOTED_RE = re.compile(r'"([^"\n]{3,80})"|\u201c([^\u201d\n]{3,80})\u201d|(?:(?<=\s)|^)\'([^\'\n]{3,80})\'(?=[\s.,;:!?)]|$)')
# A click target: two numbers of 5+ digits in all (smaller pairs are prose: "steps 5 7", the time 10:30).
_COORDINATE_RE = re.compile(r"\d+ \d+")
MIN_COORDINATE_DIGITS = 5
# Action arguments that name a choice from a small vocabulary, never a value.
_NOT_VALUES = frozenset({"button", "direction", "keys", "key"})


@dataclass(frozen=True)
class GuardResult:
    """``ok`` or the first guard that failed (``guard``) with a one-line ``reason``."""

    ok: bool
    reason: str = ""
    guard: GuardName = "ok"


_PASS = GuardResult(ok=True)


def _fail(guard: GuardName, reason: str) -> GuardResult:
    return GuardResult(ok=False, reason=reason, guard=guard)


def check_rationale(rationale: str) -> GuardResult:
    """The ``rationale`` guard: ``rationale`` is at most `MAX_RATIONALE_CHARS` characters."""
    if len(rationale) <= MAX_RATIONALE_CHARS:
        return _PASS
    return _fail("rationale", f"the rationale is {len(rationale):,} characters, over the cap of "
                              f"{MAX_RATIONALE_CHARS:,}; say why in one paragraph")


def clipped_rationale(rationale: str) -> str:
    """``rationale`` as the ledger keeps it: whole within `MAX_RATIONALE_CHARS`, else its first
    `MAX_RATIONALE_CHARS` characters and a note of how many were dropped (the guard rejects it)."""
    if len(rationale) <= MAX_RATIONALE_CHARS:
        return rationale
    dropped = len(rationale) - MAX_RATIONALE_CHARS
    return rationale[:MAX_RATIONALE_CHARS] + f" [... {dropped:,} more characters not kept]"


def protected_regions(text: str) -> list[str]:
    """The protected regions of ``text`` (markers included), in order; an unclosed one runs to the end."""
    regions: list[str] = []
    pos = 0
    while (start := text.find(PROTECTED_BEGIN, pos)) != -1:
        end = text.find(PROTECTED_END, start + len(PROTECTED_BEGIN))
        stop = len(text) if end == -1 else end + len(PROTECTED_END)
        regions.append(text[start:stop])
        pos = stop
    return regions


def changed_line_count(old: str | None, new: str | None) -> int:
    """Lines added plus lines removed between two texts (``None`` = empty file)."""
    a = (old or "").splitlines()
    b = (new or "").splitlines()
    count = 0
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes():
        if tag != "equal":
            count += (i2 - i1) + (j2 - j1)
    return count


# -- normalisation ---------------------------------------------------------------------------------

# Letters of other scripts that render like Latin ones (NFKC leaves them alone).
_HOMOGLYPHS = str.maketrans({
    # Cyrillic
    "\u0430": "a", "\u0431": "b", "\u0432": "b", "\u0435": "e", "\u0433": "r", "\u043a": "k", "\u043c": "m",
    "\u043d": "h", "\u043e": "o", "\u043f": "n", "\u0440": "p", "\u0441": "c", "\u0442": "t", "\u0443": "y",
    "\u0445": "x", "\u044c": "b", "\u0455": "s", "\u0456": "i", "\u0458": "j", "\u04bb": "h", "\u0501": "d",
    "\u051b": "q", "\u051d": "w", "\u04af": "y", "\u04cf": "l", "\u0475": "v",
    "\u0410": "A", "\u0412": "B", "\u0415": "E", "\u041a": "K", "\u041c": "M", "\u041d": "H", "\u041e": "O",
    "\u0420": "P", "\u0421": "C", "\u0422": "T", "\u0423": "Y", "\u0425": "X", "\u0405": "S", "\u0406": "I",
    "\u0408": "J", "\u04ae": "Y", "\u04ba": "H", "\u04c0": "I", "\u0500": "D", "\u051a": "Q", "\u051c": "W",
    "\u0474": "V",
    # Greek
    "\u03b1": "a", "\u03b2": "b", "\u03b3": "y", "\u03b5": "e", "\u03b9": "i", "\u03ba": "k", "\u03bd": "v",
    "\u03bf": "o", "\u03c1": "p", "\u03c4": "t", "\u03c5": "u", "\u03c7": "x", "\u03c9": "w", "\u03f2": "c",
    "\u03f3": "j", "\u0391": "A", "\u0392": "B", "\u0395": "E", "\u0396": "Z", "\u0397": "H", "\u0399": "I",
    "\u039a": "K", "\u039c": "M", "\u039d": "N", "\u039f": "O", "\u03a1": "P", "\u03a4": "T", "\u03a5": "Y",
    "\u03a7": "X", "\u03f9": "C", "\u037f": "J",
    # Armenian
    "\u0585": "o", "\u057d": "u", "\u0570": "h", "\u0578": "n", "\u0581": "g", "\u0566": "q",
    # Latin letters NFKC keeps
    "\u0131": "i", "\u0237": "j", "\u0251": "a", "\u0261": "g", "\u026a": "i", "\u1d00": "a", "\u0299": "b",
    "\u1d04": "c", "\u1d05": "d", "\u1d07": "e", "\u029c": "h", "\u1d0a": "j", "\u1d0b": "k", "\u029f": "l",
    "\u1d0d": "m", "\u0274": "n", "\u1d0f": "o", "\u1d18": "p", "\u0280": "r", "\u1d1b": "t", "\u1d1c": "u",
    "\u1d20": "v", "\u1d21": "w", "\u028f": "y", "\u1d22": "z",
})
# Dropped: format (zero-width, soft hyphen, BOM, tags), combining marks, unassigned, private use, surrogates.
_DROP_CATEGORIES = frozenset({"Cf", "Mn", "Me", "Cn", "Co", "Cs"})
# Invisible fillers that are letters or symbols by category.
_INVISIBLE = frozenset("\u115f\u1160\u3164\uffa0\u2800")
_ASCII_CONTROL_RE = re.compile(r"[\x00-\x08\x0e-\x1f\x7f]")


def normalise_text(text: str) -> str:
    """``text`` as guards 5-7 see it (case kept): NFKC, invisible characters dropped, look-alike letters
    folded to Latin, decimal digits to ASCII (see the module docstring)."""
    if text.isascii():  # the common case: only control characters can hide anything
        return _ASCII_CONTROL_RE.sub("", text)
    out: list[str] = []
    for ch in unicodedata.normalize("NFKD", text):
        if ch.isascii():
            out.append(ch)
            continue
        category = unicodedata.category(ch)
        if category in _DROP_CATEGORIES or ch in _INVISIBLE or (category == "Cc" and not ch.isspace()):
            continue
        out.append(str(unicodedata.digit(ch)) if category == "Nd" else ch)
    folded = unicodedata.normalize("NFKC", "".join(out)).translate(_HOMOGLYPHS)
    return _ASCII_CONTROL_RE.sub("", folded)


_BASE64_RUN_RE = re.compile(r"[A-Za-z0-9+/_-]{8,}={0,2}")
_HEX_RUN_RE = re.compile(r"(?:(?:\\x|0[xX]|%)?[0-9A-Fa-f]{2}[ \t:,-]?){4,}")
_HEX_PREFIX_RE = re.compile(r"\\x|0x|%", re.IGNORECASE)
_NOT_HEX_RE = re.compile(r"[^0-9A-Fa-f]")
DECODE_DEPTH = 2


def _printable(data: bytes) -> str | None:
    """``data`` as text when it is UTF-8 with nothing but printable characters and white space."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return None
    if len(text) < MIN_VALUE_LENGTH or not all(c.isprintable() or c in "\t\n\r" for c in text):
        return None
    return text


def _decode_base64(run: str) -> str | None:
    body = run.rstrip("=")
    if "-" in body or "_" in body:
        if "+" in body or "/" in body:
            return None
        body = body.replace("-", "+").replace("_", "/")
    body = body[: len(body) - len(body) % 4] if len(body) % 4 == 1 else body
    try:
        return _printable(base64.b64decode(body + "=" * (-len(body) % 4), validate=True))
    except (binascii.Error, ValueError):
        return None


def _decode_hex(run: str) -> str | None:
    digits = _NOT_HEX_RE.sub("", _HEX_PREFIX_RE.sub("", run))
    return _printable(bytes.fromhex(digits[: len(digits) - len(digits) % 2]))


def decoded_texts(text: str, depth: int = DECODE_DEPTH) -> list[str]:
    """The printable texts that base64 and hex runs of ``text`` decode to, normalised (nested runs too)."""
    found: list[str] = []
    for pattern, decode in ((_BASE64_RUN_RE, _decode_base64), (_HEX_RUN_RE, _decode_hex)):
        for match in pattern.finditer(text):
            decoded = decode(match.group(0))
            if decoded is not None:
                decoded = normalise_text(decoded)
                found.append(decoded)
                if depth > 1:
                    found.extend(decoded_texts(decoded, depth - 1))
    return found


class LintText:
    """A text as guards 5-7 compare it, computed once: normalised, with its decoded runs appended."""

    def __init__(self, text: str | None) -> None:
        plain = normalise_text(text or "")
        self.lower = "\n".join([plain, *decoded_texts(plain)]).lower()
        self.words: list[str] = _WORD_RE.findall(self.lower)
        self.word_set = set(self.words)
        self.word_line = f" {' '.join(self.words)} "
        self.compact = "".join(self.words)
        # Axis names dropped, so "x=243, y=58" reads as the coordinate pair "243 58".
        self.coordinate_line = f" {' '.join(w for w in self.words if w not in ('x', 'y'))} "

    def value_count(self, value: str) -> int:
        """Occurrences of a value (see ``new_value``): a word sequence as words, a token as a whole token."""
        if " " in value:
            if value.split(" ", 1)[0] not in self.word_set:
                return 0
            line = self.coordinate_line if _COORDINATE_RE.fullmatch(value) else self.word_line
            return line.count(f" {value} ")
        if value not in self.lower:
            return 0
        return len(re.findall(rf"(?<![\w.@/\\:-]){re.escape(value)}(?![\w@/\\:-]|\.\w)", self.lower))


def normalise_words(text: str) -> list[str]:
    """Normalised, lower-cased words with punctuation dropped (what the copy lint compares)."""
    return _WORD_RE.findall(normalise_text(text).lower())


def _ngrams(words: list[str], n: int) -> set[tuple[str, ...]]:
    return {tuple(words[i:i + n]) for i in range(len(words) - n + 1)}


def instruction_ngrams(instructions: Iterable[str], n: int = COPY_NGRAM) -> set[tuple[str, ...]]:
    """Every word n-gram of the dev instructions (build once per run and pass to ``check_candidate``)."""
    grams: set[tuple[str, ...]] = set()
    for instruction in instructions:
        grams |= _ngrams(normalise_words(instruction), n)
    return grams


def _token_values(text: str) -> set[str]:
    """Tokens of normalised ``text`` of 4+ characters with a digit or an inner ``. @ _ / \\ :``, lower-cased."""
    values: set[str] = set()
    for token in text.split():
        value = token.strip(_VALUE_STRIP).lower()
        if len(value) >= MIN_VALUE_LENGTH and (any(c.isdigit() for c in value) or _INNER_SEPARATOR_RE.search(value)):
            values.add(value)
    return values


def instruction_values(instructions: Iterable[str]) -> set[str]:
    """The distinctive values of the dev instructions, normalised and lower-cased (see guard 7): tokens
    of 4+ characters with a digit or an inner ``. @ _ / \\ :``, and quoted names of 2+ words (as words)."""
    values: set[str] = set()
    for raw in instructions:
        instruction = normalise_text(raw)
        values |= _token_values(instruction)
        for match in _QUOTED_RE.finditer(instruction):
            words = normalise_words(next(g for g in match.groups() if g))
            if len(words) >= 2:
                values.add(" ".join(words))
    return values


def _typed_values(text: str) -> set[str]:
    """What an action typed: its distinctive tokens, and the whole text as words when it is a phrase of
    3+ words, or of 2 words one of which is capitalised or has a digit (``Thanks Kim``; a plain pair
    such as ``time zone`` is how a general rule talks, not an answer). Split at white space:
    ``=SUM(B2:B6)`` is one token, not the words ``sum b2 b6``."""
    normalised = normalise_text(text)
    values = _token_values(normalised)
    words = normalise_words(normalised)
    raw = normalised.split()
    distinctive = any(w[:1].isupper() or any(c.isdigit() for c in w) for w in raw)
    if len(raw) >= 2 and (len(words) >= 3 or (len(words) == 2 and distinctive)):
        values.add(" ".join(words))
    return values


def _coordinate(x: Any, y: Any) -> str | None:
    """A click target ``x y`` of 5+ digits in all, from integral numbers (None otherwise)."""
    if isinstance(x, bool) or isinstance(y, bool) or not isinstance(x, int | float) or not isinstance(y, int | float):
        return None
    if x != int(x) or y != int(y) or x < 0 or y < 0:
        return None
    pair = f"{int(x)} {int(y)}"
    return pair if len(pair) - 1 >= MIN_COORDINATE_DIGITS else None


def trajectory_values(trajectories: Iterable[Trajectory]) -> set[str]:
    """The distinctive values of the dev trajectories' actions, normalised and lower-cased (see guard 7):
    what ``type`` actions typed and other string arguments (tokens with a digit or an inner separator,
    phrases of 3+ words, or 2 with a capital or digit), and click, move, scroll and drag targets of 5+ digits (``"243 58"``)."""
    values: set[str] = set()
    for trajectory in trajectories:
        for step in trajectory.steps:
            params = step.action.parameters
            for key, arg in params.items():
                if isinstance(arg, str) and key not in _NOT_VALUES:
                    values |= _typed_values(arg)
            for x_key, y_key in (("x", "y"), ("start_x", "start_y"), ("end_x", "end_y")):
                pair = _coordinate(params.get(x_key), params.get(y_key))
                if pair is not None:
                    values.add(pair)
    return values


def new_value(old: str | None, new: str, values: Iterable[str]) -> str | None:
    """The first (sorted) value that occurs more often in normalised ``new`` than in normalised ``old``."""
    return _new_value(LintText(old), LintText(new), sorted(values))


def _new_value(old: LintText, new: LintText, values: list[str]) -> str | None:
    for value in values:
        count = new.value_count(value)
        if count and count > old.value_count(value):
            return value
    return None


def _id_key(ident: str) -> str:
    """An id's compact form: normalised, lower-cased, letters and digits only."""
    return "".join(_WORD_RE.findall(normalise_text(ident).lower()))


class _IdIndex:
    """The dev ids by compact form, sorted, for full matches and the prefix walk of guard 5."""

    def __init__(self, ids: Iterable[str]) -> None:
        by_key: dict[str, str] = {}
        for ident in sorted({i.strip() for i in ids}):
            key = _id_key(ident)
            if len(key) >= MIN_ID_LENGTH:
                by_key.setdefault(key, ident)
        self.by_key = by_key
        self.keys = sorted(by_key)

    def owner(self, prefix: str) -> str | None:
        """The (first) id whose compact form starts with ``prefix``."""
        i = bisect.bisect_left(self.keys, prefix)
        return self.by_key[self.keys[i]] if i < len(self.keys) and self.keys[i].startswith(prefix) else None

    def prefixes(self, text: LintText) -> Counter[str]:
        """The longest id prefix (5+ characters, with a digit) each word of ``text`` starts, counted."""
        found: Counter[str] = Counter()
        words = text.words
        for i, word in enumerate(words):
            acc, best, j = word, None, i
            while self.owner(acc) is not None:
                if len(acc) >= MIN_ID_PREFIX and any(c.isdigit() for c in acc):
                    best = acc
                j += 1
                if j == len(words):
                    break
                acc += words[j]
            if best is not None:
                found[best] += 1
        return found


def _new_id(path: str, old: LintText, new: LintText, index: _IdIndex) -> GuardResult | None:
    for key in index.keys:
        if key in new.compact and new.compact.count(key) > old.compact.count(key):
            return _fail("overfit_id", f"{path} contains the dev id {index.by_key[key]!r}; write rules, not item references")
    new_prefixes = index.prefixes(new)
    if new_prefixes:
        old_prefixes = index.prefixes(old)
        for prefix in sorted(new_prefixes):
            if new_prefixes[prefix] > old_prefixes[prefix]:
                return _fail("overfit_id", f"{path} contains {prefix!r}, a prefix of the dev id "
                             f"{index.owner(prefix)!r}; write rules, not item references")
    return None


def longest_new_copy(
    old: str | None, new: str, instruction_grams: set[tuple[str, ...]], n: int = COPY_NGRAM
) -> list[str]:
    """The longest run of words in ``new`` covered by instruction n-grams that ``old`` lacks ([] if none)."""
    return _longest_new_copy(LintText(old), LintText(new), instruction_grams, n)


def _longest_new_copy(
    old: LintText, new: LintText, instruction_grams: set[tuple[str, ...]], n: int = COPY_NGRAM
) -> list[str]:
    words = new.words
    if len(words) < n or not instruction_grams:
        return []
    old_grams = _ngrams(old.words, n)
    best: tuple[int, int] = (0, -1)  # (first ngram index, last ngram index) of the longest run
    run_start: int | None = None
    for i in range(len(words) - n + 1):
        gram = tuple(words[i:i + n])
        if gram in instruction_grams and gram not in old_grams:
            run_start = i if run_start is None else run_start
            if i - run_start > best[1] - best[0]:
                best = (run_start, i)
        else:
            run_start = None
    if best[1] < best[0]:
        return []
    return words[best[0]:best[1] + n]


def _quote(words: list[str], limit: int = 80) -> str:
    text = " ".join(words)
    return text if len(text) <= limit else text[: limit - 3].rstrip() + "..."


def _is_ngram_set(value: object) -> bool:
    return isinstance(value, set | frozenset) and all(isinstance(g, tuple) for g in value) and bool(value)


@overload
def check_candidate(
    changed: Changes, allowed_files: Iterable[str], max_diff_lines: int, dev_ids: Iterable[str],
    dev_recording_ids: Iterable[str], dev_instructions: set[tuple[str, ...]], dev_values: Iterable[str],
    dev_trajectory_values: Iterable[str] = ..., *, structure_moves: Sequence[str] = ..., max_members: int = ...,
) -> GuardResult: ...


@overload
def check_candidate(
    changed: Changes, allowed_files: Iterable[str], max_diff_lines: int, dev_ids: Iterable[str],
    dev_recording_ids: Iterable[str], dev_instructions: Iterable[str], dev_values: Iterable[str] | None = None,
    dev_trajectory_values: Iterable[str] = ..., *, structure_moves: Sequence[str] = ..., max_members: int = ...,
) -> GuardResult: ...


def check_candidate(
    changed: Changes,
    allowed_files: Iterable[str],
    max_diff_lines: int,
    dev_ids: Iterable[str],
    dev_recording_ids: Iterable[str],
    dev_instructions: Iterable[str] | set[tuple[str, ...]],
    dev_values: Iterable[str] | None = None,
    dev_trajectory_values: Iterable[str] = (),
    *,
    structure_moves: Sequence[str] = (),
    max_members: int = 1,
) -> GuardResult:
    """Run every guard on a candidate; the first failure wins (see the module docstring).

    ``dev_instructions`` is either the instruction texts or a prebuilt ``instruction_ngrams`` set;
    ``dev_values`` a prebuilt ``instruction_values`` set, computed from the texts when None. With a
    prebuilt n-gram set it is required (a ValueError otherwise): the value guard is never skipped.
    ``dev_trajectory_values`` is a prebuilt ``trajectory_values`` set. ``structure_moves`` and
    ``max_members``: ``[optimizer]``'s, for an edit of prompts/judge.toml (guard 2).
    """
    grams: set[tuple[str, ...]]
    if _is_ngram_set(dev_instructions):
        if dev_values is None:
            raise ValueError("check_candidate needs dev_values with a prebuilt n-gram set (pass instruction_values)")
        grams = cast(set[tuple[str, ...]], dev_instructions)
    else:
        texts = [str(i) for i in dev_instructions]
        grams = instruction_ngrams(texts)
        if dev_values is None:
            dev_values = instruction_values(texts)
    changes = {path: pair for path, pair in changed.items() if pair[0] != pair[1]}
    if not changes:
        return _fail("empty", "the candidate changes nothing")

    # One path rule (`optimizer.paths`): a spelling that is not the canonical name of an allowed file is outside.
    allowed = {name for a in allowed_files if (name := prompt_file_or_none(a)) is not None} - {JUDGE_TOML}
    if JUDGE_TOML in changes:
        old_toml, new_toml = changes[JUDGE_TOML]
        if new_toml is None:
            return _fail("structure", f"the candidate deletes {JUDGE_TOML}; structure moves edit keys, never the file")
        refused = check_structure(JUDGE_TOML, old_toml, new_toml, structure_moves, max_members)
        if refused is not None:
            return _fail("structure", refused)
        allowed.add(JUDGE_TOML)
    outside = sorted(p for p in changes if prompt_file_or_none(p) not in allowed or prompt_file_or_none(p) != p)
    if outside:
        return _fail(
            "allowed_files",
            f"the candidate changes {', '.join(outside)}, outside the allowed files ({', '.join(sorted(allowed))})",
        )
    for path, (_old, new) in sorted(changes.items()):
        if new is None:
            return _fail("allowed_files", f"the candidate deletes {path}; allowed files may be edited, not deleted")

    for path, (old, new) in sorted(changes.items()):
        result = check_protected(path, old or "", new or "")
        if not result.ok:
            return result

    total = sum(changed_line_count(old, new) for old, new in changes.values())
    if total > max_diff_lines:
        per_file = ", ".join(f"{p} {changed_line_count(o, n)}" for p, (o, n) in sorted(changes.items()))
        return _fail("diff_size", f"the candidate changes {total} lines ({per_file}), over the cap of {max_diff_lines}")

    # Every text is normalised and decoded once; guards 5-7 all read these. Not the memory's cases: a case
    # names its dev items and quotes their instructions by design, and cross-fitting keeps each case away
    # from its own items' fold (`optimizer.judge.memory`); principles.md is linted like any prompt.
    texts_of = {path: (LintText(old), LintText(new)) for path, (old, new) in sorted(changes.items())
                if path not in LINT_EXEMPT}
    index = _IdIndex([*dev_ids, *dev_recording_ids])
    for path, (old_t, new_t) in texts_of.items():
        failed = _new_id(path, old_t, new_t, index)
        if failed is not None:
            return failed
    for path, (old_t, new_t) in texts_of.items():
        copied = _longest_new_copy(old_t, new_t, grams)
        if copied:
            return _fail(
                "overfit_copy",
                f"{path} copies {len(copied)} words from a dev instruction: '{_quote(copied)}'",
            )
    value_sets = ((sorted(dev_values), "instruction"), (sorted(set(dev_trajectory_values)), "trajectory"))
    for path, (old_t, new_t) in texts_of.items():
        for values, source in value_sets:
            value = _new_value(old_t, new_t, values)
            if value is not None:
                return _fail(
                    "overfit_value",
                    f"{path} names {value!r}, a value from a dev {source}; write rules that hold for any value",
                )
    return _PASS


def check_protected(path: str, old: str, new: str) -> GuardResult:
    """Guard 3 alone: ``new`` keeps every protected region and marker of ``old`` (also checked up front
    for a manual edit, `optimizer.loop.strategies.manual.capture_edits`)."""
    for marker in (PROTECTED_BEGIN, PROTECTED_END):
        before, after = old.count(marker), new.count(marker)
        if after < before:
            return _fail("protected", f"{path} removes a protection marker {marker}")
        if after > before:
            return _fail("protected", f"{path} adds a protection marker {marker}; protected regions are set by humans")
    old_regions, new_regions = protected_regions(old), protected_regions(new)
    for index, (a, b) in enumerate(zip(old_regions, new_regions, strict=True), start=1):
        if a != b:
            line = old[: old.find(a)].count("\n") + 1
            return _fail("protected", f"{path} edits protected region {index} (starting at line {line})")
    return _PASS
