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

import logging
import operator
import time
from datetime import datetime
from functools import partial, reduce

from pyspark.sql import DataFrame, Observation, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery

from spark_jobs.engine import (
    bronze,
    changes,
    faults,
    gold_writes,
    inputs,
    lake,
    marks,
    restatements,
)
from spark_jobs.engine import session as session_mod
from spark_jobs.engine import silver as silver_mod
from spark_jobs.engine.inputs import Position
from spark_jobs.engine.links import LinkIndex
from spark_jobs.engine.progress import Progress
from spark_jobs.views.base import View
from warehouse.base import metrics, registry
from warehouse.base.settings import Settings
from warehouse.base.text import first_line

SILVER = registry.SILVER_EVENTS

log = logging.getLogger(__name__)


# What a replay or batch reads (docs/contract.md §5 names them): "bronze" is all of
# history as the lake keeps it (bronze, validated and deduplicated into silver);
# "kafka" is every record Kafka still holds, validated and deduplicated on the fly.
SOURCES = ("bronze", "kafka")


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
# Without Spark 4's DataFrame query context: with it, every DataFrame operation a
# batch builds (a few hundred) captures the JVM thread's stack trace to name the
# user code in a later error. An error keeps its class and message. The view host
# also turns PySpark's side of it off (`warehouse.ops.processes`); stop 103's spike
# (8 live v2 batches a round, beside a test run) measured about 10 % less CPU with
# both off.
LIVE_SESSION_CONF = {
    **session_mod.INTERPRETED_CONF,
    "spark.sql.dataFrameQueryContext.enabled": "false",
}


def live_session(spark: SparkSession) -> SparkSession:
    """A new session of the application for one live query, set up for small batches."""
    session = spark.newSession()
    for key, value in LIVE_SESSION_CONF.items():
        session.conf.set(key, value)
    for key, value in session_mod.few_shuffles_conf(session).items():
        session.conf.set(key, value)
    return session


