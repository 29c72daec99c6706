"""A rollout that drives itself (issue 69): move, hold, measure, judge, move again.

The rules (the plan, the gates' verdicts, the next move) are in
`warehouse.base.autorollout`; the state is a row of `control.rollouts`
(`warehouse.sql.rollouts`). This module measures the gates' figures from the
real systems, never from its own bookkeeping:
- agreement: the two gold tables through Trino, on the columns the candidate
  declares in `agrees_with`, over the windows final in both, each difference
  looked up in `gold.restatements` since the candidate was registered;
- freshness: the newest silver version (its Delta log) against what the view
  host says the candidate's stream has read all of;
- integrity: `gold.audit_runs`, the audit's own record;
- serving: Trino's `system.runtime.queries`, the analysts' queries on
  `serving.<view>` since the step began.

Users move only through `lifecycle.rollout`, which changes the candidate's
percent and never a pin. One process drives a view's rollout at a time (a
PostgreSQL session lock); killed, a rerun resumes it from its row.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

from warehouse.base import autorollout as rules
from warehouse.base import registry
from warehouse.base.autorollout import Figures, Move, Plan
from warehouse.base.settings import Settings
from warehouse.base.sqlnames import check_user
from warehouse.ops import lifecycle, streams
from warehouse.sql import rollouts, serving, trino_client, versions
from warehouse.sql.rollouts import Rollout, RolloutError

if TYPE_CHECKING:
    from spark_jobs.views.base import View

log = logging.getLogger(__name__)

# How often a holding rollout looks for a person's stop.
POLL_S = 1.0
# How often a hold says how long it has left.
PROGRESS_S = 30.0
# How long agreement waits before it looks again at keys that differed unexplained.
SETTLE_S = 10.0
ANALYSTS = "analyst.%"


# -- the figures -----------------------------------------------------------------------
def _iso(at: datetime) -> str:
    return f"from_iso8601_timestamp('{at.astimezone(UTC).isoformat()}')"


def _key_string(columns: tuple[str, ...], alias: str) -> str:
    """A restatement's window_key for a gold row (spark_jobs.engine.scoping._key_string)."""
    cast = [f"CAST({alias}.{c} AS varchar)" for c in columns]
    return cast[0] if len(cast) == 1 else f"concat_ws('|', {', '.join(cast)})"


def _compared(cand: View, cur: View, columns: dict[str, str]) -> str:
    """The CTEs `c`, `o`, `newest` and `d`: every key of either version's gold table, with
    whether the two differ on the columns `columns` maps (the candidate's to the current's)."""
    c_table = registry.gold_view_table(cand.name, cand.version).trino_name
    o_table = registry.gold_view_table(cur.name, cur.version).trino_name
    keys = cand.key
    on = " AND ".join(f"c.{k} = o.{k}" for k in keys)
    same = " AND ".join(
        f"c.{mine} IS NOT DISTINCT FROM o.{theirs}" for mine, theirs in columns.items()
    )
    start, end = cand.window[0], cand.window[1]
    return f"""c AS (SELECT * FROM {c_table}),
o AS (SELECT * FROM {o_table}),
newest AS (SELECT max({start}) AS at FROM o),
d AS (
    SELECT {", ".join(f"coalesce(c.{k}, o.{k}) AS {k}" for k in keys)},
           coalesce(c.{end}, o.{cur.window[1]}) AS window_end_,
           NOT (c.{keys[0]} IS NOT NULL AND o.{keys[0]} IS NOT NULL AND {same}) AS differs
    FROM c FULL OUTER JOIN o ON {on}
)"""


def difference_by_hour_sql(cand: View, cur: View, columns: dict[str, str], hours: int) -> str:
    """Per hour of window start, the newest `hours` of them: the keys either version
    has, and those where the two differ on what they share (the page's chart)."""
    start = cand.window[0]
    return f"""
WITH {_compared(cand, cur, columns)}
SELECT CAST(date_trunc('hour', {start}) AS varchar) AS hour, count(*) AS keys,
       count_if(differs) AS differing
FROM d GROUP BY 1 ORDER BY 1 DESC LIMIT {int(hours)}
"""


