"""Running a view version: the same code for a live stream, a replay and a batch.

The unit of work is `apply_changes`: given silver rows that changed (a
micro-batch of silver's change feed, or all of silver), find the scopes they
touch, recompute exactly those from silver, and replace them in the gold
table with one MERGE. Recomputing from silver rather than folding the change
into old results is what makes the answer independent of arrival order,
micro-batch boundaries and lateness; replacing whole scopes makes a repeated
micro-batch harmless.

A view whose rows add up (`View.sums`: counts and sums per hour) is the
exception in a live stream: `fold_changes` adds what a micro-batch put in
silver to gold's rows and takes off what it took out, reading no silver. The
sum of the changes is as independent of their order as the recompute, and the
batch's transaction id on its commit keeps a retried batch from counting twice.
"""

from __future__ import annotations

import json
import logging
import operator
import threading
import time
import uuid
from collections.abc import Iterable
from datetime import datetime
from functools import reduce
from typing import Any, NamedTuple

from delta.tables import DeltaTable
from pyspark.sql import Column, DataFrame, Row, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery

from spark_jobs import bronze, lake
from spark_jobs import session as session_mod
from spark_jobs import silver as silver_mod
from spark_jobs.testing import faults
from spark_jobs.views import changes, inputs, restatements
from spark_jobs.views.base import View, merged_ranges
from spark_jobs.views.inputs import Position
from spark_jobs.views.links import LinkIndex
from warehouse.base import metrics, registry
from warehouse.base.settings import Settings
from warehouse.base.text import first_line

SILVER = registry.SILVER_EVENTS

log = logging.getLogger(__name__)


# What a replay or batch reads (docs/contract.md §5 names them): "bronze" is all of
# history as the lake keeps it (bronze, validated and deduplicated into silver);
# "kafka" is every record Kafka still holds, validated and deduplicated on the fly.
SOURCES = ("bronze", "kafka")


# Every view version's table: with its change feed on, since a live version
# publishes its commits from it; and without Delta's auto compaction, which
# bin-packs a table's small files (under 64 MiB: every file of a view's table)
# into one as soon as the writer has seen 50 of them, mixing the times that
# gold's layout keeps apart (GOLD_FILE_ROWS). Tried: the first live MERGE after
# a replay of 60 files compacted them into one. A live MERGE replaces the files
# it touches rather than adding one per commit, and maintenance lays the table
# out again daily.
AUTO_COMPACT = "delta.autoOptimize.autoCompact"
GOLD_PROPERTIES = {changes.CDF_PROPERTY: "true", AUTO_COMPACT: "false"}


# Gold's files are laid out by time: a replay writes them sorted by the window
# start, at most this many rows each (about 250 KiB of cart_sessions), and
# maintenance Z-orders them by it into files of about GOLD_FILE_BYTES. A live
# MERGE then rewrites only the files whose hours its rows start in, which a live
# batch's recent rows keep to the newest few: Delta rewrites every file holding a
# row a MERGE changes. Profiled in `make bench`, with gold in 3 files of mixed
# times, each cart_sessions batch rewrote all 546,000 rows (12-15 s of task time);
# alone, a 2,200-row MERGE into 581,000 rows took 3.3-4.6 s in 3 such files and
# 1.1-1.3 s in 13 files by time. Small, since the newest file takes every new
# row until the next maintenance, and a live batch rewrites it whole: with
# 1 MiB files that was 45,000 rows of older sessions in each cart batch.
GOLD_FILE_ROWS = 10_000
GOLD_FILE_BYTES = 256 << 10


def ensure_gold(spark: SparkSession, path: str, view: View) -> None:
    """Create the view version's table if it is new; set GOLD_PROPERTIES on one made
    before they were what they are (auto compaction was on)."""
    lake.ensure_table(spark, path, view.schema, GOLD_PROPERTIES)
    lake.ensure_properties(spark, path, GOLD_PROPERTIES)


def gold_rows(view: View, silver: DataFrame) -> DataFrame:
    """The view's function, its output held to the declared schema (types and order).

    Cast by type name: over Spark Connect a StringType object arrives with an
    explicit UTF8_BINARY collation, which Delta then writes into the table's
    schema as "string collate UTF8_BINARY", a type Trino 476 cannot read."""
    return view.compute(silver).select(
        *[F.col(f.name).cast(f.dataType.simpleString()) for f in view.schema.fields]
    )


# A live query's own session evaluates its plans without generating code. A
# micro-batch recomputes a few hours or sessions, so compiling is most of the
# work: the time ranges and the watermark are literals, which Spark inlines into
# the generated Java, so every batch compiled (Janino) and JIT-compiled classes
# of its own. Profiled in the bench's freshness phase with three live streams,
# the JIT's threads were the host's busiest; without code generation in the
# view queries, freshness went from p50 100 s / p95 116 s to 88 s / 102 s (81 s /
# 91 s with ingest's session interpreted too: ingest now plans its small
# batches so, `ingest.INTERPRETED_BELOW`). Replays and validation run in
# sessions of their own and keep code generation: they read all of history,
# where compiled code pays.
LIVE_SESSION_CONF = session_mod.INTERPRETED_CONF


