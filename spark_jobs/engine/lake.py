"""Delta table mechanics every layer shares."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import random
import shutil
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import unquote, urlparse

import deltalake
import pyarrow as pa
from delta.exceptions import (
    ConcurrentAppendException,
    ConcurrentDeleteDeleteException,
    ConcurrentDeleteReadException,
    ConcurrentTransactionException,
    ConcurrentWriteException,
    DeltaConcurrentModificationException,
)
from delta.tables import DeltaTable
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.streaming import DataStreamWriter, StreamingQuery
from pyspark.sql.types import StructType

from spark_jobs.engine import delta_checksum, session

log = logging.getLogger(__name__)
T = TypeVar("T")
# Listed one by one: in delta-spark 4 the raised (captured) classes do not share
# DeltaConcurrentModificationException as a base.
CONFLICTS = (
    ConcurrentAppendException,
    ConcurrentDeleteDeleteException,
    ConcurrentDeleteReadException,
    ConcurrentTransactionException,
    ConcurrentWriteException,
    DeltaConcurrentModificationException,
    # delta-rs's, when a commit it retried against newer ones still conflicts
    # (`Committer`).
    deltalake.exceptions.CommitFailedError,
)


# -- small files beside the tables (checkpoint markers, plans) -----------------------
# Through Hadoop's FileSystem, as Spark reaches checkpoints: the same code then
# works for a local lake and for s3a://. A Spark Connect client has no JVM of its
# own: it reaches a local lake's files directly (warehouse.ops.sessions hands it
# out for local lakes only).
def _fs(spark: SparkSession, path: str) -> tuple[Any, Any]:
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    hadoop_path = jvm.org.apache.hadoop.fs.Path(path)
    return hadoop_path, hadoop_path.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())


def _local(spark: SparkSession, path: str) -> Path | None:
    """The local file at `path` when `spark` is a Connect client; None for a JVM session."""
    if not session.is_connect(spark):
        return None
    if path.startswith("file:"):
        return Path(urlparse(path).path)
    if "://" in path:
        raise ValueError(f"a Spark Connect session reaches a local lake's files only, not {path}")
    return Path(path)


def _crc(local: Path) -> Path:
    """The checksum Hadoop's local file system keeps beside each file it writes. A
    file changed without it would fail Hadoop's next read (ChecksumException)."""
    return local.with_name(f".{local.name}.crc")


def list_names(spark: SparkSession, path: str) -> list[str]:
    """The names in a directory; none if it does not exist."""
    if (local := _local(spark, path)) is not None:
        if not local.is_dir():
            return []
        # As Hadoop lists them: without its checksum files.
        return sorted(
            p.name
            for p in local.iterdir()
            if not (p.name.startswith(".") and p.name.endswith(".crc"))
        )
    hadoop_path, fs = _fs(spark, path)
    if not fs.exists(hadoop_path):
        return []
    return [str(st.getPath().getName()) for st in fs.listStatus(hadoop_path)]


def read_text(spark: SparkSession, path: str) -> str | None:
    """A small file's text, or None if it does not exist."""
    if (local := _local(spark, path)) is not None:
        return local.read_text() if local.is_file() else None
    hadoop_path, fs = _fs(spark, path)
    if not fs.exists(hadoop_path):
        return None
    stream = fs.open(hadoop_path)
    try:
        jvm = spark.sparkContext._jvm
        assert jvm is not None
        return str(jvm.org.apache.commons.io.IOUtils.toString(stream, "UTF-8"))
    finally:
        stream.close()


def write_text(spark: SparkSession, path: str, text: str) -> None:
    """Replace a small file whole: readers see the old text or the new, never half."""
    if (local := _local(spark, path)) is not None:
        local.parent.mkdir(parents=True, exist_ok=True)
        tmp = local.with_name(local.name + ".tmp")
        tmp.write_text(text)
        _crc(local).unlink(missing_ok=True)
        os.replace(tmp, local)
        return
    hadoop_path, fs = _fs(spark, path)
    tmp, _ = _fs(spark, path + ".tmp")
    out = fs.create(tmp, True)
    try:
        out.write(bytearray(text.encode()))
    finally:
        out.close()
    fs.delete(hadoop_path, False)
    if not fs.rename(tmp, hadoop_path):
        raise OSError(f"could not write {path}")


def modified_at(spark: SparkSession, path: str) -> float | None:
    """A file's modification time (seconds since the epoch), or None if it does not exist."""
    if (local := _local(spark, path)) is not None:
        return local.stat().st_mtime if local.exists() else None
    hadoop_path, fs = _fs(spark, path)
    if not fs.exists(hadoop_path):
        return None
    return float(fs.getFileStatus(hadoop_path).getModificationTime()) / 1000


def exists(spark: SparkSession, path: str) -> bool:
    """Whether a file or directory exists."""
    if (local := _local(spark, path)) is not None:
        return local.exists()
    hadoop_path, fs = _fs(spark, path)
    return bool(fs.exists(hadoop_path))


def delete_tree(spark: SparkSession, path: str) -> None:
    """Remove a directory and everything under it; nothing if it does not exist."""
    if (local := _local(spark, path)) is not None:
        if local.is_dir():
            shutil.rmtree(local)
        else:
            local.unlink(missing_ok=True)
            _crc(local).unlink(missing_ok=True)
        return
    hadoop_path, fs = _fs(spark, path)
    if fs.exists(hadoop_path):
        fs.delete(hadoop_path, True)


def move(spark: SparkSession, src: str, dest: str) -> None:
    """Move a directory (a rename locally; a copy and delete on an object store)."""
    if (local := _local(spark, src)) is not None:
        target = _local(spark, dest)
        assert target is not None
        if not local.exists():
            raise FileNotFoundError(f"cannot move {src}: it does not exist")
        target.parent.mkdir(parents=True, exist_ok=True)
        os.rename(local, target)
        return
    source, fs = _fs(spark, src)
    target_path, _ = _fs(spark, dest)
    if not fs.exists(source):
        raise FileNotFoundError(f"cannot move {src}: it does not exist")
    fs.mkdirs(target_path.getParent())
    if not fs.rename(source, target_path):
        raise OSError(f"could not move {src} to {dest}")


