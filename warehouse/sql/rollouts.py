"""Automatic rollouts' state in PostgreSQL (`control.rollouts`, migration 0005).

One row per rollout. Its `step` and `state` are the whole state machine, so a
driver killed at any point is resumed from the row. Each decision is also written
to `control.view_events` in the same transaction, with its figures as JSON, so
`regauge versions show` tells the story. The rules live in
`warehouse.base.autorollout`; this module only reads and writes.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg

from warehouse.base import page
from warehouse.base.autorollout import Plan, Thresholds
from warehouse.base.settings import Settings
from warehouse.sql import versions
from warehouse.sql.versions import VersionError


class RolloutError(VersionError):
    """A rollout command refused; the message says why and what to do."""


@dataclass(frozen=True)
class Rollout:
    id: int
    view_name: str
    version: int
    current_version: int
    steps: list[int]
    hold_s: float
    thresholds: dict[str, int]
    step: int
    step_at: datetime | None
    state: str
    why: str
    stop_by: str | None
    started_by: str
    request_id: str | None
    started_at: datetime
    ended_at: datetime | None

    @property
    def plan(self) -> Plan:
        return Plan(
            self.view_name,
            self.version,
            tuple(self.steps),
            self.hold_s,
            Thresholds(**self.thresholds),
        )

    @property
    def percent(self) -> int:
        """The candidate's share the rollout reached (0 before its first move)."""
        return self.steps[self.step] if self.step >= 0 else 0


def _one(conn: psycopg.Connection[Any], sql: str, params: list[Any]) -> Rollout | None:
    row = conn.execute(sql, params).fetchone()
    return Rollout(**row) if row else None


def running(settings: Settings, view: str) -> Rollout | None:
    with versions.transaction(settings, view) as conn:
        return _one(
            conn,
            "SELECT * FROM control.rollouts WHERE view_name = %s AND state = 'running'",
            [view],
        )


def history(settings: Settings, view: str, limit: int = 10) -> list[Rollout]:
    with versions.transaction(settings, view) as conn:
        rows = conn.execute(
            "SELECT * FROM control.rollouts WHERE view_name = %s ORDER BY id DESC LIMIT %s",
            [view, limit],
        )
        return [Rollout(**r) for r in rows]


def requested(settings: Settings, view: str, request_id: str) -> Rollout | None:
    """The rollout started for `request_id`, running or ended, if any."""
    with versions.transaction(settings, view) as conn:
        return _one(
            conn,
            "SELECT * FROM control.rollouts WHERE view_name = %s AND request_id = %s",
            [view, request_id],
        )


def start(
    settings: Settings, p: Plan, current_version: int, by: str, request_id: str | None = None
) -> Rollout:
    """A new running rollout of `p`, or the running one if it is the same candidate
    (a rerun resumes it with the plan it started with)."""
    with versions.transaction(settings, p.view) as conn:
        found = _one(
            conn,
            "SELECT * FROM control.rollouts WHERE view_name = %s AND state = 'running'",
            [p.view],
        )
        if found is not None:
            if found.version != p.version:
                raise RolloutError(
                    f"a rollout of {p.view} v{found.version} is running (since "
                    f"{found.started_at:%Y-%m-%d %H:%M}); stop it first: "
                    f"regauge autorollout stop {p.view}"
                )
            return found
        row = conn.execute(
            "INSERT INTO control.rollouts (view_name, version, current_version, steps, hold_s, "
            "thresholds, started_by, request_id) VALUES (%s, %s, %s, %s, %s, %s, %s, %s) "
            "RETURNING *",
            [
                p.view,
                p.version,
                current_version,
                list(p.steps),
                p.hold_s,
                json.dumps(p.thresholds.as_dict()),
                by,
                request_id,
            ],
        ).fetchone()
        assert row is not None
        versions.event(
            conn,
            p.view,
            p.version,
            "autorollout",
            f"started by {by}: {p.describe()}, against v{current_version}; "
            f"thresholds {json.dumps(p.thresholds.as_dict())}",
        )
        return Rollout(**row)