def live_session(spark: SparkSession) -> SparkSession:
    """A new session of the application for one live query, set up for small batches."""
    session = spark.newSession()
    for key, value in LIVE_SESSION_CONF.items():
        session.conf.set(key, value)
    return session


# Past this many changed rows in one batch (a catch-up after an outage, a replay
# through the runner), sessions are recomputed whole, customer by customer: the
# spans near each change are one broadcast row per changed event and one row per
# span collected here, which a backlog of a million recent events made a 10 GiB
# view host in `make bench`; and a backlog touches most of history anyway.
MAX_NEAR_CHANGES = 20_000


# A batch's changes to gold are read off the MERGE's source (one Spark job, which
# also gives the hours the MERGE may touch) when they are at most this many rows:
# they then go to the view's topic from the driver (`changes.Staged`). A larger
# source (a catch-up) stays in Spark, and the change feed publishes it.
MAX_STAGED_ROWS = 50_000


class Applied(NamedTuple):
    """What `apply_changes` or `fold_changes` did: how many scopes it changed, the part
    of silver it read them from (a fold reads none), the rows it recomputed (what
    placing the batch's restatements in sessions needs: every event it landed is
    in one of them), and the gold commit it made with its records for the view's
    topic, when read off the MERGE; and whether it folded the change in."""

    scopes: int
    silver: DataFrame | None
    rows: DataFrame | None = None
    staged: changes.Staged | None = None
    folded: bool = False


# Delta's idempotent DML: a MERGE under a (txnAppId, txnVersion) that the table
# has committed already is skipped, and the commit records the pair otherwise.
TXN_APP_ID = "spark.databricks.delta.write.txnAppId"
TXN_VERSION = "spark.databricks.delta.write.txnVersion"


def apply_changes(
    spark: SparkSession,
    path: str,
    view: View,
    changed: DataFrame,
    silver: DataFrame,
    links: LinkIndex | None = None,
    txn: tuple[str, int] | None = None,
) -> Applied:
    """Recompute the scopes `changed` touches from `silver`; replace them in gold at `path`.

    With `links` (a view with linked events, run batch after batch by a live
    stream), linked events and the `of` events they link to are read from the
    days of silver the index names, not from all of history. With `txn` (a live
    stream's txnAppId and batch id) the commit records it, for `fold_changes`."""
    gold = DeltaTable.forPath(spark, path)
    # The commit the MERGE below makes is this one's successor, unless another
    # writer commits in between (then the change feed publishes both).
    before = lake.newest_version(spark, path)
    target = gold.toDF()
    # The changed rows' times (UTC microseconds), for sessions when the batch is
    # small enough to follow change by change. One job counts and bounds them.
    times: tuple[int, int] | None = None
    if view.scope.gap is not None:
        size, first, last = changed.agg(
            F.count(F.lit(1)),
            F.min(F.unix_micros("event_time")),
            F.max(F.unix_micros("event_time")),
        ).first() or (0, None, None)
        if first is not None and last is not None and size <= MAX_NEAR_CHANGES:
            times = (first, last)
    if times is not None:
        # Sessions: only the rows within the gap of a change can move, and gold
        # says where they are. Read the events in their spans, from the days the
        # spans cover: the work then follows the change, not the customer's history.
        near = view.near(changed, view.around(target, *times)).localCheckpoint(eager=True)
        spans = near.collect()
        n_scopes = len({tuple(r[c] for c in view.scope_columns) for r in spans})
        if spans:
            target = view.starting_in(
                target, min(r["lo"] for r in spans), max(r["hi"] for r in spans)
            )
        silver = view.narrowed(silver, merged_ranges((r["lo"], r["hi"] + 1) for r in spans))
        deciding = view.restrict_near(silver, near)
        replaced = view.rows_near(target, near)
    else:
        of_silver = silver
        if links is not None:
            taken = links.follow(changed, silver)
            of_silver = view.of_on_days(silver, links.of_days(taken.linked_hashes))
        scopes = view.scopes_of(changed, of_silver).localCheckpoint(eager=True)
        # Where the scopes bound their events' time (an hour), read only those days of
        # silver: the work then follows the change, not the size of history. (One row
        # of bounds per scope, so the same Spark job counts them.)
        bounds = view.time_bounds(scopes)
        if bounds is None:
            n_scopes = scopes.count()
        else:
            rows = bounds.collect()
            n_scopes = len(rows)
            if rows and view.scope.within and view.scope.within[0] == view.window[0]:
                target = view.starting_in(target, min(r[0] for r in rows), max(r[0] for r in rows))
            ranges = merged_ranges((r[0], r[1]) for r in rows)
            linked_days = None if links is None else links.linked_days(ranges)
            silver = view.narrowed(silver, ranges, linked_days)
        deciding = view.restrict(silver, scopes)
        replaced = target.join(F.broadcast(scopes), list(view.scope_columns), "left_semi")
    if not n_scopes:
        return Applied(0, silver)
    # Materialised first: the rows are used twice (what differs from gold, and
    # placing the batch's restatements), and Spark would otherwise read silver and
    # recompute for each (profiled: two scans of 3.9 M rows in one cart batch).
    fresh = gold_rows(view, deciding).localCheckpoint(eager=True)
    # Materialised once: a MERGE reads its source twice (to find the files it
    # touches, then to write them), and the source reads the gold the MERGE changes.
    source = differences(view, fresh, replaced).localCheckpoint(eager=True)
    what = f"{view.table_name}: replacing {n_scopes} scopes"
    staged = _merge(spark, gold, view, source, before, txn, retry_as=what)
    return Applied(n_scopes, silver, fresh, staged)