def checkpoint_has_progress(spark: SparkSession, checkpoint: str) -> bool:
    """Whether a streaming query planned a batch in this checkpoint (so it resumes there)."""
    return any(name.isdigit() for name in list_names(spark, checkpoint + "/offsets"))


def checkpoint_app_id(spark: SparkSession, checkpoint: str, prefix: str) -> str:
    """The Delta txnAppId of one streaming checkpoint: new when the checkpoint is new.

    A fixed id would make a fresh checkpoint (batch ids from 0 again) skip every
    write as "already committed", so the id lives inside the checkpoint.
    """
    marker = checkpoint + "/regauge_txn_app_id"
    known = (read_text(spark, marker) or "").strip()
    if not known:
        known = f"{prefix}-{uuid.uuid4()}"
        write_text(spark, marker, known + "\n")
    return known


# The columns a change-feed row carries besides the table's own.
CDF_COLUMNS = ("_change_type", "_commit_version", "_commit_timestamp")


def table_ref(path: str) -> str:
    """A Delta table by path in SQL: delta.`path`, with any backtick in it doubled."""
    return "delta.`{}`".format(path.replace("`", "``"))


def history(spark: SparkSession, path: str, limit: int | None = None) -> DataFrame:
    """The table's commits, newest first (DESCRIBE HISTORY: SQL, so a Spark Connect
    client gets it too; DeltaTable's Connect plugin is not served here)."""
    return spark.sql(
        f"DESCRIBE HISTORY {table_ref(path)}" + (f" LIMIT {int(limit)}" if limit else "")
    )


def newest_version(spark: SparkSession, path: str) -> int:
    """The Delta table's newest commit version.

    Read from the table's log through Delta's JVM API where this process has the
    JVM: DESCRIBE HISTORY is 2 to 5 Spark jobs and about 250 ms on an idle 2-core
    machine, the log's listing about 20 ms and mostly no job (one where the newest
    commit has no checksum file to read the table's metadata from). A live view's
    publisher asks it every micro-batch. A Spark Connect client (and a path with
    no table, which DESCRIBE HISTORY refuses with its reason) asks Spark."""
    if not session.is_connect(spark):
        version = int(snapshot(spark, path).version())
        if version >= 0:
            return version
    (last,) = history(spark, path, 1).select("version").collect()
    return int(last["version"])


def snapshot(spark: SparkSession, path: str) -> Any:
    """The table's newest snapshot, through Delta's JVM API: its file count, id and
    properties without a Spark job (DESCRIBE DETAIL takes a second)."""
    jvm = spark._jvm
    assert jvm is not None
    return delta_log(spark, path).update(False, jvm.scala.Option.empty(), jvm.scala.Option.empty())


def delta_log(spark: SparkSession, path: str) -> Any:
    """The table's DeltaLog, through Delta's JVM API (in the driver's JVM only)."""
    jvm = spark._jvm
    assert jvm is not None
    return jvm.org.apache.spark.sql.delta.DeltaLog.forTable(spark._jsparkSession, path)


def start_stream(
    writer: DataStreamWriter, available_now: bool, trigger: str, guard: BatchGuard | None = None
) -> StreamingQuery:
    """Start a streaming query: until caught up (`available_now`), or every `trigger`.
    With `guard` (the one its foreachBatch function runs under), `stop_stream` lets
    the query's running micro-batch finish before stopping it."""
    if available_now:
        query = writer.trigger(availableNow=True).start()
    else:
        query = writer.trigger(processingTime=trigger).start()
    if guard is not None:
        _GUARDS[str(query.runId)] = guard
    return query


class StreamStopping(RuntimeError):
    """A micro-batch that began while its query was being stopped: it writes nothing,
    and the query's next start runs it again from its checkpoint."""


class BatchGuard:
    """Lets a query's stop wait for its running micro-batch instead of cutting it.

    `StreamingQuery.stop` interrupts a running batch: its commits so far stay, the
    rest waits for the next start (every write is under the batch's transaction id,
    so the retry is exact). Until then the lake is half-settled: bronze holds
    records silver does not account for, and the audit reports them (seen after
    `make bench` stopped ingest). A foreachBatch function run under the guard holds
    its lock; `stop` takes the lock first, so it waits for the batch, and a batch
    that begins during the stop raises before writing anything, rather than
    waiting for a lock the stop holds while it waits for the batch's thread.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()

    def wrap(
        self, each_batch: Callable[[DataFrame, int], None]
    ) -> Callable[[DataFrame, int], None]:
        def guarded(batch: DataFrame, batch_id: int) -> None:
            if not self._lock.acquire(blocking=False):
                raise StreamStopping(f"batch {batch_id} began while its query was stopping")
            try:
                each_batch(batch, batch_id)
            finally:
                self._lock.release()

        return guarded

    def stop(self, query: StreamingQuery, wait_s: float) -> bool:
        """Stop `query` once its running batch is done, or after `wait_s` whatever it is
        doing; True if no batch was cut."""
        between = self._lock.acquire(timeout=wait_s)
        try:
            query.stop()
        finally:
            if between:
                self._lock.release()
        return between


# Each guarded query's guard, by run id, until `stop_stream`.
_GUARDS: dict[str, BatchGuard] = {}

# How long a stop waits for a guarded query's running micro-batch: under the bench's
# load an ingest batch took 20-40 s on 2 cores (250,000 records, the most one takes
# locally), a live view batch 10-40 s. The view host stops its queries at once,
# within its SIGTERM budget (`daemon.STOP_WAIT_S`).
STOP_WAIT_S = 60.0


def stop_stream(query: StreamingQuery, wait_s: float = STOP_WAIT_S) -> bool:
    """Stop a query `start_stream` started, after its running micro-batch if it was
    guarded and the batch ends within `wait_s`; True if no batch was cut (a cut one
    is logged). Safe to call on a query that has ended, whose guard it drops."""
    guard = _GUARDS.pop(str(query.runId), None)
    if not query.isActive:
        return True
    if guard is None:
        query.stop()
        return True
    if guard.stop(query, wait_s):
        return True
    log.warning(
        "%s stopped in the middle of a batch after %.0f s: its next start finishes the "
        "batch exactly (its writes are under the batch's transaction id)",
        query.name,
        wait_s,
    )
    return False


def txn_version(spark: SparkSession, path: str, app_id: str) -> int | None:
    """The last txnVersion the table committed under `app_id` (None: none yet): what
    an append under that id compares itself with (`append_once`), from the newest
    snapshot's checksum where it holds the ids, else from its state."""
    newest = snapshot(spark, path)
    known = _checksum_txns(newest)
    if known is not None:
        return known.get(app_id)
    found = newest.transactions().get(app_id)
    return int(found.get()) if found.isDefined() else None