def agreement_sql(cand: View, cur: View, columns: dict[str, str], since: datetime) -> str:
    """Keys of final windows where the candidate and the current version differ on what
    they share, each with whether a restatement since `since` explains it.

    A key is explained while one version has restated a late event on it and the
    other has not: one stream is behind the other there. A key where every restated
    event was restated by both (or none was) is not: the two versions have seen the
    same events, so a difference left is a wrong number. (An earlier rule, any restatement of
    either version, let a faulty v3 through: every late event is restated by both.)"""
    start = cand.window[0]
    lateness = int(cand.allowed_lateness.total_seconds())
    window_key = _key_string(cand.window_key, "d")
    return f"""
WITH {_compared(cand, cur, columns)},
final AS (
    SELECT d.* FROM d, newest
    WHERE d.window_end_ <= newest.at - INTERVAL '{lateness}' SECOND
),
-- Keys with an event one version has restated and the other not (yet): the other
-- stream has not folded that late event in, so the two may differ there for now.
-- Once both have restated it, a difference left on the key is a wrong number.
pending AS (
    SELECT window_start, window_key FROM (
        SELECT window_start, window_key, coalesce(event_id, reason) AS event,
               count(DISTINCT version) AS versions
        FROM {registry.GOLD_RESTATEMENTS.trino_name}
        WHERE "view" = '{cand.name}' AND version IN ({cand.version}, {cur.version})
          AND restated_at >= {_iso(since)}
        GROUP BY 1, 2, 3
    ) WHERE versions = 1
    GROUP BY 1, 2
),
differing AS (
    SELECT CAST(d.{start} AS varchar) || ' ' || {window_key} AS key_text,
           p.window_start IS NOT NULL AS explained
    FROM final d
    LEFT JOIN pending p ON p.window_start = d.{start} AND p.window_key = {window_key}
    WHERE d.differs
)
SELECT (SELECT count(*) FROM final),
       (SELECT count(*) FROM differing),
       (SELECT array_agg(key_text) FROM differing WHERE NOT explained)
"""


def _agreement(
    settings: Settings, r: Rollout, since: datetime, sleep: Callable[[float], None] = time.sleep
) -> dict[str, object]:
    cand = lifecycle.view_code(r.view_name, r.version)
    cur = lifecycle.view_code(r.view_name, r.current_version)
    columns = cand.agrees_with.get(cur.version)
    if not columns:
        # Nothing declared in common: nothing to disagree on.
        return {"keys_compared": 0, "keys_differing": 0, "keys_unexplained": 0}
    sql = agreement_sql(cand, cur, columns, since)
    compared, differing, unexplained = trino_client.query(settings, sql).rows[0]
    first = set(unexplained or ())
    if first:
        # One stream may have folded in an event the other has not yet: such a
        # difference is gone a moment later, a wrong number stays. Only the keys
        # that differ unexplained both times count.
        sleep(SETTLE_S)
        compared, differing, unexplained = trino_client.query(settings, sql).rows[0]
        log.info(
            "%s: %d unexplained differences, then %d",
            r.view_name,
            len(first),
            len(unexplained or ()),
        )
    persistent = sorted(first & set(unexplained or ()))
    return {
        "shared_columns": tuple(columns),
        "keys_compared": int(compared),
        "keys_differing": int(differing),
        "keys_unexplained": len(persistent),
        "unexplained_examples": tuple(persistent[:5]),
    }


def silver_newest(settings: Settings, source: str) -> int:
    """The newest version of the source's silver table, from its Delta log (delta-rs:
    no Spark), on a local lake or an object store."""
    from deltalake import DeltaTable

    where, options = settings.delta_rs(registry.source_tables(source).silver.path(settings))
    return int(DeltaTable(where, storage_options=options or None).version())


