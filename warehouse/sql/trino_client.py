"""Talking to Trino: one connection helper and a readable table printer."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import requests
import trino

from warehouse.base import registry
from warehouse.base.settings import Settings


@dataclass(frozen=True)
class Result:
    columns: list[str]
    rows: list[tuple[Any, ...]]


def connect(settings: Settings, user: str | None = None) -> trino.dbapi.Connection:
    """A connection as `user` (default: regauge's own login, `trino_login`).

    Without a password (the local stack), Trino takes the user name as sent. With
    one (a cluster), regauge logs in over HTTPS as its own login and acts as `user`,
    which Trino's impersonation rules (infra/trino/rules.json) must allow: the
    analyst's own rules then apply, as if they had logged in themselves.
    """
    extra: dict[str, Any] = {}
    if settings.trino_password:
        extra["auth"] = trino.auth.BasicAuthentication(
            settings.trino_login, settings.trino_password
        )
    if settings.trino_ca_file:
        # Through a session of our own: requests lets REQUESTS_CA_BUNDLE in the
        # environment win over a session's `verify` (psf/requests#3829).
        session = requests.Session()
        session.verify = settings.trino_ca_file
        session.trust_env = False
        extra["http_session"] = session
    return trino.dbapi.connect(
        host=settings.trino_host,
        port=settings.trino_port,
        user=user or settings.trino_login,
        http_scheme=settings.trino_scheme,
        request_timeout=120,
        **extra,
    )


def query(
    settings: Settings, sql: str, params: list[Any] | None = None, user: str | None = None
) -> Result:
    """Run one statement and fetch everything it returns."""
    with connect(settings, user) as conn:
        cur = conn.cursor()
        cur.execute(sql, params)
        rows = [tuple(r) for r in cur.fetchall()]
        columns = [d[0] for d in (cur.description or [])]
    return Result(columns, rows)


def scalar(
    settings: Settings, sql: str, params: list[Any] | None = None, user: str | None = None
) -> Any:
    result = query(settings, sql, params, user)
    if len(result.rows) != 1 or len(result.rows[0]) != 1:
        raise ValueError(f"expected one value from {sql!r}, got {len(result.rows)} rows")
    return result.rows[0][0]


def flush_lake_cache(settings: Settings) -> None:
    """Trino caches each Delta table's metadata and file list for a while: after a
    rewrite of files (an erasure, maintenance), make the next query read them anew."""
    query(settings, f"CALL {registry.TRINO_LAKE_CATALOG}.system.flush_metadata_cache()")


def format_table(result: Result) -> str:
    """Render a result as an aligned text table (what `regauge query` prints)."""
    from io import StringIO

    from rich.console import Console
    from rich.table import Table

    table = Table(show_lines=False)
    for col in result.columns:
        table.add_column(col)
    for row in result.rows:
        table.add_row(*("NULL" if v is None else str(v) for v in row))
    buf = StringIO()
    Console(file=buf, width=160, force_terminal=False).print(table)
    return (
        buf.getvalue().rstrip()
        + f"\n({len(result.rows)} row{'s' if len(result.rows) != 1 else ''})"
    )


def format_csv(result: Result) -> str:
    """RFC 4180 CSV with a header row; NULL is an empty field."""
    import csv
    from io import StringIO

    buf = StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(result.columns)
    writer.writerows(["" if v is None else v for v in row] for row in result.rows)
    return buf.getvalue().rstrip("\n")


def format_json(result: Result) -> str:
    """One JSON object per row (JSON Lines); decimals and times as strings, exact."""
    import json

    return "\n".join(
        json.dumps(dict(zip(result.columns, row, strict=True)), default=str) for row in result.rows
    )


FORMATS = {"table": format_table, "csv": format_csv, "json": format_json}
