"""The one exception type for problems a user can fix."""


class UserError(Exception):
    """Bad input, config or environment. The message is one sentence saying what is wrong and what to do.

    The CLI prints it as a single line on stderr and exits non-zero; it never shows a traceback.
    """
