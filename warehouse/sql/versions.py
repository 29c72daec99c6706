"""The version registry (docs/contract.md §4): which versions of a view exist, which are
live, and who is routed to which.

`regauge.control.view_versions` holds one row per version, `view_pins` the
users pinned to one. A view has at most one current version (`serving`) and
one candidate (`ready`); unique indexes in the database hold that rule. The
state changes themselves are pure functions (`plan_rollout`, `retire_refusal`)
so they are tested without a database; the functions here own the IO, each
in one transaction that locks the view's rows.

Over 400 lines on purpose: each rule sits beside the one transaction that
applies it, so a reader checks a state change and its locking in one place.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from psycopg.rows import dict_row

from warehouse.base.settings import Settings
from warehouse.base.sqlnames import check_identifier, check_user
from warehouse.sql import migrations

log = logging.getLogger(__name__)

STATUSES = ("building", "ready", "serving", "retired", "failed")
LIVE = ("ready", "serving")
SOURCES = ("bronze", "kafka")


class VersionError(ValueError):
    """A registry change that is refused; the message says why and what to do."""


def check_percent(percent: int) -> int:
    if isinstance(percent, bool) or not isinstance(percent, int) or not 0 <= percent <= 100:
        raise VersionError(f"percent {percent!r} must be a whole number from 0 to 100")
    return percent


def check_rollout(view: str, percent: int, pin: str | None, unpin: str | None) -> None:
    """A rollout's names and numbers, refused before anything is read or written."""
    check_identifier(view, "view")
    check_percent(percent)
    for user in (pin, unpin):
        if user is not None:
            check_user(user)


def cohort(user: str) -> int:
    """docs/contract.md §4: the first 8 bytes of SHA-256, signed big-endian, floor-mod 100."""
    return int.from_bytes(hashlib.sha256(user.encode()).digest()[:8], "big", signed=True) % 100


@dataclass(frozen=True)
class Version:
    view_name: str
    version: int
    status: str
    rollout_percent: int
    created_at: datetime | None = None
    ready_at: datetime | None = None
    retired_at: datetime | None = None
    source_position: str | None = None
    validation: dict[str, Any] | None = None

    @property
    def live(self) -> bool:
        return self.status in LIVE

    @property
    def label(self) -> str:
        return f"{self.view_name} v{self.version}"


# -- pure rules ------------------------------------------------------------------------
def route(versions: Sequence[Version], pins: Mapping[str, int], user: str) -> int | None:
    """The version `user` sees (docs/contract.md §4); None if the view has no live version.

    The serving view in Trino computes the same thing in SQL; tests hold the two equal.
    """
    live = {v.version: v for v in versions if v.live}
    if user in pins and pins[user] in live:
        return pins[user]
    current = next((v for v in live.values() if v.status == "serving"), None)
    candidate = next((v for v in live.values() if v.status == "ready"), None)
    if candidate is not None and cohort(user) < candidate.rollout_percent:
        return candidate.version
    return current.version if current is not None else None


def plan_rollout(versions: Sequence[Version], version: int, percent: int) -> dict[int, Version]:
    """The rows that change when `percent` of users are routed to `version`.

    `percent` is the share of (unpinned) users on `version`; the other live
    version gets the rest. At 100 the candidate becomes the current version
    and the old current becomes the candidate at 0 %, so every step, including
    that one, can be undone until the old version is retired. Rolling out the
    current version below 100 % swaps the roles the same way.
    """
    check_percent(percent)
    by_version = {v.version: v for v in versions}
    target = by_version.get(version)
    if target is None:
        raise VersionError(f"{_label(versions, version)} is not registered")
    if not target.live:
        raise VersionError(
            f"{target.label} is {target.status}; only a ready or serving version can be rolled "
            "out" + (" (wait for its reprocess to finish)" if target.status == "building" else "")
        )
    other = next((v for v in versions if v.live and v.version != version), None)
    if other is None:
        if percent == 100:
            return {}
        raise VersionError(
            f"{target.label} is the only live version: there is no other version to route "
            "the remaining users to"
        )
    if percent == 100:
        new_target, new_other = ("serving", 100), ("ready", 0)
    else:
        # Below 100 the target is the candidate, even if it was the current version.
        new_target, new_other = ("ready", percent), ("serving", 100 - percent)
    changes: dict[int, Version] = {}
    for row, (status, pct) in ((target, new_target), (other, new_other)):
        if (row.status, row.rollout_percent) != (status, pct):
            changes[row.version] = _replace(row, status=status, rollout_percent=pct)
    return changes