def committed(spark: SparkSession, path: str, app_id: str, version: int) -> bool:
    """Whether the table committed (`app_id`, `version`) or a later version of that id."""
    last = txn_version(spark, path, app_id)
    return last is not None and last >= version


def _checksum_txns(snap: Any) -> dict[str, int] | None:
    """Each transaction id's last committed version, from the checksum file of the
    snapshot's version; None where there is none, or it does not hold the ids."""
    checksum = snap.checksumOpt()
    if checksum.isEmpty() or checksum.get().setTransactions().isEmpty():
        return None
    found: dict[str, int] = {}
    marks = checksum.get().setTransactions().get().iterator()
    while marks.hasNext():
        mark = marks.next()
        found[str(mark.appId())] = int(mark.version())
    return found


def write_checkpoint(spark: SparkSession, path: str) -> int:
    """Write a checkpoint of the table's newest version; that version."""
    return checkpoint_newest(spark, path)[0]


def checkpoint_newest(spark: SparkSession, path: str) -> tuple[int, int]:
    """Write a checkpoint of the table's newest version; that version and its
    number of data files (read from the same snapshot: no second log read)."""
    jvm = spark._jvm
    assert jvm is not None
    newest = snapshot(spark, path)
    newest.deltaLog().checkpoint(newest, jvm.scala.Option.empty())
    return int(newest.version()), int(newest.numOfFiles())


def unnamed_files(spark: SparkSession, path: str, before_ms: float | None = None) -> int:
    """How many files in the table's folder (its log aside) its newest version does
    not name, of those last modified before `before_ms` (epoch ms; any time if None).

    VACUUM deletes only such files older than its retention (by their modification
    time, whatever the log says of them): none of them means it would delete none.
    A file written after the snapshot is read counts too (the caller vacuums then)."""
    names = DataFrame(snapshot(spark, path).allFiles().toDF(), spark).select("path").collect()
    # The log's paths are relative and URI-encoded (a partition value's ':' is %3A).
    named = {unquote(r[0]) for r in names}
    hadoop_path, fs = _fs(spark, path)
    root = hadoop_path.toUri().getPath().rstrip("/") + "/"
    files = fs.listFiles(hadoop_path, True)
    unnamed = 0
    while files.hasNext():
        status = files.next()
        found = status.getPath()
        name, relative = found.getName(), found.toUri().getPath()[len(root) :]
        if relative.startswith("_delta_log/") or (name.startswith(".") and name.endswith(".crc")):
            continue
        if before_ms is None or status.getModificationTime() < before_ms:
            unnamed += relative not in named
    return unnamed


def append_once(df: DataFrame, path: str, app_id: str, version: int) -> None:
    """Append, unless this (app_id, version) already committed to the table: a
    micro-batch retried after a crash skips the appends it made before.

    The commit carries Delta's SetTransaction for (app_id, version), as the
    writer's txnAppId/txnVersion options make it, and a commit by another
    writer under the same id in between fails it. Skipped versions leave gaps,
    which Delta allows: a version is only compared with the last one committed.
    Writer options rather than the session-wide txn confs, where the writer
    runs: the view queries share the session and must not pick them up.

    `df` must not read the table it appends to: the append is blind (no read
    of the table can conflict with it), and callers materialise their rows
    first (`localCheckpoint`).
    """
    if _append_by_checksum(df, path, app_id, version) is None:
        append_by_writer(df, path, app_id, version)


def append_live(
    df: DataFrame,
    path: str,
    app_id: str,
    version: int,
    writer: Committer | None,
    what: str,
    rows: pa.Table | None = None,
) -> int | None:
    """`append_once`, by delta-rs where `writer` (the table's `Committer`, a live
    batch's on a local lake) is given: the rows come to the driver in one job and
    delta-rs commits them under the same transaction id, in a few hundredths, where
    Spark's write and commit took 0.5-0.8 s of every live batch for each table
    (bronze, the ledger; docs/BENCHMARKS.md, issue 67). Spark's append if delta-rs
    refuses. A Spark append after delta-rs's reads the ids from the checksum the
    `Committer` writes; where that version has none (the chain of them broke
    beyond `delta_checksum.CATCH_UP`), Spark rebuilds the table's state to find them.

    `rows`: `df` as Arrow, if the caller has them on the driver already.

    The version delta-rs committed; None if Spark appended, or nothing was (the
    id had committed already)."""
    if writer is not None:
        done = writer.txn_version(app_id)
        if done is not None and done >= version:
            return None  # a retry: appended already, so no job to bring the rows over
        table = df.toArrow() if rows is None else rows
        tag = df.sparkSession.conf.get(USER_METADATA, None)
        try:
            return retry_on_conflict(
                lambda: writer.append(table, txn=(app_id, version), user_metadata=tag or None),
                what,
            )
        except MergeRefused as exc:
            log.warning("%s: delta-rs could not append (%s); appending with Spark", what, exc)
    append_once(df, path, app_id, version)
    return None


