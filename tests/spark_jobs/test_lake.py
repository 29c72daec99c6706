"""Delta mechanics shared by every layer, under concurrent writers."""

from __future__ import annotations

import json
import shutil
import threading
from pathlib import Path

import deltalake
import pyarrow as pa
import pytest
from pyspark.sql import functions as F
from pyspark.sql.types import DecimalType, LongType, StringType, StructField, StructType

from spark_jobs.engine import lake
from spark_jobs.engine.lake import USER_METADATA

SCHEMA = StructType([StructField("x", LongType(), False)])


def test_tables_created_by_writers_started_together_end_as_one_table(spark, tmp_path):
    """Several view queries start at once and each ensures gold.restatements: every
    one must succeed, and the table ends with exactly one creating commit."""
    writers = 4
    for round_ in range(3):
        path = str(tmp_path / f"shared{round_}")
        start = threading.Barrier(writers)
        errors: list[BaseException] = []

        def create(
            path: str = path, start: threading.Barrier = start, errors: list = errors
        ) -> None:
            start.wait()
            try:
                lake.ensure_table(spark, path, SCHEMA)
            except Exception as exc:  # collected and asserted below
                errors.append(exc)

        threads = [threading.Thread(target=create) for _ in range(writers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
        history = spark.sql(f"DESCRIBE HISTORY delta.`{path}`").collect()
        assert [r.operation for r in history].count("CREATE TABLE") == 1
        assert spark.read.format("delta").load(path).schema == SCHEMA


def test_a_write_that_conflicts_is_tried_again_and_other_errors_are_not():
    from delta.exceptions import ConcurrentAppendException

    tries: list[int] = []

    def conflicts_twice() -> str:
        tries.append(1)
        if len(tries) < 3:
            raise ConcurrentAppendException(message="files were added by a concurrent update")
        return "merged"

    assert lake.retry_on_conflict(conflicts_twice, "a merge", backoff_s=0.01) == "merged"
    assert len(tries) == 3

    def broken() -> None:
        tries.append(1)
        raise ValueError("not a conflict")

    tries.clear()
    with pytest.raises(ValueError, match="not a conflict"):
        lake.retry_on_conflict(broken, "a merge", backoff_s=0.01)
    assert len(tries) == 1

    def always() -> None:
        raise ConcurrentAppendException(message="again")

    with pytest.raises(ConcurrentAppendException):
        lake.retry_on_conflict(always, "a merge", attempts=2, backoff_s=0.01)


def test_files_beside_the_tables_are_reached_through_hadoops_filesystem(spark, tmp_path):
    """Markers, checkpoints and archives go through the same calls for a local
    folder and an s3a:// bucket; here, the local folder."""
    root = str(tmp_path)
    lake.write_text(spark, f"{root}/ckpt/marker", "41\n")
    lake.write_text(spark, f"{root}/ckpt/marker", "42\n")  # replaced whole
    assert lake.read_text(spark, f"{root}/ckpt/marker") == "42\n"
    assert lake.exists(spark, f"{root}/ckpt") and not lake.exists(spark, f"{root}/nope")
    assert lake.read_text(spark, f"{root}/nope") is None

    lake.move(spark, f"{root}/ckpt", f"{root}/_archive/checkpoint/x@1")
    assert not lake.exists(spark, f"{root}/ckpt")
    assert lake.list_names(spark, f"{root}/_archive/checkpoint") == ["x@1"]
    assert lake.read_text(spark, f"{root}/_archive/checkpoint/x@1/marker") == "42\n"

    lake.delete_tree(spark, f"{root}/_archive")
    lake.delete_tree(spark, f"{root}/_archive")  # gone already: nothing to do
    assert lake.list_names(spark, root) == []
    with pytest.raises(FileNotFoundError, match="does not exist"):
        lake.move(spark, f"{root}/nope", f"{root}/elsewhere")


def test_the_newest_version_is_the_newest_commit_and_no_table_is_refused(spark, tmp_path):
    path = str(tmp_path / "t")
    with pytest.raises(Exception, match=r"(?i)not a delta table|DELTA_MISSING"):
        lake.newest_version(spark, path)
    for n in range(3):
        spark.range(n, n + 1).write.format("delta").mode("append").save(path)
        (newest,) = lake.history(spark, path, 1).select("version").collect()
        # What DESCRIBE HISTORY says, after each commit.
        assert lake.newest_version(spark, path) == newest["version"] == n


def test_session_settings_hold_inside_and_are_as_before_outside(spark):
    set_before, unset = "spark.sql.shuffle.partitions", "spark.sql.codegen.maxFields"
    before = spark.conf.get(set_before)
    assert spark.conf.get(unset, None) is None
    settings = {set_before: "7", unset: "42"}
    with pytest.raises(RuntimeError, match="inside"), lake.session_conf(spark, settings):
        assert (spark.conf.get(set_before), spark.conf.get(unset)) == ("7", "42")
        raise RuntimeError("inside")
    assert spark.conf.get(set_before) == before
    assert spark.conf.get(unset, None) is None


def test_offset_ranges_split_at_the_largest_gaps():
    offsets = [50, 1, 2, 3, 10, 11, 2]
    assert lake.offset_ranges(offsets, 3) == [(1, 3), (10, 11), (50, 50)]
    assert lake.offset_ranges(offsets, 2) == [(1, 11), (50, 50)]
    assert lake.offset_ranges(offsets, 1) == [(1, 50)]
    assert lake.offset_ranges(offsets, 64) == [(1, 3), (10, 11), (50, 50)]


def test_at_positions_reads_only_the_files_that_can_hold_them(spark, tmp_path):
    """Spark's `at_positions` and delta-rs's `read_at_positions` alike."""
    path = tmp_path / "t"
    files = []
    for first in (0, 100, 200):  # three appends: three files of narrow offset ranges
        spark.createDataFrame(
            [(p, o) for p in (0, 1) for o in range(first, first + 50)], "partition int, offset long"
        ).coalesce(1).write.format("delta").mode("append").save(str(path))
        files.append(next(f for f in path.glob("*.parquet") if f not in files))
    table = spark.read.format("delta").load(str(path))
    # The middle file is moved away: reading it would fail.
    files[1].rename(files[1].with_suffix(".away"))
    got = lake.at_positions(table, [(0, 3), (1, 7), (0, 220), (1, 40)])
    assert sorted((r.partition, r.offset) for r in got.collect()) == [
        (0, 3),
        (0, 220),
        (1, 7),
        (1, 40),
    ]
    assert lake.at_positions(table, []).count() == 0
    # delta-rs skips by the same statistics (the ledger's read in `silver._history`).
    schema = table.schema
    read = lake.read_at_positions(spark, str(path), {}, [(0, 3), (1, 7), (0, 220)], schema)
    assert sorted(tuple(r) for r in read.collect()) == [(0, 3), (0, 220), (1, 7)]
    assert read.schema == schema
    assert lake.read_at_positions(spark, str(path), {}, [], schema).count() == 0
    files[1].with_suffix(".away").rename(files[1])
    assert lake.at_positions(table, [(1, 120)]).count() == 1
    assert lake.read_at_positions(spark, str(path), {}, [(1, 120), (1, 999)], schema).count() == 1


def test_a_stop_waits_for_the_running_batch_and_no_batch_begins_during_it(spark, tmp_path):
    """`stop_stream` on a guarded query returns only after the running batch has
    written, and a batch that begins while it stops writes nothing (it raises): so
    each batch the function began it finished, and the table holds whole batches."""
    path = str(tmp_path / "out")
    began: list[int] = []
    ended: list[int] = []
    running = threading.Event()

    def each_batch(batch, batch_id: int) -> None:
        began.append(batch_id)
        batch.selectExpr("value AS x").write.format("delta").mode("append").save(path)
        if batch_id >= 1:  # the rate source's first batch is empty
            running.set()
            # A Spark job long enough for the stop below to arrive in the middle of
            # it: an unguarded stop cancels it, and the function raises.
            batch.sparkSession.range(1).selectExpr(
                "reflect('java.lang.Thread', 'sleep', CAST(2000 AS BIGINT))"
            ).collect()
        ended.append(batch_id)

    guard = lake.BatchGuard()
    writer = (
        spark.readStream.format("rate")
        .option("rowsPerSecond", 50)
        .load()
        .writeStream.foreachBatch(guard.wrap(each_batch))
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
    )
    query = lake.start_stream(writer, False, "100 milliseconds", guard)
    # Generous bounds: `make test` runs this beside the integration tests at the
    # lowest priority (infra/run-tests.sh), where a busy minute can pass in a wait.
    assert running.wait(300), "no batch began"
    assert lake.stop_stream(query, 120.0) is True
    assert not query.isActive
    # Stopped between batches: the one that was running had finished.
    assert began and began == ended
    error = query.exception()
    assert error is None or lake.StreamStopping.__name__ in str(error)
    written = spark.read.format("delta").load(path).count()
    assert written > 0
    # Safe to call again on a stopped query.
    assert lake.stop_stream(query, 1.0) is True


# -- appends exactly once ------------------------------------------------------------
PAIR = StructType([StructField("x", LongType(), False), StructField("p", StringType(), True)])


def _pairs(spark, *xs: int):
    return spark.createDataFrame([(x, "a") for x in xs], PAIR)


def _xs(spark, path: str) -> list[int]:
    return sorted(r.x for r in spark.read.format("delta").load(path).collect())


def _added(path: str) -> list[bool]:
    """dataChange of each file the table's newest commit added."""
    newest = max(Path(path, "_delta_log").glob("*.json"))
    actions = [json.loads(line) for line in newest.read_text().splitlines()]
    return [a["add"]["dataChange"] for a in actions if "add" in a]


def _last_commit(spark, path: str):
    (row,) = (
        spark.sql(f"DESCRIBE HISTORY delta.`{path}`")
        .orderBy(F.col("version").desc())
        .limit(1)
        .select("operation", "operationParameters", "operationMetrics", "isBlindAppend")
        .collect()
    )
    return row


def test_an_append_once_reads_its_id_from_the_checksum_and_commits_as_the_writer_would(
    spark, tmp_path
):
    by_writer, ours = str(tmp_path / "writer"), str(tmp_path / "ours")
    for path in (by_writer, ours):
        lake.ensure_table(spark, path, PAIR, partitioned_by=("p",))
    for version in (0, 1):
        lake.append_by_writer(_pairs(spark, version), by_writer, "app", version)
        assert lake._append_by_checksum(_pairs(spark, version), ours, "app", version) is True
    # A retry of the last batch changes nothing, and neither does an older one.
    assert lake._append_by_checksum(_pairs(spark, 1), ours, "app", 1) is False
    lake.append_once(_pairs(spark, 0), ours, "app", 0)
    assert _xs(spark, ours) == [0, 1]
    assert lake._checksum_txns(lake.snapshot(spark, ours)) == {"app": 1}
    assert lake.txn_version(spark, ours, "app") == lake.txn_version(spark, by_writer, "app") == 1
    # The writer's commit: operation, parameters, metrics, a blind append, and files
    # that are new data (what a change feed reads as inserts).
    assert _last_commit(spark, ours) == _last_commit(spark, by_writer)
    assert _added(ours) == _added(by_writer) == [True]
    # Another id counts on its own.
    lake.append_once(_pairs(spark, 9), ours, "other", 0)
    assert lake.txn_version(spark, ours, "other") == 0
    assert _xs(spark, ours) == [0, 1, 9]


def test_without_a_checksum_the_writer_appends_once(spark, tmp_path):
    path = str(tmp_path / "t")
    lake.ensure_table(spark, path, PAIR)
    lake.append_once(_pairs(spark, 0), path, "app", 0)
    for crc in (tmp_path / "t" / "_delta_log").glob("*.crc"):
        crc.unlink()
    spark.sparkContext._jvm.org.apache.spark.sql.delta.DeltaLog.clearCache()
    assert lake._checksum_txns(lake.snapshot(spark, path)) is None
    assert lake.txn_version(spark, path, "app") == 0  # from the table's state
    assert lake._append_by_checksum(_pairs(spark, 1), path, "app", 1) is None
    lake.append_once(_pairs(spark, 0), path, "app", 0)  # the writer skips it
    lake.append_once(_pairs(spark, 1), path, "app", 1)
    assert _xs(spark, path) == [0, 1]


def test_an_append_once_keeps_the_tables_rules(spark, tmp_path):
    path = str(tmp_path / "t")
    lake.ensure_table(spark, path, PAIR)
    lake.append_once(_pairs(spark, 0), path, "app", 0)
    # NOT NULL holds where the checksum is read too.
    nullable = StructType([StructField("x", LongType(), True), PAIR.fields[1]])
    with pytest.raises(Exception, match="NOT NULL"):
        lake.append_once(spark.createDataFrame([(None, "a")], nullable), path, "app", 1)
    # Other columns are left to the writer, which refuses them as before.
    wider = StructType([*PAIR.fields, StructField("extra", LongType(), True)])
    extra = spark.createDataFrame([(1, "a", 2)], wider)
    assert lake._append_by_checksum(extra, path, "app", 1) is None
    with pytest.raises(Exception, match="schema mismatch"):
        lake.append_once(extra, path, "app", 1)
    assert _xs(spark, path) == [0]


def test_a_commit_under_the_same_id_in_between_fails_the_append(spark, tmp_path, monkeypatch):
    """Two writers under one id (a lock lost): the one that commits second is refused,
    as the writer's own check refuses it, and commits nothing."""
    path = str(tmp_path / "t")
    lake.ensure_table(spark, path, PAIR)
    lake.append_once(_pairs(spark, 0), path, "app", 0)
    columns = lake._columns
    first: list[int] = []

    def meanwhile(schema):
        # After the append read its snapshot, the other writer commits batch 1.
        if not first:
            first.append(1)
            lake.append_by_writer(_pairs(spark, 1), path, "app", 1)
        return columns(schema)

    monkeypatch.setattr(lake, "_columns", meanwhile)
    with pytest.raises(Exception, match="ConcurrentTransaction"):
        lake.append_once(_pairs(spark, 1), path, "app", 1)
    assert _xs(spark, path) == [0, 1]


def test_an_append_once_takes_the_settings_of_its_rows_session(spark, tmp_path):
    """As the writer does: the commit's userMetadata is the rows' session's, whichever
    session is active (a micro-batch's rows come in a session of their own)."""
    tagged = spark.newSession()
    tagged.conf.set(USER_METADATA, "batch 7")
    for how, path in (("writer", str(tmp_path / "w")), ("ours", str(tmp_path / "o"))):
        lake.ensure_table(spark, path, PAIR)
        lake.append_once(_pairs(spark, 0), path, "app", 0)
        rows = tagged.createDataFrame([(1, "a")], PAIR)
        if how == "writer":
            lake.append_by_writer(rows, path, "app", 1)
        else:
            assert lake._append_by_checksum(rows, path, "app", 1) is True
        (meta,) = (
            spark.sql(f"DESCRIBE HISTORY delta.`{path}`")
            .where("version = 2")
            .select("userMetadata")
        ).first() or (None,)
        assert meta == "batch 7", how
    assert spark.conf.get(USER_METADATA, None) is None


def test_a_table_gains_the_columns_a_newer_schema_adds_where_the_schema_puts_them(spark, tmp_path):
    """A silver made under an older contract gains a newer one's column (docs/contract.md
    §10): in place, after the column before it, and its rows read null there."""
    path = str(tmp_path / "t")
    old = StructType([StructField("a", StringType()), StructField("z", StringType())])
    new = StructType(
        [
            StructField("a", StringType()),
            StructField("m", DecimalType(18, 2)),
            StructField("z", StringType()),
        ]
    )
    lake.ensure_table(spark, path, old)
    spark.createDataFrame([("x", "y")], old).write.format("delta").mode("append").save(path)
    assert lake.ensure_columns(spark, path, new) == ["m"]
    assert lake.ensure_columns(spark, path, new) == []  # once
    table = spark.read.format("delta").load(path)
    assert table.schema == new
    assert [tuple(r) for r in table.collect()] == [("x", None, "y")]


def _committed_table(spark, path: str, interval: int) -> None:
    """A table as gold is made (Spark, the change feed on), holding k=a and k=b."""
    spark.sql(
        f"CREATE TABLE delta.`{path}` (k STRING NOT NULL, n BIGINT) USING delta TBLPROPERTIES "
        f"('delta.enableChangeDataFeed'='true', 'delta.checkpointInterval'='{interval}')"
    )
    spark.createDataFrame([("a", 1), ("b", 2)], "k string, n long").write.format("delta").mode(
        "append"
    ).save(path)


def _merge(
    committer: lake.Committer,
    rows: list[tuple[str, int, str]],
    batch: int,
    columns: tuple[str, ...] = ("k", "n"),
    **kw,
):
    source = pa.table(
        {
            "k": [r[0] for r in rows],
            "n": pa.array([r[1] for r in rows], pa.int64()),
            "_op": [r[2] for r in rows],
        }
    )
    return committer.merge(
        source,
        "t.`k` = s.`k`",
        columns=list(columns),
        delete_when="s._op = 'delete'",
        update_when="s._op = 'upsert' AND (t.`n` IS DISTINCT FROM s.`n`)",
        insert_when="s._op = 'upsert'",
        txn=("app", batch),
        user_metadata=f"tag {batch}",
        **kw,
    )


def test_a_merge_by_delta_rs_is_one_commit_spark_reads_with_its_change_feed_txn_and_tag(
    spark, tmp_path
):
    """A live batch's gold commit on a local lake (`lake.Committer`): Spark reads its
    rows, its change feed (what the publisher sends when it cannot send the
    batch's own records), the batch's transaction id and its tag (`marks`). A merge
    that changes nothing makes no commit; one from a version gold has moved past
    (`expected`) is a conflict and commits nothing, as does one delta-rs refuses.
    delta-rs's checkpoint (every 2 commits here) leaves no stale Hadoop checksum of
    `_last_checkpoint` behind, which Spark's next read of it would fail on."""
    path = str(tmp_path / "gold")
    _committed_table(spark, path, interval=2)
    assert lake.write_checkpoint(spark, path) == 1
    marker = tmp_path / "gold" / "_delta_log" / "._last_checkpoint.crc"
    assert marker.exists()  # Hadoop's checksum of Spark's checkpoint marker
    committer = lake.Committer(path, {})
    made = _merge(committer, [("a", 10, "upsert"), ("b", 0, "delete"), ("c", 3, "upsert")], 7)
    assert made == 2 == lake.newest_version(spark, path)
    assert sorted(map(tuple, spark.read.format("delta").load(path).collect())) == [
        ("a", 10),
        ("c", 3),
    ]
    feed = (
        spark.read.format("delta")
        .option("readChangeFeed", "true")
        .option("startingVersion", 2)
        .load(path)
        .select("k", "n", "_change_type")
    )
    assert sorted(map(tuple, feed.collect())) == [
        ("a", 1, "update_preimage"),
        ("a", 10, "update_postimage"),
        ("b", 2, "delete"),
        ("c", 3, "insert"),
    ]
    assert lake.txn_version(spark, path, "app") == 7 == committer.txn_version("app")
    assert lake.commit_metadata(spark, path, 2) == "tag 7"
    # Nothing differs: no commit, and so no transaction id either.
    assert _merge(committer, [("a", 10, "upsert")], 8) is None
    assert committer.txn_version("app") == 7
    # Gold moved past the version the rows were read from.
    with pytest.raises(lake.CONFLICTS):
        _merge(committer, [("a", 11, "upsert")], 9, expected=1)
    assert committer.version() == 2
    # An error that is no conflict (a column the source lacks): refused, for Spark's
    # MERGE to make (`gold_writes._merge_rs`), and nothing committed.
    with pytest.raises(lake.MergeRefused):
        _merge(committer, [("a", 11, "upsert")], 9, columns=("k", "n", "gone"))
    assert committer.version() == 2
    # Version 3 is a checkpoint's (interval 2): delta-rs writes it and its marker.
    assert _merge(committer, [("c", 4, "upsert")], 9) == 3
    assert (
        json.loads((tmp_path / "gold" / "_delta_log" / "_last_checkpoint").read_text())["version"]
        == 3
    )
    assert not marker.exists()
    assert dict(map(tuple, spark.read.format("delta").load(path).collect())) == {"a": 10, "c": 4}


def test_an_append_by_delta_rs_is_skipped_under_its_txn_and_spark_appends_after_it(spark, tmp_path):
    """A live batch's restatements on a local lake (`Committer.append`): one commit
    Spark reads, with the batch's transaction id and its tag; the same id again
    appends nothing (a batch retried after its commit); Spark's own append under
    another id works after it, though delta-rs wrote no checksum; and rows delta-rs
    refuses commit nothing, for Spark's append to make."""
    from spark_jobs.engine import restatements

    path = str(tmp_path / "restatements")
    lake.ensure_table(spark, path, restatements.RESTATEMENTS_SCHEMA)
    created = lake.newest_version(spark, path)
    at = "timestamp'2001-01-01 00:00:00'"
    found = spark.sql(
        f"SELECT 'v' AS view, 2 AS version, {at} AS window_start, "
        f"{at} + INTERVAL 1 HOUR AS window_end, 'GBP' AS window_key, 'e1' AS event_id, "
        f"{at} AS event_time, 99L AS lateness, current_timestamp() AS restated_at, "
        "'late' AS reason"
    )
    rows = found.toArrow()
    committer = lake.Committer(path, {})
    assert committer.append(rows, txn=("app", 3), user_metadata="tag 3") == created + 1
    read = spark.read.format("delta").load(path)
    assert [(r.view, r.version, r.window_key, r.event_id) for r in read.collect()] == [
        ("v", 2, "GBP", "e1")
    ]
    assert read.first().window_start == found.first().window_start
    assert lake.txn_version(spark, path, "app") == 3 == committer.txn_version("app")
    assert lake.commit_metadata(spark, path, created + 1) == "tag 3"
    # The same batch again: nothing appended.
    assert committer.append(rows, txn=("app", 3), user_metadata="tag 3") is None
    assert read.count() == 1
    # Spark's append after delta-rs's commit (no checksum of it: Delta's writer path)
    # skips the batch delta-rs committed (the fallback after a refusal) and makes
    # another.
    checkpointed = found.localCheckpoint(eager=True)
    lake.append_once(checkpointed, path, "app", 3)
    assert read.count() == 1
    lake.append_once(checkpointed, path, "spark", 1)
    assert read.count() == 2 and lake.txn_version(spark, path, "spark") == 1
    # A column the table lacks: refused, nothing committed.
    with pytest.raises(lake.MergeRefused):
        committer.append(
            rows.append_column("gone", pa.array([1], pa.int64())),
            txn=("app", 4),
            user_metadata=None,
        )
    assert committer.version() == created + 2 and read.count() == 2


def test_a_table_delta_rs_cannot_write_is_refused_not_retried_as_a_conflict(spark, tmp_path):
    """delta-rs raises CommitFailedError, its conflict, also for a table feature it
    does not support (row tracking here): no retry mends that, so the committer
    refuses (MergeRefused), for Spark's append to make, and commits nothing."""
    path = str(tmp_path / "tracked")
    spark.sql(
        f"CREATE TABLE delta.`{path}` (x BIGINT) USING delta "
        "TBLPROPERTIES ('delta.enableRowTracking' = 'true')"
    )
    committer = lake.Committer(path, {})
    before = committer.version()
    with pytest.raises(lake.MergeRefused, match=r"(?i)unsupported|feature"):
        committer.append(
            pa.table({"x": pa.array([1], pa.int64())}), txn=("app", 1), user_metadata=None
        )
    assert committer.version() == before and committer.txn_version("app") is None


def test_a_local_table_read_at_positions_stays_open_until_it_is_made_again(tmp_path):
    """`lake.open_table` keeps a local table open between live batches, taking in
    each new commit, and opens a table made again at the same path anew: a kept
    table would answer from the old one's files."""
    path = str(tmp_path / "t")
    schema = StructType([StructField("partition", LongType()), StructField("offset", LongType())])

    def write(offsets: list[int]) -> None:
        rows = pa.table({"partition": [0] * len(offsets), "offset": offsets})
        deltalake.write_deltalake(path, rows, mode="append")

    def offsets() -> list[int]:
        found = lake.arrow_at_positions(path, {}, [(0, o) for o in range(10)], schema)
        return sorted(found.column("offset").to_pylist())

    write([1, 2])
    first = lake.open_table(path, {})
    write([3])
    assert lake.open_table(path, {}) is first
    assert offsets() == [1, 2, 3]
    shutil.rmtree(path)
    write([7])  # made again: one commit, version 0
    assert lake.open_table(path, {}) is not first
    assert offsets() == [7]