def _merge(
    spark: SparkSession,
    gold: DeltaTable,
    view: View,
    source: DataFrame,
    before: int,
    txn: tuple[str, int] | None,
    *,
    retry_as: str | None,
) -> changes.Staged | None:
    """MERGE `source` (materialised: gold's columns and `_op`, see `differences`) into
    `gold`, whose newest commit was `before`; the commit's records for the view's
    topic, when read off the source (None: published from the change feed, or no
    commit). With `retry_as` (what to call it in the log), again after a
    conflicting commit (safe where `source` replaces whole rows as silver decides
    them); without, a conflict is raised."""
    values: dict[str, str | Column] = {f.name: f"s.{f.name}" for f in view.schema.fields}
    key = list(view.key)
    # Only rows whose values moved are in the source, so the change feed (and the
    # published view changes) holds only those. Checked again here, null-safe, in
    # case a retry after a conflict meets a gold that already has them.
    differs = " OR ".join(
        f"NOT (t.`{f.name}` <=> s.`{f.name}`)" for f in view.schema.fields if f.name not in key
    )
    update_when = f"s._op = 'upsert' AND ({differs})" if differs else "false"
    commit = before + 1
    written: list[Row] = (
        source.select(*changes.staged_columns(view, commit), _hour_micros(view).alias("hour"))
        .limit(MAX_STAGED_ROWS + 1)
        .collect()
    )
    fits = len(written) <= MAX_STAGED_ROWS
    staged_rows = written if fits else []
    hour_rows = (
        written if fits else source.select(_hour_micros(view).alias("hour")).distinct().collect()
    )
    hours = _within_hours(view, [r["hour"] for r in hour_rows])
    if hours is None:
        # Every recomputed row came out as gold has it (a micro-batch retried after
        # its commit, a change that moves no total): nothing to write. Gold's
        # newest tag names an older silver version, of which gold is the view too.
        return None
    condition = lake.merge_condition(key) + hours

    def run() -> DataFrame:
        return (
            gold.alias("t")
            .merge(source.alias("s"), condition)
            .whenMatchedDelete(condition="s._op = 'delete'")
            .whenMatchedUpdate(condition=update_when, set=values)
            .whenNotMatchedInsert(condition="s._op = 'upsert'", values=values)
            .execute()
        )

    ids = {} if txn is None else {TXN_APP_ID: txn[0], TXN_VERSION: str(txn[1])}
    with lake.source_checkpointed(spark), lake.session_conf(spark, ids):
        # Replacing whole scopes is safe to repeat after a conflicting commit
        # (table maintenance, an operator's fix) aborted the first try.
        merged = run() if retry_as is None else lake.retry_on_conflict(run, retry_as)
    # The MERGE's metrics are one local row. A MERGE that changed no row may make no
    # commit at all: then `commit` is not its own, and the change feed decides.
    if staged_rows and (merged.first() or {"num_affected_rows": 0})["num_affected_rows"]:
        return changes.Staged(commit, [(commit, r["key"], r["value"]) for r in staged_rows])
    return None


def fold_changes(
    spark: SparkSession, path: str, view: View, feed: DataFrame, txn: tuple[str, int]
) -> Applied | None:
    """Fold a micro-batch of silver's change feed (`feed`, with `_change_type`) into
    the gold table at `path` of a view whose rows add up (`View.sums`): each row
    it touches, plus what it put in silver, minus what it took out. None where
    `apply_changes` must recompute instead: the batch touches more than
    MAX_STAGED_ROWS rows (a catch-up), or another writer's commit conflicted.

    Gold must be the view of silver as of the commit before the batch's first,
    as every batch before it leaves it. A fold is not safe to repeat, as a
    recompute is: so its commit carries the batch's transaction id (`txn`, the
    stream's txnAppId and the batch id), and a batch retried after its commit
    (a crash before the stream recorded it) finds the id in gold and folds
    nothing."""
    assert view.sums is not None, f"{view.table_name}: its rows do not add up"
    app_id, batch_id = txn
    sign = F.when(F.col("_change_type").isin(*restatements.REMOVED), -1).otherwise(1)
    sums = view.summed(feed, sign)
    moved = reduce(operator.or_, [F.col(c) != 0 for c in view.sums.measures])
    # One small job over the materialised batch: the rows it touches, and their hours.
    touched = (
        sums.select(F.unix_micros(view.window[0]).alias("start"), moved.alias("moved"))
        .limit(MAX_STAGED_ROWS + 1)
        .collect()
    )
    if len(touched) > MAX_STAGED_ROWS:
        return None
    starts = [r["start"] for r in touched if r["moved"]]
    if not starts:
        # No event of the view, or its events came and went again within the batch.
        return Applied(len(touched), None, folded=True)
    done = lake.txn_version(spark, path, app_id)
    if done is not None and done >= batch_id:
        log.info(
            "%s: batch %d is in gold already (its commit came before a restart); "
            "not folding it twice",
            view.table_name,
            batch_id,
        )
        return Applied(len(touched), None, folded=True)
    gold = DeltaTable.forPath(spark, path)
    # Read before gold's rows: the MERGE's commit follows it unless another writer's
    # comes between (then the change feed publishes both).
    before = lake.newest_version(spark, path)
    old = view.starting_in(gold.toDF(), min(starts), max(starts))
    source = folded(view, sums.where(moved), old).localCheckpoint(eager=True)
    try:
        staged = _merge(spark, gold, view, source, before, txn, retry_as=None)
    except lake.CONFLICTS as exc:
        # The rows were read before the other commit: recompute them from silver.
        log.info(
            "%s: folding batch %d met a concurrent commit (%s); recomputing its rows instead",
            view.table_name,
            batch_id,
            type(exc).__name__,
        )
        return None
    return Applied(len(touched), None, None, staged, folded=True)