def retire_refusal(
    versions: Sequence[Version], pins: Mapping[str, int], version: int
) -> str | None:
    """Why `version` cannot be retired now, or None if it can."""
    row = next((v for v in versions if v.version == version), None)
    if row is None:
        return f"{_label(versions, version)} is not registered"
    if row.status == "building":
        return f"{row.label} is being built; let its reprocess finish or fail first"
    if row.status == "serving":
        return (
            f"{row.label} is the current version; roll another version out to 100 % first "
            f"(regauge rollout {row.view_name} <version> 100)"
        )
    if row.status == "ready" and row.rollout_percent > 0:
        return (
            f"{row.rollout_percent} % of users are still routed to {row.label}; roll it back "
            f"first (regauge rollout {row.view_name} {row.version} 0)"
        )
    pinned = sorted(user for user, v in pins.items() if v == version)
    if pinned:
        shown = ", ".join(pinned[:5]) + (f" and {len(pinned) - 5} more" if len(pinned) > 5 else "")
        return (
            f"{len(pinned)} user(s) are pinned to {row.label} ({shown}); unpin them first "
            f"(regauge rollout {row.view_name} <version> <percent> --unpin USER)"
        )
    return None


def register_refusal(versions: Sequence[Version], version: int) -> str | None:
    """Why a reprocess of `version` cannot start (or resume), or None."""
    row = next((v for v in versions if v.version == version), None)
    if row is not None and row.status in ("ready", "serving"):
        return f"{row.label} is already built and {row.status}; roll it out instead"
    if row is not None and row.status == "retired":
        return f"{row.label} was retired; reprocess the change as a new version"
    others = [v for v in versions if v.version != version]
    building = next((v for v in others if v.status == "building"), None)
    if building is not None:
        return f"{building.label} is being built; one reprocess per view at a time"
    candidate = next((v for v in others if v.status == "ready"), None)
    if candidate is not None:
        return (
            f"{candidate.label} is already the candidate (at most two live versions); "
            f"roll it out to 100 % and retire the old one, or retire it, first"
        )
    return None


def _label(versions: Sequence[Version], version: int) -> str:
    return f"{versions[0].view_name} v{version}" if versions else f"v{version}"


def _replace(row: Version, **changes: Any) -> Version:
    from dataclasses import replace

    return replace(row, **changes)


# -- IO --------------------------------------------------------------------------------
_migrated: set[str] = set()


@contextmanager
def transaction(settings: Settings, view: str) -> Iterator[psycopg.Connection[Any]]:
    """One transaction holding a lock on `view`'s registry rows (other views go on)."""
    check_identifier(view, "view")
    dsn = settings.postgres_dsn()
    if dsn not in _migrated:
        migrations.apply(settings)
        _migrated.add(dsn)
    with psycopg.connect(dsn, autocommit=False, row_factory=dict_row) as conn:
        # hashtext() turns the name into a lock key: two commands on one view queue.
        conn.execute("SELECT pg_advisory_xact_lock(hashtext('regauge.view.' || %s))", [view])
        yield conn


@contextmanager
def exclusive(settings: Settings, view: str) -> Iterator[None]:
    """Hold `view`'s lifecycle lock for a whole step: the registry change and the
    serving view regenerated from it. Without it a rollout could regenerate the
    serving view from a registry read before a concurrent retire committed, and
    route users to a table the retire just dropped.

    A session-level advisory lock on a connection of its own, under another key
    than `transaction`'s (which each step takes inside it): other steps on the
    same view wait here; other views go on."""
    check_identifier(view, "view")
    with psycopg.connect(settings.postgres_dsn(), autocommit=True) as conn:
        conn.execute("SELECT pg_advisory_lock(hashtext('regauge.lifecycle.' || %s))", [view])
        try:
            yield
        finally:
            conn.execute("SELECT pg_advisory_unlock(hashtext('regauge.lifecycle.' || %s))", [view])


