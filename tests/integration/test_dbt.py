"""dbt on silver through the real lake, Spark, Trino and Airflow's scheduler.

The daily revenue marts are held to an answer computed here from silver with
Spark, and to the revenue_hourly views' own code summed per day. The project is
built once, by the `regauge_dbt` DAG, whose one task runs `regauge dbt build` as
an engineer would (a second full build from the CLI cost the suite 2.5 minutes
and checked the same command).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from decimal import Decimal

import pytest
from delta.tables import DeltaTable
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from spark_jobs import views
from spark_jobs.engine import gold_writes, lake
from spark_jobs.testing.landing import fresh_seed
from warehouse.base import registry
from warehouse.base.settings import Settings
from warehouse.ops import airflow_client, ingest_ctl, pipeline
from warehouse.sql.trino_client import query

ANALYST = "analyst.dana"
MARTS = ("fct_orders", "fct_daily_revenue_v1", "fct_daily_revenue_v2", "dim_customers")
Day = dict[tuple[object, str], tuple[object, ...]]


@dataclass(frozen=True)
class Build:
    run_id: str
    # dbt's own output, from the task's log.
    log: str


@pytest.fixture(scope="module")
def airflow(stack, settings: Settings) -> airflow_client.Client:
    client = airflow_client.Client(settings)
    client.wait_for_dag("regauge_dbt")
    return client


@pytest.fixture(scope="module")
def built(
    stack, settings: Settings, spark: SparkSession, airflow: airflow_client.Client
) -> Iterator[Build]:
    """A chaos run ingested, then the whole project built through the scheduler."""
    ingest_ctl.stop(settings)  # silver must hold still while the marts are compared
    # A few days of orders in every currency; the marts are compared with all of
    # silver, so more events only make every later module's passes longer. In the
    # suite, test_analysts.py's 3,000 (a chaos run of the shop's) are those days
    # already: 2,000 more cost this fixture 11 s. Alone, the module makes its own.
    made = lake.exists(spark, registry.SILVER_EVENTS.path(settings))
    if not made or not _silver(spark, settings).where("event_type = 'order_placed'").take(1):
        pipeline.produce(settings, seed=fresh_seed(), count=2_000, chaos=True)
    pipeline.ingest_once(spark, settings)
    run_id = airflow.run("regauge_dbt", {})
    yield Build(run_id, airflow.task_log("regauge_dbt", run_id, "dbt_build"))


def _silver(spark: SparkSession, settings: Settings) -> DataFrame:
    return spark.read.format("delta").load(registry.SILVER_EVENTS.path(settings))


def _rows(settings: Settings, sql: str) -> Day:
    return {(r[0], r[1]): tuple(r[2:]) for r in query(settings, sql, user=ANALYST).rows}


def test_dbt_build_runs_every_model_and_test_and_publishes_the_marts(built, settings):
    assert "Completed successfully" in built.log
    done = next(line for line in built.log.splitlines() if "Done. PASS=" in line)
    assert "ERROR=0" in done and "WARN=0" in done
    assert int(done.split("PASS=")[1].split()[0]) >= 50  # models, data tests and unit tests
    for name in MARTS:
        assert f"published lakehouse.marts.{name}" in built.log
        (n,) = query(settings, f"SELECT count(*) FROM lakehouse.marts.{name}", user=ANALYST).rows[0]
        assert n > 0, name


def test_daily_revenue_v1_and_v2_equal_silver_and_the_hourly_views_summed(built, settings, spark):
    silver = _silver(spark, settings)
    # Independent of the dbt SQL: orders and cancellations straight from silver.
    orders = silver.where("event_type = 'order_placed'").select(
        "order_id", "currency", "total", F.to_date("event_time").alias("day")
    )
    cancelled = (
        silver.where("event_type = 'order_cancelled'")
        .select("order_id")
        .distinct()
        .withColumn("cancelled", F.lit(True))
    )
    daily = (
        orders.join(cancelled, "order_id", "left")
        .groupBy("day", "currency")
        .agg(
            F.count("*").alias("n"),
            F.sum("total").alias("gross"),
            F.count_if(F.col("cancelled").isNotNull()).alias("n_cancelled"),
            F.sum(F.when(F.col("cancelled").isNotNull(), F.col("total")).otherwise(0)).alias(
                "cancelled_total"
            ),
        )
        .collect()
    )
    want_v1 = {(r.day, r.currency): (r.n, Decimal(r.gross)) for r in daily}
    want_v2 = {
        (r.day, r.currency): (
            r.n,
            r.n_cancelled,
            Decimal(r.gross),
            Decimal(r.cancelled_total),
            Decimal(r.gross) - Decimal(r.cancelled_total),
        )
        for r in daily
    }
    got_v1 = _rows(
        settings,
        "SELECT revenue_date, currency, orders, revenue FROM lakehouse.marts.fct_daily_revenue_v1",
    )
    got_v2 = _rows(
        settings,
        "SELECT revenue_date, currency, orders_placed, orders_cancelled, gross_revenue, "
        "cancelled_revenue, net_revenue FROM lakehouse.marts.fct_daily_revenue_v2",
    )
    assert len(want_v1) > 5
    assert got_v1 == want_v1
    assert got_v2 == want_v2

    # The hourly views' own code over the same silver, summed per day.
    def per_day(version: int, columns: list[str]) -> Day:
        hourly = gold_writes.gold_rows(views.get("revenue_hourly", version), silver)
        rows = (
            hourly.groupBy(F.to_date("window_start").alias("day"), "currency")
            .agg(*[F.sum(c).alias(c) for c in columns])
            .collect()
        )
        return {(r.day, r.currency): tuple(r[c] for c in columns) for r in rows}

    assert per_day(1, ["orders", "revenue"]) == got_v1
    v2_columns = [
        "orders_placed",
        "orders_cancelled",
        "gross_revenue",
        "cancelled_revenue",
        "net_revenue",
    ]
    assert per_day(2, v2_columns) == got_v2


def test_a_second_run_through_the_scheduler_changes_nothing(built, settings, spark, airflow):
    def counts() -> dict[str, int]:
        return {
            name: query(settings, f"SELECT count(*) FROM lakehouse.marts.{name}").rows[0][0]
            for name in MARTS
        }

    first = counts()
    orders_table = DeltaTable.forPath(spark, registry.mart("fct_orders").path(settings))
    newest = orders_table.history(1).select("version").first()
    assert newest is not None, "fct_orders has no commit"
    last = newest["version"]
    run_id = airflow.run("regauge_dbt", {"select": "fct_orders+"})
    # The param reached dbt: fct_orders and what is built on it ran, not what it reads.
    log = airflow.task_log("regauge_dbt", run_id, "dbt_build")
    built = set(re.findall(r"START sql \w+ model \w+\.(\w+)", log))
    assert {"fct_orders", "dim_customers"} <= built, log[-3000:]
    assert not any(name.startswith(("stg_", "int_")) for name in built), built
    assert counts() == first
    # fct_orders is incremental: the second run merged no row into it.
    # (An incremental merge of nothing may make no commit at all.)
    later = orders_table.history().where(F.col("version") > last).collect()
    for commit in later:
        metrics = commit.operationMetrics or {}
        assert metrics.get("numTargetRowsInserted", "0") == "0", commit
        assert metrics.get("numTargetRowsUpdated", "0") == "0", commit


def test_a_bad_select_is_refused_before_a_run_exists(airflow):
    before = len(airflow.runs("regauge_dbt"))
    with pytest.raises(airflow_client.Refused) as refused:
        airflow.trigger("regauge_dbt", {"select": "fct_orders; rm -rf /"})
    assert refused.value.status == 400
    assert "param select" in refused.value.detail
    assert len(airflow.runs("regauge_dbt")) == before


def test_the_readme_mart_example_runs_as_an_analyst(built, settings):
    from warehouse.tools.examples import analyst_examples

    sql = analyst_examples()["Daily net revenue, from the dbt mart"]
    got = query(settings, sql, user=ANALYST).rows
    want = query(
        settings,
        "SELECT revenue_date, currency, orders_placed, orders_cancelled, "
        "gross_revenue - cancelled_revenue FROM lakehouse.marts.fct_daily_revenue_v2 "
        "WHERE currency = 'EUR'",
    ).rows
    assert 0 < len(got) <= 7
    assert [tuple(r) for r in got] == sorted(map(tuple, want), reverse=True)[: len(got)]
