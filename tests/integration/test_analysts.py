"""Analysts through Trino: the analysts' guide's federated examples, and what an analyst may not do.

Each example runs as written, as an analyst, and must equal an answer the test
computes itself: from the Delta tables through Spark and from PostgreSQL
directly, never through Trino (docs/contract.md §2, §7).
"""

from __future__ import annotations

import subprocess
import sys
from collections import defaultdict
from collections.abc import Iterator
from decimal import Decimal

import psycopg
import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from trino.exceptions import TrinoUserError

from spark_jobs.engine import audit as spark_audit
from spark_jobs.engine import lake as lakefs
from spark_jobs.testing.landing import fresh_seed
from warehouse.base import registry
from warehouse.base.settings import Settings
from warehouse.ops import pipeline
from warehouse.sql import catalog, versions
from warehouse.sql.trino_client import query
from warehouse.tools.examples import analyst_examples

ANALYST = "analyst.alice"
EXAMPLES = analyst_examples()


@pytest.fixture(scope="module")
def lake(stack, settings: Settings, spark: SparkSession) -> SparkSession:
    """Some traffic in silver, the web's browsing of it (same seed), and reference data
    for every customer and product in it."""
    seed = fresh_seed()
    pipeline.produce(settings, seed=seed, count=3000, chaos=True)
    pipeline.produce(settings, seed=seed, count=2000, chaos=True, source="web")
    pipeline.ingest_once(spark, settings)
    # Gold has a table even on a fresh lake where no view has run yet.
    pipeline.ensure_restatements(spark, settings)
    # And the audit's table, as after a first `regauge audit`: denied by rule, not by absence.
    lakefs.ensure_table(spark, spark_audit.AUDIT_RUNS.path(settings), spark_audit.AUDIT_RUNS_SCHEMA)
    catalog.publish(spark_audit.AUDIT_RUNS, settings)
    return spark


def _pg(settings: Settings, sql: str) -> list[tuple]:
    with psycopg.connect(settings.postgres_dsn()) as conn:
        return [tuple(r) for r in conn.execute(sql)]


def _silver(spark: SparkSession, settings: Settings):
    return spark.read.format("delta").load(registry.SILVER_EVENTS.path(settings))


def test_the_readme_has_the_examples_the_tests_check():
    assert len(EXAMPLES) >= 4
    assert all(sql.lstrip().upper().startswith(("SELECT", "WITH")) for sql in EXAMPLES.values())


def test_net_revenue_by_segment_and_country(settings, lake):
    got = query(settings, EXAMPLES["Net revenue by customer segment and country"], user=ANALYST)
    silver = _silver(lake, settings)
    cancelled = {
        r.order_id
        for r in silver.where("event_type = 'order_cancelled'").select("order_id").collect()
    }
    people = {
        c: (seg, country)
        for c, country, seg in _pg(
            settings, "SELECT customer_id, country, segment FROM reference.customers"
        )
    }
    want: dict[tuple, list] = defaultdict(lambda: [0, Decimal("0.00"), Decimal("0.00")])
    for r in (
        silver.where("event_type = 'order_placed' AND currency = 'EUR'")
        .select("customer_id", "order_id", "total")
        .collect()
    ):
        if r.customer_id not in people:
            continue
        acc = want[people[r.customer_id]]
        acc[0] += 1
        acc[1] += r.total
        acc[2] += Decimal("0.00") if r.order_id in cancelled else r.total
    assert got.columns == ["segment", "country", "orders", "gross_revenue", "net_revenue"]
    assert len(got.rows) > 3
    assert {(r[0], r[1]): [r[2], r[3], r[4]] for r in got.rows} == dict(want)
    nets = [r[4] for r in got.rows]
    assert nets == sorted(nets, reverse=True)


def test_conversion_by_referrer_joins_the_two_sources(settings, lake):
    """docs/contract.md §10: each source's silver is the analysts' to read, and one query
    joins them. Checked against both silvers read by Spark."""
    got = query(
        settings, EXAMPLES["Sessions by referrer, and how many led to an order"], user=ANALYST
    )
    web = lake.read.format("delta").load(registry.source_tables("web").silver.path(settings))
    referrer = {
        r.session_id: r.referrer
        for r in web.where("event_type = 'session_started'")
        .select("session_id", "referrer")
        .collect()
    }
    first: dict[tuple, object] = {}
    for r in web.where("event_type = 'product_viewed'").collect():
        key = (r.session_id, r.customer_id, r.product_id)
        first[key] = min(first.get(key, r.event_time), r.event_time)
    ordered: dict[tuple, list] = defaultdict(list)
    for r in (
        _silver(lake, settings)
        .where("event_type = 'order_placed'")
        .select("customer_id", "event_time", F.explode("items.product_id").alias("product_id"))
        .collect()
    ):
        ordered[(r.customer_id, r.product_id)].append(r.event_time)
    converted = {s for (s, c, p), t in first.items() if any(o >= t for o in ordered[(c, p)])}
    want: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for session, source in referrer.items():
        want[source][0] += 1
        want[source][1] += session in converted
    assert got.columns == ["referrer", "sessions", "sessions_with_an_order", "conversion_pct"]
    assert {r[0]: [r[1], r[2]] for r in got.rows} == dict(want)
    assert sum(n for _, n in want.values()) > 0  # the generator's views lead to orders