def _rows(conn: psycopg.Connection[Any], view: str | None) -> list[Version]:
    sql = "SELECT * FROM control.view_versions"
    params: list[Any] = []
    if view is not None:
        sql += " WHERE view_name = %s"
        params.append(view)
    return [Version(**r) for r in conn.execute(sql + " ORDER BY view_name, version", params)]


def _pins(conn: psycopg.Connection[Any], view: str) -> dict[str, int]:
    rows = conn.execute(
        "SELECT user_name, version FROM control.view_pins WHERE view_name = %s", [view]
    )
    return {r["user_name"]: r["version"] for r in rows}


def event(conn: psycopg.Connection[Any], view: str, version: int, action: str, detail: str) -> None:
    conn.execute(
        "INSERT INTO control.view_events (view_name, version, action, detail) "
        "VALUES (%s, %s, %s, %s)",
        [view, version, action, detail],
    )
    log.info("%s v%d: %s%s", view, version, action, f" ({detail})" if detail else "")


def versions(settings: Settings, view: str | None = None) -> list[Version]:
    with transaction(settings, view or "all") as conn:
        return _rows(conn, view)


def get(settings: Settings, view: str, version: int) -> Version:
    found = next((v for v in versions(settings, view) if v.version == version), None)
    if found is None:
        raise VersionError(f"{view} v{version} is not registered (see `regauge versions list`)")
    return found


def pins(settings: Settings, view: str) -> dict[str, int]:
    with transaction(settings, view) as conn:
        return _pins(conn, view)


def events(settings: Settings, view: str, limit: int = 20) -> list[dict[str, Any]]:
    with transaction(settings, view) as conn:
        rows = conn.execute(
            "SELECT * FROM control.view_events WHERE view_name = %s ORDER BY id DESC LIMIT %s",
            [view, limit],
        )
        return list(reversed(list(rows)))


def register(settings: Settings, view: str, version: int, source: str) -> str:
    """Register `version` as building, or resume a build that failed or stopped."""
    if source not in SOURCES:
        raise VersionError(f"source {source!r}: expected one of {', '.join(SOURCES)}")
    with transaction(settings, view) as conn:
        rows = _rows(conn, view)
        refusal = register_refusal(rows, version)
        if refusal:
            raise VersionError(refusal)
        existing = next((v for v in rows if v.version == version), None)
        if existing is None:
            conn.execute(
                "INSERT INTO control.view_versions (view_name, version, status) "
                "VALUES (%s, %s, 'building')",
                [view, version],
            )
            event(conn, view, version, "registered", f"building from {source}")
            return "registered"
        conn.execute(
            "UPDATE control.view_versions SET status = 'building', validation = NULL, "
            "ready_at = NULL WHERE view_name = %s AND version = %s",
            [view, version],
        )
        event(conn, view, version, "resumed", f"was {existing.status}; building from {source}")
        return "resumed"


def _require_status(row: Version, *allowed: str) -> None:
    if row.status not in allowed:
        raise VersionError(f"{row.label} is {row.status}; expected {' or '.join(allowed)}")


def _one(rows: Sequence[Version], view: str, version: int) -> Version:
    row = next((v for v in rows if v.version == version), None)
    if row is None:
        raise VersionError(f"{view} v{version} is not registered; run regauge_reprocess first")
    return row


def record_position(settings: Settings, view: str, version: int, position: str) -> None:
    with transaction(settings, view) as conn:
        _require_status(_one(_rows(conn, view), view, version), "building")
        conn.execute(
            "UPDATE control.view_versions SET source_position = %s "
            "WHERE view_name = %s AND version = %s",
            [position, view, version],
        )
        event(conn, view, version, "replayed", position)


def record_validation(
    settings: Settings, view: str, version: int, report: Mapping[str, Any]
) -> Version:
    """Store the gate's report; a failed gate marks the version failed."""
    with transaction(settings, view) as conn:
        _require_status(_one(_rows(conn, view), view, version), "building")
        status = "building" if report.get("passed") else "failed"
        conn.execute(
            "UPDATE control.view_versions SET validation = %s, status = %s "
            "WHERE view_name = %s AND version = %s",
            [json.dumps(report, default=str), status, view, version],
        )
        event(
            conn,
            view,
            version,
            "validated" if report.get("passed") else "failed",
            str(report.get("summary", "")),
        )
        return _one(_rows(conn, view), view, version)


