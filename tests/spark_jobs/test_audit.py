"""The audit's Spark parts on small DataFrames: which keys differ, and sampling scopes."""

from __future__ import annotations

from pyspark.sql import functions as F

from spark_jobs.engine import gold_writes
from spark_jobs.engine.audit import differing_keys, differing_rows, sample_scopes
from spark_jobs.views import cart_sessions_v1, revenue_hourly_v1
from tests.spark_jobs.conftest import at, cart, order


def test_differing_keys_names_changed_missing_and_extra_rows(spark, silver_df):
    view = revenue_hourly_v1.VIEW
    silver = silver_df(
        [order("o1", at(5), "10.00"), order("o2", at(65), "4.00"), order("o3", at(125), "1.00")]
    )
    want = gold_writes.gold_rows(view, silver)
    # One value changed (10:00), one row gone (11:00), one row moved to 13:00.
    hour = F.hour("window_start")
    have = (
        want.where(hour != 11)
        .withColumn("revenue", F.when(hour == 10, F.col("revenue") + 1).otherwise(F.col("revenue")))
        .withColumn(
            "window_start",
            F.when(hour == 12, F.col("window_start") + F.expr("INTERVAL 1 HOUR")).otherwise(
                F.col("window_start")
            ),
        )
    )
    missing, unexpected, keys = differing_keys(view, want, have)
    # Missing: 10:00 (old value), 11:00, 12:00; unexpected: 10:00 (new value), 13:00.
    assert (missing, unexpected) == (3, 2)
    assert [k["window_start"][11:16] for k in keys] == ["10:00", "11:00", "12:00", "13:00"]


def test_an_unchanged_table_has_no_differing_keys(spark, silver_df):
    view = revenue_hourly_v1.VIEW
    want = gold_writes.gold_rows(view, silver_df([order("o1", at(5), "10.00")]))
    assert differing_keys(view, want, want) == (0, 0, [])


def test_sampling_takes_scopes_from_silver_and_from_gold(spark, silver_df):
    view = cart_sessions_v1.VIEW
    silver = silver_df([cart("cust-1", at(0)), cart("cust-2", at(5))])
    gold = gold_writes.gold_rows(view, silver_df([cart("cust-9", at(0))]))
    everything = {r.customer_id for r in sample_scopes(view, silver, gold, 1.0).collect()}
    assert everything == {"cust-1", "cust-2", "cust-9"}
    assert sample_scopes(view, silver, gold, 0.0).count() == 0


def test_differing_rows_names_each_changed_column_and_leaves_one_sided_keys_alone(spark):
    want = spark.createDataFrame(
        [("e1", 1, "a", None), ("e2", 2, "b", "x"), ("e3", 3, "c", "y")],
        "event_id string, total int, note string, extra string",
    )
    have = spark.createDataFrame(
        # e1: total changed; e2: note and a NULL where a value was; e4 only here.
        [("e1", 1001, "a", None), ("e2", 2, "B", None), ("e3", 3, "c", "y"), ("e4", 4, "d", "z")],
        "event_id string, total int, note string, extra string",
    )
    found = {r.event_id: r.columns for r in differing_rows(have, want, ["event_id"]).collect()}
    assert found == {"e1": ["total"], "e2": ["note", "extra"]}
    assert differing_rows(want, want, ["event_id"]).count() == 0
