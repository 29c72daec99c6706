"""Folding a change into gold, for views whose rows add up (`View.sums`): batch after
batch of silver's change feed (new events, replaced winners, erasures) folds into
the rows `compute` makes of silver after it, a retried batch folds nothing, and a
gold that does not hold what a batch takes out fails the batch instead."""

from __future__ import annotations

import random
from dataclasses import replace
from typing import Any

import pytest
from pyspark.errors import PySparkException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import LongType, StringType, StructField, StructType

from spark_jobs import views
from spark_jobs.engine import gold_writes, lake, marks, runner
from spark_jobs.engine import silver as silver_mod
from spark_jobs.views.base import Sums, View
from tests.frames import assert_df_equality
from tests.spark_jobs.conftest import assert_staged_is_the_newest_commit, at, order
from tests.spark_jobs.views.test_runner import LOG
from warehouse.base import registry

SUMMED = sorted(k for k, v in views.discover().items() if v.sums is not None)
APP = "regauge-test-fold"

# Each batch: (change type, silver row). A pre-image and a post-image share an
# event id: the winner silver replaced, and what replaced it.
BATCHES: list[list[tuple[str, dict[str, Any]]]] = [
    [
        ("insert", order("o1", at(5), "10.00", event_id="a")),
        ("insert", order("o2", at(15), "4.50", event_id="b")),
        ("insert", order("o3", at(65), "3.25", currency="USD", event_id="c")),
        ("insert", order("o4", at(hours=-50), "7.00", event_id="d")),
    ],
    [
        # A replaced winner moves to another hour and currency, and a late order
        # joins the hour it left.
        ("update_preimage", order("o1", at(5), "10.00", event_id="a")),
        ("update_postimage", order("o1", at(70), "12.00", currency="USD", event_id="a")),
        ("insert", order("o5", at(20), "1.10", event_id="e")),
    ],
    [
        # An erasure takes the last order of its hour out (the row goes), and an
        # order that comes and goes within the batch changes nothing.
        ("delete", order("o4", at(hours=-50), "7.00", event_id="d")),
        ("insert", order("o6", at(hours=2), "2.00", event_id="f")),
        ("delete", order("o6", at(hours=2), "2.00", event_id="f")),
        ("insert", order("o7", at(16), "0.40", event_id="g")),
    ],
]


def _feed(silver_df, batch: list[tuple[str, dict[str, Any]]], version: int) -> DataFrame:
    """A micro-batch of silver's change feed: the rows with `_change_type`."""
    rows = silver_df([row for _, row in batch])
    spark = rows.sparkSession
    schema = StructType(
        [
            *rows.schema.fields,
            StructField("_change_type", StringType()),
            StructField("_commit_version", LongType()),
        ]
    )
    return spark.createDataFrame(
        [(*r, kind, version) for r, (kind, _) in zip(rows.collect(), batch, strict=True)], schema
    )


def _empty_gold(silver_df, tmp_path, name: str, version: int) -> tuple[View, SparkSession, str]:
    """The view version, the tests' session, and the path of an empty gold table."""
    view = views.get(name, version)
    path = str(tmp_path / "gold")
    spark = silver_df([]).sparkSession
    gold_writes.ensure_gold(spark, path, view)
    return view, spark, path


@pytest.mark.parametrize("by", ["spark", "delta-rs"])
@pytest.mark.parametrize("name,version", SUMMED)
def test_folded_batches_give_the_views_rows_of_silver_after_them(
    silver_df, tmp_path, name, version, by, monkeypatch
):
    """By Spark's MERGE, and by delta-rs's (`lake.Committer`, a live stream's on a local
    lake): the same gold, the same records published as its change feed gives, and
    the same transaction ids, which Spark reads from delta-rs's commits too. With
    delta-rs, every batch reads gold's rows by it too, the first and last though they
    hold an hour two days before their others: by the rows' own starts, not the days
    between."""
    view, spark, path = _empty_gold(silver_df, tmp_path, name, version)
    writer = lake.Committer(path, {}) if by == "delta-rs" else None
    reads: list[str] = []
    if writer is not None:
        real_read = writer.read_where

        def read_where(spark: SparkSession, version: int, condition: str) -> DataFrame:
            reads.append(condition)
            return real_read(spark, version, condition)

        monkeypatch.setattr(writer, "read_where", read_where)
    silver: dict[str, dict[str, Any]] = {}
    for batch_id, batch in enumerate(BATCHES):
        for kind, row in batch:
            if kind in ("insert", "update_postimage"):
                silver[row["event_id"]] = row
            else:
                silver.pop(row["event_id"])
        applied = gold_writes.fold_changes(
            spark, path, view, _feed(silver_df, batch, batch_id), (APP, batch_id), writer
        )
        assert applied is not None and applied.scopes > 0 and applied.folded
        expected = gold_writes.gold_rows(view, silver_df(list(silver.values())))
        assert_df_equality(
            spark.read.format("delta").load(path),
            expected,
            ignore_row_order=True,
            ignore_nullable=True,
        )
        # What the batch publishes, read off its MERGE: the records of its commit's
        # change feed (the erased hour's tombstone included).
        assert_staged_is_the_newest_commit(spark, path, view, applied.staged)
        assert lake.txn_version(spark, path, APP) == batch_id

    assert len(reads) == (len(BATCHES) if writer is not None else 0), reads
    # The last batch again (its commit came before a crash): nothing is folded twice.
    newest = lake.newest_version(spark, path)
    again = gold_writes.fold_changes(
        spark, path, view, _feed(silver_df, BATCHES[-1], 2), (APP, len(BATCHES) - 1), writer
    )
    assert again is not None and again.scopes > 0 and again.staged is None
    assert lake.newest_version(spark, path) == newest
    assert_df_equality(
        spark.read.format("delta").load(path),
        gold_writes.gold_rows(view, silver_df(list(silver.values()))),
        ignore_row_order=True,
        ignore_nullable=True,
    )


