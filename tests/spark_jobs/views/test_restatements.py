"""The watermark's lookup and a live batch's reads, on silver as the lake lays it out:
partitioned by event type and date, so both read only the days they need."""

from __future__ import annotations

import dataclasses

import pytest
from pyspark.sql import functions as F

from spark_jobs import silver
from spark_jobs.views import restatements, revenue_hourly_v2
from spark_jobs.views.base import merged_ranges
from tests.spark_jobs.conftest import at, cancel, cart, order

VIEW = revenue_hourly_v2.VIEW
LOG = [
    order("o1", at(hours=-30), "1.00"),
    order("o2", at(5), "2.00"),
    cancel("o1", at(hours=20)),
    order("o3", at(hours=26), "3.00"),
    cart("c1", at(hours=50)),  # not an event this view reads
]


@pytest.fixture
def lake(spark, settings, tmp_path, silver_df):
    s = dataclasses.replace(settings, lake_root=str(tmp_path / "lake"))
    silver.ensure_tables(spark, s)
    silver_df(LOG).write.format("delta").mode("append").save(silver.SILVER.path(s))
    return s


def _micros(spark, when) -> int:
    (micros,) = spark.createDataFrame([(when,)], "t timestamp").select(F.unix_micros("t")).collect()
    return int(micros[0])


def test_the_newest_event_time_is_the_same_whatever_lower_bound_it_starts_from(spark, lake):
    def newest(since):
        (row,) = restatements.newest_before(spark, lake, VIEW, 1, since).collect()
        return row["newest"]

    assert newest(None) == at(hours=26)
    for bound in (at(hours=-30), at(5), at(hours=26)):
        assert newest(_micros(spark, bound)) == at(hours=26)


def test_reads_of_a_live_batch_prune_silver_by_type_and_day(spark, lake):
    """The directories a batch reads are chosen by partition filters, before any file
    is opened; a plan without them would read all of history."""
    full = spark.read.format("delta").load(silver.SILVER.path(lake))
    hour = _micros(spark, at(0))
    narrowed = VIEW.narrowed(full, merged_ranges([(hour, hour + 3_600_000_000)]))
    plan = narrowed._jdf.queryExecution().executedPlan().toString()
    assert "PartitionFilters: [" in plan and "event_date" in plan.split("PartitionFilters: [")[1]
    assert sorted(r.order_id for r in narrowed.collect()) == ["o1", "o2"]  # the cancel, o2
    newest = restatements.newest_before(spark, lake, VIEW, 1, hour)
    plan = newest._jdf.queryExecution().executedPlan().toString()
    assert "event_date" in plan.split("PartitionFilters: [")[1]
