"""Table maintenance against real Delta tables in a temp lake: what OPTIMIZE, the
checkpoint and VACUUM leave, and that a lagging change-feed reader keeps the
files it has yet to read (delta-io/delta#1515)."""

from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path
from urllib.parse import urlparse

import pytest
from delta.tables import DeltaTable
from pyspark.sql import functions as F

from spark_jobs.engine import lake, maintenance, marks
from warehouse.base import registry


@pytest.fixture
def temp_lake(settings, tmp_path):
    return dataclasses.replace(settings, lake_root=str(tmp_path / "lake"))


def _parquet_files(path: str) -> list[Path]:
    return [p for p in Path(path).rglob("*.parquet") if "_delta_log" not in p.parts]


def test_one_row_commits_are_compacted_checkpointed_and_vacuumed(spark, temp_lake):
    """Six one-row commits are compacted into one file, checkpointed and vacuumed; a
    second run deletes only the stray file older than the retention.

    Over 20 s: six appends, then `maintain` twice on a real Delta table (an OPTIMIZE, two
    checkpoints and two VACUUMs, each with its start and end commits), since what it
    proves is what Delta's own OPTIMIZE, checkpoint and VACUUM leave on disk."""
    path = f"{temp_lake.lake_root}/gold/small_v1"
    for i in range(6):
        spark.range(i, i + 1, numPartitions=1).write.format("delta").mode("append").save(path)
    assert len(_parquet_files(path)) == 6

    with lake.vacuum_session(spark):
        done = maintenance.maintain(spark, path, 0.0)

    assert (done.files_before, done.files_after, done.compacted) == (6, 1, 6)
    # The six small files are gone from the disk, not only from the table.
    assert done.vacuumed == 6 and len(_parquet_files(path)) == 1
    assert Path(f"{path}/_delta_log/{done.checkpoint:020d}.checkpoint.parquet").is_file()
    rows = {r.id for r in spark.read.format("delta").load(path).collect()}
    assert rows == set(range(6))
    assert maintenance.lake_tables(spark, temp_lake) == [path]

    # A file the log does not name goes once older than the retention given (not
    # Delta 4's default 7 days): an abandoned write's. A younger one may be a write
    # still under way, and stays.
    abandoned, under_way = Path(path, "part-abandoned.parquet"), Path(path, "part-new.parquet")
    for file, age_h in ((abandoned, 3), (under_way, 0.5)):
        file.write_bytes(b"PAR1")
        os.utime(file, (time.time() - age_h * 3600,) * 2)
    with lake.vacuum_session(spark):
        again = maintenance.maintain(spark, path, 1.0)
    assert again.vacuumed == 1
    assert (abandoned.exists(), under_way.exists()) == (False, True)
    # One file is what bin-packing would leave: no OPTIMIZE ran, none committed.
    assert (again.files_before, again.compacted) == (1, 0)
    assert _operations(spark, path).count("OPTIMIZE") == 1

    # Now the one file the table does not name is younger than the retention: VACUUM,
    # with nothing it could delete, does not run (nor commit its start and end).
    an_hour_ago = (time.time() - 3600) * 1000
    assert (lake.unnamed_files(spark, path), lake.unnamed_files(spark, path, an_hour_ago)) == (1, 0)
    vacuums = _operations(spark, path).count("VACUUM END")
    with lake.vacuum_session(spark):
        third = maintenance.maintain(spark, path, 1.0)
    assert (third.vacuumed, third.notes) == (0, ["nothing to vacuum"])
    assert _operations(spark, path).count("VACUUM END") == vacuums == 2
    assert under_way.exists() and len(_parquet_files(path)) == 2

    # Outside the session, Delta's 7-day retention check stands again.
    assert not lake.in_vacuum_session(spark)
    with pytest.raises(RuntimeError, match="vacuum_session"):
        maintenance.maintain(spark, path, 0.0)


def _operations(spark, path: str) -> list[str]:
    """The operations of a table's commits, newest first."""
    return [r.operation for r in lake.history(spark, path).collect()]


def test_delta_leaves_a_lone_file_as_it_is_which_maintain_relies_on(spark, temp_lake):
    """`maintain` runs no bin-packing OPTIMIZE on a table of one file. Delta's own
    leaves such a file as it is, even with deleted rows in a deletion vector
    (regauge's sessions make none; a user's table may have them)."""
    path = f"{temp_lake.lake_root}/gold/with_dvs_v1"
    spark.range(0, 100, numPartitions=1).write.format("delta").option(
        "delta.enableDeletionVectors", "true"
    ).save(path)
    DeltaTable.forPath(spark, path).delete("id < 50")
    assert len(_parquet_files(path)) == 1  # the delete wrote a deletion vector, not a file

    (optimized,) = DeltaTable.forPath(spark, path).optimize().executeCompaction().collect()
    metrics = optimized["metrics"]
    assert (metrics["numFilesRemoved"], metrics["numFilesAdded"]) == (0, 0)
    assert _operations(spark, path) == ["DELETE", "WRITE"]