def differences(view: View, fresh: DataFrame, replaced: DataFrame) -> DataFrame:
    """(the rows recomputed, the rows of gold they replace) -> what gold must change,
    as gold's columns and `_op`: "upsert" for a row that is new or whose values
    moved, "delete" for a row the recompute no longer produces (two sessions
    merged into one, say). Rows that came out as gold has them are left out: a
    MERGE rewrites every file holding a row its source matches."""
    key = list(view.key)
    rest = [f.name for f in view.schema.fields if f.name not in key]
    new = fresh.select(
        *key, *[F.col(c).alias("_new_" + c) for c in rest], F.lit(True).alias("_new")
    )
    old = replaced.select(
        *key, *[F.col(c).alias("_old_" + c) for c in rest], F.lit(True).alias("_old")
    )
    moved = [~F.col("_new_" + c).eqNullSafe(F.col("_old_" + c)) for c in rest]
    op = (
        F.when(F.col("_old").isNull(), "upsert")
        .when(F.col("_new").isNull(), "delete")
        .when(reduce(operator.or_, moved, F.lit(False)), "upsert")
    )
    return (
        new.join(old, key, "full_outer")
        .withColumn("_op", op)
        .where(F.col("_op").isNotNull())
        .select(*key, *[F.col("_new_" + c).alias(c) for c in rest], "_op")
    )


def folded(view: View, sums: DataFrame, old: DataFrame) -> DataFrame:
    """(a batch's change per row, `View.summed`, each moving a measure; rows of gold
    holding at least those it touches) -> the MERGE's source, as `differences`
    makes it: each touched row with the change added ("upsert"), or "delete" where
    its count falls to 0.

    A count below 0, or a change to a row gold does not hold that leaves it no
    event, fails the job: gold did not hold what the batch took out, so it is not
    the view of silver it follows on from, and folding on would keep it wrong."""
    assert view.sums is not None, f"{view.table_name}: its rows do not add up"
    key = list(view.key)
    measures = list(view.sums.measures)
    before = old.select(
        *key, *[F.col(c).alias("_old_" + c) for c in measures], F.lit(True).alias("_old")
    )
    joined = sums.join(before, key, "left")
    after = {c: F.coalesce(F.col("_old_" + c), F.lit(0)) + F.col(c) for c in measures}
    count = after[view.sums.count]
    op = (
        F.when(
            (count < 0) | ((count == 0) & F.col("_old").isNull()),
            F.raise_error(
                F.lit(
                    f"{view.table_name}: a fold took {view.sums.count} below what gold "
                    "holds: gold is not the view of silver as of its last batch; "
                    "replay the version to rebuild it"
                )
            ),
        )
        .when(count > 0, "upsert")
        .otherwise("delete")
    )
    return joined.select(
        *[
            (after[f.name] if f.name in after else F.col(f.name))
            .cast(f.dataType.simpleString())
            .alias(f.name)
            for f in view.schema.fields
        ],
        op.alias("_op"),
    )


def _hour_micros(view: View) -> Column:
    """The UTC hour a gold row's window starts in, as microseconds."""
    return F.unix_micros(F.date_trunc("hour", view.window[0]))


def _within_hours(view: View, hours: Iterable[int]) -> str | None:
    """A condition on the MERGE's target (to AND to its key match): its window start
    in `hours` (the hours the source's rows start in, `_hour_micros`, as literals
    merged into ranges); None if there are none (the source is empty). The key
    match implies it, since the window start is part of the key; Delta uses it to
    skip gold's files outside those hours, which gold's layout by time makes most
    of them (GOLD_FILE_ROWS)."""
    start = view.window[0]
    hour = 3_600_000_000
    ranges = merged_ranges((h, h + hour) for h in set(hours))
    if not ranges:
        return None
    if start not in view.key:
        return ""
    column = f"t.`{start}`"
    return (
        " AND ("
        + " OR ".join(
            f"({column} >= timestamp_micros({lo}) AND {column} < timestamp_micros({hi}))"
            for lo, hi in ranges
        )
        + ")"
    )