@pytest.mark.parametrize("name,version", SUMMED)
def test_a_batch_recomputed_instead_is_not_folded_after_it(silver_df, tmp_path, name, version):
    """A recompute's commit carries the batch's transaction id too (a fold that met a
    conflicting commit recomputes), so the batch retried after it folds nothing."""
    view = views.get(name, version)
    path = str(tmp_path / "gold")
    batch = BATCHES[0]
    silver = silver_df([row for _, row in batch])
    spark = silver.sparkSession
    gold_writes.ensure_gold(spark, path, view)
    gold_writes.apply_changes(spark, path, view, silver, silver, txn=(APP, 7))
    assert lake.txn_version(spark, path, APP) == 7
    newest = lake.newest_version(spark, path)
    again = gold_writes.fold_changes(spark, path, view, _feed(silver_df, batch, 1), (APP, 7))
    assert again is not None and again.staged is None
    assert lake.newest_version(spark, path) == newest
    assert_df_equality(
        spark.read.format("delta").load(path),
        gold_writes.gold_rows(view, silver),
        ignore_row_order=True,
        ignore_nullable=True,
    )


@pytest.mark.parametrize("name,version", SUMMED)
def test_a_fold_taking_out_what_gold_does_not_hold_fails_the_batch(
    silver_df, tmp_path, name, version
):
    view, spark, path = _empty_gold(silver_df, tmp_path, name, version)
    erased = [("delete", order("o1", at(5), "10.00", event_id="a"))]
    with pytest.raises(PySparkException, match="replay the version"):
        gold_writes.fold_changes(spark, path, view, _feed(silver_df, erased, 0), (APP, 0))
    assert spark.read.format("delta").load(path).count() == 0


@pytest.mark.parametrize("name,version", SUMMED)
def test_a_batch_touching_more_rows_than_fit_is_recomputed(
    silver_df, tmp_path, monkeypatch, name, version
):
    monkeypatch.setattr(gold_writes, "MAX_STAGED_ROWS", 1)
    view, spark, path = _empty_gold(silver_df, tmp_path, name, version)
    assert (
        gold_writes.fold_changes(spark, path, view, _feed(silver_df, BATCHES[0], 0), (APP, 0))
        is None
    )
    assert lake.newest_version(spark, path) == 0


def test_sums_need_rows_that_follow_from_their_own_events():
    v1 = views.get("revenue_hourly", 1)
    assert v1.sums is not None
    with pytest.raises(ValueError, match="must be a measure of 1"):
        Sums(measures={"orders": "total"}, count="orders")
    # A cancellation changes its order's row: no fold for v2.
    v2 = views.get("revenue_hourly", 2)
    with pytest.raises(ValueError, match="fixed windows and no linked events"):
        replace(v2, sums=v1.sums)
    # Every gold column besides the scope's must be a measure.
    with pytest.raises(ValueError, match="left over: revenue"):
        replace(v1, sums=Sums(measures={"orders": "1"}, count="orders"))


@pytest.mark.parametrize("name,version", SUMMED)
def test_shuffled_folds_of_the_shared_log_give_its_rows(silver_df, tmp_path, name, version):
    """The event log every view is tested on (`test_runner.LOG`), folded in small
    batches in a shuffled order, gives what `compute` makes of it."""
    view, spark, path = _empty_gold(silver_df, tmp_path, name, version)
    log = list(LOG)
    random.Random(len(name) + version).shuffle(log)
    chunks = [log[i : i + 3] for i in range(0, len(log), 3)]
    for batch_id, chunk in enumerate(chunks):
        # Unique ids, as silver's are: the shared log's repeat an order_id, not an event.
        batch = [("insert", {"event_id": f"x{batch_id}-{i}", **row}) for i, row in enumerate(chunk)]
        gold_writes.fold_changes(
            spark, path, view, _feed(silver_df, batch, batch_id), (APP, batch_id)
        )
    expected = gold_writes.gold_rows(view, silver_df(LOG))
    assert expected.count() > 1
    assert_df_equality(
        spark.read.format("delta").load(path),
        expected,
        ignore_row_order=True,
        ignore_nullable=True,
    )


def test_only_a_replay_from_bronze_lets_a_stream_fold(silver_df, settings, tmp_path):
    """A replay from Kafka may hold records silver does not have yet, which a fold
    would count again when they arrive; a replay whose source is not recorded may
    have left batches without their transaction ids. Streams after those recompute."""
    lake_settings = replace(settings, lake_root=str(tmp_path / "lake"))
    rows = silver_df([row for _, row in BATCHES[0]])
    rows.write.format("delta").partitionBy(*silver_mod.SILVER_PARTITIONS).save(
        registry.SILVER_EVENTS.path(lake_settings)
    )
    spark = rows.sparkSession
    v1, v2 = views.get("revenue_hourly", 1), views.get("revenue_hourly", 2)
    assert not marks.folds(spark, lake_settings, v1)  # never replayed
    for view in (v1, v2):
        runner.replay(spark, lake_settings, view)
    assert marks.folds(spark, lake_settings, v1)
    assert not marks.folds(spark, lake_settings, v2)  # its rows do not add up
    marker = marks.marker(lake_settings, v1, marks.REPLAY_SOURCE_MARKER)
    lake.write_text(spark, marker, "kafka\n")
    assert not marks.folds(spark, lake_settings, v1)
    lake.delete_tree(spark, marker)
    assert not marks.folds(spark, lake_settings, v1)