def _follow(spark, source: str, sink: str, checkpoint: str) -> None:
    """One run of a stream reading `source`'s change feed into `sink`, as a view does."""
    (
        spark.readStream.format("delta")
        .option("readChangeFeed", "true")
        .option("startingVersion", 0)
        .load(source)
        .writeStream.format("delta")
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start(sink)
        .awaitTermination()
    )


def test_a_file_past_the_compacted_size_is_not_packed_again(spark, temp_lake, monkeypatch):
    """Bronze and the ledger grow forever: OPTIMIZE packs the new small files and
    leaves a file past COMPACTED_FILE_BYTES as it is, instead of rewriting it with
    them every run."""
    path = f"{temp_lake.lake_root}/bronze/growing"
    spark.range(0, 20_000, numPartitions=1).write.format("delta").save(path)
    (large,) = spark.read.format("delta").load(path).inputFiles()
    for i in range(3):
        one = spark.range(20_000 + i, 20_001 + i, numPartitions=1)
        one.write.format("delta").mode("append").save(path)
    size = Path(urlparse(large).path).stat().st_size
    monkeypatch.setattr(maintenance, "COMPACTED_FILE_BYTES", size - 1)

    with lake.vacuum_session(spark):
        done = maintenance.maintain(spark, path, 0.0)

    assert (done.files_before, done.files_after, done.compacted) == (4, 2, 3)
    table = spark.read.format("delta").load(path)
    assert large in table.inputFiles()
    assert table.count() == 20_003


def test_a_lagging_change_feed_reader_keeps_the_files_it_has_yet_to_read(spark, temp_lake):
    """VACUUM keeps the change files a stream reading the change feed has yet to read
    (delta-io/delta#1515), and takes them once no reader is behind.

    Over 20 s: two runs of a real change-feed stream (a query started and stopped each),
    an UPDATE and a DELETE on its source and a DELETE on its sink, and `maintain` on
    both, since what it proves is what Delta's VACUUM does to the files a real stream's
    checkpoint still needs."""
    root = temp_lake.lake_root
    source, sink = f"{root}/silver/feed", f"{root}/gold/copy_v1"
    checkpoint = registry.gold_view_table("copy", 1).checkpoint(temp_lake)
    (
        spark.range(10)
        .withColumn("v", F.lit(0))
        .write.format("delta")
        .option("delta.enableChangeDataFeed", "true")
        .save(source)
    )
    _follow(spark, source, sink, checkpoint)
    # The reader stops here; the table moves on: rewritten files, change files.
    table = DeltaTable.forPath(spark, source)
    table.update("id < 5", {"v": F.lit(1)})
    table.delete("id = 9")

    paths = maintenance.lake_tables(spark, temp_lake)
    pins = maintenance.pins(spark, temp_lake, paths)
    held = [p for p in pins if p.path == source]
    # Where the stream goes on from: after version 0's files, or at version 1.
    assert [p.reader for p in held] == ["the stream writing gold.copy_v1 (main)"]
    assert held[0].version in (0, 1)
    hours, by = maintenance.retention_for(spark, source, pins, 0.0, time.time())
    assert by == held[0] and hours >= maintenance.MARGIN_HOURS
    change_files = list(Path(source, "_change_data").rglob("*.parquet"))
    assert change_files

    with lake.vacuum_session(spark):
        done = maintenance.maintain(spark, source, hours, by)
    assert done.held_by == held[0].reader and done.vacuumed == 0
    assert all(f.is_file() for f in change_files)

    # The reader catches up with every change it missed.
    _follow(spark, source, sink, checkpoint)
    got = spark.read.format("delta").load(sink)
    changes = got.where("_commit_version > 0").groupBy("_change_type").count().collect()
    assert {r["_change_type"]: r["count"] for r in changes} == {
        "update_preimage": 5,
        "update_postimage": 5,
        "delete": 1,
    }

    # With no reader behind it, the same VACUUM takes the files no version needs.
    with lake.vacuum_session(spark):
        spark.sql(f"DELETE FROM delta.`{sink}`")
        assert maintenance.maintain(spark, sink, 0.0).vacuumed > 0


def test_the_audit_s_tag_holds_gold_and_the_silver_version_it_names(spark, temp_lake):
    gold = registry.gold_view_table("tagged", 1).path(temp_lake)
    spark.range(3).write.format("delta").save(gold)
    spark.conf.set(marks.TAG_CONF, marks.tag(7, "bronze"))
    try:
        spark.range(3, 4).write.format("delta").mode("append").save(gold)
    finally:
        spark.conf.unset(marks.TAG_CONF)
    spark.range(4, 5).write.format("delta").mode("append").save(gold)  # untagged, newer
    marker = f"{registry.gold_view_table('tagged', 1).checkpoint(temp_lake)}/"
    lake.write_text(spark, marker + marks.REPLAY_MARKER, "5\n")

    pins = maintenance.gold_pins(spark, temp_lake, [gold])
    silver = registry.SILVER_EVENTS.path(temp_lake)
    assert {(p.path, p.version, p.reader) for p in pins} == {
        (gold, 1, "the audit of gold.tagged_v1"),
        (silver, 7, "the audit of gold.tagged_v1"),
        (silver, 5, "gold.tagged_v1's stream, not started yet"),
    }
