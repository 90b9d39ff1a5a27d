"""``--write-docs NAME``: a benchmark's printed figures as the docs site's include file.

The docs pages include ``docs/figures/<NAME>.md`` (pymdownx.snippets, ``--8<--``) where they show a
measured table, so no figure in the docs is typed by hand: re-run the benchmark with
``--write-docs NAME`` and the page shows what it printed, with the command line, the machine and the
date. `with_docs_figure` wraps a script's ``main``: the option is taken off the command line before
``main`` parses it, and everything ``main`` prints still reaches the terminal.
"""

from __future__ import annotations

import contextlib
import datetime
import io
import os
import platform
import re
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TextIO

FIGURES = Path(__file__).resolve().parents[1] / "docs" / "figures"
NAME = re.compile(r"^[a-z0-9][a-z0-9-]{0,63}$")


class _Tee(io.TextIOBase):
    """Writes to the terminal and keeps a copy."""

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.copy = io.StringIO()

    def write(self, text: str) -> int:
        self.copy.write(text)
        return self.out.write(text)

    def flush(self) -> None:
        self.out.flush()


def split_write_docs(argv: Sequence[str]) -> tuple[str | None, list[str]]:
    """(the NAME of ``--write-docs NAME`` or None, the other arguments)."""
    args = list(argv)
    if "--write-docs" not in args:
        return None, args
    at = args.index("--write-docs")
    if at + 1 >= len(args) or not NAME.match(args[at + 1]):
        raise SystemExit(
            "--write-docs needs a NAME: lower-case letters, digits and '-' (docs/figures/NAME.md)"
        )
    return args[at + 1], args[:at] + args[at + 2 :]


@contextlib.contextmanager
def _teed() -> Iterator[_Tee]:
    real = sys.stdout
    tee = _Tee(real)
    sys.stdout = tee  # type: ignore[assignment]  # a text stream in all but name
    try:
        yield tee
    finally:
        sys.stdout = real


def figure_text(command: str, output: str, when: datetime.datetime) -> str:
    """The include file: where it came from, then the script's output as a text block."""
    machine = f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"
    return (
        f"<!-- Written by `{command}` on {when:%Y-%m-%d} ({machine}): its printed output. -->\n\n"
        f"```text\n{output.rstrip()}\n```\n"
    )


def with_docs_figure(main: Callable[[list[str]], int | None], argv: Sequence[str] | None = None) -> int:
    """Run ``main`` on the command line; with ``--write-docs NAME`` also write what it printed to
    docs/figures/NAME.md (only when it succeeds). Returns main's exit code."""
    name, rest = split_write_docs(sys.argv[1:] if argv is None else argv)
    if name is None:
        return int(main(rest) or 0)
    with _teed() as tee:
        code = int(main(rest) or 0)
    if code == 0:
        script = Path(sys.argv[0]).name
        command = " ".join(["python", f"benchmarks/{script}", *rest, "--write-docs", name])
        FIGURES.mkdir(parents=True, exist_ok=True)
        (FIGURES / f"{name}.md").write_text(
            figure_text(command, tee.copy.getvalue(), datetime.datetime.now()), encoding="utf-8"
        )
        print(f"wrote docs/figures/{name}.md", file=sys.stderr)
    return code