def mark_ready(settings: Settings, view: str, version: int) -> Version:
    """building -> ready (a candidate at 0 %), or -> serving if the view has no current
    version yet (its first version: there is nothing to migrate from)."""
    with transaction(settings, view) as conn:
        rows = _rows(conn, view)
        row = _one(rows, view, version)
        if row.status in LIVE:
            return row
        _require_status(row, "building")
        if not (row.validation or {}).get("passed"):
            raise VersionError(f"{row.label} has not passed validation; run the gate first")
        first = not any(v.status == "serving" for v in rows)
        status, percent = ("serving", 100) if first else ("ready", 0)
        conn.execute(
            "UPDATE control.view_versions SET status = %s, rollout_percent = %s, "
            "ready_at = now() WHERE view_name = %s AND version = %s",
            [status, percent, view, version],
        )
        event(conn, view, version, status, "first version: serves everyone" if first else "0 %")
        return _one(_rows(conn, view), view, version)


def rollout(
    settings: Settings,
    view: str,
    version: int,
    percent: int,
    pin: str | None = None,
    unpin: str | None = None,
) -> list[str]:
    """Route `percent` of users to `version`; pin or unpin one user. Returns what changed."""
    check_rollout(view, percent, pin, unpin)
    done: list[str] = []
    with transaction(settings, view) as conn:
        rows = _rows(conn, view)
        changes = plan_rollout(rows, version, percent)
        # A swap breaks "one serving, one ready" between the two updates; the
        # constraints are checked at commit.
        for row in changes.values():
            conn.execute(
                "UPDATE control.view_versions SET status = %s, rollout_percent = %s "
                "WHERE view_name = %s AND version = %s",
                [row.status, row.rollout_percent, view, row.version],
            )
            event(conn, view, row.version, "rollout", f"{row.status} at {row.rollout_percent} %")
            done.append(f"{row.label}: {row.status}, {row.rollout_percent} % of users")
        if pin is not None:
            conn.execute(
                "INSERT INTO control.view_pins (view_name, user_name, version) "
                "VALUES (%s, %s, %s) ON CONFLICT (view_name, user_name) "
                "DO UPDATE SET version = EXCLUDED.version, pinned_at = now()",
                [view, pin, version],
            )
            event(conn, view, version, "pinned", pin)
            done.append(f"{pin} pinned to {view} v{version}")
        if unpin is not None:
            gone = conn.execute(
                "DELETE FROM control.view_pins WHERE view_name = %s AND user_name = %s",
                [view, unpin],
            ).rowcount
            if gone:
                event(conn, view, version, "unpinned", unpin)
            done.append(f"{unpin} unpinned" if gone else f"{unpin} was not pinned")
    return done


def mark_retired(settings: Settings, view: str, version: int) -> bool:
    """Mark `version` retired if no user is routed to it. False if it already was."""
    with transaction(settings, view) as conn:
        rows = _rows(conn, view)
        if _one(rows, view, version).status == "retired":
            return False
        refusal = retire_refusal(rows, _pins(conn, view), version)
        if refusal:
            raise VersionError(refusal)
        conn.execute(
            "UPDATE control.view_versions SET status = 'retired', rollout_percent = 0, "
            "retired_at = now() WHERE view_name = %s AND version = %s",
            [view, version],
        )
        event(conn, view, version, "retired", "")
        return True


def forget(settings: Settings, view: str) -> int:
    """Delete every registry row of `view` (rollouts, pins, versions, history). For starting a
    demo or a test over; tables in the lake are left alone."""
    with transaction(settings, view) as conn:
        conn.execute("DELETE FROM control.rollouts WHERE view_name = %s", [view])
        conn.execute("DELETE FROM control.view_pins WHERE view_name = %s", [view])
        conn.execute("DELETE FROM control.view_events WHERE view_name = %s", [view])
        return conn.execute(
            "DELETE FROM control.view_versions WHERE view_name = %s", [view]
        ).rowcount
