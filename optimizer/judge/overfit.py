"""The overfit lint's text matching: how a prompt text is compared with the dev items' material.

Shared by the guards (`optimizer.loop.guards`, which document the rules: guards 5-7) and the memory's
provenance check (`optimizer.judge.provenance`, which withholds a case from every item its text matches).
A text is normalised and decoded once (`LintText`); an item's material is its id, its instruction's word
n-grams (`instruction_ngrams`) and values (`instruction_values`), and its actions' values
(`trajectory_values`). Pure functions over strings and trajectories; nothing here reads a file or a label.
"""

from __future__ import annotations

import base64
import binascii
import bisect
import re
import unicodedata
from collections import Counter
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from optimizer.models import Trajectory

COPY_NGRAM = 8
# Ids shorter than this (compact form) are not searched for: they would match ordinary words (real ids are UUIDs).
MIN_ID_LENGTH = 6
# A prefix of an id counts from this length, and only with a digit in it (see guard 5).
MIN_ID_PREFIX = 5

_WORD_RE = re.compile(r"[^\W_]+", re.UNICODE)
MIN_VALUE_LENGTH = 4
_VALUE_STRIP = " \t\"'`()[]{}<>,;:!?.\u201c\u201d\u2018\u2019"
_INNER_SEPARATOR_RE = re.compile(r"[^\W_][.@_/\\:][^\W_]", re.UNICODE)
_QUOTED_RE = re.compile(
    r'"([^"\n]{3,80})"|\u201c([^\u201d\n]{3,80})\u201d|(?:(?<=\s)|^)\'([^\'\n]{3,80})\'(?=[\s.,;:!?)]|$)'
)
# A click target: two numbers of 5+ digits in all (smaller pairs are prose: "steps 5 7", the time 10:30).
COORDINATE_RE = re.compile(r"\d+ \d+")
MIN_COORDINATE_DIGITS = 5
# Action arguments that name a choice from a small vocabulary, never a value.
_NOT_VALUES = frozenset({"button", "direction", "keys", "key"})


# -- normalisation ---------------------------------------------------------------------------------

# Letters of other scripts that render like Latin ones (NFKC leaves them alone).
_HOMOGLYPHS = str.maketrans(
    {
        # Cyrillic
        "\u0430": "a",
        "\u0431": "b",
        "\u0432": "b",
        "\u0435": "e",
        "\u0433": "r",
        "\u043a": "k",
        "\u043c": "m",
        "\u043d": "h",
        "\u043e": "o",
        "\u043f": "n",
        "\u0440": "p",
        "\u0441": "c",
        "\u0442": "t",
        "\u0443": "y",
        "\u0445": "x",
        "\u044c": "b",
        "\u0455": "s",
        "\u0456": "i",
        "\u0458": "j",
        "\u04bb": "h",
        "\u0501": "d",
        "\u051b": "q",
        "\u051d": "w",
        "\u04af": "y",
        "\u04cf": "l",
        "\u0475": "v",
        "\u0410": "A",
        "\u0412": "B",
        "\u0415": "E",
        "\u041a": "K",
        "\u041c": "M",
        "\u041d": "H",
        "\u041e": "O",
        "\u0420": "P",
        "\u0421": "C",
        "\u0422": "T",
        "\u0423": "Y",
        "\u0425": "X",
        "\u0405": "S",
        "\u0406": "I",
        "\u0408": "J",
        "\u04ae": "Y",
        "\u04ba": "H",
        "\u04c0": "I",
        "\u0500": "D",
        "\u051a": "Q",
        "\u051c": "W",
        "\u0474": "V",
        # Greek
        "\u03b1": "a",
        "\u03b2": "b",
        "\u03b3": "y",
        "\u03b5": "e",
        "\u03b9": "i",
        "\u03ba": "k",
        "\u03bd": "v",
        "\u03bf": "o",
        "\u03c1": "p",
        "\u03c4": "t",
        "\u03c5": "u",
        "\u03c7": "x",
        "\u03c9": "w",
        "\u03f2": "c",
        "\u03f3": "j",
        "\u0391": "A",
        "\u0392": "B",
        "\u0395": "E",
        "\u0396": "Z",
        "\u0397": "H",
        "\u0399": "I",
        "\u039a": "K",
        "\u039c": "M",
        "\u039d": "N",
        "\u039f": "O",
        "\u03a1": "P",
        "\u03a4": "T",
        "\u03a5": "Y",
        "\u03a7": "X",
        "\u03f9": "C",
        "\u037f": "J",
        # Armenian
        "\u0585": "o",
        "\u057d": "u",
        "\u0570": "h",
        "\u0578": "n",
        "\u0581": "g",
        "\u0566": "q",
        # Latin letters NFKC keeps
        "\u0131": "i",
        "\u0237": "j",
        "\u0251": "a",
        "\u0261": "g",
        "\u026a": "i",
        "\u1d00": "a",
        "\u0299": "b",
        "\u1d04": "c",
        "\u1d05": "d",
        "\u1d07": "e",
        "\u029c": "h",
        "\u1d0a": "j",
        "\u1d0b": "k",
        "\u029f": "l",
        "\u1d0d": "m",
        "\u0274": "n",
        "\u1d0f": "o",
        "\u1d18": "p",
        "\u0280": "r",
        "\u1d1b": "t",
        "\u1d1c": "u",
        "\u1d20": "v",
        "\u1d21": "w",
        "\u028f": "y",
        "\u1d22": "z",
    }
)
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
            line = self.coordinate_line if COORDINATE_RE.fullmatch(value) else self.word_line
            return line.count(f" {value} ")
        if value not in self.lower:
            return 0
        return len(re.findall(rf"(?<![\w.@/\\:-]){re.escape(value)}(?![\w@/\\:-]|\.\w)", self.lower))


