"""The one error type users see: `PlelabError` subclasses carry a message the CLI prints as one line."""


class PlelabError(Exception):
    """An error the user can fix; the CLI prints its message as one line instead of a traceback."""
