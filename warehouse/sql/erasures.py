"""The erasure log, `control.erasures` (CONTRACT.md §8), and the reference data an
erasure removes. The log never holds the customer's id: only an erasure id,
times, the operator's reason and the rows removed per layer."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from psycopg.rows import dict_row

from warehouse.base.settings import Settings
from warehouse.sql import migrations


@dataclass(frozen=True)
class Erasure:
    erasure_id: str
    requested_at: datetime
    completed_at: datetime | None
    reason: str
    requested_by: str
    status: str
    phase: str | None
    removed: dict[str, int]
    error: str | None


def _connect(settings: Settings) -> psycopg.Connection[dict[str, Any]]:
    migrations.apply(settings)
    return psycopg.connect(settings.postgres_dsn(), autocommit=True, row_factory=dict_row)


def start(settings: Settings, reason: str, requested_by: str) -> str:
    erasure_id = uuid.uuid4().hex
    with _connect(settings) as conn:
        conn.execute(
            "INSERT INTO control.erasures (erasure_id, reason, requested_by, phase) "
            "VALUES (%s, %s, %s, 'registered')",
            [erasure_id, reason, requested_by],
        )
    return erasure_id


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


def recent(settings: Settings, limit: int = 20) -> list[Erasure]:
    with _connect(settings) as conn:
        rows = conn.execute(
            "SELECT * FROM control.erasures ORDER BY requested_at DESC LIMIT %s", [limit]
        ).fetchall()
    return [Erasure(**r) for r in rows]


def delete_reference(settings: Settings, customer_id: str) -> int:
    """Remove the customer from the reference data; rows removed."""
    with _connect(settings) as conn:
        found = conn.execute("SELECT to_regclass('reference.customers') AS t").fetchone()
        if found is None or found["t"] is None:
            return 0
        cur = conn.execute("DELETE FROM reference.customers WHERE customer_id = %s", [customer_id])
        return cur.rowcount
