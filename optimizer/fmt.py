"""How numbers and free text are shown on one line: the report, the CLI's tables, the TUI's cells and
the optimiser's notes all format through these, so a figure reads the same on every screen.

- `num`: a number at ``digits`` decimals, ``missing`` (default "—") for None; ``signed`` adds "+";
- `signed`: a difference, always with its sign;
- `p_value`: a p-value at ``digits`` decimals, in scientific notation below 0.001;
- `one_line`: free text as one line of at most ``limit`` characters, cut with "…".

Where two screens differ on purpose (the text report's "-" and the score table's "n/a" for a missing
figure, the TUI's first line of a note against the report's whole note) the difference is a parameter.
Pure: imports nothing of the project, so every layer may use it.
"""

from __future__ import annotations

DASH = "—"
# What the score table, the optimiser's notes and the loop's lines show for a missing figure.
NA = "n/a"
# Below this a p-value is shown in scientific notation (fixed decimals would round it to zero).
_SMALL_P = 0.001


def num(value: float | None, digits: int = 3, *, missing: str = DASH, signed: bool = False) -> str:
    """``value`` at ``digits`` decimals ("+" before a positive one when ``signed``), or ``missing``."""
    if value is None:
        return missing
    return f"{value:+.{digits}f}" if signed else f"{value:.{digits}f}"


def signed(value: float | None, digits: int = 3, *, missing: str = DASH) -> str:
    """A difference at ``digits`` decimals with its sign ("+0.050", "-0.120"), or ``missing``."""
    return num(value, digits, missing=missing, signed=True)


def p_value(p: float, digits: int) -> str:
    """A p-value at ``digits`` decimals, or as "1.2e-05" below 0.001."""
    return f"{p:.{digits}f}" if p >= _SMALL_P else f"{p:.1e}"


def one_line(text: str | None, limit: int, *, first_line: bool = False, trim: bool = True) -> str:
    """``text`` as one line of at most ``limit`` characters, cut with "…".

    The line is all of ``text`` with its runs of whitespace made one space, or with ``first_line`` the
    first line of the stripped text as it is written. ``trim`` drops the spaces before the "…" of a
    cut line (the text report's; the TUI keeps them).
    """
    raw = (text or "").strip()
    line = (raw.splitlines() or [""])[0] if first_line else " ".join(raw.split())
    if len(line) <= limit:
        return line
    cut = line[: limit - 1]
    return (cut.rstrip() if trim else cut) + "…"