# -- modes -------------------------------------------------------------------------------
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
    path = gold_writes.gold_table(view).path(settings)
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
    table = gold_writes.gold_table(view)
    if source == "kafka":
        records = bronze.to_bronze_rows(bronze.read_kafka_batch(spark, settings))
        silver = silver_mod.from_records(
            bronze.ignoring_forgotten(records, bronze.forgotten_positions(spark, settings)),
            silver_mod.deployed_plan(spark, settings),
        ).localCheckpoint(eager=True)
    else:
        silver = read_input(spark, settings, view, position)
    events = silver.where(F.col("event_type").isin(*view.event_types)).count()
    # Laid out by time (see gold_writes.GOLD_FILE_ROWS): sorted by the window start, each task's
    # run cut into files of at most that many rows. A new table gets
    # GOLD_PROPERTIES when its stream starts (`gold_writes.ensure_gold`; this may run over
    # Spark Connect, where Delta's table API does not), and an overwrite keeps them.
    answer = gold_writes.gold_rows(view, silver).orderBy(view.window[0])
    with Progress(spark, f"replay {view.table_name}", events) as progress:
        (
            answer.write.format("delta")
            .mode("overwrite")
            .option("overwriteSchema", "true")
            .option("maxRecordsPerFile", gold_writes.GOLD_FILE_ROWS)
            .option("userMetadata", marks.tag(position, source))
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
    table = gold_writes.gold_table(view)
    path = table.path(settings)
    gold_writes.ensure_gold(spark, path, view)
    inputs.ensure(spark, settings, view)
    by_source = inputs.event_types_by_source(view)
    checkpoint = table.checkpoint(settings)
    replayed = marks.replayed_through(spark, settings, view)
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
        marks.read_position(spark, settings, view, marks.POSITION_MARKER)
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
    # delta-rs commits the batches' small MERGEs on a local lake (`lake.Committer`
    # says why not on S3), and reads gold's newest version for them and the publisher.
    committer = lake.Committer(*settings.delta_rs(path)) if settings.lake_is_local else None
    # ...and the batches' appends of restatements.
    restated_by = (
        lake.Committer(*settings.delta_rs(restatements.RESTATEMENTS.path(settings)))
        if settings.lake_is_local
        else None
    )
    publisher = changes.Publisher(spark, settings, view, path, committer) if publish else None
    folding = marks.folds(spark, settings, view)
    if publisher is not None:
        _publish(publisher, renew=True)

    def each_batch(changes: DataFrame, batch_id: int) -> None:
        nonlocal through
        version = F.col("_commit_version")
        summary = [
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
            # A view of sessions follows a small change by its span (`apply_changes`).
            *(gold_writes.span_columns() if view.scope.gap is not None else []),
        ]
        # The summary is observed while the batch is materialised: one Spark job
        # where an aggregate over the materialised rows ran a second.
        observed = Observation()
        mine = (
            changes.where(relevant)
            .observe(observed, *[c.alias(f"s{i}") for i, c in enumerate(summary)])
            .localCheckpoint(eager=True)
        )
        got = observed.get
        stats = [got[f"s{i}"] for i in range(len(summary))]
        n = len(view.sources)
        ranges = {
            src: (int(stats[2 * i]), int(stats[2 * i + 1]))
            for i, src in enumerate(view.sources)
            if stats[2 * i + 1] is not None
        }
        if not ranges:
            return
        oldest = stats[2 * n]
        landed_at = 2 * n + 1
        span_at = landed_at + len(restatements.Landed._fields)
        landed = restatements.Landed(*stats[landed_at:span_at])
        span = (
            (stats[span_at], stats[span_at + 1], stats[span_at + 2], stats[span_at + 3] or [])
            if stats[span_at:]
            else None
        )
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
        spark.conf.set(marks.TAG_CONF, marks.tag(at, "stream"))
        txn = (app_id, batch_id)
        try:
            applied = None
            if folding:
                applied = gold_writes.fold_changes(spark, path, view, mine, txn, committer)
            if applied is None:
                # One snapshot of silver, the batch's last commit, for the recompute
                # and for placing restatements. Pre-images matter too: a replaced
                # winner may leave a scope it was in. Read by Spark only if the batch
                # needs more of it than delta-rs's picks: a DataFrame of a version
                # has Spark build that snapshot, two jobs for each source when
                # its version has no checksum (stop 100's event log).
                changed = mine.drop(*lake.CDF_COLUMNS)
                applied = gold_writes.apply_changes(
                    spark,
                    path,
                    view,
                    changed,
                    partial(read_input, spark, settings, view, at),
                    links,
                    txn,
                    span,
                    partial(inputs.read_where, spark, settings, view, at),
                    partial(lake.read_where, spark, *settings.delta_rs(path)),
                    committer,
                )
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
                    writer=restated_by,
                    commits=ranges,
                )
        finally:
            spark.conf.unset(marks.TAG_CONF)
        if n > 1 and at != through:
            lake.write_text(spark, marks.marker(settings, view, marks.POSITION_MARKER), f"{at}\n")
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
    return lake.exists(spark, gold_writes.gold_table(view).checkpoint(settings) + "/offsets")


def can_stream(spark: SparkSession, settings: Settings, view: View) -> bool:
    """Whether a stream knows where to start: its checkpoint, or its replay's marker."""
    return (
        has_checkpoint(spark, settings, view)
        or marks.replayed_through(spark, settings, view) is not None
    )


def replay(spark: SparkSession, settings: Settings, view: View, source: str = "bronze") -> Position:
    """Rebuild the view from all of its input up to the newest commits; return that
    position.

    Clears the view's stream checkpoint and leaves the position beside it, so
    the stream started next (`stream`) continues right after it.
    """
    lake.delete_tree(spark, gold_writes.gold_table(view).checkpoint(settings))
    position = batch(spark, settings, view, source=source)
    lake.write_text(spark, marks.marker(settings, view, marks.REPLAY_SOURCE_MARKER), f"{source}\n")
    lake.write_text(spark, marks.marker(settings, view), f"{position}\n")
    return position
