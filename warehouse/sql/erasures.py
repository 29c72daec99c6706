"""The erasure log, `control.erasures` (docs/contract.md §8), and the reference data an
erasure removes. The log never holds the customer's id: only an erasure id,
times, the operator's reason and the rows removed per layer."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.rows import dict_row

from warehouse import sources
from warehouse.base import registry
from warehouse.base.settings import Settings
from warehouse.base.sqlnames import quote_identifier
from warehouse.sql import migrations, trino_client


def _connect(settings: Settings) -> psycopg.Connection[dict[str, Any]]:
    migrations.apply(settings)
    return psycopg.connect(settings.postgres_dsn(), autocommit=True, row_factory=dict_row)


# The steps an erasure records as it completes them (`phase`), in order
# (warehouse.ops.erasure). A rerun under the same request id resumes after the last.
PHASES = ("registered", "found", "deleted", "recomputed", "rebuilt", "compacted", "done")
# From this phase on, the lake has changed: what is left needs no customer id.
LAKE_CHANGED = "deleted"


@dataclass(frozen=True)
class Started:
    erasure_id: str
    phase: str  # the last step completed: "registered" for a new erasure
    removed: dict[str, int]
    status: str = "running"

    @property
    def resumed(self) -> bool:
        return self.phase != "registered"


def start(
    settings: Settings, reason: str, requested_by: str, request_id: str | None = None
) -> Started:
    """A new erasure; or, for a `request_id` seen before, that request's erasure, to
    resume after the last step it completed (or to report, if it is done)."""
    with _connect(settings) as conn:
        if request_id is not None:
            row = conn.execute(
                "SELECT erasure_id, phase, status, removed FROM control.erasures "
                "WHERE request_id = %s",
                [request_id],
            ).fetchone()
            if row is not None:
                return _resuming(conn, row)
        erasure_id = uuid.uuid4().hex
        conn.execute(
            "INSERT INTO control.erasures (erasure_id, reason, requested_by, phase, request_id) "
            "VALUES (%s, %s, %s, 'registered', %s)",
            [erasure_id, reason, requested_by, request_id],
        )
    return Started(erasure_id, "registered", {})


def resume(settings: Settings, erasure_id: str) -> Started:
    """Erasure `erasure_id`, to resume after the last step it completed. KeyError if
    there is none."""
    with _connect(settings) as conn:
        row = conn.execute(
            "SELECT erasure_id, phase, status, removed FROM control.erasures WHERE erasure_id = %s",
            [erasure_id],
        ).fetchone()
        if row is None:
            raise KeyError(erasure_id)
        return _resuming(conn, row)


def _resuming(conn: psycopg.Connection[dict[str, Any]], row: dict[str, Any]) -> Started:
    phase = str(row["phase"] or "registered")
    if row["status"] != "done":
        conn.execute(
            "UPDATE control.erasures SET status = 'running', error = NULL WHERE erasure_id = %s",
            [row["erasure_id"]],
        )
    return Started(str(row["erasure_id"]), phase, dict(row["removed"] or {}), str(row["status"]))


def supersede(settings: Settings, by: str) -> list[str]:
    """Close the failed erasures that had changed the lake: erasure `by`, which just
    ended, did all that was left of theirs (every step after the deletion works on
    the whole lake, not on one customer). Their ids."""
    with _connect(settings) as conn:
        rows = conn.execute(
            "UPDATE control.erasures SET status = 'done', phase = 'done', completed_at = now(), "
            "error = 'finished by erasure ' || %s "
            "WHERE status = 'failed' AND erasure_id <> %s AND phase = ANY(%s) "
            "RETURNING erasure_id",
            [by, by, list(PHASES[PHASES.index(LAKE_CHANGED) : -1])],
        ).fetchall()
    return [str(r["erasure_id"]) for r in rows]


def advance(settings: Settings, erasure_id: str, phase: str, removed: dict[str, int]) -> None:
    with _connect(settings) as conn:
        conn.execute(
            "UPDATE control.erasures SET phase = %s, removed = %s WHERE erasure_id = %s",
            [phase, json.dumps(removed), erasure_id],
        )


def finish(settings: Settings, erasure_id: str, removed: dict[str, int]) -> None:
    with _connect(settings) as conn:
        conn.execute(
            "UPDATE control.erasures SET status = 'done', phase = 'done', completed_at = now(), "
            "removed = %s, error = NULL WHERE erasure_id = %s",
            [json.dumps(removed), erasure_id],
        )


def fail(settings: Settings, erasure_id: str, error: str) -> None:
    with _connect(settings) as conn:
        conn.execute(
            "UPDATE control.erasures SET status = 'failed', error = %s WHERE erasure_id = %s",
            [error[:1000], erasure_id],
        )


def delete_reference(settings: Settings, customer_id: str) -> int:
    """Remove the customer from the reference data; rows removed. The table is then
    rewritten (VACUUM FULL): a deleted row's bytes otherwise stay in its data file
    until the page is reused."""
    with _connect(settings) as conn:
        found = conn.execute("SELECT to_regclass('reference.customers') AS t").fetchone()
        if found is None or found["t"] is None:
            return 0
        cur = conn.execute("DELETE FROM reference.customers WHERE customer_id = %s", [customer_id])
        conn.execute("VACUUM FULL reference.customers")  # autocommit: outside a transaction
        return cur.rowcount


def mentions(settings: Settings, customer_id: str) -> dict[str, int]:
    """Rows that name the customer, per table, as Trino reads them: every source's
    bronze (key and raw value) and quarantine (raw value), restatement keys, the
    reference data, and every lake table or view with a customer_id column (silver,
    views, marts, serving)."""
    lake_catalog = registry.TRINO_LAKE_CATALOG
    checks = {}
    for name in sorted(sources.discover()):
        src = registry.source_tables(name)
        bronze, quarantine = src.bronze.trino_name, src.quarantine.trino_name
        checks[bronze] = (
            f"SELECT count(*) FROM {bronze} WHERE key = ? OR strpos(from_utf8(value), ?) > 0"
        )
        checks[quarantine] = (
            f"SELECT count(*) FROM {quarantine} WHERE strpos(from_utf8(raw_value), ?) > 0"
        )
    checks |= {
        registry.GOLD_RESTATEMENTS.trino_name: (
            f"SELECT count(*) FROM {registry.GOLD_RESTATEMENTS.trino_name} WHERE window_key = ?"
        ),
        f"{registry.TRINO_OPS_CATALOG}.reference.customers": (
            f"SELECT count(*) FROM {registry.TRINO_OPS_CATALOG}.reference.customers "
            "WHERE customer_id = ?"
        ),
    }
    with_column = trino_client.query(
        settings,
        f"SELECT table_schema, table_name FROM {lake_catalog}.information_schema.columns "
        "WHERE column_name = 'customer_id' AND table_schema <> 'information_schema' "
        "ORDER BY 1, 2",
    ).rows
    for schema, table in with_column:
        name = f"{lake_catalog}.{schema}.{table}"
        quoted = f"{quote_identifier(schema, 'schema')}.{quote_identifier(table, 'table')}"
        checks[name] = f"SELECT count(*) FROM {lake_catalog}.{quoted} WHERE customer_id = ?"
    # One query for every table: each of Trino's queries costs a round of planning
    # and scheduling (some 50 tables on a lake with views, marts and serving views).
    union = " UNION ALL ".join(f"SELECT ? AS name, ({sql}) AS n" for sql in checks.values())
    params = [p for name, sql in checks.items() for p in (name, *[customer_id] * sql.count("?"))]
    rows = trino_client.query(settings, union, params).rows
    found = {str(name): int(n) for name, n in rows}
    return {name: found[name] for name in checks}