def lag(settings: Settings, view: str, version: int) -> dict[str, object]:
    """`lag_versions`: how many silver versions the version's live stream is behind
    silver's newest (its worst source), or `missing` with why it cannot be told."""
    code = lifecycle.view_code(view, version)
    read = streams.read_through(settings, view, version)
    if read is None:
        name = streams.query_name(view, version)
        return {"missing": f"{name} is not running in the view host (regauge streams list)"}
    read = {path.rstrip("/"): v for path, v in read.items()}
    behind = []
    for source in code.sources:
        path = registry.source_tables(source).silver.path(settings).rstrip("/")
        if path not in read:
            return {"missing": f"{view} v{version} has not reported reading {path} yet"}
        behind.append(max(0, silver_newest(settings, source) - read[path]))
    return {"lag_versions": max(behind)}


def integrity_sql(since: datetime) -> str:
    table = registry.GOLD_AUDIT_RUNS.trino_name
    return f"""
WITH runs AS (
    SELECT run_id, max(finished_at) AS finished_at, bool_and(passed) AS passed
    FROM {table} GROUP BY run_id
)
SELECT (SELECT passed FROM runs ORDER BY finished_at DESC LIMIT 1),
       (SELECT CAST(max(finished_at) AS varchar) FROM runs),
       (SELECT count(*) FROM runs WHERE NOT passed AND finished_at >= {_iso(since)})
"""


def integrity(settings: Settings, since: datetime) -> dict[str, object]:
    """The latest audit's verdict and time, and how many audits failed since `since`."""
    passed, at, failed = trino_client.query(settings, integrity_sql(since)).rows[0]
    if passed is None:
        return {"missing": "no audit on record: run `regauge audit` (or regauge_audit) first"}
    return {"audit_passed": bool(passed), "audit_finished_at": at, "audits_failed_during": failed}


def serving_sql(
    view: str, since: datetime, percent: int, pinned_here: list[str], pinned_away: list[str]
) -> str:
    """Analysts' queries on the serving view since `since`, by analysts routed to the
    candidate: pinned to it, or unpinned in a cohort below its percent (docs/contract.md
    §4, the serving view's own rule). Trino keeps finished queries for a while
    (query.min-expire-age), long enough for a step."""
    # A user name holds no quote (check_user), so it can stand in a literal.
    here = ", ".join(f"'{check_user(u)}'" for u in pinned_here) or "NULL"
    away = ", ".join(f"'{check_user(u)}'" for u in pinned_away) or "NULL"
    cohort = serving.COHORT_SQL.format(user='"user"')
    return f"""
SELECT count(*), count_if(state = 'FAILED'),
       array_agg(CAST(error_code AS varchar) || ': ' || substr(query, 1, 120))
           FILTER (WHERE state = 'FAILED')
FROM system.runtime.queries
WHERE "user" LIKE '{ANALYSTS}' AND created >= {_iso(since)}
  AND strpos(lower(query), 'serving.{view}') > 0
  AND ("user" IN ({here}) OR (coalesce("user" NOT IN ({away}), true) AND {cohort} < {percent}))
"""


def _serving(settings: Settings, r: Rollout, since: datetime) -> dict[str, object]:
    pins = versions.pins(settings, r.view_name)
    here = sorted(u for u, v in pins.items() if v == r.version)
    away = sorted(u for u, v in pins.items() if v != r.version)
    sql = serving_sql(r.view_name, since, r.percent, here, away)
    total, failed, examples = trino_client.query(settings, sql).rows[0]
    return {
        "queries": int(total),
        "failed_queries": int(failed),
        "failed_examples": tuple((examples or ())[:3]),
    }


