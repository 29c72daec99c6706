"""`lakehouse.serving.<view>`: one Trino view per view that routes each user to a version.

The view unions the live versions' gold tables and keeps the rows of the
version the current user is routed to. The routing itself (pins, cohort,
the candidate's percent) is read from `ops.control.view_routing` at query time, so a
rollout takes effect on the next query without touching the view; the view
is regenerated whenever the set of live versions changes (and, harmlessly,
on every other change too).

Columns are the union of the live versions' columns in version order, NULL
where the routed version lacks one, plus `view_version`. It runs as its owner
(SECURITY DEFINER): an analyst needs no access to the registry or to every
gold table, while `current_user` inside it is still the analyst.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from warehouse.base import registry
from warehouse.base.settings import Settings
from warehouse.base.sqlnames import UnsafeNameError, check_identifier, quote_identifier
from warehouse.sql import trino_client, versions
from warehouse.sql.versions import Version, VersionError

log = logging.getLogger(__name__)

SERVING_SCHEMA = "serving"
# Scalar Trino types only: bigint, varchar, decimal(18,2), timestamp(3) with time zone.
_TYPE = re.compile(r"[a-z]+(\([0-9]{1,2}(,[0-9]{1,2})?\))?( with time zone)?")
COHORT_SQL = "((from_big_endian_64(substr(sha256(to_utf8({user})), 1, 8)) % 100) + 100) % 100"


@dataclass(frozen=True)
class Column:
    name: str
    type: str


def trino_name(view: str) -> str:
    return f"{registry.TRINO_LAKE_CATALOG}.{SERVING_SCHEMA}.{check_identifier(view, 'view')}"


def _check_type(text: str) -> str:
    if not _TYPE.fullmatch(text):
        raise UnsafeNameError(f"column type {text!r} is not allowed in a serving view")
    return text


def union_columns(columns: Mapping[int, Sequence[Column]]) -> list[Column]:
    """Columns of all versions, first seen first (versions ascending); refuse type clashes."""
    merged: dict[str, Column] = {}
    for version in sorted(columns):
        for col in columns[version]:
            seen = merged.get(col.name)
            if seen is None:
                merged[col.name] = col
            elif seen.type != col.type:
                owner = min(v for v in columns if any(c.name == col.name for c in columns[v]))
                raise VersionError(
                    f"column {col.name!r} is {seen.type} in v{owner} but {col.type} in "
                    f"v{version}: same-named columns must have the same type, so the rollout "
                    "is refused (rename the column in the new version)"
                )
    return list(merged.values())


def view_sql(view: str, columns: Mapping[int, Sequence[Column]]) -> str:
    """CREATE OR REPLACE VIEW for `view` routing between the versions in `columns`."""
    check_identifier(view, "view")
    if not columns:
        raise ValueError("a serving view needs at least one version")
    union = union_columns(columns)
    versions_list = ", ".join(str(int(v)) for v in sorted(columns))
    control = f"{registry.TRINO_OPS_CATALOG}.control"
    name = f"'{view}'"
    branches = []
    for version in sorted(columns):
        have = {c.name for c in columns[version]}
        select = ",\n       ".join(
            f"g.{quote_identifier(c.name, 'column')}"
            if c.name in have
            else f"CAST(NULL AS {_check_type(c.type)}) AS {quote_identifier(c.name, 'column')}"
            for c in union
        )
        gold = registry.gold_view_table(view, int(version)).trino_name
        branches.append(
            f"SELECT {select},\n       {int(version)} AS view_version\nFROM {gold} AS g"
        )
    shown = ",\n       ".join(f"u.{quote_identifier(c.name, 'column')}" for c in union)
    # The route is computed once per query, from one scan of control.view_routing
    # (versions and pins as rows) folded by one aggregate, and joined to the union
    # of the versions: a CTE is inlined wherever it is used, so a route joined into
    # each version's branch read PostgreSQL's two control tables once per live
    # version, and one ask cost Trino 0.31-0.40 CPU-s instead of 0.20-0.24 (two
    # live versions). Scalar subqueries per status had made a 25-stage plan.
    # The trade: every live version's gold table is scanned and the join keeps one
    # (view_version is a constant per branch, which no dynamic filter prunes), where
    # a branch whose route was empty might have stopped early. Gold tables are
    # windowed aggregates, and two versions are live only during a rollout.
    return (
        f"""CREATE OR REPLACE VIEW {trino_name(view)}
COMMENT 'regauge: routes each user to one live version of {view} (docs/contract.md section 4)'
SECURITY DEFINER AS
WITH live AS (
    SELECT max(version) FILTER (WHERE status = 'serving') AS serving,
           max(version) FILTER (WHERE status = 'ready') AS candidate,
           coalesce(max(rollout_percent) FILTER (WHERE status = 'ready'), 0) AS percent,
           max(version) FILTER (WHERE status = 'pinned') AS pin
    FROM {control}.view_routing
    WHERE view_name = {name} AND version IN ({versions_list})
      AND (user_name IS NULL OR user_name = current_user)
),
route AS (
    SELECT coalesce(
        IF(pin IN (serving, candidate), pin),
        IF({COHORT_SQL.format(user="current_user")} < percent, candidate, serving)
    ) AS version
    FROM live
)
SELECT {shown},
       u.view_version
FROM (
"""
        + "\nUNION ALL\n".join(branches)
        + "\n) AS u\nJOIN route ON u.view_version = route.version"
    )


def columns_of(settings: Settings, view: str, version: int) -> list[Column]:
    """A published version's columns as Trino sees them (what analysts get)."""
    table = registry.gold_view_table(view, version)
    found = trino_client.query(
        settings,
        f"SELECT column_name, data_type FROM {registry.TRINO_LAKE_CATALOG}.information_schema"
        ".columns WHERE table_schema = ? AND table_name = ? ORDER BY ordinal_position",
        [table.schema, table.name],
    )
    if not found.rows:
        raise VersionError(f"{table.trino_name} is not published in Trino")
    return [Column(str(n), str(t)) for n, t in found.rows]


def regenerate(settings: Settings, view: str, live: Sequence[Version] | None = None) -> str:
    """Make `lakehouse.serving.<view>` route between the view's live versions now.

    Returns a one-line description of what it did.
    """
    rows = versions.versions(settings, view) if live is None else live
    live_versions = sorted(v.version for v in rows if v.live)
    catalog = quote_identifier(registry.TRINO_LAKE_CATALOG, "catalog")
    trino_client.query(
        settings, f"CREATE SCHEMA IF NOT EXISTS {catalog}.{quote_identifier(SERVING_SCHEMA)}"
    )
    if not live_versions:
        trino_client.query(settings, f"DROP VIEW IF EXISTS {trino_name(view)}")
        return f"{trino_name(view)} dropped: {view} has no live version"
    columns = {v: columns_of(settings, view, v) for v in live_versions}
    trino_client.query(settings, view_sql(view, columns))
    shown = ", ".join(f"v{v}" for v in live_versions)
    log.info("%s now routes between %s", trino_name(view), shown)
    return f"{trino_name(view)} routes between {shown}"


def check_compatible(settings: Settings, view: str, version: int) -> None:
    """Refuse `version` if a same-named column has another type in a live version."""
    rows = versions.versions(settings, view)
    row = next((v for v in rows if v.version == version), None)
    if row is None or row.status not in ("building", *versions.LIVE):
        # Unregistered, failed or retired: the registry's own refusal says more.
        return
    live = {v.version for v in rows if v.live}
    union_columns({v: columns_of(settings, view, v) for v in live | {version}})