class Progress:
    """Logs a long Spark job's progress as events done of total, rate and time left.

    Spark reports tasks, not rows; the share of the job's tasks finished
    stands in for the share of events, which is close for a scan-heavy job.
    A session with a JVM here asks Spark's status tracker for its job group's
    tasks; a Spark Connect client is told its operations' stages as they run.
    """

    def __init__(self, spark: SparkSession, label: str, total: int, every_s: float = 5.0) -> None:
        self.spark, self.label, self.total, self.every_s = spark, label, total, every_s
        self.group = f"regauge-{uuid.uuid4().hex[:8]}"
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self.started = 0.0
        self.seconds = 0.0
        self.remote = session_mod.is_connect(spark)
        # Any: pyspark types the handler as its ProgressHandler class, though any
        # callable with its keyword arguments is called.
        self._handler: Any = self._heard
        # Over Spark Connect: each operation's stages as last reported, (tasks, done).
        self._operations: dict[str, list[tuple[int, int]]] = {}
        self._lock = threading.Lock()

    def __enter__(self) -> Progress:
        self.started = time.monotonic()
        log.info("%s: %s events to process", self.label, f"{self.total:,}")
        if self.remote:
            self.spark.registerProgressHandler(self._handler)
        else:
            self.spark.sparkContext.setJobGroup(self.group, self.label)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        if self.remote:
            self.spark.removeProgressHandler(self._handler)
        else:
            self.spark.sparkContext.setLocalProperty("spark.jobGroup.id", None)  # type: ignore[arg-type]
        self.seconds = time.monotonic() - self.started

    def _heard(
        self,
        stages: Iterable[Any] | None,
        inflight_tasks: int,
        operation_id: str | None,
        done: bool,
    ) -> None:
        """Spark Connect's report on one operation (its keyword names are the API's)."""
        seen = [(s.num_tasks, s.num_tasks if done else s.num_completed_tasks) for s in stages or ()]
        with self._lock:
            self._operations[operation_id or ""] = seen

    def share_done(self) -> float:
        if self.remote:
            with self._lock:
                reported = [st for seen in self._operations.values() for st in seen]
            total = sum(tasks for tasks, _ in reported)
            return sum(done for _, done in reported) / total if total else 0.0
        tracker = self.spark.sparkContext.statusTracker()
        done = total = 0
        for job_id in tracker.getJobIdsForGroup(self.group):
            job = tracker.getJobInfo(job_id)
            if job is None:
                continue
            stages = [tracker.getStageInfo(i) for i in job.stageIds]
            tasks = sum(st.numTasks for st in stages if st is not None) or 1
            total += tasks
            # A finished job counts whole: stages it skipped never report tasks.
            if job.status == "SUCCEEDED":
                done += tasks
            else:
                done += sum(st.numCompletedTasks for st in stages if st is not None)
        return done / total if total else 0.0

    def _watch(self) -> None:
        shown = 0.0
        while not self._stop.wait(self.every_s):
            # A job that starts adds its tasks to the total: never report going back.
            share = shown = max(shown, self.share_done())
            elapsed = time.monotonic() - self.started
            rate = share * self.total / elapsed if elapsed else 0.0
            left = f"~{self.total * (1 - share) / rate:.0f} s left" if rate else "starting"
            log.info(
                "%s: ~%s of %s events (%.0f%%), %s events/s, %s",
                self.label,
                f"{int(share * self.total):,}",
                f"{self.total:,}",
                share * 100,
                f"{rate:,.0f}",
                left,
            )

    def summary(self) -> str:
        rate = self.total / self.seconds if self.seconds else 0.0
        return f"{self.total:,} events in {self.seconds:.1f} s ({rate:,.0f} events/s)"


# -- modes -------------------------------------------------------------------------------
def gold_table(view: View) -> registry.Table:
    return registry.gold_view_table(view.name, view.version)


def silver_version(spark: SparkSession, settings: Settings) -> int:
    """The newest commit of the shop's silver."""
    return lake.newest_version(spark, SILVER.path(settings))


def read_silver(spark: SparkSession, settings: Settings, version: int | None = None) -> DataFrame:
    """The shop's silver (as of a version)."""
    return lake.read_version(spark, SILVER.path(settings), version)


def check_replay_source(view: View, source: str) -> None:
    """Refuse a replay `source` the view cannot be built from, before any work (a
    reprocess's first task asks it too)."""
    if source not in SOURCES:
        raise ValueError(f"unknown replay source {source!r}: use {' or '.join(SOURCES)}")
    if source == "kafka" and view.sources != (registry.SHOP_SOURCE,):
        raise ValueError(
            f"{view.table_name} reads {', '.join(view.sources)}: a replay from Kafka reads "
            "the shop's topic only; replay it from bronze (the lake keeps every record)"
        )


def read_input(
    spark: SparkSession, settings: Settings, view: View, at: Position | None = None
) -> DataFrame:
    """What the view's function reads: its sources' silver, as of `at` (None: newest)."""
    return inputs.read(spark, settings, view, at)


