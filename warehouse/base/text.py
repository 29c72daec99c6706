"""Short text for logs and one-line errors."""

from __future__ import annotations


def first_line(what: BaseException | str, limit: int = 300) -> str:
    """The first line of an error or its text, at most `limit` characters: a JVM's
    error carries its stack trace in the message. An exception without a message
    is named by its type."""
    text = str(what).strip()
    if not text:
        return type(what).__name__ if isinstance(what, BaseException) else ""
    return text.splitlines()[0][:limit]
