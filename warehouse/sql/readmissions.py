"""The re-admission log, `control.readmissions` (docs/contract.md §10): one row per run,
with the contract version that judged the records and what became of them.

A run that did not finish (failed, or killed while `running`) is resumed under its
own id by the next run for the same source and reason: its commits carry that id
(`spark_jobs.engine.readmit`), so nothing is admitted twice."""

from __future__ import annotations

import json
import uuid
from typing import Any

import psycopg
from psycopg.rows import dict_row

from warehouse.base.settings import Settings
from warehouse.sql import migrations


def _connect(settings: Settings) -> psycopg.Connection[dict[str, Any]]:
    migrations.apply(settings)
    return psycopg.connect(settings.postgres_dsn(), autocommit=True, row_factory=dict_row)


def start(
    settings: Settings, source: str, reason: str, contract_version: int, requested_by: str
) -> tuple[str, bool]:
    """The id to run under, and whether it resumes a run that did not finish."""
    with _connect(settings) as conn:
        unfinished = conn.execute(
            "SELECT readmission_id, contract_version FROM control.readmissions "
            "WHERE source = %s AND reason = %s AND status <> 'done' "
            "ORDER BY requested_at DESC LIMIT 1",
            [source, reason],
        ).fetchone()
        if unfinished is not None and unfinished["contract_version"] == contract_version:
            conn.execute(
                "UPDATE control.readmissions SET status = 'running', error = NULL "
                "WHERE readmission_id = %s",
                [unfinished["readmission_id"]],
            )
            return str(unfinished["readmission_id"]), True
        readmission_id = uuid.uuid4().hex
        conn.execute(
            "INSERT INTO control.readmissions "
            "(readmission_id, source, reason, contract_version, requested_by) "
            "VALUES (%s, %s, %s, %s, %s)",
            [readmission_id, source, reason, contract_version, requested_by],
        )
    return readmission_id, False


def counted(
    settings: Settings,
    readmission_id: str,
    examined: int,
    admitted: int,
    still_quarantined: dict[str, int],
) -> None:
    """What became of the records, once the quarantine is restated. The first try to
    get there counts: a rerun examines only what that try left in the quarantine."""
    with _connect(settings) as conn:
        conn.execute(
            "UPDATE control.readmissions SET examined = %s, admitted = %s, "
            "still_quarantined = %s WHERE readmission_id = %s AND examined IS NULL",
            [examined, admitted, json.dumps(still_quarantined), readmission_id],
        )


def finish(settings: Settings, readmission_id: str) -> dict[str, Any]:
    """Mark the run done; its row."""
    with _connect(settings) as conn:
        row = conn.execute(
            "UPDATE control.readmissions SET status = 'done', completed_at = now(), "
            "examined = coalesce(examined, 0), admitted = coalesce(admitted, 0), error = NULL "
            "WHERE readmission_id = %s RETURNING *",
            [readmission_id],
        ).fetchone()
    assert row is not None, readmission_id
    return row


def fail(settings: Settings, readmission_id: str, error: str) -> None:
    with _connect(settings) as conn:
        conn.execute(
            "UPDATE control.readmissions SET status = 'failed', error = %s "
            "WHERE readmission_id = %s",
            [error[:1000], readmission_id],
        )


def runs(settings: Settings, source: str | None = None) -> list[dict[str, Any]]:
    """Every run, newest first (of one source, if given)."""
    with _connect(settings) as conn:
        return conn.execute(
            "SELECT * FROM control.readmissions WHERE %(source)s::text IS NULL "
            "OR source = %(source)s ORDER BY requested_at DESC",
            {"source": source},
        ).fetchall()