def get(settings: Settings, rollout_id: int, view: str) -> Rollout:
    with versions.transaction(settings, view) as conn:
        found = _one(conn, "SELECT * FROM control.rollouts WHERE id = %s", [rollout_id])
    if found is None:
        raise RolloutError(f"rollout {rollout_id} of {view} is gone (was the view forgotten?)")
    return found


def stepped(settings: Settings, r: Rollout, step: int, detail: str) -> Rollout:
    """Record that step `step` was reached (its users moved) and begins to hold."""
    with versions.transaction(settings, r.view_name) as conn:
        row = conn.execute(
            "UPDATE control.rollouts SET step = %s, step_at = now() "
            "WHERE id = %s AND state = 'running' RETURNING *",
            [step, r.id],
        ).fetchone()
        if row is None:
            raise RolloutError(f"rollout {r.id} of {r.view_name} is no longer running")
        versions.event(conn, r.view_name, r.version, "autorollout", detail)
        return Rollout(**row)


def judged(settings: Settings, r: Rollout, figures: Mapping[str, Any], verdict: str) -> None:
    """Record one step's gate figures and verdicts."""
    with versions.transaction(settings, r.view_name) as conn:
        versions.event(
            conn,
            r.view_name,
            r.version,
            "judged",
            page.judged_detail(r.percent, verdict, figures),
        )


def ended(settings: Settings, r: Rollout, state: str, why: str) -> Rollout:
    with versions.transaction(settings, r.view_name) as conn:
        row = conn.execute(
            "UPDATE control.rollouts SET state = %s, why = %s, ended_at = now() "
            "WHERE id = %s AND state = 'running' RETURNING *",
            [state, why, r.id],
        ).fetchone()
        if row is None:
            raise RolloutError(f"rollout {r.id} of {r.view_name} is no longer running")
        versions.event(conn, r.view_name, r.version, state.replace("_", " "), why)
        return Rollout(**row)


def ask_stop(settings: Settings, view: str, by: str) -> Rollout:
    """Ask the running rollout of `view` to stop where it is."""
    with versions.transaction(settings, view) as conn:
        row = conn.execute(
            "UPDATE control.rollouts SET stop_by = %s WHERE view_name = %s AND state = 'running' "
            "RETURNING *",
            [by, view],
        ).fetchone()
        if row is None:
            raise RolloutError(f"no rollout of {view} is running")
        r = Rollout(**row)
        versions.event(conn, view, r.version, "stop asked", f"by {by} at {r.percent} %")
        return r


def stop_asked(settings: Settings, r: Rollout) -> str | None:
    with versions.transaction(settings, r.view_name) as conn:
        row = conn.execute("SELECT stop_by FROM control.rollouts WHERE id = %s", [r.id]).fetchone()
    return row["stop_by"] if row else None


def _lock_key(view: str) -> str:
    return f"regauge.autorollout.{view}"


@contextmanager
def driving(settings: Settings, view: str) -> Iterator[bool]:
    """Yield True while this process is the one driver of `view`'s rollout (False if
    another holds it). A PostgreSQL session lock: a driver killed with -9 releases it
    when its connection drops, so a rerun can take over at once."""
    with psycopg.connect(settings.postgres_dsn(), autocommit=True) as conn:
        got = conn.execute("SELECT pg_try_advisory_lock(hashtext(%s))", [_lock_key(view)])
        row = got.fetchone()
        held = bool(row and row[0])
        try:
            yield held
        finally:
            if held:
                conn.execute("SELECT pg_advisory_unlock(hashtext(%s))", [_lock_key(view)])


def driven(settings: Settings, view: str) -> bool:
    """Whether some process drives `view`'s rollout now."""
    with driving(settings, view) as mine:
        return not mine
