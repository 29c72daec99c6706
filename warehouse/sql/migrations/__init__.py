"""Schema migrations for the `regauge` PostgreSQL database, applied in file-name order.

Each `NNNN_<what>.sql` runs once, in a transaction, and is recorded in
`control.schema_migrations`. Plain SQL files and a ledger are all this needs:
the database is ours alone, and a migration framework would be one more
dependency with its own tables and CLI.
"""

from __future__ import annotations

import logging
from pathlib import Path

import psycopg

from warehouse.base.settings import Settings

log = logging.getLogger(__name__)

HERE = Path(__file__).resolve().parent
# Any number: it only has to be the same for every process that migrates.
_LOCK = 0x7265_6761_7567_65


def pending(applied: set[str]) -> list[Path]:
    return [p for p in sorted(HERE.glob("[0-9][0-9][0-9][0-9]_*.sql")) if p.stem not in applied]


def apply(settings: Settings) -> list[str]:
    """Apply the migrations not yet applied; return their names. Safe to run concurrently."""
    done: list[str] = []
    with psycopg.connect(settings.postgres_dsn(), autocommit=False) as conn:
        # Serialise concurrent callers (two CLI commands starting at once).
        conn.execute("SELECT pg_advisory_xact_lock(%s)", [_LOCK])
        conn.execute("CREATE SCHEMA IF NOT EXISTS control")
        conn.execute(
            "CREATE TABLE IF NOT EXISTS control.schema_migrations ("
            " name text PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())"
        )
        applied = {r[0] for r in conn.execute("SELECT name FROM control.schema_migrations")}
        for path in pending(applied):
            conn.execute(path.read_text())
            conn.execute("INSERT INTO control.schema_migrations (name) VALUES (%s)", [path.stem])
            log.info("applied migration %s", path.stem)
            done.append(path.stem)
    return done