def _order_lines(spark: SparkSession, settings: Settings, eur_only: bool):
    placed = _silver(spark, settings).where("event_type = 'order_placed'")
    if eur_only:
        placed = placed.where("currency = 'EUR'")
    return (
        placed.select(F.explode("items").alias("i"))
        .select("i.product_id", "i.quantity", "i.unit_price")
        .collect()
    )


def test_revenue_by_product_category(settings, lake):
    got = query(settings, EXAMPLES["Revenue by product category"], user=ANALYST)
    category = dict(_pg(settings, "SELECT product_id, category FROM reference.products"))
    want: dict[str, list] = defaultdict(lambda: [0, Decimal("0.00")])
    for line in _order_lines(lake, settings, eur_only=True):
        if line.product_id in category:
            acc = want[category[line.product_id]]
            acc[0] += line.quantity
            acc[1] += line.quantity * line.unit_price
    assert {r[0]: [r[1], r[2]] for r in got.rows} == dict(want)
    assert len(got.rows) > 1


def test_top_products_list_versus_sold_price(settings, lake):
    got = query(
        settings, EXAMPLES["Top products, list price versus the price they sold at"], user=ANALYST
    )
    products = {
        p: (cat, price)
        for p, cat, price in _pg(
            settings, "SELECT product_id, category, list_price FROM reference.products"
        )
    }
    units: dict[str, int] = defaultdict(int)
    amount: dict[str, Decimal] = defaultdict(Decimal)
    for line in _order_lines(lake, settings, eur_only=False):
        if line.product_id in products:
            units[line.product_id] += line.quantity
            amount[line.product_id] += line.quantity * line.unit_price
    top = sorted(units, key=lambda p: (-units[p], p))[:10]
    want = [
        (
            p,
            products[p][0],
            products[p][1],
            units[p],
            (amount[p] / units[p]).quantize(Decimal("0.01")),
        )
        for p in top
    ]
    assert [tuple(r) for r in got.rows] == want


@pytest.fixture
def probe_registry(stack, settings: Settings) -> Iterator[str]:
    """A registry state for a throwaway view: v1 serving, v2 at 30 %, one pin."""
    view = "routing_probe"
    with psycopg.connect(settings.postgres_dsn()) as conn:
        conn.execute("DELETE FROM control.view_pins WHERE view_name = %s", [view])
        conn.execute("DELETE FROM control.view_versions WHERE view_name = %s", [view])
        conn.execute(
            "INSERT INTO control.view_versions (view_name, version, status, rollout_percent) "
            "VALUES (%s, 1, 'serving', 70), (%s, 2, 'ready', 30), (%s, 3, 'failed', 0)",
            [view, view, view],
        )
    try:
        yield view
    finally:
        with psycopg.connect(settings.postgres_dsn()) as conn:
            conn.execute("DELETE FROM control.view_pins WHERE view_name = %s", [view])
            conn.execute("DELETE FROM control.view_versions WHERE view_name = %s", [view])


@pytest.mark.parametrize("pin", [None, 1, 2])
def test_which_version_a_user_is_routed_to(settings, probe_registry, pin):
    view = probe_registry
    if pin is not None:
        with psycopg.connect(settings.postgres_dsn()) as conn:
            conn.execute(
                "INSERT INTO control.view_pins (view_name, user_name, version) VALUES (%s, %s, %s)",
                [view, ANALYST, pin],
            )
    got = query(settings, EXAMPLES["Which version of each view a user is routed to"], user=ANALYST)
    rows = {r[0]: r for r in got.rows}
    # Independently: the registry read straight from PostgreSQL, routed in Python.
    for name in {v.view_name for v in versions.versions(settings) if v.live}:
        want = versions.route(
            versions.versions(settings, name), versions.pins(settings, name), ANALYST
        )
        assert rows[name][1:] == (ANALYST, versions.cohort(ANALYST), want)
    assert rows[view][3] == (pin if pin is not None else 1)  # alice's cohort is 85 >= 30


