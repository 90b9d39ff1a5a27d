""" "Did you mean" for a command line argparse refused: the closest command, action or option to a typo
(`difflib`), for `optimizer.cli.main` to add to its one-line refusal."""

from __future__ import annotations

import argparse
import difflib
import re
from collections.abc import Iterable, Sequence

_INVALID_CHOICE = re.compile(r"invalid choice: '([^']*)' \(choose from (.*)\)")
_UNRECOGNIZED = "unrecognized arguments: "


def closest(word: str, candidates: Iterable[str]) -> str | None:
    """The candidate nearest ``word`` (difflib's ratio at least 0.6), or None."""
    found = difflib.get_close_matches(word, list(candidates), n=1, cutoff=0.6)
    return found[0] if found else None


def did_you_mean(parser: argparse.ArgumentParser, argv: Sequence[str], message: str) -> str | None:
    """`` (did you mean `run`?)`` for argparse's ``message`` about ``argv``, or None when nothing is close:
    an invalid choice is matched against its choices, an unknown option against the options of the
    (sub)command it was given to."""
    if m := _INVALID_CHOICE.search(message):
        guess = closest(m.group(1), re.findall(r"'([^']*)'", m.group(2)))
    elif _UNRECOGNIZED in message:
        options = _options(_command_parser(parser, argv))
        unknown = [
            w.split("=", 1)[0] for w in message.split(_UNRECOGNIZED, 1)[1].split() if w.startswith("-")
        ]
        guess = next((g for w in unknown if (g := closest(w, options))), None)
    else:
        return None
    return f" (did you mean `{guess}`?)" if guess else None


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _command_parser(parser: argparse.ArgumentParser, argv: Sequence[str]) -> argparse.ArgumentParser:
    """The innermost (sub)command parser ``argv`` names (``devset import`` → its parser)."""
    for word in argv:
        sub = _subcommands(parser).get(word)
        if sub is not None:
            parser = sub
    return parser


def _options(parser: argparse.ArgumentParser) -> list[str]:
    return [s for action in parser._actions for s in action.option_strings if s.startswith("--")]
