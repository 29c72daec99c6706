"""Delta table maintenance: compaction, a checkpoint and VACUUM, never ahead of a reader.

One-second triggers and MERGEs leave every table with many small files, a long
log and files no version needs any more. `maintain` runs, per table:

1. OPTIMIZE, which bin-packs small files into large ones, or lays a view
   version's table out by its window start (`gold_writes.GOLD_FILE_ROWS`). Its commit
   changes no data (dataChange=false): streams reading the table, through its
   change feed too, skip it. A writer's MERGE that conflicts with it is retried
   (`lake.retry_on_conflict`), and so is OPTIMIZE.
2. A checkpoint of the log, so Trino and Spark read one Parquet file instead of
   the JSON commits since the last one. Delta's log cleanup also runs then: it
   drops commit files older than the table's log retention.
3. VACUUM, which deletes the files that no version younger than the retention
   still uses, the change feed's `_change_data` files included. It runs only
   when a file older than the retention is one the newest version does not name
   (`lake.unnamed_files`): otherwise it would delete none.

The retention is the configured one (`Settings.maintenance_retention_hours`, 7
days by default, Delta's own; never under `MIN_RETENTION_HOURS`) or longer:
long enough to keep every version some reader still needs readable. Those
readers, each a `Pin`:

- a streaming query, whose checkpoint names the next version of each Delta
  table it reads: each view's stream reads silver's change feed. A VACUUM past
  a lagging change-feed reader deletes the change files it has yet to read,
  and the reader fails (delta-io/delta#1515).
- a view whose replay is done and whose stream has not started yet: the stream
  starts at the silver version its replay marker names.
- the audit and the validation gate, which read each gold table as of its
  newest tagged commit and silver as of the version that tag names.

A table whose oldest pinned version is older than its log retention (30 days
by default) gets a longer log retention too, so the checkpoint's log cleanup
keeps that version's commit.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from delta.tables import DeltaTable
from pyspark.sql import SparkSession

from spark_jobs import views
from spark_jobs.engine import gold_writes, lake, marks
from warehouse.base import registry
from warehouse.base.settings import Settings

log = logging.getLogger(__name__)

# The schemas whose tables regauge writes, in the order they are derived.
SCHEMAS = ("bronze", "silver", "gold", *registry.DBT_SCHEMAS)
# Past a pinned version's age: time for the reader to move on before the next run.
MARGIN_HOURS = 1.0
# Never less: a write under way has written files it has not committed yet, and
# VACUUM takes any file the log does not name that is older than the retention.
MIN_RETENTION_HOURS = 1.0
# OPTIMIZE's target file size (bytes), 1 GiB by default.
_OPTIMIZE_FILE_SIZE = "spark.databricks.delta.optimize.maxFileSize"
# Files OPTIMIZE bin-packs: those under this size (Delta's default is 1 GiB).
_OPTIMIZE_MIN_FILE_SIZE = "spark.databricks.delta.optimize.minFileSize"
# Bronze and the ledger are one unpartitioned table each, kept forever. With
# Delta's default every file under 1 GiB is packed again with the day's small
# files, so each run rewrote all of them until they passed 1 GiB: at 5 M events
# about 250 MB of bronze and 385 MB of ledger (50 and 77 bytes an event on the
# developer's lake), every day. A file this large is left as it is, so a run
# rewrites at most this much beside the new files.
COMPACTED_FILE_BYTES = 128 << 20
# Delta's default delta.logRetentionDuration.
DEFAULT_LOG_RETENTION_HOURS = 30 * 24.0
_LOG_RETENTION = "delta.logRetentionDuration"
# The units of a Delta interval property ("interval 30 days"), in hours.
_UNIT_HOURS = {"second": 1 / 3600, "minute": 1 / 60, "hour": 1.0, "day": 24.0, "week": 168.0}


@dataclass(frozen=True)
class Pin:
    """A version of a table that a reader still needs readable."""

    path: str
    version: int
    reader: str


@dataclass
class Result:
    """What maintaining one table did."""

    path: str
    files_before: int
    files_after: int
    retention_hours: float
    # The reader that made the retention longer than the configured one, if any.
    held_by: str | None = None
    compacted: int = 0  # files OPTIMIZE replaced
    vacuumed: int = 0  # files VACUUM deleted
    checkpoint: int | None = None
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        return table_name(self.path)


def table_name(path: str) -> str:
    """`schema.name` of a table at `<lake>/<schema>/<name>`."""
    return ".".join(path.rstrip("/").rsplit("/", 2)[-2:])


# -- which tables -----------------------------------------------------------------------
def lake_tables(spark: SparkSession, settings: Settings) -> list[str]:
    """Every Delta table under the lake's schemas, bronze first."""
    root = settings.lake_root.rstrip("/")
    found = []
    for schema in SCHEMAS:
        for name in sorted(lake.list_names(spark, f"{root}/{schema}")):
            path = f"{root}/{schema}/{name}"
            if not name.startswith((".", "_")) and DeltaTable.isDeltaTable(spark, path):
                found.append(path)
    return found