def test_an_analyst_reads_only_what_the_contract_lists(settings, lake):
    readable = [
        registry.SILVER_EVENTS.trino_name,
        registry.SILVER_LEDGER.trino_name,
        registry.GOLD_RESTATEMENTS.trino_name,
        "ops.reference.customers",
        "ops.reference.products",
        "ops.control.view_versions",
    ]
    for table in readable:
        query(settings, f"SELECT count(*) FROM {table}", user=ANALYST)
    forbidden = [
        f"SELECT count(*) FROM {registry.BRONZE_EVENTS.trino_name}",
        f"SELECT count(*) FROM {registry.SILVER_QUARANTINE.trino_name}",
        f"SELECT count(*) FROM {registry.GOLD_AUDIT_RUNS.trino_name}",
        # A metadata table is a way into its table: denied with it.
        f'SELECT count(*) FROM lakehouse.silver."{registry.SILVER_QUARANTINE.name}$history"',
        f'SELECT * FROM lakehouse.silver."{registry.SILVER_QUARANTINE.name}$properties"',
        f'SELECT count(*) FROM lakehouse.gold."{registry.GOLD_AUDIT_RUNS.name}$history"',
        f'SELECT count(*) FROM lakehouse.bronze."{registry.BRONZE_EVENTS.name}$history"',
        "SELECT count(*) FROM ops.control.view_events",
        "SELECT count(*) FROM ops.control.schema_migrations",
        # Every user's pins, as the serving views read them (as their owner).
        "SELECT count(*) FROM ops.control.view_routing",
        f"INSERT INTO {registry.GOLD_RESTATEMENTS.trino_name} "
        f"SELECT * FROM {registry.GOLD_RESTATEMENTS.trino_name} LIMIT 1",
        f"DELETE FROM {registry.SILVER_EVENTS.trino_name} WHERE event_id = 'x'",
        "CREATE TABLE lakehouse.gold.analyst_scratch (x integer)",
        "CREATE SCHEMA lakehouse.analyst_scratch",
        f"DROP TABLE {registry.GOLD_RESTATEMENTS.trino_name}",
        f"ALTER TABLE {registry.SILVER_EVENTS.trino_name} ADD COLUMN x integer",
        "UPDATE ops.control.view_versions SET rollout_percent = 100",
        "INSERT INTO ops.control.view_pins (view_name, user_name, version) "
        "VALUES ('revenue_hourly', 'analyst.alice', 2)",
        "DELETE FROM ops.control.view_pins",
        "CALL lakehouse.system.register_table(schema_name => 'gold', table_name => 'x', "
        "table_location => 'local:///gold/x')",
    ]
    for sql in forbidden:
        with pytest.raises(TrinoUserError, match="Access Denied"):
            query(settings, sql, user=ANALYST)


def test_an_analyst_sees_only_their_own_pins(settings, probe_registry):
    view = probe_registry
    with psycopg.connect(settings.postgres_dsn()) as conn:
        conn.execute(
            "INSERT INTO control.view_pins (view_name, user_name, version) "
            "VALUES (%s, %s, 1), (%s, 'analyst.bob', 2)",
            [view, ANALYST, view],
        )
    sql = f"SELECT user_name, version FROM ops.control.view_pins WHERE view_name = '{view}'"

    def pins_seen_by(user: str) -> list[tuple[str, int]]:
        return sorted(tuple(r) for r in query(settings, sql, user=user).rows)

    assert pins_seen_by(ANALYST) == [(ANALYST, 1)]
    assert pins_seen_by("analyst.bob") == [("analyst.bob", 2)]
    assert pins_seen_by("engineer.bob") == [(ANALYST, 1), ("analyst.bob", 2)]


def test_an_analyst_reads_the_metadata_of_what_they_may_read(settings, lake):
    history = f'lakehouse.silver."{registry.SILVER_EVENTS.name}$history"'
    assert query(settings, f"SELECT count(*) FROM {history}", user=ANALYST).rows[0][0] > 0


def test_an_engineer_reads_everything_and_a_stranger_nothing(settings, lake):
    for table in (
        registry.BRONZE_EVENTS.trino_name,
        registry.SILVER_QUARANTINE.trino_name,
        f'lakehouse.silver."{registry.SILVER_QUARANTINE.name}$history"',
        registry.GOLD_AUDIT_RUNS.trino_name,
        "ops.control.view_events",
    ):
        assert query(settings, f"SELECT count(*) FROM {table}", user="engineer.bob").rows
        with pytest.raises(TrinoUserError, match="Access Denied"):
            query(settings, f"SELECT count(*) FROM {table}", user="mallory")
    with pytest.raises(TrinoUserError, match="Access Denied"):
        query(settings, f"SELECT count(*) FROM {registry.SILVER_EVENTS.trino_name}", user="mallory")


@pytest.mark.parametrize(
    "argv",
    [
        ["rollout", "x; drop table y", "2", "10"],
        ["rollout", "revenue_hourly", "2", "10", "--pin", "eve'; drop table y --"],
        ["retire", 'revenue_hourly"; drop table y', "1"],
        ["versions", "show", "revenue_h\u043eurly", "1"],  # a Cyrillic o
        ["query", "SELECT 1", "--user", "x'; drop table y"],
        ["streams", "start", "../../etc", "1"],
    ],
)
def test_injected_names_are_refused_before_any_sql_is_sent(settings, stack, argv):
    proc = subprocess.run(
        [sys.executable, "-m", "warehouse.cli", *argv], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "not allowed" in proc.stderr or "not a plain identifier" in proc.stderr
    seen = query(
        settings,
        "SELECT count(*) FROM system.runtime.queries WHERE strpos(query, 'drop table y') > 0 "
        "AND strpos(query, 'system.runtime.queries') = 0",
    ).rows[0][0]
    assert seen == 0