def append_by_writer(df: DataFrame, path: str, app_id: str, version: int) -> None:
    """`append_once` through Delta's writer, whose check rebuilds the table's state."""
    (
        df.write.format("delta")
        .mode("append")
        .option("txnAppId", app_id)
        .option("txnVersion", version)
        .save(path)
    )


# Delta's writer asks the newest snapshot which version `app_id` committed last.
# delta-spark 4.4 answers only by rebuilding the snapshot's whole state (3 Spark
# jobs), and every commit makes a new snapshot, so every append paid for it, three
# or four times per ingest batch: 1.0-1.1 s an append against 0.4 s with the ids
# read from the checksum file Delta writes with each commit, which holds them too
# (setTransactionsInCrc.writeOnCommit, on by default). Alone on 2 cores, warm
# (docs/BENCHMARKS.md).
def _append_by_checksum(df: DataFrame, path: str, app_id: str, version: int) -> bool | None:
    """The append through Delta's transaction API, the committed version of `app_id`
    read from the snapshot's checksum: True if it committed, False if (app_id,
    version) had committed already. None, having done nothing, where the checksum
    cannot say (no checksum, or no transaction ids in it), where the rows' columns
    differ from the table's (the writer's schema checks then apply), or for a
    Spark Connect client."""
    spark = df.sparkSession
    if session.is_connect(spark):
        return None
    jvm = spark._jvm
    assert jvm is not None
    # PySpark's own handle on the JVM's active session (its name has a dot inside).
    sessions = getattr(jvm, "org.apache.spark.sql.classic.SparkSession")
    before = sessions.getActiveSession()
    # A transaction takes its settings (the commit's userMetadata, say) from the
    # thread's active session; the writer runs with the rows' session active.
    sessions.setActiveSession(spark._jsparkSession)
    try:
        txn = delta_log(spark, path).startTransaction()
        known = _checksum_txns(txn.snapshot())
        if known is None:
            if path not in _WRITER_APPENDS:
                _WRITER_APPENDS.add(path)
                log.info(
                    "%s: the newest checksum holds no transaction ids (more than Delta "
                    "keeps there, or no checksum); its appends rebuild its state",
                    path,
                )
            return None
        table = StructType.fromJson(json.loads(txn.metadata().schema().json()))
        if _columns(table) != _columns(df.schema):
            return None
        # What the writer's check records: a commit under the same id after this
        # snapshot makes this one fail (ConcurrentTransactionException).
        txn.readTxn().append(app_id)
        if known.get(app_id, -1) >= version:
            return False
        files = txn.writeFiles(df._jdf)
        mark = jvm.org.apache.spark.sql.delta.actions.SetTransaction(
            app_id, version, jvm.scala.Some(int(time.time() * 1000))
        )
        none = jvm.scala.Option.empty()
        operation = jvm.org.apache.spark.sql.delta.DeltaOperations.Write(
            jvm.org.apache.spark.sql.SaveMode.Append,
            # The writer records the partitionBy it was given, none: an empty Seq.
            jvm.scala.Some(txn.metadata().partitionColumns().take(0)),
            *[none] * 7,
        )
        txn.commit(files.appended(mark), operation)
        return True
    finally:
        if before.isDefined():
            sessions.setActiveSession(before.get())
        else:
            sessions.clearActiveSession()


# Tables whose appends went through the writer for want of ids in the checksum
# (said once each): Delta keeps at most 100 ids there.
_WRITER_APPENDS: set[str] = set()


def _columns(schema: StructType) -> list[tuple[str, str]]:
    """Names and types, nullability aside: Delta's own checks enforce NOT NULL."""
    return [(f.name, f.dataType.simpleString()) for f in schema.fields]


def read_version(spark: SparkSession, path: str, version: int | None = None) -> DataFrame:
    """A Delta table as of a version (None: its newest)."""
    reader = spark.read.format("delta")
    if version is not None:
        reader = reader.option("versionAsOf", version)
    return reader.load(path)


def ensure_table(
    spark: SparkSession,
    path: str,
    schema: StructType,
    properties: dict[str, str] | None = None,
    partitioned_by: tuple[str, ...] = (),
) -> None:
    """Create the Delta table at `path` (with its first commit) if it does not exist yet.

    Safe when several writers start at once (view queries share gold.restatements):
    createIfNotExists is not atomic, and the loser of the race fails, for example
    with DELTA_CREATE_TABLE_WITH_NON_EMPTY_LOCATION. A table that exists after the
    failure is the winner's, created from the same schema; otherwise try again."""
    builder = DeltaTable.createIfNotExists(spark).location(path).addColumns(schema)
    if partitioned_by:
        builder = builder.partitionedBy(*partitioned_by)
    for key, value in (properties or {}).items():
        builder = builder.property(key, value)
    attempts = 5
    for attempt in range(1, attempts + 1):
        try:
            builder.execute()
            return
        except Exception as exc:  # whatever the race raised, the check below decides
            if DeltaTable.isDeltaTable(spark, path):
                log.info("%s was created by a concurrent writer (%s)", path, type(exc).__name__)
                return
            if attempt == attempts:
                raise
            time.sleep(0.5 * attempt + random.random())


def ensure_columns(spark: SparkSession, path: str, schema: StructType) -> list[str]:
    """Add to the table at `path` the columns of `schema` it lacks (a contract that
    gained a field: docs/contract.md §10), each after the column `schema` puts before it;
    returns their names. Adding a column is a metadata commit: no file is rewritten,
    and rows already there read null, which is what they held."""
    have = {f.name for f in spark.read.format("delta").load(path).schema.fields}
    added = []
    for i, f in enumerate(schema.fields):
        if f.name in have:
            continue
        place = f"AFTER `{schema.fields[i - 1].name}`" if i else "FIRST"
        kind = f.dataType.simpleString()
        spark.sql(f"ALTER TABLE delta.`{path}` ADD COLUMNS (`{f.name}` {kind} {place})")
        log.info("%s: added column %s %s", path, f.name, kind)
        have.add(f.name)
        added.append(f.name)
    return added