def time_columns(settings: Settings) -> dict[str, str]:
    """Each view version's table (path) -> its window start, which its files are
    laid out by (gold_writes.GOLD_FILE_ROWS)."""
    return {
        gold_writes.gold_table(view).path(settings): view.window[0]
        for view in views.discover().values()
    }


# -- who reads what -----------------------------------------------------------------------
def table_ids(spark: SparkSession, paths: Iterable[str]) -> dict[str, str]:
    """Each table's id (what a streaming checkpoint calls its `reservoirId`) -> its path."""
    return {str(lake.snapshot(spark, path).metadata().id()): path for path in paths}


def stream_pins(spark: SparkSession, settings: Settings, ids: dict[str, str]) -> list[Pin]:
    """The Delta version each streaming query reads next, from its checkpoint.

    The newest offsets file is the end of the last batch planned, which may not
    have committed: the one before it is where a restart would begin, so the
    older of the two counts."""
    root = f"{settings.lake_root.rstrip('/')}/_checkpoints"
    pins = []
    for schema in lake.list_names(spark, root):
        for table in lake.list_names(spark, f"{root}/{schema}"):
            for query in lake.list_names(spark, f"{root}/{schema}/{table}"):
                checkpoint = f"{root}/{schema}/{table}/{query}"
                batches = sorted(
                    int(n) for n in lake.list_names(spark, f"{checkpoint}/offsets") if n.isdigit()
                )
                needed: dict[str, int] = {}
                for batch in batches[-2:]:
                    text = lake.read_text(spark, f"{checkpoint}/offsets/{batch}") or ""
                    for source in _delta_sources(text):
                        rid, version = source["reservoirId"], int(source["reservoirVersion"])
                        needed[rid] = min(version, needed.get(rid, version))
                for rid, version in needed.items():
                    if rid in ids:
                        reader = f"the stream writing {schema}.{table} ({query})"
                        pins.append(Pin(ids[rid], version, reader))
    return pins


def _delta_sources(offsets: str) -> Iterable[dict]:
    """The Delta source offsets of one offsets file: a version line, the batch's
    metadata, then one line per source (a Kafka source's is a map of topics)."""
    for line in offsets.splitlines()[2:]:
        try:
            offset = json.loads(line)
        except ValueError:
            continue
        if isinstance(offset, dict) and "reservoirId" in offset and "reservoirVersion" in offset:
            yield offset


