"""Restatements (docs/contract.md §3, lateness and finality): which final windows an event
changed, recorded in `gold.restatements` so an analyst sees which closed numbers
moved and why.

A window is final once the view's watermark has passed its end: the newest time
it has seen, minus the allowed lateness, where an event's time counts at most
up to its Kafka record timestamp (docs/contract.md §3), so one producer with a clock
a day fast cannot make every on-time window "final". The runner calls `record` after
each micro-batch's MERGE; the view's declared scope says where an event lands.
"""

from __future__ import annotations

import logging
import operator
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import reduce
from typing import NamedTuple

import pyarrow as pa
from delta.tables import DeltaTable
from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql.types import (
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from spark_jobs.engine import inputs, lake, scoping
from spark_jobs.engine.inputs import Position
from spark_jobs.engine.silver import READMISSION_TAG
from spark_jobs.views.base import View
from warehouse.base import registry
from warehouse.base.settings import Settings

log = logging.getLogger(__name__)

RESTATEMENTS = registry.GOLD_RESTATEMENTS
RESTATEMENTS_SCHEMA = StructType(
    [
        StructField("view", StringType(), False),
        StructField("version", IntegerType(), False),
        StructField("window_start", TimestampType(), False),
        StructField("window_end", TimestampType(), False),
        # The key besides time: the currency of an hour, the customer of a session.
        StructField("window_key", StringType(), False),
        # NULL for an erasure: the event is gone, and naming it would keep it.
        StructField("event_id", StringType(), True),
        StructField("event_time", TimestampType(), True),
        # Seconds the window had been over (in event time: the watermark's newest
        # time minus the window's end) when this event restated it.
        StructField("lateness", LongType(), False),
        StructField("restated_at", TimestampType(), False),
        # Why the closed number moved: LATE (an event landed in it) or ERASURE.
        StructField("reason", StringType(), True),
    ]
)
# Most commits are the live batches' appends by delta-rs, which checkpoints every
# 100 commits unless the table says otherwise (Spark: 10); readers (Spark, Trino)
# would replay up to 99 commit files. As gold's (`gold_writes.GOLD_PROPERTIES`).
RESTATEMENTS_PROPERTIES = {"delta.checkpointInterval": "10"}
LATE = "late"
ERASURE = "erasure"
# An event that re-admission brought back from the quarantine (docs/contract.md §10):
# it lands like a late one, from a silver commit that carries READMISSION_TAG.
READMISSION = "readmission"
RESTATEMENT_KEY = ("view", "version", "window_start", "window_key", "event_id")
# The change-feed rows that put an event in silver, and those that take one out.
LANDED = ("insert", "update_postimage")
REMOVED = ("update_preimage", "delete")


def vouched_time() -> Column:
    """The time an event vouches for (docs/contract.md §3): its event time, at most its
    Kafka record timestamp."""
    return F.least("event_time", "kafka_timestamp")


class Landed(NamedTuple):
    """What a change-feed micro-batch put in silver, as far as restatements care."""

    # The newest time (UTC microseconds) its events vouch for (None: it put none).
    newest: int | None
    # The earliest event time (UTC microseconds) of its `of` events (an order, a
    # cart event), and how many linked events (a cancellation) it put.
    earliest_of: int | None
    linked: int
    # Winners it replaced: event ids already in silver.
    replaced: int
    # The newest time the events it took out of silver vouched for (None: it took
    # none out): a replaced winner's earlier record, an erased customer's event.
    removed_newest: int | None

    @staticmethod
    def columns(view: View) -> list[Column]:
        """Aggregates over the batch's change-feed rows, in the fields' order."""
        landed = F.col("_change_type").isin(*LANDED)
        of = landed & F.col("event_type").isin(*view.scope.of)
        linked = landed & F.col("event_type").isin(*view.scope.linked)
        return [
            F.unix_micros(F.max(F.when(landed, vouched_time()))),
            F.unix_micros(F.min(F.when(of, F.col("event_time")))),
            F.count(F.when(linked, True)),
            F.count(F.when(F.col("_change_type") == "update_postimage", True)),
            F.unix_micros(F.max(F.when(F.col("_change_type").isin(*REMOVED), vouched_time()))),
        ]


def can_restate(view: View, newest: int | None, landed: Landed) -> bool:
    """Whether a batch could restate a final window, by its summary alone.

    A window is final once its end is at or before the watermark: `newest`, the
    newest time seen before the batch, minus the allowed lateness. An `of`
    event lands in a window that ends after its own time, so if the earliest of
    them is past that point none can restate anything. A linked event lands in
    the windows of the events it links to, which may be old: so any linked
    event may restate.
    """
    if newest is None:
        return False
    if landed.linked:
        return True
    if landed.earliest_of is None:
        return False
    return landed.earliest_of <= newest - int(view.allowed_lateness.total_seconds() * 1_000_000)


def restated(
    view: View,
    landed: DataFrame,
    silver: DataFrame | None,
    gold: DataFrame | None,
    newest_before: DataFrame | Column,
) -> DataFrame:
    """The final windows `landed` events restated.

    `newest_before` is one row, `newest`: the newest event time the view had
    seen before these events; or that time as a literal column, which costs no
    join (a one-row DataFrame is broadcast, a Spark job of its own). A window is
    final once that minus the allowed lateness (the watermark) has passed its end.
    """
    lateness_s = int(view.allowed_lateness.total_seconds())
    placed = scoping.lands_in(view, landed, silver, gold)
    where = (
        placed.withColumn("newest", newest_before)
        if isinstance(newest_before, Column)
        else placed.crossJoin(newest_before)
    )
    return where.where(
        F.col("newest").isNotNull()
        & (F.unix_micros("window_end") <= F.unix_micros("newest") - lateness_s * 1_000_000)
    ).select(
        F.lit(view.name).alias("view"),
        F.lit(view.version).alias("version"),
        "window_start",
        "window_end",
        "window_key",
        "event_id",
        "event_time",
        (F.unix_seconds("newest") - F.unix_seconds("window_end")).alias("lateness"),
        F.current_timestamp().alias("restated_at"),
        F.lit(LATE).alias("reason"),
    )


# A batch of up to this many silver commits of a source has each one's commit file
# read for re-admission's tag; past it (a catch-up), a Spark job lists the commits
# that landed the view's events first.
MAX_COMMITS_READ = 64


def _readmitted(
    spark: SparkSession,
    settings: Settings,
    changes: DataFrame,
    view: View | None,
    commits: dict[str, tuple[int, int]] | None,
) -> Column | None:
    """Which of the batch's rows a re-admission's silver commits landed, as a
    condition (None: none did), read from each commit's file (of each source the
    view reads: None, the shop's). `commits`, each source's first and last commit in
    the batch, where known; else one Spark job lists the commits."""
    landed = changes.where(F.col("_change_type").isin(*LANDED))
    by_source: dict[str, Column | None] = (
        {registry.SHOP_SOURCE: None}
        if view is None
        else {
            s: F.col("event_type").isin(*t) for s, t in inputs.event_types_by_source(view).items()
        }
    )
    tagged_rows: list[Column] = []
    for src, of_source in by_source.items():
        span = None if commits is None else commits.get(src)
        if commits is not None and span is None:
            continue  # no row of this source in the batch
        if span is not None and span[1] - span[0] < MAX_COMMITS_READ:
            versions = list(range(span[0], span[1] + 1))
        else:
            rows = landed if of_source is None else landed.where(of_source)
            versions = [r[0] for r in rows.select("_commit_version").distinct().collect()]
        path = inputs.silver_table(src).path(settings)
        tagged = [v for v in versions if lake.commit_metadata(spark, path, v) == READMISSION_TAG]
        if tagged:
            on = F.col("_commit_version").isin(*tagged)
            tagged_rows.append(on if of_source is None else on & of_source)
    return reduce(operator.or_, tagged_rows) if tagged_rows else None


def _name_readmissions(
    spark: SparkSession,
    settings: Settings,
    changes: DataFrame,
    found: DataFrame,
    view: View | None = None,
    commits: dict[str, tuple[int, int]] | None = None,
    where: Column | None = None,
) -> DataFrame:
    """`found` with reason READMISSION for the events a re-admission's silver commits
    landed (`where`, if the caller asked `_readmitted` already). Asked only of a
    batch that restated something."""
    where = _readmitted(spark, settings, changes, view, commits) if where is None else where
    if where is None:
        return found
    readmitted = (
        changes.where(F.col("_change_type").isin(*LANDED) & where)
        .select("event_id", F.lit(True).alias("_readmitted"))
        .distinct()
    )
    return (
        found.join(readmitted, "event_id", "left")
        .withColumn(
            "reason", F.when(F.col("_readmitted"), F.lit(READMISSION)).otherwise(F.col("reason"))
        )
        .select(*RESTATEMENTS_SCHEMA.fieldNames())
        .localCheckpoint(eager=True)
    )


def _arrow_rs(
    spark: SparkSession,
    settings: Settings,
    view: View,
    changes: DataFrame,
    found: DataFrame,
    commits: dict[str, tuple[int, int]] | None,
) -> tuple[DataFrame, pa.Table]:
    """`found` (re-admissions named) and its rows at the driver, for delta-rs."""
    rows = found.toArrow()
    if not rows.num_rows:
        return found, rows
    readmitted = _readmitted(spark, settings, changes, view, commits)
    if readmitted is not None:
        # Rare (a re-admission's commits in the batch): named by a join, as Spark's path.
        found = _name_readmissions(spark, settings, changes, found, view, where=readmitted)
        rows = found.toArrow()
    return found, rows


def _append_rs(
    spark: SparkSession,
    settings: Settings,
    view: View,
    changes: DataFrame,
    found: DataFrame,
    txn: tuple[str, int],
    writer: lake.Committer,
    commits: dict[str, tuple[int, int]] | None,
) -> int:
    """`record`'s append by delta-rs, for a batch that replaced no winner: how many
    restatements it found. Found again by Spark's append if delta-rs refuses."""
    found, rows = _arrow_rs(spark, settings, view, changes, found, commits)
    if not rows.num_rows:
        return 0
    tag = spark.conf.get(lake.USER_METADATA, None)
    label = f"restatements of {view.table_name}"
    try:
        lake.retry_on_conflict(
            lambda: writer.append(rows, txn=txn, user_metadata=tag or None), label
        )
    except lake.MergeRefused as exc:
        log.warning("%s: delta-rs could not append them (%s); appending with Spark", label, exc)
        app_id, batch_id = txn
        checkpointed = found.localCheckpoint(eager=True)
        path = RESTATEMENTS.path(settings)
        lake.retry_on_conflict(
            lambda: _spark_commit(
                path, lambda: lake.append_once(checkpointed, path, app_id, batch_id)
            ),
            label,
        )
    return int(rows.num_rows)


def _insert_absent_rs(
    spark: SparkSession,
    settings: Settings,
    view: View,
    changes: DataFrame,
    found: DataFrame,
    writer: lake.Committer,
    commits: dict[str, tuple[int, int]] | None,
) -> int | None:
    """`record`'s insert-if-absent by delta-rs, for a batch that replaced a winner:
    how many restatements it found, or None if delta-rs refused (Spark's MERGE then
    runs). Safe to repeat, as Spark's: a row already there is not inserted again,
    and a merge that inserts nothing makes no commit. Spark's MERGE of the same rows
    took 3 to 4 s of a live batch under load, most of it two snapshot-state
    rebuilds of the table (bench of stop 98)."""
    found, rows = _arrow_rs(spark, settings, view, changes, found, commits)
    if not rows.num_rows:
        return 0
    tag = spark.conf.get(lake.USER_METADATA, None)
    label = f"restatements of {view.table_name}"
    # Quoted: DataFusion folds unquoted names to lower case. delta-rs narrows the
    # table's files by the source's bounds on the key (its window starts).
    on = " AND ".join(f"t.`{k}` = s.`{k}`" for k in RESTATEMENT_KEY)

    def run() -> int | None:
        return writer.merge(
            rows,
            on,
            columns=RESTATEMENTS_SCHEMA.names,
            delete_when=None,
            update_when=None,
            insert_when="true",
            txn=None,
            user_metadata=tag or None,
        )

    try:
        lake.retry_on_conflict(run, label)
    except lake.MergeRefused as exc:
        log.warning("%s: delta-rs could not merge them (%s); merging with Spark", label, exc)
        return None
    return int(rows.num_rows)


def _spark_commit(path: str, commit: Callable[[], object]) -> None:
    """A Spark commit to the table live batches append to with delta-rs: under its
    commit lock (`lake.committing`), so that it cannot replace one of theirs."""
    with lake.committing(path):
        commit()


def ensure_table(spark: SparkSession, settings: Settings) -> None:
    """Create the table, or bring one made before erasures existed to this schema:
    a `reason` column (its rows were all late events) and a nullable event."""
    path = RESTATEMENTS.path(settings)
    lake.ensure_table(spark, path, RESTATEMENTS_SCHEMA, RESTATEMENTS_PROPERTIES)
    # Several streams start at once: a concurrent ALTER is a conflict, tried again.
    lake.retry_on_conflict(
        lambda: _spark_commit(
            path, lambda: lake.ensure_properties(spark, path, RESTATEMENTS_PROPERTIES)
        ),
        f"{RESTATEMENTS.trino_name}'s properties",
    )
    if "reason" in spark.read.format("delta").load(path).columns:
        return
    table = f"delta.`{path}`"
    log.info("%s: adding the reason column (docs/contract.md §3)", RESTATEMENTS.trino_name)
    for statement in (
        # The column last: it is what says the migration happened.
        f"ALTER TABLE {table} ALTER COLUMN event_id DROP NOT NULL",
        f"ALTER TABLE {table} ALTER COLUMN event_time DROP NOT NULL",
        f"ALTER TABLE {table} ADD COLUMNS (reason STRING)",
        f"UPDATE {table} SET reason = '{LATE}' WHERE reason IS NULL",
    ):
        try:
            spark.sql(statement)
        except Exception as exc:
            # Two streams starting at once both migrate: the loser finds it done.
            if "reason" not in spark.read.format("delta").load(path).columns:
                raise
            log.info("%s: migrated by a concurrent writer (%s)", path, type(exc).__name__)
            return


def newest_before(
    spark: SparkSession,
    settings: Settings,
    view: View,
    version: int | Position,
    floor: int | None = None,
) -> DataFrame:
    """One row, `newest`: the newest time the view's events in its input as of
    `version` (a position; a number: the shop's silver version) vouch for (null if
    none): max(min(event_time, kafka_timestamp)).

    `floor` (UTC microseconds), if given, is a time some event in that version
    vouches for. The newest is then at least `floor`, and an event vouching for
    that much has an event time at least as late (a vouched time is the earlier of
    the two), so only the days from `floor`'s on are read: a partition filter,
    exact, and bounded by how recent `floor` is instead of by history.
    """
    at = version if isinstance(version, Position) else Position(((registry.SHOP_SOURCE, version),))
    columns = ("event_type", "event_date", "event_time", "kafka_timestamp")
    frames = [
        lake.read_version(spark, inputs.silver_table(src).path(settings), v).select(*columns)
        for src, v in at.versions
        if v >= 0
    ]
    if not frames:
        return spark.range(1).select(F.lit(None).cast("timestamp").alias("newest"))
    silver = inputs.union(frames).where(F.col("event_type").isin(*view.event_types))
    if floor is not None:
        # The UTC date as a literal, as silver's event_date is (silver.py), whatever
        # the session's time zone.
        since = datetime.fromtimestamp(floor / 1e6, UTC).date()
        silver = silver.where(F.col("event_date") >= F.lit(since))
    return silver.agg(F.max(vouched_time()).alias("newest"))


def surviving_newest(changes: DataFrame) -> int | None:
    """The newest time vouched for by the events a change-feed batch leaves in silver:
    of each event id's last change (a batch may span commits that insert an event and
    then replace it), those that put it in. None if the batch leaves none."""
    last = Window.partitionBy("event_id").orderBy(
        F.col("_commit_version").desc(),
        # In one commit, an update's post-image comes after its pre-image.
        F.when(F.col("_change_type") == "update_preimage", 1).otherwise(0),
    )
    (newest,) = changes.withColumn("_last", F.row_number().over(last)).where(
        (F.col("_last") == 1) & F.col("_change_type").isin(*LANDED)
    ).agg(F.unix_micros(F.max(vouched_time()))).first() or (None,)
    return None if newest is None else int(newest)


@dataclass
class Watermark:
    """The newest time (UTC microseconds, None: no event yet) the view's events in
    silver vouch for, as a stream knows it from one micro-batch to the next.

    Read from silver once, at the stream's first batch with scopes (`record`);
    then each batch carries it forward with what it landed (`advance`). That is
    the same answer as reading silver again, because the stream sees every
    change silver makes to the view's events, and a batch that only inserts
    events can only raise the maximum.

    A batch that took events out (a replaced winner's earlier record, which can
    carry an older Kafka timestamp or other content) changes nothing either if
    each of them vouched for less than the maximum: the event that set it is
    still there. Otherwise the maximum is unknown until the next batch reads
    silver again, but only the days from `floor` on (`newest_before`): the
    newest time vouched for by an event still in silver that the stream saw
    land. A live batch otherwise reads no silver for it, however long the
    history.
    """

    known: bool = False
    micros: int | None = None
    # While not known: a time some event in silver vouches for (None: none known).
    floor: int | None = None

    def advance(self, landed: Landed, surviving: int | None = None) -> None:
        """Take in what a batch landed (once the batch is done). `surviving` is
        `surviving_newest` of the batch, needed only when `takes_out_newest`."""
        removed = landed.removed_newest
        if self.known:
            if self.takes_out_newest(landed):
                self.known, self.micros, self.floor = False, None, surviving
            elif landed.newest is not None:
                new = landed.newest
                self.micros = new if self.micros is None else max(self.micros, new)
        elif removed is not None and (self.floor is None or removed >= self.floor):
            # The event behind the floor may be among those taken out.
            self.floor = surviving
        elif landed.newest is not None:
            # Nothing it took out vouched for as much as the floor, nor did anything it
            # landed and took out again: what it landed from the floor on stays.
            self.floor = landed.newest if self.floor is None else max(self.floor, landed.newest)

    def takes_out_newest(self, landed: Landed) -> bool:
        """Whether the batch took out an event that may have set the maximum (or, not
        knowing it, the floor)."""
        removed = landed.removed_newest
        if removed is None:
            return False
        if not self.known:
            return self.floor is None or removed >= self.floor
        return self.micros is None or removed >= self.micros


def record(
    spark: SparkSession,
    settings: Settings,
    view: View,
    changes: DataFrame,
    silver: DataFrame | None,
    placed: DataFrame | None,
    before: Position,
    watermark: Watermark,
    txn: tuple[str, int],
    summary: Landed,
    writer: lake.Committer | None = None,
    commits: dict[str, tuple[int, int]] | None = None,
) -> int:
    """Record what a change-feed micro-batch (already limited to the view's event
    types, of the commits after `before`) restated, exactly once.
    Returns how many restatements it found.

    `silver` must hold every `of` event of the scopes the batch touched (it may
    hold no more: `scoping.narrowed`, or more of silver's rows: a live batch's read
    by delta-rs, `scoping.narrowed_sql`; None for a view without linked events, which
    places each event by itself: `scoping.lands_in`), and `placed` the gold rows the batch
    recomputed (`Applied.rows`): every event it landed is in one of them.
    `watermark` is as of `before`; if it is not known yet, it is read from silver
    here.

    An event enters silver once, so the restatements of a batch that only
    inserted events are new: they are appended under `txn` (the stream's
    txnAppId and the batch id), which skips the append if a retry of the batch
    already made it, and reads nothing of the table, however large it has
    grown. A batch that replaced a winner (an event id already in silver,
    maybe already restated) inserts only the rows not there yet, with a MERGE.
    A batch that cannot restate anything (`can_restate`) costs no Spark job.

    With `writer` (the table's `lake.Committer`, on a local lake), the append and
    the MERGE are delta-rs's: the rows come to the driver in one Spark job and are
    committed with no other, where Spark's append took a materialisation, a count
    and its commit's jobs, and its MERGE two snapshot-state rebuilds. `commits`
    (each source's first and last silver commit in the batch) saves the job that
    would list them to look for re-admissions.
    """
    landed = changes.where(F.col("_change_type").isin(*LANDED)).drop(*lake.CDF_COLUMNS)
    if not watermark.known:
        if any(v >= 0 for _, v in before.versions):
            newest_then = newest_before(spark, settings, view, before, watermark.floor)
            (watermark.micros,) = newest_then.select(F.unix_micros("newest")).first() or (None,)
        watermark.known = True
    micros = watermark.micros
    if micros is None or not can_restate(view, micros, summary):
        return 0
    # As a literal: no second pass over silver where it is used, and no join.
    newest = F.timestamp_micros(F.lit(micros))
    # A session is placed in the rows as recomputed, not in all of gold (fixed
    # windows, an hour say, are placed from the event alone).
    gold = None if view.fixed_windows else placed
    # One row per key: a cancellation lands once per order it cancels, and two
    # orders may share an id and an hour.
    found = restated(view, landed, silver, gold, newest).dropDuplicates(list(RESTATEMENT_KEY))
    if writer is not None and not summary.replaced:
        return _append_rs(spark, settings, view, changes, found, txn, writer, commits)
    if writer is not None:
        done = _insert_absent_rs(spark, settings, view, changes, found, writer, commits)
        if done is not None:
            return done
    found = found.localCheckpoint(eager=True)
    n, first, last = found.agg(
        F.count(F.lit(1)),
        F.unix_micros(F.min("window_start")),
        F.unix_micros(F.max("window_start")),
    ).first() or (0, None, None)
    if n:
        found = _name_readmissions(spark, settings, changes, found, view, commits)
    if n and not summary.replaced:
        app_id, batch_id = txn
        # A repeat after a conflicting commit is skipped if the first try landed.
        path = RESTATEMENTS.path(settings)
        lake.retry_on_conflict(
            lambda: _spark_commit(path, lambda: lake.append_once(found, path, app_id, batch_id)),
            f"restatements of {view.table_name}",
        )
    elif n:
        # Insert-if-absent, so a retry after a concurrent commit is harmless. The
        # conditions on the table alone let the MERGE read only this view
        # version's rows in the windows found (and skip the files without any),
        # not every restatement ever recorded.
        condition = (
            f"{lake.merge_condition(RESTATEMENT_KEY)} AND t.view = '{view.name}'"
            f" AND t.version = {view.version} AND t.window_start BETWEEN"
            f" timestamp_micros({first}) AND timestamp_micros({last})"
        )
        with lake.source_checkpointed(spark):
            path = RESTATEMENTS.path(settings)
            lake.retry_on_conflict(
                lambda: _spark_commit(
                    path,
                    lambda: (
                        DeltaTable.forPath(spark, path)
                        .alias("t")
                        .merge(found.alias("s"), condition)
                        .whenNotMatchedInsertAll()
                        .execute()
                    ),
                ),
                f"restatements of {view.table_name}",
            )
    return n
