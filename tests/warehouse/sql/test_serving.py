"""The serving view's SQL: columns unioned in version order, types held equal."""

from __future__ import annotations

import pytest

from warehouse.base.sqlnames import UnsafeNameError
from warehouse.sql.serving import Column, union_columns, view_sql
from warehouse.sql.versions import VersionError

V1 = [
    Column("window_start", "timestamp(3) with time zone"),
    Column("currency", "varchar"),
    Column("orders", "bigint"),
    Column("revenue", "decimal(18,2)"),
]
V2 = [
    Column("window_start", "timestamp(3) with time zone"),
    Column("currency", "varchar"),
    Column("orders_placed", "bigint"),
    Column("net_revenue", "decimal(18,2)"),
]


def test_columns_are_the_union_in_version_order():
    assert [c.name for c in union_columns({2: V2, 1: V1})] == [
        "window_start",
        "currency",
        "orders",
        "revenue",
        "orders_placed",
        "net_revenue",
    ]


def test_a_type_clash_refuses_the_rollout():
    clash = [*V2[:2], Column("orders", "integer")]
    with pytest.raises(VersionError, match="'orders' is bigint in v1 but integer in v2"):
        union_columns({1: V1, 2: clash})


def test_each_version_fills_the_columns_it_lacks_with_typed_nulls():
    sql = view_sql("revenue_hourly", {1: V1, 2: V2})
    first, second = sql.split("UNION ALL")
    assert 'CAST(NULL AS bigint) AS "orders_placed"' in first
    assert 'CAST(NULL AS decimal(18,2)) AS "revenue"' in second
    assert "lakehouse.gold.revenue_hourly_v1" in first and "1 AS view_version" in first
    assert "lakehouse.gold.revenue_hourly_v2" in second and "2 AS view_version" in second
    assert "SECURITY DEFINER" in sql and "version IN (1, 2)" in sql


@pytest.mark.parametrize("view", ["x; drop table y", 'a"b', "Revenue", "r\u0435venue"])
def test_names_outside_the_gate_never_reach_sql(view):
    with pytest.raises(UnsafeNameError):
        view_sql(view, {1: V1})


@pytest.mark.parametrize("type_", ["bigint) --", "bigint) union select (1", "row(a bigint)"])
def test_a_hostile_column_type_is_refused(type_):
    with pytest.raises(UnsafeNameError):
        view_sql("revenue_hourly", {1: V1, 2: [*V2, Column("x", type_)]})


def test_the_route_is_read_once_and_joined_to_the_union_of_the_versions():
    # A CTE is inlined wherever it is used: a route joined into each version's
    # branch read PostgreSQL's control tables once per live version (issue 67).
    sql = view_sql("revenue_hourly", {1: V1, 2: V2})
    assert sql.count("ops.control.view_routing") == 1
    assert "view_pins" not in sql and sql.count("JOIN route") == 1
    assert sql.rstrip().endswith("JOIN route ON u.view_version = route.version")
    assert "user_name IS NULL OR user_name = current_user" in sql
