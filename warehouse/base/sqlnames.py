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
# docs/contract.md §1: customer_id is any string of 1-64 characters, and silver keeps
# every one, so `forget` must be able to name every one (issue 68, B): a quote, a
# space or a newline included. It only ever reaches a query as a bound parameter or
# a Spark literal, never inside SQL text.
_CUSTOMER_ID = re.compile(r"[\s\S]{1,64}")
# An erasure's request id (an Airflow run id, e.g. manual__2026-12-03T21:23:21+00:00),
# as control.erasures' check allows it.
_REQUEST_ID = re.compile(r"[A-Za-z0-9_.:+-]{1,250}")
# Words and simple punctuation: a reason is for people, and must not carry an id.
_REASON = re.compile(r"[A-Za-z0-9 ,.;:()/#'_-]{1,200}")


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


def check_customer_id(customer_id: str) -> str:
    if not _CUSTOMER_ID.fullmatch(customer_id):
        raise UnsafeNameError(
            f"customer id {customer_id[:70]!r} is not 1-64 characters (docs/contract.md §1)"
        )
    return customer_id


def check_request_id(request_id: str) -> str:
    if not _REQUEST_ID.fullmatch(request_id):
        raise UnsafeNameError(
            f"request id {request_id[:260]!r} is not 1-250 characters of letters, digits "
            "and _ . : + -, e.g. an Airflow run id"
        )
    return request_id


def check_reason(reason: str, customer_id: str) -> str:
    """An erasure's reason, as the erasure log keeps it: plain words, never the id."""
    reason = reason.strip()
    if not _REASON.fullmatch(reason):
        raise UnsafeNameError(
            "the reason must be 1-200 characters of letters, digits, spaces and , . ; : ( ) / "
            "# ' _ -, for example 'GDPR art. 17 request 1234'"
        )
    if customer_id.lower() in reason.lower():
        raise UnsafeNameError(
            "the reason names the customer; the erasure log must not hold the id it erases"
        )
    return reason