def gold_pins(spark: SparkSession, settings: Settings, gold_paths: Sequence[str]) -> list[Pin]:
    """Each gold table's newest tagged commit, and the silver version it was computed
    from: what the audit and the validation gate read. And the silver version a
    replayed view's stream will start at, before its checkpoint exists."""

    def silver_of(source: str) -> str:
        return registry.source_tables(source).silver.path(settings)

    root = f"{settings.lake_root.rstrip('/')}/_checkpoints/gold"
    pins = []
    for path in gold_paths:
        name = path.rstrip("/").rsplit("/", 1)[-1]
        found = marks.latest_tag(spark, path)
        if found is not None:
            gold_version, position, _ = found
            pins.append(Pin(path, gold_version, f"the audit of gold.{name}"))
            for source, version in position.versions:
                pins.append(Pin(silver_of(source), version, f"the audit of gold.{name}"))
        checkpoint = f"{root}/{name}/main"
        marker = lake.read_text(spark, f"{checkpoint}/{marks.REPLAY_MARKER}")
        if marker and not lake.checkpoint_has_progress(spark, checkpoint):
            # `123` (the shop's silver), or `shop@123,web@45` over several sources.
            for part in marker.strip().split(","):
                source, _, number = part.rpartition("@")
                if number.isdigit():
                    pins.append(
                        Pin(
                            silver_of(source or registry.SHOP_SOURCE),
                            int(number),
                            f"gold.{name}'s stream, not started yet",
                        )
                    )
    return pins


def pins(spark: SparkSession, settings: Settings, paths: Sequence[str]) -> list[Pin]:
    """Every version of `paths` some reader still needs."""
    gold = [p for p in paths if table_name(p).startswith("gold.")]
    return stream_pins(spark, settings, table_ids(spark, paths)) + gold_pins(spark, settings, gold)


# -- how long to keep ---------------------------------------------------------------------
def version_age_hours(spark: SparkSession, path: str, version: int, now: float) -> float | None:
    """Hours since `version` was committed (its commit file's time, which is what Delta's
    own timestamps are), or None if its commit file is gone."""
    committed = lake.modified_at(spark, f"{path.rstrip('/')}/_delta_log/{version:020d}.json")
    return None if committed is None else max(0.0, now - committed) / 3600


def retention_for(
    spark: SparkSession, path: str, pins: Sequence[Pin], floor_hours: float, now: float
) -> tuple[float, Pin | None]:
    """The VACUUM retention that keeps every pinned version of `path` readable: the
    floor, or the oldest pinned version's age and a margin; and the pin that set it."""
    hours, held_by = floor_hours, None
    for pin in (p for p in pins if p.path == path):
        age = version_age_hours(spark, path, pin.version, now)
        if age is None:
            # Not committed yet (a stream waiting for the next version) or its commit
            # is gone; the newest commits are younger than any retention.
            continue
        needed = math.ceil(age + MARGIN_HOURS)
        if needed > hours:
            hours, held_by = float(needed), pin
    return hours, held_by


# -- the work ------------------------------------------------------------------------------
def files_in(spark: SparkSession, path: str) -> int:
    """How many data files the table's newest version has."""
    return int(lake.snapshot(spark, path).numOfFiles())


