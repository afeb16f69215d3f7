"""The base of every user-facing error: the CLI prints its message and exits 2, with no traceback."""


class CoralError(ValueError):
    """Bad input or an impossible request; the message names the file, field or argument and the reason."""
