"""The one exception type for problems a user can fix, and the one reading of a pydantic
`ValidationError` for its one-line message (`first_error`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pydantic import ValidationError

# pydantic's prefix for a validator's own ValueError ("Value error, base_urls is empty; ...").
_VALUE_ERROR = "Value error, "


class UserError(Exception):
    """Bad input, config or environment. The message is one sentence saying what is wrong and what to do.

    The CLI prints it as a single line on stderr and exits non-zero; it never shows a traceback.
    """


@dataclass(frozen=True)
class FirstError:
    """The first problem a `ValidationError` holds, in the pieces a one-line message is made of."""

    loc: str  # its dotted location ("judge.base_urls"); "" when the value as a whole is wrong
    msg: str  # pydantic's message as pydantic says it (a validator's keeps "Value error, ")
    more: int  # how many further problems the error holds

    @property
    def reason(self) -> str:
        """The message without pydantic's "Value error, " before a validator's own sentence."""
        return self.msg.removeprefix(_VALUE_ERROR)

    def where(self, whole: str) -> str:
        """The location, or ``whole`` (e.g. "file", "row") when the value as a whole is wrong."""
        return self.loc or whole

    def line(self, whole: str = "row") -> str:
        """``"<where>: <msg> (and N more)"``: a bad record's problem, as the devset's checks report it."""
        more = f" (and {self.more} more)" if self.more else ""
        return f"{self.where(whole)}: {self.msg}{more}"


def first_error(exc: ValidationError) -> FirstError:
    """The first of ``exc``'s problems (pydantic lists at least one)."""
    errors = exc.errors()
    first = errors[0]
    return FirstError(
        loc=".".join(str(part) for part in first["loc"]), msg=str(first["msg"]), more=len(errors) - 1
    )