def read_gold(
    spark: SparkSession, settings: Settings, view: View, version: int | None = None
) -> DataFrame:
    """The view's table (as of a Delta version), in its declared columns."""
    path = gold_table(view).path(settings)
    return lake.read_version(spark, path, version).select(*view.schema.fieldNames())


def batch(
    spark: SparkSession,
    settings: Settings,
    view: View,
    *,
    as_of: Position | None = None,
    source: str = "bronze",
) -> Position:
    """Recompute the whole view into its gold table, from the lake's history (silver as
    of a position, `source="bronze"`) or from every record Kafka still holds (`"kafka"`).

    Returns the position a stream should follow on from. From Kafka, that
    is silver's newest commit when the read began: every later change is
    recomputed from silver, so the hand-off is exact once silver has caught up.
    """
    check_replay_source(view, source)
    inputs.ensure(spark, settings, view)
    inputs.event_types_by_source(view)  # refuses a view whose sources do not add up
    position = inputs.newest(spark, settings, view) if as_of is None else as_of
    table = gold_table(view)
    if source == "kafka":
        records = bronze.to_bronze_rows(bronze.read_kafka_batch(spark, settings))
        silver = silver_mod.from_records(
            bronze.ignoring_forgotten(records, bronze.forgotten_positions(spark, settings)),
            silver_mod.deployed_plan(spark, settings),
        ).localCheckpoint(eager=True)
    else:
        silver = read_input(spark, settings, view, position)
    events = silver.where(F.col("event_type").isin(*view.event_types)).count()
    # Laid out by time (see GOLD_FILE_ROWS): sorted by the window start, each task's
    # run cut into files of at most that many rows. A new table gets
    # GOLD_PROPERTIES when its stream starts (`ensure_gold`; this may run over
    # Spark Connect, where Delta's table API does not), and an overwrite keeps them.
    answer = gold_rows(view, silver).orderBy(view.window[0])
    with Progress(spark, f"replay {view.table_name}", events) as progress:
        (
            answer.write.format("delta")
            .mode("overwrite")
            .option("overwriteSchema", "true")
            .option("maxRecordsPerFile", GOLD_FILE_ROWS)
            .option("userMetadata", tag(position, source))
            .save(table.path(settings))
        )
    log.info(
        "%s: recomputed from %s (%s): %s",
        table.trino_name,
        source,
        position.describe(),
        progress.summary(),
    )
    return position