def maintain(
    spark: SparkSession,
    path: str,
    retention_hours: float,
    held_by: Pin | None = None,
    order_by: str | None = None,
) -> Result:
    """OPTIMIZE, checkpoint and VACUUM one table (inside `lake.vacuum_session`). With
    `order_by` (a view version's window start, `time_columns`), OPTIMIZE lays the
    table out by that column instead of bin-packing it."""
    if not lake.in_vacuum_session(spark):
        raise RuntimeError("maintain runs inside lake.vacuum_session(spark)")
    spark.conf.set(lake.VACUUM_LOGGING, "true")
    started = time.monotonic()
    newest = lake.snapshot(spark, path)
    result = Result(path, int(newest.numOfFiles()), 0, retention_hours)
    result.held_by = held_by.reader if held_by else None
    table = DeltaTable.forPath(spark, path)

    if order_by is None and result.files_before <= 1:
        # Bin-packing one file leaves it as it is, deleted rows and all (Delta 4.4;
        # tests/spark_jobs/test_maintenance.py checks): OPTIMIZE would only plan,
        # with a Spark job over the snapshot, and commit nothing.
        metrics = None
    elif order_by is None:
        with lake.session_conf(spark, {_OPTIMIZE_MIN_FILE_SIZE: str(COMPACTED_FILE_BYTES)}):
            metrics = lake.retry_on_conflict(
                lambda: table.optimize().executeCompaction().select("metrics").first(),
                f"OPTIMIZE {result.name}",
            )
    elif already_laid_out(result.files_before, int(newest.sizeInBytes())):
        # One file of at most GOLD_FILE_BYTES is what Z-ordering it would write
        # again, row for row: one file, the same times in it, the same statistics.
        # It rewrote each small view table whole every run (about 2 s a table, warm,
        # on 2 cores: 7.3 s against 5.3 s) and could take a live MERGE's file from it.
        metrics = None
    else:
        # Sorted by time into files of about GOLD_FILE_BYTES: a bin-packing would
        # put a small table in one file of mixed times, which every live MERGE
        # would then rewrite whole (gold_writes.GOLD_FILE_ROWS says why).
        # It rewrites every file, so a live stream's MERGE can win each try; the
        # layout is an optimisation, and the next run tries again.
        try:
            with lake.session_conf(spark, {_OPTIMIZE_FILE_SIZE: str(gold_writes.GOLD_FILE_BYTES)}):
                metrics = lake.retry_on_conflict(
                    lambda: table.optimize().executeZOrderBy(order_by).select("metrics").first(),
                    f"OPTIMIZE {result.name} ZORDER BY ({order_by})",
                )
        except lake.CONFLICTS as exc:
            log.warning(
                "%s: not laid out by %s this time; live writes conflicted with each try (%s)",
                result.name,
                order_by,
                type(exc).__name__,
            )
            result.notes.append(f"not laid out by {order_by}: live writes conflicted")
            metrics = None
    if metrics is not None:
        result.compacted = int(metrics["metrics"]["numFilesRemoved"] or 0)

    if retention_hours > _log_retention_hours(spark, path):
        # The checkpoint's log cleanup would drop the commit a reader still needs.
        spark.sql(
            f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES "
            f"('{_LOG_RETENTION}' = 'interval {math.ceil(retention_hours)} hours')"
        )
        result.notes.append(f"log kept {math.ceil(retention_hours)} h")
    # The checkpointed snapshot is the newest after OPTIMIZE, and VACUUM removes no
    # file of it: its count is the files after, without reading the log again
    # (about a second a table on 2 cores, 19 tables a run).
    result.checkpoint, result.files_after = lake.checkpoint_newest(spark, path)

    # VACUUM's own cutoff: Delta rounds the retention to whole hours (half up).
    cutoff_ms = (time.time() - math.floor(retention_hours + 0.5) * 3600) * 1000
    if lake.unnamed_files(spark, path, cutoff_ms):
        table.vacuum(retention_hours)
        for row in table.history(2).select("operation", "operationMetrics").collect():
            if row["operation"] == "VACUUM END":
                result.vacuumed = int((row["operationMetrics"] or {}).get("numDeletedFiles", 0))
    else:
        # Every file older than the retention is the newest version's (the files an
        # OPTIMIZE just replaced are younger): VACUUM would list them all, read the
        # table's state and commit twice to delete none. 1.2 s a table on 2 cores,
        # warm, against 0.35 s for this check; most tables of most runs. (Empty
        # folders, which VACUUM removes whatever their age, wait for a run that vacuums.)
        result.notes.append("nothing to vacuum")
    result.seconds = time.monotonic() - started
    return result


def already_laid_out(files: int, size_bytes: int) -> bool:
    """Whether a view version's table of `files` files and `size_bytes` bytes is laid
    out by time already: Z-ordering writes files of about GOLD_FILE_BYTES, so a
    table in one file no larger has nothing to gain."""
    return files <= 1 and size_bytes <= gold_writes.GOLD_FILE_BYTES


def _log_retention_hours(spark: SparkSession, path: str) -> float:
    found = lake.snapshot(spark, path).metadata().configuration().get(_LOG_RETENTION)
    text = str(found.get()) if found.isDefined() else None
    if not text:
        return DEFAULT_LOG_RETENTION_HOURS
    parts = text.lower().replace("interval", "").split()
    try:
        return float(parts[0]) * _UNIT_HOURS[parts[1].rstrip("s")]
    except (IndexError, KeyError, ValueError):
        log.warning("%s: cannot read %s=%r; taking Delta's default", path, _LOG_RETENTION, text)
        return DEFAULT_LOG_RETENTION_HOURS
