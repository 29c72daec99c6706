"""Gather the rollout page (issue 69) from the real systems; `warehouse.base.page`
renders it.

Per view with a version: the registry's versions and pins (PostgreSQL), each live
version's freshness (the view host's `read_through` against silver's Delta log, as
the freshness gate measures it), the analysts seen in Trino's recent queries with
the version each is routed to and why, the rollouts with their moves and judged
gate figures (`control.rollouts`, `control.view_events`), and the candidate's
difference from the current version per hour (Trino, on `agrees_with`'s columns).
A part that cannot be read (Trino down, the host stopped) becomes a line on the
page saying so; the rest is still shown.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import asdict
from datetime import UTC, datetime
from typing import Any, TypeVar

from warehouse.base import page as shown
from warehouse.base.page import Analyst, HourDifference, Page, RolloutRow, VersionRow, ViewPage
from warehouse.base.settings import Settings
from warehouse.ops import autorollout, lifecycle
from warehouse.sql import rollouts, trino_client, versions

log = logging.getLogger(__name__)
T = TypeVar("T")

# Trino keeps finished queries for query.min-expire-age: analysts seen in that time.
SEEN_SQL = f"""
SELECT DISTINCT "user" FROM system.runtime.queries
WHERE "user" LIKE '{autorollout.ANALYSTS}' ORDER BY 1
"""
ROLLOUTS_SHOWN = 5
EVENTS_READ = 400


def _part(problems: list[str], what: str, read: Callable[[], T], default: T) -> T:
    try:
        return read()
    except Exception as exc:  # one part missing leaves the rest of the page
        log.warning("the page's %s: %s", what, exc)
        problems.append(f"{what}: not read ({type(exc).__name__}: {str(exc)[:200]})")
        return default


def _bool(value: object) -> bool | None:
    return value if isinstance(value, bool) else None


def _str(value: object) -> str | None:
    return None if value is None else str(value)


def _iso(at: datetime | None) -> str | None:
    return at.astimezone(UTC).isoformat() if at else None


def gather(settings: Settings, views: list[str] | None = None) -> Page:
    problems: list[str] = []
    now = datetime.now(UTC)
    nothing: dict[str, object] = {}
    audit = _part(
        problems, "the latest audit", lambda: autorollout.integrity(settings, now), nothing
    )
    if "missing" in audit:
        problems.append(str(audit["missing"]))
    nobody: list[str] = []
    seen = _part(
        problems,
        "analysts in Trino's recent queries",
        lambda: [str(r[0]) for r in trino_client.query(settings, SEEN_SQL).rows],
        nobody,
    )
    names = views or sorted({v.view_name for v in versions.versions(settings) if v.live})
    return Page(
        generated_at=now.isoformat(),
        audit_passed=_bool(audit.get("audit_passed")),
        audit_finished_at=_str(audit.get("audit_finished_at")),
        views=[_view(settings, name, seen) for name in names],
        problems=problems,
    )


def _view(settings: Settings, view: str, seen: list[str]) -> ViewPage:
    problems: list[str] = []
    rows = [v for v in versions.versions(settings, view) if v.status != "retired"]
    pins = versions.pins(settings, view)
    users = sorted(set(seen) | set(pins))
    analysts = [_analyst(rows, pins, u) for u in users]
    listed = [
        VersionRow(
            version=v.version,
            status=v.status,
            percent=v.rollout_percent,
            analysts=sum(1 for a in analysts if a.version == v.version),
            **_lag(settings, problems, v),
            built_from=v.source_position or "-",
            validation=_validation(v.validation),
        )
        for v in rows
    ]
    events = versions.events(settings, view, EVENTS_READ)
    ended = rollouts.history(settings, view, ROLLOUTS_SHOWN)
    none: tuple[str | None, list[HourDifference]] = (None, [])
    compared, hours = _part(
        problems, "the difference per hour", lambda: _difference(settings, rows), none
    )
    return ViewPage(
        view=view,
        versions=listed,
        analysts=analysts,
        rollouts=[_rollout(r, events) for r in ended],
        compared=compared,
        hours=hours,
        problems=problems,
    )


def _analyst(rows: list[versions.Version], pins: dict[str, int], user: str) -> Analyst:
    seen = versions.route(rows, pins, user)
    live = {v.version for v in rows if v.live}
    if user in pins and pins[user] in live:
        return Analyst(user, seen, "pin", f"pinned to v{pins[user]}")
    candidate = next((v for v in rows if v.live and v.status == "ready"), None)
    cohort = versions.cohort(user)
    if candidate is None:
        return Analyst(user, seen, "cohort", f"cohort {cohort}: one live version")
    share = candidate.rollout_percent
    if cohort < share:
        return Analyst(user, seen, "cohort", f"cohort {cohort} < {share} %: the candidate")
    return Analyst(user, seen, "cohort", f"cohort {cohort} ≥ {share} %: the current version")


def _lag(settings: Settings, problems: list[str], v: versions.Version) -> dict[str, Any]:
    if not v.live:
        return {"lag_versions": None, "lag_note": "no live stream"}
    unread: dict[str, object] = {"missing": "not read"}
    got = _part(
        problems,
        f"v{v.version}'s freshness",
        lambda: autorollout.lag(settings, v.view_name, v.version),
        unread,
    )
    lag = got.get("lag_versions")
    return {
        "lag_versions": lag if isinstance(lag, int) else None,
        "lag_note": str(got.get("missing", "")),
    }


def _validation(report: dict[str, Any] | None) -> str:
    if not report:
        return "-"
    return f"{'passed' if report.get('passed') else 'FAILED'}: {report.get('summary', '')}"


def _rollout(r: rollouts.Rollout, events: list[dict[str, Any]]) -> RolloutRow:
    """The rollout's row, with the moves and judgements its events record."""
    start, end = r.started_at, r.ended_at or datetime.now(UTC)
    # Its events are written in the transactions that move its row: between its
    # start and its end, both included (one transaction's now() is one time).
    mine = [e for e in events if e["version"] == r.version and start <= e["at"] <= end]
    moves: list[tuple[str, int]] = []
    judgements = []
    for e in mine:
        at = str(_iso(e["at"]))
        if e["action"] == "autorollout":
            percent = e["detail"].split(" %", 1)[0]
            if percent.isdigit():
                moves.append((at, int(percent)))
        elif e["action"] == "rolled back":
            moves.append((at, 0))
        elif e["action"] == "judged":
            judged = shown.parse_judged(at, e["detail"])
            if judged is not None:
                judgements.append(judged)
    return RolloutRow(
        id=r.id,
        version=r.version,
        current_version=r.current_version,
        state=r.state,
        steps=list(r.steps),
        percent=r.percent,
        hold_s=r.hold_s,
        started_at=str(_iso(r.started_at)),
        ended_at=_iso(r.ended_at),
        why=r.why,
        by=r.stop_by or r.started_by,
        moves=moves,
        judgements=judgements,
    )


def _difference(
    settings: Settings, rows: list[versions.Version]
) -> tuple[str | None, list[HourDifference]]:
    live = [v for v in rows if v.live]
    current = next((v for v in live if v.status == "serving"), None)
    other = next((v for v in live if v.status == "ready"), None)
    if current is None or other is None:
        return None, []
    # The newer version declares what it shares with the older (`agrees_with`).
    new, old = sorted((current, other), key=lambda v: v.version, reverse=True)
    new_code = lifecycle.view_code(new.view_name, new.version)
    old_code = lifecycle.view_code(old.view_name, old.version)
    columns = new_code.agrees_with.get(old.version)
    if not columns:
        return None, []
    sql = autorollout.difference_by_hour_sql(new_code, old_code, columns, shown.HOURS)
    hours = [
        HourDifference(str(h), int(k), int(d)) for h, k, d in trino_client.query(settings, sql).rows
    ]
    return f"v{new.version} against v{old.version} on {', '.join(columns)}", hours


def as_json(page: Page) -> dict[str, Any]:
    return asdict(page)