def stream(
    spark: SparkSession,
    settings: Settings,
    view: View,
    *,
    trigger: str | None = None,
    available_now: bool = False,
    publish: bool = False,
) -> StreamingQuery:
    """Follow silver's change feed into the view's gold table.

    With `publish`, every gold commit also goes to the view version's Kafka topic
    (`changes.Publisher`): the commits made before the stream starts (its
    replay) at once, then each batch's after it.

    The stream starts right after the commit its replay was built from (the
    marker `replay` leaves beside the checkpoint), so nothing is missed and
    nothing counted twice. Once the stream has a checkpoint, the checkpoint decides.

    Each micro-batch recomputes from silver *as of the batch's last commit*
    and tags its gold commit with that version, so every tagged gold commit
    equals the view's function of one silver snapshot: what validation and
    the audit compare against.
    """
    table = gold_table(view)
    path = table.path(settings)
    ensure_gold(spark, path, view)
    inputs.ensure(spark, settings, view)
    by_source = inputs.event_types_by_source(view)
    checkpoint = table.checkpoint(settings)
    replayed = replayed_through(spark, settings, view)
    floor = inputs.nowhere(view) if replayed is None else replayed
    # A change feed cannot start at a version that does not exist yet, so the
    # stream starts *at* the replay's commit and skips it and everything before.
    # Over several sources, one feed of each, read together: their union.
    feeds = []
    for src in view.sources:
        reader = spark.readStream.format("delta").option("readChangeFeed", "true")
        if floor[src] >= 0:
            reader = reader.option("startingVersion", floor[src])
        feeds.append(reader.load(inputs.silver_table(src).path(settings)))
    of_source = {src: F.col("event_type").isin(*types) for src, types in by_source.items()}
    relevant = reduce(
        operator.or_,
        [of_source[src] & (F.col("_commit_version") > floor[src]) for src in view.sources],
    )
    # Where the stream has read each source to, for a view over several: a batch
    # reads each source's silver as of its last change in the batch, or as of the
    # last one an earlier batch saw (kept beside the checkpoint for a restart).
    # Nothing in between changes the view's events, so that snapshot is the one
    # the batch's offsets stand at, as far as the view can tell.
    kept = (
        _read_position(spark, settings, view, POSITION_MARKER)
        if has_checkpoint(spark, settings, view)
        else None
    )
    through = kept or Position(tuple((s, max(v, 0)) for s, v in floor.versions))

    restatements.ensure_table(spark, settings)
    # Restatements are appended once per batch under this id (see restatements.record).
    app_id = lake.checkpoint_app_id(spark, checkpoint, f"regauge-{view.table_name}")

    # The newest event time the view has seen, read from silver once and then
    # carried from batch to batch: what decides whether a window was final.
    watermark = restatements.Watermark()
    # Built at the first batch with changes of the view's event types, from the
    # whole snapshot of silver it reads; then grown by each later batch's changes.
    links = LinkIndex(view) if view.scope.linked else None
    publisher = changes.Publisher(spark, settings, view, path) if publish else None
    folding = folds(spark, settings, view)
    if publisher is not None:
        _publish(publisher, renew=True)

    def each_batch(changes: DataFrame, batch_id: int) -> None:
        nonlocal through
        mine = changes.where(relevant).localCheckpoint(eager=True)
        version = F.col("_commit_version")
        stats = mine.agg(
            *[
                agg(F.when(of_source[src], version))
                for src in view.sources
                for agg in (F.min, F.max)
            ],
            # The oldest new event's Kafka timestamp: the batch's freshness. Not a
            # delete's (an erasure) or a pre-image's, which are old by nature.
            F.min(
                F.when(
                    F.col("_change_type").isin("insert", "update_postimage"),
                    F.col("kafka_timestamp"),
                )
            ),
            *restatements.Landed.columns(view),
        ).first()
        n = len(view.sources)
        ranges = {
            src: (int(stats[2 * i]), int(stats[2 * i + 1]))
            for i, src in enumerate(view.sources)
            if stats is not None and stats[2 * i + 1] is not None
        }
        if stats is None or not ranges:
            return
        oldest = stats[2 * n]
        landed = restatements.Landed(*stats[2 * n + 1 :])
        # The input as of the batch's last commit of each source, and as it stood
        # before the batch (what its restatements compare against).
        at = through.after({src: last for src, (_, last) in ranges.items()})
        before = through.after({src: first - 1 for src, (first, _) in ranges.items()})
        # Said before the work, so a slow batch shows in the log while it runs.
        log.info(
            "%s batch %d: applying silver versions %s",
            table.trino_name,
            batch_id,
            ", ".join(
                (f"{src}@" if n > 1 else "") + f"{first}-{last}"
                for src, (first, last) in ranges.items()
            ),
        )
        spark.conf.set(TAG_CONF, tag(at, "stream"))
        txn = (app_id, batch_id)
        try:
            applied = fold_changes(spark, path, view, mine, txn) if folding else None
            if applied is None:
                # One snapshot of silver, the batch's last commit, for the recompute
                # and for placing restatements. Pre-images matter too: a replaced
                # winner may leave a scope it was in.
                silver = read_input(spark, settings, view, at)
                changed = mine.drop(*lake.CDF_COLUMNS)
                applied = apply_changes(spark, path, view, changed, silver, links, txn)
            if applied.scopes:
                restated = restatements.record(
                    spark,
                    settings,
                    view,
                    mine,
                    applied.silver,
                    applied.rows,
                    before,
                    watermark,
                    txn=txn,
                    summary=landed,
                )
        finally:
            spark.conf.unset(TAG_CONF)
        if n > 1 and at != through:
            lake.write_text(spark, _marker(settings, view, POSITION_MARKER), f"{at}\n")
        through = at
        # Only once the batch is done: a batch retried after a failure must see
        # the watermark as it was before it.
        watermark.advance(
            landed,
            restatements.surviving_newest(mine) if watermark.takes_out_newest(landed) else None,
        )
        if applied.scopes:
            _record_batch(view, oldest, restated)
        # Before publishing: the crash it stands for leaves a gold commit that only
        # the next batch, or the next start, publishes.
        faults.maybe_crash("view_after_commit", batch_id)
        if publisher is not None:
            _publish(publisher, staged=applied.staged)
        if applied.scopes:
            log.info(
                "%s batch %d: %d scopes %s (%s), %d restatements of final windows",
                table.trino_name,
                batch_id,
                applied.scopes,
                "folded in" if applied.folded else "recomputed",
                at.describe(),
                restated,
            )

    guard = lake.BatchGuard()
    writer = (
        inputs.union(feeds)
        .writeStream.queryName(f"{view.table_name}")
        .foreachBatch(guard.wrap(each_batch))
        .option("checkpointLocation", checkpoint)
    )
    try:
        query = lake.start_stream(
            writer, available_now, trigger or settings.trigger_interval, guard
        )
    except BaseException:
        if publisher is not None:
            publisher.close()
        raise
    if publisher is not None:
        _PUBLISHERS[str(query.runId)] = publisher
    return query


# Each started query's publisher, by run id (a query restarted from its checkpoint
# keeps its id, not its run id), until `release`: its Kafka producer (a
# transactional id, buffers and librdkafka's threads) would otherwise outlive the
# query in a process that starts it again, as the view host does after a failure.
_PUBLISHERS: dict[str, changes.Publisher] = {}


def release(query: StreamingQuery) -> None:
    """Stop a query `stream` started, once its running micro-batch is done (at most
    `lake.STOP_WAIT_S`), or take one that ended, and close its change publisher.
    Safe to call twice."""
    try:
        lake.stop_stream(query)
    finally:
        publisher = _PUBLISHERS.pop(str(query.runId), None)
        if publisher is not None:
            publisher.close()