def measure(settings: Settings, r: Rollout) -> Figures:
    """Every gate's figures for the step `r` holds; a figure that cannot be measured
    is missing, with why (its gate then fails)."""
    since = r.step_at or r.started_at
    built = versions.get(settings, r.view_name, r.version).created_at or r.started_at
    found: dict[str, object] = {}
    missing: dict[str, str] = {}
    parts: dict[str, Callable[[], dict[str, object]]] = {
        "agreement": lambda: _agreement(settings, r, built),
        "freshness": lambda: lag(settings, r.view_name, r.version),
        "integrity": lambda: integrity(settings, since),
        "serving": lambda: _serving(settings, r, since),
    }
    for gate, part in parts.items():
        try:
            figures = part()
        except Exception as exc:  # one gate's figures missing fails that gate, not the rest
            log.warning("%s: %s figures not measured: %s", r.view_name, gate, exc)
            figures = {"missing": f"not measured: {type(exc).__name__}: {exc}"}
        if "missing" in figures:
            missing[gate] = str(figures.pop("missing"))
        found.update(figures)
    return Figures(**found, missing=missing)  # type: ignore[arg-type]


# -- the loop --------------------------------------------------------------------------
def _current(settings: Settings, view: str, version: int) -> int:
    """The version serving now, which the candidate must be measured against."""
    rows = versions.versions(settings, view)
    cand = next((v for v in rows if v.version == version), None)
    if cand is None:
        raise RolloutError(f"{view} v{version} is not registered (see `regauge versions list`)")
    if cand.status != "ready":
        raise RolloutError(
            f"{cand.label} is {cand.status}; an automatic rollout moves a ready candidate"
            + (" (run regauge_reprocess first)" if cand.status in ("building", "failed") else "")
        )
    serving = next((v for v in rows if v.status == "serving"), None)
    if serving is None:
        raise RolloutError(f"{view} has no serving version to roll {cand.label} out against")
    return serving.version


def _move(settings: Settings, r: Rollout, percent: int) -> None:
    for line in lifecycle.rollout(settings, r.view_name, r.version, percent):
        log.info("%s", line)


def _hold(settings: Settings, r: Rollout, sleep: Callable[[float], None]) -> str | None:
    """Hold the step for the plan's time; return who asked for a stop, if anyone did."""
    began = r.step_at or datetime.now(UTC)
    until = began + timedelta(seconds=r.hold_s)
    told = time.monotonic()
    while True:
        stop_by = rollouts.stop_asked(settings, r)
        if stop_by is not None:
            return stop_by
        left = (until - datetime.now(UTC)).total_seconds()
        if left <= 0:
            return None
        if time.monotonic() - told >= PROGRESS_S:
            log.info("%s v%d: holding %d %%, %.0f s left", r.view_name, r.version, r.percent, left)
            told = time.monotonic()
        sleep(min(POLL_S, left))


def _resume(settings: Settings, r: Rollout) -> Rollout:
    """Make the routing match the row after a driver died between moving users and
    recording it: a candidate at 0 % was being rolled back; otherwise its step's."""
    if r.step < 0:
        return r
    row = versions.get(settings, r.view_name, r.version)
    if row.status == "ready" and row.rollout_percent == 0:
        return rollouts.ended(
            settings, r, "rolled_back", "found at 0 % after a restart: the rollback is finished"
        )
    if (row.status, row.rollout_percent) != (
        ("serving", 100) if r.percent == 100 else ("ready", r.percent)
    ):
        log.info("%s: putting the routing back at step %d %%", r.view_name, r.percent)
        _move(settings, r, r.percent)
    return r


def _apply(settings: Settings, r: Rollout, move: Move) -> Rollout:
    if move.kind == "step":
        assert move.percent is not None
        _move(settings, r, move.percent)
        return rollouts.stepped(settings, r, move.step, f"{move.percent} %: {move.why}")
    if move.kind == "rolled_back":
        _move(settings, r, 0)
    return rollouts.ended(settings, r, move.kind, move.why)


class Terminated(BaseException):
    """Raised in the driver by SIGTERM: its Airflow run was marked failed, or its task
    was killed. The rollout then stops where it is, as a person's stop would. A
    BaseException, like KeyboardInterrupt, so that no `except Exception` on the way
    (a gate's figures not measured) takes it for a fault and rolls back."""