def normalise_words(text: str) -> list[str]:
    """Normalised, lower-cased words with punctuation dropped (what the copy lint compares)."""
    return _WORD_RE.findall(normalise_text(text).lower())


def ngrams(words: list[str], n: int) -> set[tuple[str, ...]]:
    return {tuple(words[i : i + n]) for i in range(len(words) - n + 1)}


def instruction_ngrams(instructions: Iterable[str], n: int = COPY_NGRAM) -> set[tuple[str, ...]]:
    """Every word n-gram of the dev instructions (build once per run and pass to ``check_candidate``)."""
    grams: set[tuple[str, ...]] = set()
    for instruction in instructions:
        grams |= ngrams(normalise_words(instruction), n)
    return grams


def _token_values(text: str) -> set[str]:
    """Tokens of normalised ``text`` of 4+ characters with a digit or an inner ``. @ _ / \\ :``, lower-cased."""
    values: set[str] = set()
    for token in text.split():
        value = token.strip(_VALUE_STRIP).lower()
        if len(value) >= MIN_VALUE_LENGTH and (
            any(c.isdigit() for c in value) or _INNER_SEPARATOR_RE.search(value)
        ):
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
    if (
        isinstance(x, bool)
        or isinstance(y, bool)
        or not isinstance(x, int | float)
        or not isinstance(y, int | float)
    ):
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
    return first_new_value(LintText(old), LintText(new), sorted(values))


def first_new_value(old: LintText, new: LintText, values: list[str]) -> str | None:
    for value in values:
        count = new.value_count(value)
        if count and count > old.value_count(value):
            return value
    return None


def id_key(ident: str) -> str:
    """An id's compact form: normalised, lower-cased, letters and digits only."""
    return "".join(_WORD_RE.findall(normalise_text(ident).lower()))


class IdIndex:
    """The dev ids by compact form, sorted, for full matches and the prefix walk of guard 5."""

    def __init__(self, ids: Iterable[str]) -> None:
        by_key: dict[str, str] = {}
        for ident in sorted({i.strip() for i in ids}):
            key = id_key(ident)
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


def longest_new_copy(
    old: str | None, new: str, instruction_grams: set[tuple[str, ...]], n: int = COPY_NGRAM
) -> list[str]:
    """The longest run of words in ``new`` covered by instruction n-grams that ``old`` lacks ([] if none)."""
    return longest_copy(LintText(old), LintText(new), instruction_grams, n)


def longest_copy(
    old: LintText, new: LintText, instruction_grams: set[tuple[str, ...]], n: int = COPY_NGRAM
) -> list[str]:
    words = new.words
    if len(words) < n or not instruction_grams:
        return []
    old_grams = ngrams(old.words, n)
    best: tuple[int, int] = (0, -1)  # (first ngram index, last ngram index) of the longest run
    run_start: int | None = None
    for i in range(len(words) - n + 1):
        gram = tuple(words[i : i + n])
        if gram in instruction_grams and gram not in old_grams:
            run_start = i if run_start is None else run_start
            if i - run_start > best[1] - best[0]:
                best = (run_start, i)
        else:
            run_start = None
    if best[1] < best[0]:
        return []
    return words[best[0] : best[1] + n]


def quote_words(words: list[str], limit: int = 80) -> str:
    text = " ".join(words)
    return text if len(text) <= limit else text[: limit - 3].rstrip() + "..."
