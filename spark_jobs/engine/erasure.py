"""Excision (docs/contract.md §8): one customer's events out of every lake table, for good.

What is forgotten is a set of Kafka positions (partition, offset): every record
that names the customer (its key, its parsed `customer_id`, or, for a record
that does not parse, the id as a JSON string in its raw value), closed over
event ids, so that a conflicting duplicate of a forgotten event cannot become
its winner. The positions are kept in `silver.shop_events_forgotten`, with no
personal data: they are the ignore list that bronze ingest and a replay from
Kafka honour while Kafka still holds the records, the `forgotten` term of the
accounting, and the audit's list of what must never come back.

The deletes are MERGEs against those positions, so no commit's metadata holds
the id (a DELETE's predicate would stay in the log as a literal). Removing the
history is `compact`: VACUUM with no retention, then a checkpoint, then the log
files below it deleted, since Delta's own log cleanup keeps everything written
since midnight UTC. Views are recomputed by the caller (a replay of each
version: views stay pure functions of silver); the windows the forgotten
events had landed in are recorded as restatements with reason `erasure`
beforehand, without the event or the customer.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor

from delta.tables import DeltaTable
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import (
    IntegerType,
    LongType,
    StringType,
    TimestampType,
)

from spark_jobs.engine import lake, restatements
from spark_jobs.engine.forgotten import POSITION, ensure_table
from spark_jobs.views.base import View
from warehouse.base import registry
from warehouse.base.settings import Settings

log = logging.getLogger(__name__)

FORGOTTEN = registry.SILVER_FORGOTTEN
# What an erasure restatement says instead of a key that named the customer.
ERASED_KEY = "(erased)"


# -- pure transforms ---------------------------------------------------------------
def names_customer(customer_id: str, subject_field: str = "customer_id") -> Column:
    """Whether a bronze row belongs to the customer: by key, by its parsed subject
    field (the source's declared one, docs/contract.md §10), or, when its value is
    not an event at all, by the id quoted as JSON anywhere in the raw text (a
    malformed record still holds it)."""
    text = F.col("value").cast("string")
    parsed = F.get_json_object(text, f"$.{subject_field}")
    # A producer may write a non-ASCII id as itself or as \u escapes.
    quoted = {json.dumps(customer_id), json.dumps(customer_id, ensure_ascii=False)}
    in_text = F.lit(False)
    for q in sorted(quoted):
        in_text = in_text | F.coalesce(text.contains(q), F.lit(False))
    return (
        (F.col("key") == F.lit(customer_id))
        | (parsed == F.lit(customer_id))
        | (parsed.isNull() & in_text)
    )


def positions(
    bronze: DataFrame,
    ledger: DataFrame,
    quarantine: DataFrame,
    customer_id: str,
    subject_field: str = "customer_id",
) -> DataFrame:
    """(partition, offset, event_id) of every record to forget: those naming the
    customer, and every record silver settled under one of their event ids."""
    matched = bronze.where(names_customer(customer_id, subject_field)).select(
        *POSITION, F.get_json_object(F.col("value").cast("string"), "$.event_id").alias("event_id")
    )
    ids = matched.where(F.col("event_id").isNotNull()).select("event_id").distinct()
    same_id = (
        ledger.select(*POSITION, "event_id")
        .unionByName(quarantine.where(F.col("event_id").isNotNull()).select(*POSITION, "event_id"))
        .join(ids, "event_id", "left_semi")
    )
    return matched.unionByName(same_id).dropDuplicates(POSITION)


def forgotten_rows(found: DataFrame, erasure_id: str) -> DataFrame:
    """Positions found -> rows of the forgotten table (the event id only hashed)."""
    return found.select(
        F.lit(erasure_id).alias("erasure_id"),
        F.col("partition").cast(IntegerType()),
        F.col("offset").cast(LongType()),
        F.sha2(F.col("event_id"), 256).alias("event_id_sha256"),
        F.current_timestamp().alias("forgotten_at"),
    )


def erasure_restatements(
    view: View,
    gone: DataFrame,
    silver: DataFrame,
    gold: DataFrame,
    customer_id: str,
) -> DataFrame:
    """The final windows the forgotten silver rows `gone` had landed in (`silver` and
    `gold` as they were before the erasure), as restatements with reason `erasure`:
    no event, and a window key that named the customer replaced by ERASED_KEY."""
    events = gone.where(F.col("event_type").isin(*view.event_types))
    # By position and event type: over several sources (a union of their silvers)
    # a position alone names a record in each topic, and an event type one source.
    at = [*POSITION, "event_type"]
    kept = silver.join(gone.select(*at), at, "left_anti")
    newest = kept.where(F.col("event_type").isin(*view.event_types)).agg(
        F.max(restatements.vouched_time()).alias("newest")
    )
    found = restatements.restated(view, events, silver, gold, newest)
    return (
        found.withColumn(
            "window_key",
            F.when(F.col("window_key") == F.lit(customer_id), F.lit(ERASED_KEY)).otherwise(
                F.col("window_key")
            ),
        )
        .withColumn("event_id", F.lit(None).cast(StringType()))
        .withColumn("event_time", F.lit(None).cast(TimestampType()))
        .withColumn("reason", F.lit(restatements.ERASURE))
        .dropDuplicates(["view", "version", "window_start", "window_key"])
    )


# -- IO ----------------------------------------------------------------------------
def find(
    spark: SparkSession,
    settings: Settings,
    customer_id: str,
    src: registry.SourceTables = registry.SHOP,
    subject_field: str = "customer_id",
) -> DataFrame:
    """The positions of `src`'s topic to forget, materialised: the deletes below change
    their inputs. `subject_field`: the source's declared one."""
    read = spark.read.format("delta").load
    return positions(
        read(src.bronze.path(settings)),
        read(src.ledger.path(settings)),
        read(src.quarantine.path(settings)),
        customer_id,
        subject_field,
    ).localCheckpoint(eager=True)


def record(
    spark: SparkSession,
    settings: Settings,
    found: DataFrame,
    erasure_id: str,
    src: registry.SourceTables = registry.SHOP,
) -> int:
    """Add the positions to `src`'s ignore list (once each, so a rerun is harmless)."""
    ensure_table(spark, settings, src)
    rows = forgotten_rows(found, erasure_id)
    DeltaTable.forPath(spark, src.forgotten.path(settings)).alias("t").merge(
        rows.alias("s"), lake.merge_condition(POSITION)
    ).whenNotMatchedInsertAll().execute()
    return found.count()


def _delete_matching(
    spark: SparkSession, path: str, source: DataFrame, on: list[str], what: str
) -> int:
    """MERGE-delete the rows of `path` matching `source` on `on`; rows deleted."""
    table = DeltaTable.forPath(spark, path)
    lake.retry_on_conflict(
        lambda: (
            table.alias("t")
            .merge(source.select(*on).distinct().alias("s"), lake.merge_condition(on))
            .whenMatchedDelete()
            .execute()
        ),
        what,
    )
    metrics = table.history(1).select("operation", "operationMetrics").first()
    if metrics is None or metrics["operation"] != "MERGE":
        return 0
    return int((metrics["operationMetrics"] or {}).get("numTargetRowsDeleted", 0))


def silver_rows_at(
    spark: SparkSession,
    settings: Settings,
    found: DataFrame,
    src: registry.SourceTables = registry.SHOP,
) -> DataFrame:
    """`src`'s silver rows at the forgotten positions, before they go."""
    silver = spark.read.format("delta").load(src.silver.path(settings))
    return silver.join(F.broadcast(found.select(*POSITION)), POSITION, "left_semi")


def record_restatements(
    spark: SparkSession, settings: Settings, rows: DataFrame, erasure_id: str
) -> int:
    """Append an erasure's restatements once: the append carries the erasure's id
    (Delta's txnAppId), so the erasure run again before its deletion (a resumed
    request, issue 68, B) records none twice."""
    restatements.ensure_table(spark, settings)
    rows = rows.localCheckpoint(eager=True)
    n = rows.count()
    if n:
        path = restatements.RESTATEMENTS.path(settings)
        lake.append_once(rows, path, f"regauge-erasure-{erasure_id}", 0)
    return n


def delete_in_source(
    spark: SparkSession, settings: Settings, found: DataFrame, src: registry.SourceTables
) -> dict[str, int]:
    """Delete `src`'s positions `found` from its silver, ledger, quarantine and bronze.
    Returns the rows removed per table (Trino names)."""
    removed: dict[str, int] = {}
    for table in (src.silver, src.ledger, src.quarantine, src.bronze):
        n = _delete_matching(
            spark, table.path(settings), found, POSITION, f"forgetting in {table.key}"
        )
        removed[table.trino_name] = n
    return removed


def delete_everywhere(
    spark: SparkSession,
    settings: Settings,
    found: DataFrame,
    customer_id: str,
    others: dict[registry.SourceTables, DataFrame] | None = None,
) -> dict[str, int]:
    """Delete the shop's positions `found` from its silver, ledger, quarantine and
    bronze, and `others` (another source's positions, each) from theirs; then the
    restatements that name a forgotten event or the customer's sessions; take the id
    and the forgotten event ids out of the audit's findings. Returns the rows removed
    (or, for the findings, changed) per table: Trino names, no identifiers."""
    removed = delete_in_source(spark, settings, found, registry.SHOP)
    for src, theirs in (others or {}).items():
        removed.update(delete_in_source(spark, settings, theirs, src))
    path = restatements.RESTATEMENTS.path(settings)
    if DeltaTable.isDeltaTable(spark, path):
        ids = found.where(F.col("event_id").isNotNull()).select("event_id")
        keys = spark.createDataFrame([(customer_id,)], "window_key string")
        n = _delete_matching(spark, path, ids, ["event_id"], "forgetting restatements")
        n += _delete_matching(spark, path, keys, ["window_key"], "forgetting restatements")
        removed[restatements.RESTATEMENTS.trino_name] = n
    audits = registry.GOLD_AUDIT_RUNS.path(settings)
    if DeltaTable.isDeltaTable(spark, audits):
        # An audit's findings name the exact keys that differed: a session key or an
        # event id of the customer's may be among them. The finding stays (the
        # audit's history is kept), its text without them.
        event_ids = [r.event_id for r in found.select("event_id").distinct().collect()]
        names = [customer_id, *(e for e in event_ids if e)]
        removed[registry.GOLD_AUDIT_RUNS.trino_name] = _redact(
            spark, audits, names, ("summary", "detail")
        )
    return removed


def _quoted_alternatives(texts: Sequence[str]) -> str:
    """A Java regular expression matching any of `texts` literally (\\Q...\\E each,
    with an \\E inside a text closed and reopened around it)."""
    return "|".join("\\Q" + t.replace("\\E", "\\E\\\\E\\Q") + "\\E" for t in texts)


def _redact(spark: SparkSession, path: str, names: Sequence[str], columns: Sequence[str]) -> int:
    """Replace each of `names` with ERASED_KEY in the text `columns` of `path`; rows changed."""
    pattern = _quoted_alternatives(names)
    table = DeltaTable.forPath(spark, path)
    naming = F.lit(False)
    for c in columns:
        naming = naming | F.col(c).rlike(pattern)
    lake.retry_on_conflict(
        lambda: table.update(
            condition=naming,
            set={c: F.regexp_replace(F.col(c), pattern, ERASED_KEY) for c in columns},
        ),
        "forgetting in audit findings",
    )
    metrics = table.history(1).select("operation", "operationMetrics").first()
    if metrics is None or metrics["operation"] != "UPDATE":
        return 0
    return int((metrics["operationMetrics"] or {}).get("numUpdatedRows", 0))


_FILE_RETENTION = "delta.deletedFileRetentionDuration"


@contextlib.contextmanager
def removing_history(spark: SparkSession, user_metadata: str | None = None) -> Iterator[None]:
    """The session settings `compact` needs, for the whole of a batch of tables: they
    are the session's, so tables compacted side by side share them.

    The commits made meanwhile carry `user_metadata`: a view's tag (which silver
    version its table equals) must survive on the newest commit, since the
    commits before it are gone."""
    with lake.vacuum_session(spark):
        # No VACUUM START and END commits: they hold only counts, and two commits
        # fewer for each table an erasure compacts (the lake's, the views', the
        # marts') are seconds of CPU on 2 cores. (vacuum_session puts the setting back.)
        spark.conf.set(lake.VACUUM_LOGGING, "false")
        if user_metadata is not None:
            spark.conf.set(lake.USER_METADATA, user_metadata)
        try:
            yield
        finally:
            spark.conf.unset(lake.USER_METADATA)


def compact(spark: SparkSession, path: str) -> int:
    """Remove a table's history: files no longer in its newest version (the change
    feed's too), and every log file and checkpoint before a fresh checkpoint.
    Time travel to an earlier version fails afterwards. Returns the log files
    deleted. Inside `removing_history`. Every reader and writer of the table
    must be stopped: a stream behind the newest version could no longer read
    the versions it missed."""
    if not lake.in_vacuum_session(spark):
        raise RuntimeError("compact runs inside erasure.removing_history(spark)")
    table_sql = f"delta.`{path}`"
    # A checkpoint keeps the tombstones (removed files, with their column stats)
    # younger than this retention: with none, it keeps none.
    spark.sql(
        f"ALTER TABLE {table_sql} SET TBLPROPERTIES ('{_FILE_RETENTION}' = 'interval 0 hours')"
    )
    DeltaTable.forPath(spark, path).vacuum(0.0)
    checkpointed = lake.write_checkpoint(spark, path)
    dropped = _drop_log_before(spark, f"{path.rstrip('/')}/_delta_log", checkpointed)
    # Back to the default: Delta refuses time travel to any version older than
    # the retention, which the audit and the validation gate need.
    spark.sql(f"ALTER TABLE {table_sql} UNSET TBLPROPERTIES IF EXISTS ('{_FILE_RETENTION}')")
    return dropped


def compact_all(spark: SparkSession, paths: Sequence[str], threads: int = 3) -> list[str]:
    """`compact` each of `paths` that is a Delta table, a few side by side (most of
    a compaction is small Spark jobs and commits, which overlap well); the
    paths compacted, in order."""
    tables = [p for p in paths if DeltaTable.isDeltaTable(spark, p)]
    with removing_history(spark), ThreadPoolExecutor(threads) as pool:
        for path, dropped in zip(
            tables, pool.map(lambda p: compact(spark, p), tables), strict=True
        ):
            log.info("history removed from %s (%d log files)", path, dropped)
    return tables


def _drop_log_before(spark: SparkSession, log_dir: str, version: int) -> int:
    """Delete the log's commits, checksums and checkpoints older than `version`
    (the version of the checkpoint just written, which stands in for them)."""
    dropped = 0
    for name in lake.list_names(spark, log_dir):
        stem = name.split(".", 1)[0]
        if stem.isdigit() and int(stem) < version:
            lake.delete_tree(spark, f"{log_dir}/{name}")
            dropped += 1
    return dropped
