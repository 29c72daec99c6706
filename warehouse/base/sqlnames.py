"""The one gate for names that end up inside SQL text.

Values go to Trino or PostgreSQL as bound parameters wherever the statement
allows it. Where it does not (identifiers, and arguments of Trino's CALL),
names pass through here: checked against an allow-list, then quoted.
"""

from __future__ import annotations

import re

# Plain ASCII identifiers only: unicode look-alikes, quotes, spaces and
# semicolons are refused before any SQL is built.
_IDENTIFIER = re.compile(r"[a-z][a-z0-9_]{0,62}")
# Trino user names as the contract uses them: analyst.alice, engineer.bob, regauge.
_USER = re.compile(r"[a-z][a-z0-9_.@-]{0,63}")
# Locations are lake paths or URIs; no quotes, no control characters.
_LOCATION = re.compile(r"[A-Za-z0-9_./:\-]{1,1024}")


class UnsafeNameError(ValueError):
    """A name that is not allowed inside SQL."""


def check_identifier(name: str, what: str = "name") -> str:
    """Return name if it is a plain lower-case identifier, else refuse it."""
    if not isinstance(name, str) or not _IDENTIFIER.fullmatch(name):
        raise UnsafeNameError(
            f"{what} {name!r} is not a plain identifier "
            "(lower-case ASCII letters, digits and _, starting with a letter)"
        )
    return name


def check_user(name: str) -> str:
    """Return name if it is a plain Trino user name, else refuse it."""
    if not isinstance(name, str) or not _USER.fullmatch(name):
        raise UnsafeNameError(
            f"user name {name!r} is not allowed (lower-case ASCII letters, digits and . _ @ -, "
            "starting with a letter, at most 64 characters)"
        )
    return name


def quote_identifier(name: str, what: str = "name") -> str:
    """A checked identifier, double-quoted for Trino and PostgreSQL."""
    return f'"{check_identifier(name, what)}"'


def quote_location(location: str) -> str:
    """A checked storage location as a SQL string literal."""
    if not _LOCATION.fullmatch(location):
        raise UnsafeNameError(f"location {location!r} has characters not allowed in SQL")
    return f"'{location}'"