def run(
    settings: Settings,
    plan: Plan,
    by: str,
    request_id: str | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> Rollout:
    """Drive `plan` to its end (completed, rolled back or stopped), or resume the
    running rollout of the same candidate. Returns the ended row. A request id seen
    before returns its rollout as it is (a retry never starts a second one)."""
    lifecycle.view_code(plan.view, plan.version)  # an unknown version is refused first
    found = rollouts.requested(settings, plan.view, request_id) if request_id else None
    if found is not None and found.state != "running":
        log.info("%s: request %s already ended its rollout", plan.view, request_id)
        return found
    found = found or rollouts.running(settings, plan.view)
    if found is not None and found.version == plan.version:
        log.info(
            "%s v%d: resuming the rollout started %s", plan.view, plan.version, found.started_at
        )
        if found.plan != plan:
            log.warning(
                "%s: it keeps the plan it started with: %s", plan.view, found.plan.describe()
            )
        r = found
    else:
        current = _current(settings, plan.view, plan.version)
        r = rollouts.start(settings, plan, current, by, request_id)
        log.info("%s: rollout started: %s", plan.view, r.plan.describe())
    with rollouts.driving(settings, plan.view) as mine:
        if not mine:
            raise RolloutError(
                f"another process drives the rollout of {plan.view}; "
                f"to end it: regauge autorollout stop {plan.view}"
            )
        try:
            r = _drive(settings, r, sleep)
        except (Terminated, KeyboardInterrupt):
            r = rollouts.get(settings, r.id, r.view_name)
            if r.state == "running":
                # Where the routing is, which a step cut short may have moved already.
                row = versions.get(settings, r.view_name, r.version)
                at = 100 if row.status == "serving" else row.rollout_percent
                r = rollouts.ended(
                    settings,
                    r,
                    "stopped",
                    f"stopped at {at} %: its driver was told to stop "
                    "(SIGTERM: the Airflow run marked failed, or Ctrl-C); nobody moved",
                )
    log.info("%s v%d: rollout %s: %s", r.view_name, r.version, r.state.replace("_", " "), r.why)
    return r


def _drive(settings: Settings, r: Rollout, sleep: Callable[[float], None]) -> Rollout:
    r = _resume(settings, r)
    while r.state == "running":
        stop_by = rollouts.stop_asked(settings, r)
        if r.step < 0 and stop_by is None:
            r = _apply(settings, r, rules.first_move(r.plan))
            continue
        if stop_by is None:
            stop_by = _hold(settings, r, sleep)
        if stop_by is not None:
            r = rollouts.ended(
                settings, r, "stopped", f"stopped by {stop_by} at {r.percent} %; nobody moved"
            )
            break
        figures = measure(settings, r)
        verdicts = rules.judge(figures, r.plan.thresholds)
        said = "; ".join(f"{v.gate} {'held' if v.held else 'FAILED'}: {v.why}" for v in verdicts)
        log.info("%s v%d at %d %%: %s", r.view_name, r.version, r.percent, said)
        rollouts.judged(settings, r, figures.as_dict(), said)
        # A stop asked while the gates were measured still wins: nobody moves.
        move = rules.next_move(r.plan, r.step, verdicts, rollouts.stop_asked(settings, r))
        r = _apply(settings, r, move)
    return r


def stop(settings: Settings, view: str, by: str) -> str:
    """Ask the running rollout to stop where it is. Undriven (its driver was killed),
    it ends now; driven, its driver ends it within POLL_S, and nobody moves."""
    r = rollouts.ask_stop(settings, view, by)
    if not rollouts.driven(settings, view):
        r = rollouts.ended(
            settings, r, "stopped", f"stopped by {by} at {r.percent} %, with no driver running"
        )
        return f"{view} v{r.version}: rollout stopped at {r.percent} % (no driver was running)"
    return f"{view} v{r.version}: stop asked at {r.percent} %; its driver ends it within seconds"