def ensure_properties(spark: SparkSession, path: str, properties: dict[str, str]) -> None:
    """Set those of `properties` the table at `path` does not have as given."""
    found = table_properties(spark, path)
    wrong = {k: v for k, v in properties.items() if found.get(k) != v}
    if wrong:
        pairs = ", ".join(f"'{k}' = '{v}'" for k, v in sorted(wrong.items()))
        spark.sql(f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES ({pairs})")
        log.info("%s: set %s", path, pairs)


def table_properties(spark: SparkSession, path: str) -> dict[str, str]:
    """The table's properties (its metadata's configuration), in SQL, which works
    over Spark Connect too."""
    row = spark.sql(f"DESCRIBE DETAIL delta.`{path}`").select("properties").first()
    return dict(row["properties"] or {}) if row is not None else {}


def merge_condition(key: tuple[str, ...] | list[str]) -> str:
    """`t.a = s.a AND t.b = s.b`: a MERGE's match on key columns, target `t`, source `s`."""
    return " AND ".join(f"t.{k} = s.{k}" for k in key)


# Ranges of offsets per partition in `at_positions`: Delta checks each against
# every file's statistics, so their count bounds the planning cost.
MAX_RANGES = 64


def at_positions(table: DataFrame, positions: list[tuple[int, int]]) -> DataFrame:
    """The rows of a table with `partition` and `offset` (bronze, the ledger) at these
    positions. Both are appended in log order, so each file holds narrow offset
    ranges; the filter names the positions' offsets as ranges, which Delta's data
    skipping compares with each file's minimum and maximum, so only files that can
    hold them are read. (An IN list alone would skip by its one minimum and maximum.)

    One SQL string, parsed once: a Column per literal (`isin`) was a call into the JVM
    each, about a second for a live batch's 20,000 winners (`silver._settle`)."""
    if not positions:
        return table.where(F.lit(False))
    exact = " OR ".join(
        f"(`partition` = {int(partition)} AND `offset` IN ({', '.join(map(str, offsets))}))"
        for partition, offsets in _by_partition(positions).items()
    )
    return table.where(F.expr(f"({positions_condition(positions)}) AND ({exact})"))


def positions_condition(
    positions: list[tuple[int, int]], alias: str = "", *, quote: str = "`"
) -> str:
    """SQL that holds for every one of these positions and few others (`at_positions`):
    per partition, at most MAX_RANGES ranges of offsets. In a MERGE's condition, on
    the target (`alias`), Delta skips the target's files outside them too. `quote`:
    how the dialect quotes a name (Spark's backtick, DataFusion's double quote)."""
    if not positions:
        return "false"
    # Quoted: both are SQL keywords, parsed as names only while Spark does not
    # enforce reserved words.
    prefix = f"{alias}." if alias else ""
    partition_col, offset_col = (
        f"{prefix}{quote}{name}{quote}" for name in ("partition", "offset")
    )
    return " OR ".join(
        f"({partition_col} = {int(partition)} AND ("
        + " OR ".join(
            f"{offset_col} BETWEEN {int(lo)} AND {int(hi)}"
            for lo, hi in offset_ranges(offsets, MAX_RANGES)
        )
        + "))"
        for partition, offsets in _by_partition(positions).items()
    )


def read_at_positions(
    spark: SparkSession,
    where: str,
    options: dict[str, str],
    positions: list[tuple[int, int]],
    schema: StructType,
) -> DataFrame:
    """`at_positions` read by delta-rs instead of Spark, for a few rows of a table that
    commits every batch (the ledger): Spark would rebuild the table's snapshot state
    for each new version to skip its files, about 1.8 CPU-s and 8 jobs a batch on a
    2-core machine; delta-rs reads the log and skips files by the same statistics in a
    few hundredths (docs/BENCHMARKS.md, issue 67). `where` and `options`:
    `Settings.delta_rs`. The rows come back as a local DataFrame of `schema`'s columns
    (a subset of the table's is fine)."""
    if not positions:
        return spark.createDataFrame([], schema)
    return spark.createDataFrame(arrow_at_positions(where, options, positions, schema), schema)


def arrow_at_positions(
    where: str,
    options: dict[str, str],
    positions: list[tuple[int, int]],
    schema: StructType,
) -> pa.Table:
    """`read_at_positions`'s rows as Arrow, read by delta-rs (DataFusion), no Spark."""
    exact = " OR ".join(
        f'("partition" = {int(partition)} AND "offset" IN ({", ".join(map(str, offsets))}))'
        for partition, offsets in _by_partition(positions).items()
    )
    # The ranges are what DataFusion prunes files by (their statistics in the log);
    # the IN lists pick the rows.
    ranges = positions_condition(positions, quote='"') if positions else "false"
    return _arrow_where(open_table(where, options), schema, f"({ranges}) AND ({exact or 'false'})")


# Local tables read at positions by the live path, kept open (`open_table`), each
# with the identity of the commit file of the version it was read at (`_log_identity`).
_OPEN: dict[str, tuple[tuple[int, int, int] | None, deltalake.DeltaTable]] = {}
_OPEN_LOCK = threading.Lock()


def _log_identity(where: str, version: int) -> tuple[int, int, int] | None:
    """The version, and the inode and modification time of its commit file: a table
    made again at the same path has another file there, or none."""
    try:
        found = os.stat(os.path.join(where, "_delta_log", f"{version:020d}.json"))
    except FileNotFoundError:
        return None
    return (version, found.st_ino, found.st_mtime_ns)


def _kept_current(
    where: str, kept: tuple[tuple[int, int, int] | None, deltalake.DeltaTable] | None
) -> tuple[tuple[int, int, int] | None, deltalake.DeltaTable]:
    """A kept table (`kept`: the identity of the version it was last read at, and
    the table) brought to the newest commit, or the table opened anew where it was
    made again at the same path since. (A commit through the table moves its
    version on; the identity names the version read, whose file does not change.)"""
    if kept is not None and kept[0] is not None and kept[0] == _log_identity(where, kept[0][0]):
        table = kept[1]
        table.update_incremental()
    else:
        table = deltalake.DeltaTable(where)
    return _log_identity(where, int(table.version())), table


def open_table(where: str, options: dict[str, str]) -> deltalake.DeltaTable:
    """The table at `where` as of its newest commit, read by delta-rs. A local table
    is kept open between calls, as `Committer` keeps silver: each call takes in only
    the commits since the last, where opening it reads its checkpoint and every
    commit after it (bronze, the ledger and the quarantine, read at positions by
    every live batch, checkpoint every 10 or 100 commits).

    A table made again at the same path is opened anew: the commit file of the
    version last read is another file then, or gone (`_log_identity`). Tables on
    S3 are opened each time."""
    if options or not where.startswith("/"):
        return deltalake.DeltaTable(where, storage_options=options or None)
    with _OPEN_LOCK:
        _OPEN[where] = _kept_current(where, _OPEN.get(where))
        return _OPEN[where][1]


def _arrow_where(delta: deltalake.DeltaTable, schema: StructType, condition: str) -> pa.Table:
    """`schema`'s columns of the rows of `table` that meet `condition` (DataFusion
    SQL), which prunes partitions and files by it."""
    names = ", ".join(f'"{f.name}"' for f in schema.fields)
    reader = (
        deltalake.QueryBuilder()
        .register("t", delta)
        .execute(f"SELECT {names} FROM t WHERE {condition}")
    )
    # DataFusion answers in view types (Utf8View), which Spark's Arrow reader lacks.
    # Timestamps as instants in UTC, as Delta stores them.
    arrow = to_arrow_schema(schema, timezone="UTC")
    table = pa.table(reader).cast(arrow)
    # No rows come back as columns of no chunks, which Spark's reader refuses.
    return table if table.num_rows else arrow.empty_table()


def read_where(
    spark: SparkSession, where: str, options: dict[str, str], version: int, condition: str
) -> DataFrame:
    """The rows of a table as of `version` that meet `condition` (DataFusion SQL), read
    by delta-rs into a local DataFrame of the table's own schema: for the few rows a
    live batch names in a table that commits every batch (silver). Spark would build
    the snapshot of a version that is no longer the newest (its state, from the log)
    and run a job to pick its files, for each scan of it (docs/design/
    issue-67-delta-scan-study.md); delta-rs reads the log and prunes by partition and
    statistics in about 10 ms. `where` and `options`: `Settings.delta_rs`."""
    table = deltalake.DeltaTable(where, version=version, storage_options=options or None)
    # Delta keeps the schema as Spark's own JSON: the same types and nullability as
    # Spark's read of the table.
    schema = StructType.fromJson(json.loads(table.schema().to_json()))
    return spark.createDataFrame(_arrow_where(table, schema, condition), schema)


# Commits to one local table, by delta-rs and by Spark, one at a time within this
# process (the view host runs every live stream). Spark's log store writes a commit
# on a local file system by checking that its version's file does not exist, then
# renaming onto it: safe against Spark's other commits in the JVM, which Delta
# serialises per table, but not against delta-rs's, which could land in between
# and be replaced. delta-rs never replaces a commit file (its rename refuses an
# existing one), so it is Spark's commits that must not overlap with it. Spark
# writers in other processes (maintenance) are not covered: docs/architecture.md.
_COMMIT_LOCKS: dict[str, threading.Lock] = {}
_COMMIT_LOCKS_GUARD = threading.Lock()


def _table_key(path: str) -> str:
    if "://" in path and not path.startswith("file:"):
        return path
    return os.path.normpath(urlparse(path).path if path.startswith("file:") else path)


@contextlib.contextmanager
def committing(path: str) -> Iterator[None]:
    """Hold the table's commit lock in this process (see _COMMIT_LOCKS): around a
    Spark commit to a table delta-rs also commits to, and each of delta-rs's."""
    key = _table_key(path)
    with _COMMIT_LOCKS_GUARD:
        lock = _COMMIT_LOCKS.setdefault(key, threading.Lock())
    with lock:
        yield


def _no_retry_mends(exc: deltalake.exceptions.CommitFailedError) -> bool:
    """delta-rs raises CommitFailedError for a conflict, and also for a table it
    cannot write (a table feature it does not support), which no retry mends: that
    one is a refusal, for Spark to commit instead."""
    text = str(exc).lower()
    return "unsupported" in text or "features" in text


class MergeRefused(Exception):
    """delta-rs could not make a merge or an append, for a reason other than a
    conflicting commit (`Committer`): Spark can do it. Mostly nothing was committed;
    an error in delta-rs's steps after its commit (its checkpoint) comes here too,
    which each caller's Spark path survives: it skips a transaction id committed
    already, or repeats a merge that changes nothing the second time."""


class Committer:
    """A table a live stream commits small MERGEs (gold, silver's replaced winners) or
    appends (restatements) to with delta-rs, not Spark: a few rows each batch, where
    Spark's MERGE costs 4 or 5 jobs, and each Spark commit builds the new snapshot's
    state from the log
    (docs/design/issue-67-design-b-delta-rs.md).
    Kept open between batches: each read of the log takes in only the commits
    since the last one, and the live path asks it the newest version and the
    transaction ids. Each commit also gets Delta's checksum file, as Spark's do
    (`delta_checksum`), so Spark reads the table's protocol, metadata and ids from
    it rather than with jobs over the log.

    Local tables only: on S3, Spark's log store writes a commit without the
    conditional put delta-rs relies on, so a Spark commit (maintenance) could
    overwrite one of delta-rs's. `where` and `options`: `Settings.delta_rs`."""

    def __init__(self, where: str, options: dict[str, str]) -> None:
        self.where, self.options = where, options
        self._table: deltalake.DeltaTable | None = None
        self._identity: tuple[int, int, int] | None = None

    def table(self) -> deltalake.DeltaTable:
        """The table as of its newest commit; opened anew if it was made again at the
        same path (`_kept_current`), where its kept state would be another table's."""
        if self.options:
            if self._table is None:
                self._table = deltalake.DeltaTable(self.where, storage_options=self.options)
            else:
                self._table.update_incremental()
            return self._table
        kept = None if self._table is None else (self._identity, self._table)
        self._identity, self._table = _kept_current(self.where, kept)
        return self._table

    def version(self) -> int:
        return int(self.table().version())

    def txn_version(self, app_id: str) -> int | None:
        """As `txn_version`: the last version committed under `app_id`, or None."""
        found = self.table().transaction_version(app_id)
        return None if found is None else int(found)

    def read_where(self, spark: SparkSession, version: int, condition: str) -> DataFrame:
        return read_where(spark, self.where, self.options, version, condition)

    def merge(
        self,
        source: pa.Table,
        condition: str,
        *,
        columns: list[str],
        delete_when: str | None,
        update_when: str | None,
        insert_when: str,
        txn: tuple[str, int] | None,
        user_metadata: str | None,
        expected: int | None = None,
    ) -> int | None:
        """MERGE `source` (target `t`, source `s`; DataFusion SQL; a None clause is
        left out) as one commit that
        records `txn` (app id, version; None: none, for a merge safe to repeat) and
        `user_metadata` as Spark's session setting would (USER_METADATA); the version
        committed, None if it changed no row (delta-rs then makes no commit, and
        records no txn). With `expected`,
        a table whose newest version is another is a conflict (CommitFailedError):
        for a source made from the table as of that version, not safe to apply to
        a newer one (a fold)."""
        table = self.table()
        before = table.version()
        if expected is not None and before != expected:
            raise deltalake.exceptions.CommitFailedError(
                f"{self.where}: version {before} was committed after version {expected}, "
                "which the merge's rows were read from"
            )
        values = {c: f"s.`{c}`" for c in columns}
        properties = deltalake.CommitProperties(
            app_transactions=None if txn is None else [deltalake.Transaction(*txn)],
            custom_metadata=None if user_metadata is None else {"userMetadata": user_metadata},
        )

        def run() -> Any:
            merger = table.merge(
                source,
                predicate=condition,
                source_alias="s",
                target_alias="t",
                # Materialised source: delta-rs then also narrows the table's files by
                # the source's own bounds on the key.
                streamed_exec=False,
                commit_properties=properties,
            )
            if delete_when is not None:
                merger = merger.when_matched_delete(predicate=delete_when)
            if update_when is not None:
                merger = merger.when_matched_update(updates=values, predicate=update_when)
            return merger.when_not_matched_insert(updates=values, predicate=insert_when).execute()

        self._commit(run)
        # The merge leaves the table at its own commit (a newer one by another
        # writer is read at the next call).
        after = int(table.version())
        return None if after == before else after

    def append(
        self, rows: pa.Table, *, txn: tuple[str, int], user_metadata: str | None
    ) -> int | None:
        """Append `rows` as one commit that records `txn` (app id, version) and
        `user_metadata`, as `append_once` does with Spark: the version committed, or
        None if `txn` had committed already (nothing is written then). delta-rs
        commits it after another writer's append, at the next version; a commit
        that deleted rows since the table was read is a conflict (CommitFailedError:
        `retry_on_conflict` reads the table again). An error of delta-rs's that no
        retry mends is MergeRefused."""
        table = self.table()
        app_id, version = txn
        done = table.transaction_version(app_id)
        if done is not None and int(done) >= version:
            return None
        properties = deltalake.CommitProperties(
            app_transactions=[deltalake.Transaction(app_id, version)],
            custom_metadata=None if user_metadata is None else {"userMetadata": user_metadata},
        )
        self._commit(
            lambda: deltalake.write_deltalake(
                table, rows, mode="append", commit_properties=properties
            )
        )
        return int(table.version())

    def _commit(self, write: Callable[[], Any]) -> None:
        """Run delta-rs's `write` under the table's commit lock (`committing`): a
        conflict raises CommitFailedError, any other error MergeRefused."""
        with committing(self.where):
            before = None if self._table is None else int(self._table.version())
            try:
                write()
            except deltalake.exceptions.CommitFailedError as exc:
                if _no_retry_mends(exc):
                    raise MergeRefused(str(exc).split("\n", 1)[0]) from exc
                raise
            # Arrow's and delta-rs's own errors for rows it cannot write (a type it
            # cannot cast): Spark's path then takes the batch, where raising would stop
            # ingest on it, retried with the same rows.
            except (deltalake.exceptions.DeltaError, pa.ArrowException, ValueError) as exc:
                raise MergeRefused(str(exc).split("\n", 1)[0] or type(exc).__name__) from exc
            finally:
                # Also after an error: the checkpoint after a commit may be what failed.
                self._checkpoint_checksum_dropped()
            self._checksum_written(before)

    def _checksum_written(self, before: int | None) -> None:
        """Write Delta's checksum of the version just committed (`delta_checksum`),
        so that Spark builds its snapshot without jobs over the log, and its next
        commit derives its own checksum from this one instead of rebuilding the
        table's state. A checksum not written costs only that: it never fails the
        commit."""
        root = self._local_root()
        if root is None or self._table is None:
            return
        after = int(self._table.version())
        if before is not None and after <= before:
            return  # no commit (a merge that changed nothing)
        try:
            table_id = str(self._table.metadata().id)
            delta_checksum.write_after_commit(root / "_delta_log", after, table_id)
        # Whatever goes wrong here (a disk full, a file not as expected) must not
        # fail a commit that landed: the next commit catches up, or Spark reads the
        # log as it did before checksums were written.
        except Exception as exc:
            log.warning("%s: no checksum written for version %d (%s)", self.where, after, exc)

    def _local_root(self) -> Path | None:
        if "://" in self.where and not self.where.startswith("file:"):
            return None
        return Path(urlparse(self.where).path if "://" in self.where else self.where)

    def _checkpoint_checksum_dropped(self) -> None:
        """delta-rs rewrites `_last_checkpoint` at each checkpoint it writes, but not
        the checksum Hadoop's local file system keeps beside it (`_crc`), where
        Spark wrote the file before: Spark's next read of it would then fail
        (ChecksumException) and fall back to listing the log after three tries a
        second apart. Without a checksum, Hadoop reads the file as it is (so dropping
        one that still matches, Spark's own, costs nothing)."""
        root = self._local_root()
        if root is None:
            return
        with contextlib.suppress(FileNotFoundError):
            _crc(root / "_delta_log" / "_last_checkpoint").unlink()


def _by_partition(positions: list[tuple[int, int]]) -> dict[int, list[int]]:
    offsets: dict[int, list[int]] = {}
    for partition, offset in sorted(positions):
        offsets.setdefault(partition, []).append(offset)
    return offsets


def offset_ranges(offsets: list[int], most: int) -> list[tuple[int, int]]:
    """At most `most` ranges covering every offset, split at the largest gaps (runs of
    consecutive offsets stay one range)."""
    ordered = sorted(set(offsets))
    gaps = sorted(
        (i for i in range(1, len(ordered)) if ordered[i] - ordered[i - 1] > 1),
        key=lambda i: ordered[i] - ordered[i - 1],
    )
    keep = min(most - 1, len(gaps))
    cuts = sorted(gaps[len(gaps) - keep :]) if keep > 0 else []
    starts = [0, *cuts]
    ends = [*cuts, len(ordered)]
    return [(ordered[a], ordered[b - 1]) for a, b in zip(starts, ends, strict=True)]


_MATERIALIZE_SOURCE = "spark.databricks.delta.merge.materializeSource"


@contextlib.contextmanager
def session_conf(spark: SparkSession, conf: dict[str, str]) -> Iterator[None]:
    """Session settings for the statements inside, as they were again on the way out."""
    saved = {k: spark.conf.get(k, None) for k in conf}
    for key, value in conf.items():
        spark.conf.set(key, value)
    try:
        yield
    finally:
        for key, before in saved.items():
            if before is None:
                spark.conf.unset(key)
            else:
                spark.conf.set(key, before)


def source_checkpointed(spark: SparkSession) -> contextlib.AbstractContextManager[None]:
    """For a MERGE whose source is already materialised (a localCheckpoint): Delta
    copies a source it cannot prove unchanged between its two passes, which costs
    a Spark job per MERGE; this one cannot change."""
    return session_conf(spark, {_MATERIALIZE_SOURCE: "none"})


# Delta refuses a VACUUM under 7 days unless this check is off: regauge turns it
# off only where it has worked out what the retention must keep (an erasure,
# spark_jobs.engine.maintenance).
_RETENTION_CHECK = "spark.databricks.delta.retentionDurationCheck.enabled"
_LISTING_PARALLELISM = "spark.sql.sources.parallelPartitionDiscovery.parallelism"
# VACUUM's START and END commits then carry how many files it deleted.
VACUUM_LOGGING = "spark.databricks.delta.vacuum.logging.enabled"
# On by default in Delta 4: VACUUM then ignores the retention it is given, unless
# 0, for the table's delta.deletedFileRetentionDuration (7 days).
_RETENTION_IGNORED = "spark.databricks.delta.vacuum.retentionWindowIgnore.enabled"
# Delta keeps this session setting as the userMetadata of the commits it makes.
USER_METADATA = "spark.databricks.delta.commitInfo.userMetadata"


def commit_metadata(spark: SparkSession, path: str, version: int) -> str | None:
    """The userMetadata of a table's commit `version` (`USER_METADATA`), read from its
    commit file; None if it has none, or the file is gone (log cleanup)."""
    text = read_text(spark, f"{path}/_delta_log/{version:020d}.json")
    for line in (text or "").splitlines():
        action = json.loads(line)
        if "commitInfo" in action:
            found = action["commitInfo"].get("userMetadata")
            return None if found is None else str(found)
    return None


@contextlib.contextmanager
def vacuum_session(spark: SparkSession) -> Iterator[None]:
    """Session settings for VACUUMs whose retention the caller has worked out: the
    retention given is the one used, under 7 days too, and the listing is sized to
    the cores. Undone on the way out."""
    saved = {
        k: spark.conf.get(k, None)
        for k in (_LISTING_PARALLELISM, VACUUM_LOGGING, _RETENTION_IGNORED)
    }
    spark.conf.set(_RETENTION_CHECK, "false")
    spark.conf.set(_RETENTION_IGNORED, "false")
    # VACUUM lists a table's folders in a Spark job of this many tasks, 10,000 by
    # default: a minute for a small table on 2 cores, 6 s with the cores' count.
    spark.conf.set(_LISTING_PARALLELISM, str(spark.sparkContext.defaultParallelism))
    try:
        yield
    finally:
        spark.conf.unset(_RETENTION_CHECK)
        for key, value in saved.items():
            if value is None:
                spark.conf.unset(key)
            else:
                spark.conf.set(key, value)


def in_vacuum_session(spark: SparkSession) -> bool:
    return spark.conf.get(_RETENTION_CHECK, "true") == "false"


def retry_on_conflict(
    action: Callable[[], T], what: str, attempts: int = 6, backoff_s: float = 1.0
) -> T:
    """Run a Delta write that is safe to repeat, again when another writer's commit
    conflicts with it (several view streams share gold.restatements)."""
    for attempt in range(1, attempts + 1):
        try:
            return action()
        except CONFLICTS as exc:
            if attempt == attempts:
                raise
            wait = backoff_s * attempt + random.random()
            log.info(
                "%s: conflict with a concurrent commit (%s); retrying in %.1f s",
                what,
                type(exc).__name__,
                wait,
            )
            time.sleep(wait)
    raise AssertionError("unreachable")