def _record_batch(view: View, oldest: datetime | None, restated: int) -> None:
    """A gold commit into the metrics: seconds from the Kafka timestamp of its oldest
    new event (the producer's clock, CreateTime) to now, and its restatements."""
    labels = (view.name, str(view.version))
    now = time.time()
    if oldest is not None:
        # PySpark hands a timestamp back as a naive datetime in this process's local
        # time, which is how .timestamp() reads a naive one.
        metrics.VIEW_FRESHNESS.labels(*labels).set(max(0.0, now - oldest.timestamp()))
    metrics.VIEW_BATCH_AT.labels(*labels).set(now)
    metrics.RESTATEMENTS.labels(*labels).inc(restated)


def _publish(
    publisher: changes.Publisher, *, renew: bool = False, staged: changes.Staged | None = None
) -> None:
    """Publish what is new; a failure (Kafka away, a fenced producer) is logged, not
    raised: gold carries on, and the next call publishes from where the last
    whole publish left the mark."""
    try:
        publisher.publish(renew=renew, staged=staged)
    except Exception as exc:
        log.warning(
            "%s: could not publish gold commits (%s); the next batch or start publishes them",
            publisher.topic,
            first_line(exc),
        )


def has_checkpoint(spark: SparkSession, settings: Settings, view: View) -> bool:
    return lake.exists(spark, gold_table(view).checkpoint(settings) + "/offsets")


def can_stream(spark: SparkSession, settings: Settings, view: View) -> bool:
    """Whether a stream knows where to start: its checkpoint, or its replay's marker."""
    return (
        has_checkpoint(spark, settings, view) or replayed_through(spark, settings, view) is not None
    )


# Beside a view's stream checkpoint: the position its last replay was built from,
# and what it read (a `SOURCES` name). Over several sources, also where the stream
# has read each source to (`POSITION_MARKER`), since a micro-batch with no change
# of one source says nothing of where that source stands.
REPLAY_MARKER = "regauge_replayed_through"
REPLAY_SOURCE_MARKER = "regauge_replayed_from"
POSITION_MARKER = "regauge_read_through"


def _marker(settings: Settings, view: View, name: str = REPLAY_MARKER) -> str:
    return f"{gold_table(view).checkpoint(settings)}/{name}"


def folds(spark: SparkSession, settings: Settings, view: View) -> bool:
    """Whether the view's live batches fold their changes into gold (`fold_changes`):
    its rows add up, and its last replay read bronze, so gold is the view of silver
    as of the version the stream follows on from.

    Not after a replay from Kafka: gold may then hold records silver does not have
    yet (the stream recomputes their rows once ingest brings them) or lack those
    past Kafka's retention, and a fold would count the first twice. Nor without a
    recorded source (a replay made before it was recorded, whose batches may also
    have committed without their transaction id): until the next replay, such a
    stream recomputes, which is right whatever gold holds."""
    if view.sums is None:
        return False
    source = lake.read_text(spark, _marker(settings, view, REPLAY_SOURCE_MARKER)) or ""
    return source.strip() == "bronze"


def _read_position(
    spark: SparkSession, settings: Settings, view: View, name: str
) -> Position | None:
    text = lake.read_text(spark, _marker(settings, view, name))
    return Position.parse(view, text) if text and text.strip() else None


def replayed_through(spark: SparkSession, settings: Settings, view: View) -> Position | None:
    """The position the view's last replay was built from (None: none)."""
    return _read_position(spark, settings, view, REPLAY_MARKER)


def replay(spark: SparkSession, settings: Settings, view: View, source: str = "bronze") -> Position:
    """Rebuild the view from all of its input up to the newest commits; return that
    position.

    Clears the view's stream checkpoint and leaves the position beside it, so
    the stream started next (`stream`) continues right after it.
    """
    lake.delete_tree(spark, gold_table(view).checkpoint(settings))
    position = batch(spark, settings, view, source=source)
    lake.write_text(spark, _marker(settings, view, REPLAY_SOURCE_MARKER), f"{source}\n")
    lake.write_text(spark, _marker(settings, view), f"{position}\n")
    return position


# -- tags ------------------------------------------------------------------------------
# Delta keeps this session setting as the next commits' userMetadata.
TAG_CONF = "spark.databricks.delta.commitInfo.userMetadata"


def tag(position: Position | int, source: str) -> str:
    """What a gold commit was computed from: its input as of one position (a number:
    the shop's silver version)."""
    if isinstance(position, int):
        position = Position(((registry.SHOP_SOURCE, position),))
    return json.dumps({**position.tag_fields(), "source": source})


def latest_tag(spark: SparkSession, path: str) -> tuple[int, Position, str] | None:
    """The newest gold commit tagged with a position: (gold version, position,
    source), or None if no commit has a tag yet."""
    for row in (
        lake.history(spark, path)
        .where(F.col("userMetadata").isNotNull())
        .orderBy(F.col("version").desc())
        .select("version", "userMetadata")
        .toLocalIterator()
    ):
        try:
            meta = json.loads(row["userMetadata"])
        except ValueError:
            continue
        position = Position.from_tag(meta) if isinstance(meta, dict) else None
        if position is not None:
            return int(row["version"]), position, str(meta.get("source"))
    return None
