"""Gold laid out by time: a replay writes a view version's table sorted by its window
start, maintenance keeps it so, and a live change rewrites only the files of the
hours it touches (a MERGE rewrites every file holding a row it changes)."""

from __future__ import annotations

import dataclasses
import itertools

import pytest
from delta.tables import DeltaTable
from pyspark.sql import functions as F

from spark_jobs import views
from spark_jobs.engine import gold_writes, lake, maintenance, runner
from spark_jobs.engine import silver as silver_mod
from tests.frames import assert_df_equality
from tests.spark_jobs.conftest import at, order
from warehouse.base import registry

# Eight hours of orders, two currencies in each: 16 rows of revenue_hourly v1.
HOURS = 8
ORDERS = [
    order(f"o{h}{c}", at(hours=h, minutes=10), "10.00", currency=c)
    for h in range(HOURS)
    for c in ("EUR", "USD")
]


@pytest.fixture
def temp_lake(settings, tmp_path):
    return dataclasses.replace(settings, lake_root=str(tmp_path / "lake"))


def _files(spark, path):
    """Each data file of the table's newest version, in time order: (first and last
    window start, rows)."""
    found = (
        spark.read.format("delta")
        .load(path)
        .groupBy(F.input_file_name())
        .agg(F.count(F.lit(1)), F.min("window_start"), F.max("window_start"))
        .collect()
    )
    return sorted((r[2], r[3], r[1]) for r in found)


def _last_merge(spark, path):
    history = DeltaTable.forPath(spark, path).history(1).collect()[0]
    assert history["operation"] == "MERGE"
    return history["operationMetrics"]


def _write_silver(spark, settings, rows):
    rows.write.format("delta").mode("append").partitionBy(*silver_mod.SILVER_PARTITIONS).save(
        registry.SILVER_EVENTS.path(settings)
    )


def test_a_live_change_rewrites_only_the_files_of_its_hours(
    spark, silver_df, temp_lake, monkeypatch
):
    monkeypatch.setattr(gold_writes, "GOLD_FILE_ROWS", 4)
    view = views.get("revenue_hourly", 1)
    path = gold_writes.gold_table(view).path(temp_lake)
    silver = silver_df(ORDERS)
    _write_silver(spark, temp_lake, silver)

    runner.batch(spark, temp_lake, view)

    # Sorted by time, at most 4 rows a file: each file holds its own hours.
    files = _files(spark, path)
    assert len(files) >= 4 and all(n <= 4 for _, _, n in files)
    assert all(a[1] <= b[0] for a, b in itertools.pairwise(files))

    # One late order in hour 5: the MERGE rewrites the one file holding hour 5.
    late = silver_df([order("late", at(hours=5, minutes=50), "2.50", currency="EUR")])
    after = silver.unionByName(late)
    gold_writes.ensure_gold(spark, path, view)
    applied = gold_writes.apply_changes(spark, path, view, late, after)
    metrics = _last_merge(spark, path)
    assert applied.scopes == 1
    assert (metrics["numTargetFilesRemoved"], metrics["numTargetRowsUpdated"]) == ("1", "1")
    assert metrics["numTargetRowsInserted"] == "0"
    assert_df_equality(
        runner.read_gold(spark, temp_lake, view),
        gold_writes.gold_rows(view, after),
        ignore_row_order=True,
        ignore_nullable=True,
    )


def test_maintenance_lays_a_view_version_s_table_out_by_time(
    spark, silver_df, temp_lake, monkeypatch
):
    view = views.get("revenue_hourly", 1)
    path = gold_writes.gold_table(view).path(temp_lake)
    # One file per row, in an order that mixes the hours, as MERGEs leave them.
    rows = gold_writes.gold_rows(view, silver_df(ORDERS)).collect()
    for row in sorted(rows, key=lambda r: (r["currency"], -r["window_start"].timestamp())):
        spark.createDataFrame([row], view.schema).write.format("delta").mode("append").save(path)
    assert maintenance.time_columns(temp_lake)[path] == "window_start"

    monkeypatch.setattr(gold_writes, "GOLD_FILE_BYTES", 6_000)  # a file per few rows
    with lake.vacuum_session(spark):
        done = maintenance.maintain(spark, path, 0.0, order_by="window_start")

    files = _files(spark, path)
    assert done.compacted == len(rows) and 1 < len(files) < len(rows)
    # Each hour in one file: no two files share an hour.
    assert all(a[1] < b[0] for a, b in itertools.pairwise(files))
    assert sorted(spark.read.format("delta").load(path).collect()) == sorted(rows)


def test_maintenance_leaves_a_view_version_s_table_in_one_small_file_as_it_is(
    spark, silver_df, temp_lake
):
    """Z-ordering a table of one file of at most GOLD_FILE_BYTES would write the same
    file again: maintenance commits nothing to it (nor VACUUM's log entries: every
    file is the table's, so there is nothing to vacuum)."""
    view = views.get("revenue_hourly", 1)
    path = gold_writes.gold_table(view).path(temp_lake)
    rows = gold_writes.gold_rows(view, silver_df(ORDERS))
    rows.coalesce(1).write.format("delta").save(path)
    before = lake.newest_version(spark, path)

    with lake.vacuum_session(spark):
        done = maintenance.maintain(spark, path, 0.0, order_by="window_start")

    assert (done.files_before, done.files_after, done.compacted) == (1, 1, 0)
    history = DeltaTable.forPath(spark, path).history().where(f"version > {before}")
    assert history.collect() == [] and done.notes == ["nothing to vacuum"]
    assert lake.unnamed_files(spark, path) == 0  # of any age: every file is the table's
    assert sorted(spark.read.format("delta").load(path).collect()) == sorted(rows.collect())
    # A larger file, or more than one, is laid out as before.
    assert maintenance.already_laid_out(1, gold_writes.GOLD_FILE_BYTES)
    assert not maintenance.already_laid_out(1, gold_writes.GOLD_FILE_BYTES + 1)
    assert not maintenance.already_laid_out(2, 1_000)


def test_no_compaction_undoes_the_layout(spark, silver_df, temp_lake, monkeypatch):
    """Delta's auto compaction would bin-pack a replay's 60 small files into one at
    the next write; a view version's table has it off, also one made with it on
    (turned off when its stream starts)."""
    monkeypatch.setattr(gold_writes, "GOLD_FILE_ROWS", 1)
    view = views.get("revenue_hourly", 1)
    path = gold_writes.gold_table(view).path(temp_lake)
    lake.ensure_table(
        spark, path, view.schema, {**gold_writes.GOLD_PROPERTIES, gold_writes.AUTO_COMPACT: "true"}
    )
    hours = [order(f"o{h}", at(hours=h, minutes=5), "1.00") for h in range(60)]
    silver = silver_df(hours)
    _write_silver(spark, temp_lake, silver)

    # As a stream's start does (a replay may run over Spark Connect, without it).
    gold_writes.ensure_gold(spark, path, view)
    assert lake.table_properties(spark, path)[gold_writes.AUTO_COMPACT] == "false"
    runner.batch(spark, temp_lake, view)
    late = silver_df([order("late", at(hours=30, minutes=50), "2.50")])
    gold_writes.apply_changes(spark, path, view, late, silver.unionByName(late))

    operations = [r["operation"] for r in DeltaTable.forPath(spark, path).history().collect()]
    assert "OPTIMIZE" not in operations and operations[0] == "MERGE"
    assert len(_files(spark, path)) == 60
