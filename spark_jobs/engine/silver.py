"""Bronze -> silver: validated, deduplicated events, and a quarantine for the rest.

Every bronze record ends in exactly one place (docs/contract.md §1):

- silver, if it passes the contract and is the first record of its `event_id`
  in log order (smallest partition, then offset);
- quarantine, with its reason, if it fails the contract, or if it has the
  `event_id` of that first record but different content (`conflicting_duplicate`);
- nowhere else, if it is an exact duplicate (same id, same canonical content)
  of the first record: it is counted, and kept in bronze.

"First in log order" must not depend on arrival: a record of another
partition can reach the lake after a record it precedes in log order. So the
winner of an `event_id` is recomputed over every accepted record of that id
ever seen (the ledger), and silver and the quarantine are brought to that
answer. Live, replay, or one big batch therefore end identical.

Exactly once per micro-batch: the appends carry Delta's txnAppId/txnVersion,
so a batch replayed after a crash skips what it already committed, and the
MERGEs write a state computed from the ledger, which a replay computes again
unchanged.

A lost checkpoint means re-reading, never doubling (`recover`): ingest's query
starting without a checkpoint over a bronze that already holds records first
settles, in batches of the usual size, the bronze records that neither the
ledger nor the quarantine holds; then it brings silver and the conflict
quarantine to the ledger's answer wherever they differ (a batch may have
stopped between its commits); then Kafka is read from after bronze's last copy.

Over 400 lines on purpose: the steps of one micro-batch (validate, rank,
append, merge) share its transaction id, and keeping them in one module keeps
that exactly-once argument readable in one place.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from datetime import date
from functools import reduce
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from delta.tables import DeltaTable
from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import (
    BinaryType,
    DateType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from spark_jobs.engine import bronze as bronze_mod
from spark_jobs.engine import contract, faults, lake, ledger_index
from spark_jobs.engine import session as session_mod
from warehouse.base import metrics, registry
from warehouse.base.settings import Settings

log = logging.getLogger(__name__)

# The shop's tables; every function that touches a source's tables takes its plan
# (`contract.Plan.tables`) or its name.
SILVER = registry.SILVER_EVENTS
QUARANTINE = registry.SILVER_QUARANTINE
LEDGER = registry.SILVER_LEDGER

_POSITION = [
    StructField("partition", IntegerType(), False),
    StructField("offset", LongType(), False),
]


def silver_schema(event_schema: StructType) -> StructType:
    """Silver's columns: the typed event (`contract.Plan.event_schema`), the kept
    record's position, and how it is laid out."""
    return StructType(
        [
            *event_schema.fields,
            *_POSITION,
            StructField("kafka_timestamp", TimestampType(), False),
            StructField("content_hash", StringType(), False),
            # The UTC date of event_time: with event_type, how silver is laid out.
            StructField("event_date", DateType(), False),
        ]
    )


SILVER_SCHEMA = silver_schema(contract.EVENT_SCHEMA)  # the shop's
# Silver is partitioned by what views look events up by: their type (a revenue
# view never reads cart events) and their event date (a live micro-batch that
# recomputes one hour reads that day, not all of history). Filters on these
# columns prune whole directories, in Spark and in Trino alike.
SILVER_PARTITIONS = ("event_type", "event_date")
QUARANTINE_SCHEMA = StructType(
    [
        *_POSITION,
        StructField("kafka_timestamp", TimestampType(), False),
        StructField("raw_value", BinaryType(), True),
        StructField("reason", StringType(), False),
        StructField("detail", StringType(), True),
        StructField("quarantined_at", TimestampType(), False),
        # Set when the record parsed far enough to have them: lets an engineer
        # find every record of one event id.
        StructField("event_id", StringType(), True),
        StructField("content_hash", StringType(), True),
    ]
)
# Every record that passed validation, winner or not: what "all history" means
# for dedup. Bronze holds the same records, but this is small and needs no parsing.
LEDGER_SCHEMA = StructType(
    [
        StructField("event_id", StringType(), False),
        *_POSITION,
        StructField("content_hash", StringType(), False),
    ]
)

# The userMetadata of every commit a re-admission makes (`spark_jobs.engine.readmit`): views
# name the events its silver commits land as restated by re-admission.
READMISSION_TAG = "regauge:readmission"

ACCEPTED = "accepted"
DUPLICATE = "duplicate"
CONFLICT = "conflicting_duplicate"


# -- pure transforms ---------------------------------------------------------------
def to_quarantine_rows(rejected: DataFrame) -> DataFrame:
    """Validated rows with a reject reason -> quarantine rows."""
    return rejected.select(
        "partition",
        "offset",
        "kafka_timestamp",
        F.col("value").alias("raw_value"),
        F.col("reject_reason").alias("reason"),
        F.col("reject_detail").alias("detail"),
        F.current_timestamp().alias("quarantined_at"),
        "event_id",
        "content_hash",
    )


def to_conflict_rows(conflicts: DataFrame) -> DataFrame:
    """Records that lost to an earlier one with other content (with `detail` and
    their raw `value`) -> quarantine rows."""
    return conflicts.select(
        "partition",
        "offset",
        "kafka_timestamp",
        F.col("value").alias("raw_value"),
        F.lit(CONFLICT).alias("reason"),
        "detail",
        F.current_timestamp().alias("quarantined_at"),
        "event_id",
        "content_hash",
    )


def to_silver_rows(accepted: DataFrame, plan: contract.Plan = contract.PLAN) -> DataFrame:
    """Validated, accepted rows of `plan`'s source -> its silver rows."""
    # The session time zone is UTC, so to_date is the UTC date.
    with_date = accepted.withColumn("event_date", F.to_date(plan.source.time_field))
    return with_date.select(*[F.col(f.name) for f in silver_schema(plan.event_schema).fields])


def classify(candidates: DataFrame) -> DataFrame:
    """Decide every accepted record of some event ids, given all of them ever seen.

    In: `event_id`, `partition`, `offset`, `content_hash`, `in_batch`.
    Out: the same plus `status` (accepted | duplicate | conflicting_duplicate),
    `winner_partition`, `winner_offset`, and `fresh`: no record of this id
    arrived before the current batch, so its winner is a plain insert.
    """
    by_id = Window.partitionBy("event_id")
    first = Window.partitionBy("event_id").orderBy("partition", "offset")
    winner = F.min(F.struct("partition", "offset")).over(by_id)
    return (
        candidates.withColumn("_winner", winner)
        .withColumn("_winner_hash", F.first("content_hash").over(first))
        .withColumn("fresh", F.min(F.col("in_batch").cast("int")).over(by_id) == 1)
        .select(
            "event_id",
            "partition",
            "offset",
            "content_hash",
            "in_batch",
            F.when(
                (F.col("partition") == F.col("_winner.partition"))
                & (F.col("offset") == F.col("_winner.offset")),
                F.lit(ACCEPTED),
            )
            .when(F.col("content_hash") == F.col("_winner_hash"), F.lit(DUPLICATE))
            .otherwise(F.lit(CONFLICT))
            .alias("status"),
            F.col("_winner.partition").alias("winner_partition"),
            F.col("_winner.offset").alias("winner_offset"),
            "fresh",
        )
    )


# The quarantine detail of a conflicting record, by Spark's format_string and by
# Python's % alike (`Decided.conflicts`): the audit re-derives it from bronze.
CONFLICT_DETAIL = "event_id %s was first accepted at partition %d offset %d with different content"


def conflict_detail(state: DataFrame) -> DataFrame:
    """The quarantine detail of each conflicting record: which record it lost to."""
    return state.withColumn(
        "detail",
        F.format_string(CONFLICT_DETAIL, "event_id", "winner_partition", "winner_offset"),
    )


@dataclass(frozen=True)
class Settled:
    """What silver, the quarantine and the ledger hold for a set of bronze records."""

    silver: DataFrame
    quarantine: DataFrame
    ledger: DataFrame


def settle(records: DataFrame, plan: contract.Plan = contract.PLAN) -> Settled:
    """Bronze-shaped rows (any set of Kafka records) -> where each one settles.

    The whole contract in one pure step: the same validation and the same
    winner rule as the streaming path, with every record in one batch. A
    replay straight from Kafka uses its silver; the audit re-derives all three
    from bronze and compares them with the tables.
    """
    return settle_checked(contract.validate(records, plan), plan)


def settle_checked(checked: DataFrame, plan: contract.Plan = contract.PLAN) -> Settled:
    """`settle` for records already through `contract.validate`: a caller that
    reads all three results materialises the validation once."""
    accepted = checked.where(F.col("reject_reason").isNull())
    ledger = accepted.select(*[f.name for f in LEDGER_SCHEMA.fields])
    state = classify(ledger.withColumn("in_batch", F.lit(True)))
    key = ["partition", "offset"]
    silver = to_silver_rows(
        accepted.join(state.where(F.col("status") == ACCEPTED).select(*key), key), plan
    )
    conflicts = conflict_detail(state.where(F.col("status") == CONFLICT)).select(*key, "detail")
    quarantine = to_quarantine_rows(checked.where(F.col("reject_reason").isNotNull())).unionByName(
        to_conflict_rows(conflicts.join(checked, key))
    )
    return Settled(silver, quarantine, ledger)


def from_records(records: DataFrame, plan: contract.Plan = contract.PLAN) -> DataFrame:
    """Bronze-shaped rows (any set of Kafka records) -> the silver rows they settle to."""
    return settle(records, plan).silver


# -- IO ----------------------------------------------------------------------------
# Views follow silver through its change feed: silver is not append-only, because a
# winner can be replaced by one earlier in log order. A live batch's commits to it are
# delta-rs's (`_append_winners`), which checkpoints every 100 commits unless told, where
# Spark checkpoints every 10: each new snapshot a reader builds would replay up to 99.
SILVER_PROPERTIES = {"delta.enableChangeDataFeed": "true", "delta.checkpointInterval": "10"}
# The ledger takes an append every live batch, and Spark wrote a checkpoint every
# 10 commits, inside the commit: 3-4 s of one batch in ten, the spikes of the
# bench's step timings (docs/BENCHMARKS.md, issue 67). Its live appends are
# delta-rs's now (`lake.append_live`), and its live readers keep it open
# (`lake.open_table`, `LedgerIndex.writer`), so a longer log costs them nothing.
LEDGER_PROPERTIES = {"delta.checkpointInterval": "100"}
# Not the quarantine, whose live appends are delta-rs's too (`_quarantine_once`): a
# live batch's Spark MERGE of it (conflicts that leave or name a new winner) rebuilds
# its state from the log since its last checkpoint, which grew slower as that log
# grew toward 100. Set, since delta-rs would checkpoint every 100 commits.
QUARANTINE_PROPERTIES = {"delta.checkpointInterval": "10"}


def ensure_tables(
    spark: SparkSession, settings: Settings, source: str = registry.SHOP_SOURCE
) -> None:
    """Create `source`'s silver, quarantine and ledger, with silver's columns those of
    its whole declaration."""
    plan = contract.source_plan(source)
    path = plan.tables.silver.path(settings)
    lake.ensure_table(
        spark, path, silver_schema(plan.event_schema), SILVER_PROPERTIES, SILVER_PARTITIONS
    )
    # A lake made before silver's checkpoint interval was set (ingest is not running).
    lake.ensure_properties(spark, path, SILVER_PROPERTIES)
    evolve(spark, plan.tables.silver.path(settings), contract.newest(plan))
    quarantine = plan.tables.quarantine.path(settings)
    lake.ensure_table(spark, quarantine, QUARANTINE_SCHEMA, QUARANTINE_PROPERTIES)
    lake.ensure_properties(spark, quarantine, QUARANTINE_PROPERTIES)
    ledger = plan.tables.ledger.path(settings)
    lake.ensure_table(spark, ledger, LEDGER_SCHEMA, LEDGER_PROPERTIES)
    lake.ensure_properties(spark, ledger, LEDGER_PROPERTIES)


# Which contract version of the shop a lake's ingest validates by: a property of
# silver, so it lives and travels with the data it decided, and the Spark work that
# reads silver reads it too (Trino shows it in `"shop_events$properties"`).
CONTRACT_PROPERTY = "regauge.contractVersion"


def deployed_version(
    spark: SparkSession, settings: Settings, source: str = registry.SHOP_SOURCE
) -> int:
    """The contract version this lake runs for `source` (`deploy`); the first on a new lake."""
    path = registry.source_tables(source).silver.path(settings)
    if not lake.exists(spark, f"{path}/_delta_log"):
        return contract.FIRST_VERSION
    # In SQL: a replay from Kafka asks this over Spark Connect too.
    properties = lake.table_properties(spark, path)
    return int(properties.get(CONTRACT_PROPERTY, contract.FIRST_VERSION))


def deployed_plan(
    spark: SparkSession, settings: Settings, source: str = registry.SHOP_SOURCE
) -> contract.Plan:
    """The contract ingest, the audit and re-admission judge `source`'s records by."""
    return contract.source_plan(source, deployed_version(spark, settings, source))


def _refuse_unknown(spark: SparkSession, settings: Settings, plan: contract.Plan) -> None:
    """ValueError if silver holds records of a schema version `plan` does not know: a
    lake does not go back past records it admitted (they would no longer validate)."""
    known = F.lit(False)
    for event_type, versions in plan.versions:
        known = known | (
            (F.col("event_type") == event_type) & F.col("schema_version").isin(*versions)
        )
    unknown = (
        spark.read.format("delta")
        .load(plan.tables.silver.path(settings))
        .where(~known)
        .groupBy("event_type", "schema_version")
        .count()
        .collect()
    )
    if unknown:
        held = ", ".join(f"{r['count']} {r['event_type']} v{r['schema_version']}" for r in unknown)
        raise ValueError(
            f"silver holds {held}, which contract version {plan.contract_version} does not "
            "know; a lake does not go back past records it admitted"
        )


def deploy(
    spark: SparkSession, settings: Settings, version: int, source: str = registry.SHOP_SOURCE
) -> int:
    """Run `source`'s contract `version` from now on; returns the version it replaces.

    Silver already has every declared column (`ensure_tables`), so this is one
    metadata commit. Records quarantined under the old version stay where they are
    until re-admitted (docs/contract.md §10). Ingest must be stopped meanwhile: it
    reads the version when it starts."""
    declared = contract.source_plan(source).source.contract_version
    if not 1 <= version <= declared:
        raise ValueError(
            f"{source} declares contract versions 1 to {declared}; there is no version {version}"
        )
    ensure_tables(spark, settings, source)
    before = deployed_version(spark, settings, source)
    plan = contract.source_plan(source, version)
    if version < before:
        _refuse_unknown(spark, settings, plan)
    if before != version:
        spark.sql(
            f"ALTER TABLE delta.`{plan.tables.silver.path(settings)}` "
            f"SET TBLPROPERTIES ('{CONTRACT_PROPERTY}' = '{version}')"
        )
    return before


def evolve(spark: SparkSession, path: str, plan: contract.Plan) -> None:
    """Bring a silver made under an older declaration to `plan`'s: the columns newer
    versions add, and in them, for the records of versions without the field, its
    declared default (docs/contract.md §10: v1 orders read a discount of 0.00), as if
    they had been validated under `plan`.

    Each step finds what is left to do, so a start that stopped between them is
    finished by the next. The defaults are an UPDATE, which views follow through
    silver's change feed like any other change (their rows do not move: the views
    do not read fields a contract adds)."""
    lake.ensure_columns(spark, path, silver_schema(plan.event_schema))
    for up in plan.upcasts:
        lacking = (
            (F.col("event_type") == up.event_type)
            & F.col("schema_version").isin(*up.versions)
            & F.col(up.field.name).isNull()
        )
        if spark.read.format("delta").load(path).where(lacking).isEmpty():
            continue
        DeltaTable.forPath(spark, path).update(lacking, {up.field.name: contract.default(up.field)})
        log.info(
            "%s: %s of %s v%s read its default", path, up.field.name, up.event_type, up.versions
        )


@dataclass
class BatchResult:
    batch_id: int
    rows_in: int = 0
    accepted: int = 0
    duplicates: int = 0
    conflicts: int = 0
    replaced_winners: int = 0
    rejected: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0
    # Wall seconds by step (`step`), in the order first taken: where a slow batch's
    # time went, in its log line, without a profiler.
    steps: dict[str, float] = field(default_factory=dict)
    # When the batch began (`seconds` counts from here): ingest's starts it before its
    # validation and bronze's append, which it times as steps too.
    started: float = field(default_factory=time.monotonic)

    @contextlib.contextmanager
    def step(self, name: str) -> Iterator[None]:
        """Time the statements inside as the batch's step `name` (added up if repeated)."""
        started = time.monotonic()
        try:
            yield
        finally:
            self.steps[name] = self.steps.get(name, 0.0) + time.monotonic() - started

    def record(self) -> BatchResult:
        """Count the batch into the metrics (`warehouse.base.metrics`); returns itself."""
        # A conflicting duplicate goes to the quarantine too, under its own reason.
        quarantined = {**self.rejected, CONFLICT: self.conflicts}
        metrics.SILVER_ROWS.labels("accepted").inc(self.accepted)
        metrics.SILVER_ROWS.labels("duplicate").inc(self.duplicates)
        metrics.SILVER_ROWS.labels("quarantined").inc(sum(quarantined.values()))
        for reason, n in quarantined.items():
            if n:
                metrics.QUARANTINED.labels(reason).inc(n)
        return self

    def describe(self) -> str:
        rejected = ", ".join(f"{r}={n}" for r, n in sorted(self.rejected.items())) or "none"
        rate = self.rows_in / self.seconds if self.seconds else 0.0
        steps = ", ".join(f"{name} {s:.1f}" for name, s in self.steps.items())
        return (
            f"silver batch {self.batch_id}: {self.rows_in} in, {self.accepted} accepted, "
            f"{self.duplicates} exact duplicates, {self.conflicts} conflicting, "
            f"{self.replaced_winners} winners replaced, rejected: {rejected} "
            f"({self.seconds:.1f} s, {rate:,.0f} rows/s"
            + (f"; steps, s: {steps})" if steps else ")")
        )


def process_batch(
    spark: SparkSession,
    settings: Settings,
    batch: DataFrame,
    batch_id: int,
    app_id: str,
    index: ledger_index.LedgerIndex | None = None,
    plan: contract.Plan = contract.PLAN,
    writer: lake.Committer | None = None,
    quarantine: lake.Committer | None = None,
) -> BatchResult:
    """One micro-batch of bronze rows into silver, the ledger and the quarantine.

    With `index` (ingest's, kept across its batches), the earlier records of the
    batch's ids are read from the ledger at the positions the index names;
    without, the ledger is joined whole (recovery, one-off batches). `plan`: the
    contract the lake runs (`deployed_plan`); `writer`, `quarantine`: see
    `process_checked`."""
    # Materialised once with its lineage cut: the validation plan is large, and
    # every later action would otherwise analyse and optimise it again.
    checked = contract.validate(batch, plan).localCheckpoint(eager=True)
    try:
        return process_checked(
            spark, settings, checked, batch_id, app_id, index, plan, writer, quarantine=quarantine
        )
    finally:
        checked.unpersist()


def process_checked(
    spark: SparkSession,
    settings: Settings,
    checked: DataFrame,
    batch_id: int,
    app_id: str,
    index: ledger_index.LedgerIndex | None = None,
    plan: contract.Plan = contract.PLAN,
    writer: lake.Committer | None = None,
    result: BatchResult | None = None,
    collected: pa.Table | None = None,
    quarantine: lake.Committer | None = None,
) -> BatchResult:
    """`process_batch` for a batch `contract.validate`d and materialised by the caller,
    who unpersists it: ingest's, whose bronze append reads the same rows. `writer`:
    silver's, kept open by ingest on a local lake, to append new ids and replace
    winners with delta-rs (`_append_winners`, `_merge_winners`). `result`: the
    caller's, begun before its own steps (`BatchResult.started`). `collected`: the
    batch on the driver (`collect_live`), for the tally and the ledger's delta-rs
    append without a Spark job each. `quarantine`: the quarantine's, kept open by
    ingest on a local lake, to append a live batch's quarantine rows with delta-rs
    (`_quarantine_once`)."""
    result = BatchResult(batch_id) if result is None else result
    with result.step("tally"):
        keys = _tally(checked, result, keyed=index is not None, collected=collected)
    if result.rows_in > MAX_APPENDED_BY_DELTA_RS:
        quarantine = None  # a catch-up's: Spark's, as the ledger's
    accepted = checked.where(F.col("reject_reason").isNull())
    rejected = None
    if result.rejected:
        rejected = to_quarantine_rows(checked.where(F.col("reject_reason").isNotNull()))
    if result.rows_in > sum(result.rejected.values()):
        ledger = accepted.select(*LEDGER_SCHEMA.names)
        live, rows = None, None
        if result.rows_in <= MAX_APPENDED_BY_DELTA_RS:
            # One file, not one per Kafka partition: one task, and the table's log
            # and checkpoints stay small (a live batch's ledger rows are few). By
            # delta-rs with the index's writer (a live query's on a local lake).
            ledger = ledger.coalesce(1)
            live = index.writer if index is not None else None
            if collected is not None:
                accepted_rows = collected.filter(pc.is_null(collected.column("reject_reason")))
                rows = accepted_rows.select(LEDGER_SCHEMA.names)
        with result.step("ledger"):
            path = plan.tables.ledger.path(settings)
            what = f"silver batch {batch_id}: ledger"
            lake.append_live(ledger, path, f"{app_id}/ledger", batch_id, live, what, rows)
        faults.maybe_crash("silver_after_ledger", batch_id)
        with result.step("history"):
            history = _history(spark, settings, accepted, batch_id, app_id, index, keys, plan)
        if history is None:
            _settle_new(
                settings,
                checked,
                accepted,
                rejected,
                batch_id,
                app_id,
                result,
                plan,
                writer,
                quarantine,
            )
        else:
            _settle(
                spark,
                settings,
                checked,
                accepted,
                history,
                rejected,
                batch_id,
                app_id,
                result,
                plan,
                writer=writer,
                quarantine=quarantine,
            )
    elif rejected is not None:
        with result.step("quarantine"):
            _quarantine_once(settings, rejected, batch_id, app_id, plan, quarantine)
    result.seconds = time.monotonic() - result.started
    return result


def collect_live(checked: DataFrame, *keep: str) -> pa.Table:
    """A live batch's validated records (`checked`) on the driver in one Spark job:
    their `keep` columns (ingest's: bronze's), and what `process_checked` takes of
    them as `collected` (the tally's, the index's keys, the ledger's columns)."""
    names = dict.fromkeys([*keep, "reject_reason", *LEDGER_SCHEMA.names])
    return ledger_index.keyed(checked, *names).toArrow()


def _tally(
    checked: DataFrame, result: BatchResult, *, keyed: bool, collected: pa.Table | None = None
) -> ledger_index.Keys | None:
    """Count the batch's records and rejections into `result`; with `keyed`, also the
    accepted records' index keys (`ledger_index.Keys`). One Arrow collect of a few
    bytes a record, where a count and a key collect were two Spark jobs each; none
    with `collected` (`collect_live`)."""
    if collected is not None:
        table = collected
    else:
        wanted = (
            ledger_index.keyed(checked, "reject_reason")
            if keyed
            else checked.select("reject_reason")
        )
        table = wanted.toArrow()
    reasons = table.column("reject_reason")
    result.rows_in = table.num_rows
    result.rejected = {
        str(row["values"]): int(row["counts"])
        for row in pc.value_counts(reasons.drop_null()).to_pylist()
    }
    return ledger_index.Keys.from_arrow(table.filter(pc.is_null(reasons))) if keyed else None


def _quarantine_once(
    settings: Settings,
    rows: DataFrame,
    batch_id: int,
    app_id: str,
    plan: contract.Plan,
    writer: lake.Committer | None = None,
) -> None:
    """The batch's own quarantine rows, in one append under its transaction id. One
    file: they are a few of the batch's records, whose parts (its partitions, the
    join of its conflicts) wrote up to 7 files an append. By delta-rs with `writer`
    (a live batch's), as the ledger's: Spark's append took 0.2-1.9 s of a live batch
    in stop 99's bench under chaos traffic, where nearly every batch quarantines some
    records (docs/BENCHMARKS.md, issue 67)."""
    path = plan.tables.quarantine.path(settings)
    what = f"silver batch {batch_id}: quarantine"
    lake.append_live(rows.coalesce(1), path, _rejected_txn(app_id), batch_id, writer, what)


def _rejected_txn(app_id: str) -> str:
    """The transaction id of a batch's one quarantine append."""
    return f"{app_id}/rejected"


def _history(
    spark: SparkSession,
    settings: Settings,
    accepted: DataFrame,
    batch_id: int,
    app_id: str,
    index: ledger_index.LedgerIndex | None,
    keys: ledger_index.Keys | None,
    plan: contract.Plan,
) -> DataFrame | None:
    """Every accepted record ever seen of the batch's event ids, `in_batch` or not:
    what `classify` decides them from. The ledger holds the batch's own by now.
    `keys`: the accepted records' (`_tally`), given with `index`.

    None when the index tells that every accepted record is the first of a new id
    (no earlier record of their ids, and no two share an id hash, so no two an id):
    all are fresh winners, with nothing to classify (`_settle_new`)."""
    if index is not None and keys is not None:
        index.follow(spark, (f"{app_id}/ledger", batch_id), keys)
        earlier = index.earlier(keys)
        if not earlier and len(np.unique(keys.hashes)) == len(keys.hashes):
            return None
        if len(earlier) <= MAX_POSITIONS:
            columns = [f.name for f in LEDGER_SCHEMA.fields]
            # By delta-rs: the ledger commits every batch, and Spark would rebuild its
            # snapshot state each time to find these few rows (issue 67, P6).
            where, options = settings.delta_rs(plan.tables.ledger.path(settings))
            touched = accepted.select("event_id").distinct()
            theirs = (
                lake.read_at_positions(spark, where, options, earlier, LEDGER_SCHEMA)
                .join(F.broadcast(touched), "event_id", "left_semi")
                .select(*columns, F.lit(False).alias("in_batch"))
            )
            # The batch's own first: a union plans in its first side's session, here
            # the batch's (its query's own), whose settings `_settle` changes.
            return accepted.select(*columns, F.lit(True).alias("in_batch")).unionByName(theirs)
        log.info(
            "silver batch %d: %d earlier records of its ids; joining the whole ledger",
            batch_id,
            len(earlier),
        )
    return _joined_history(spark, settings, accepted, plan)


def _joined_history(
    spark: SparkSession, settings: Settings, accepted: DataFrame, plan: contract.Plan
) -> DataFrame:
    """`_history` by joining the whole ledger: recovery, re-admission, one-off batches."""
    touched = accepted.select("event_id").distinct()
    ledger = spark.read.format("delta").load(plan.tables.ledger.path(settings))
    in_batch = accepted.select("partition", "offset", F.lit(True).alias("in_batch"))
    return (
        ledger.join(F.broadcast(touched), "event_id", "left_semi")
        .join(F.broadcast(in_batch), ["partition", "offset"], "left")
        .fillna(False, ["in_batch"])
    )


# Up to this many new ids, `_settle_new` writes silver's rows in one task.
SMALL_BATCH = 50_000


# A live batch's new winners are appended, and the winners it replaces merged, by
# delta-rs (`_append_winners`, `_merge_winners`) up to this many each: they come to
# the driver first. A catch-up's larger batches are Spark's.
MAX_APPENDED_BY_DELTA_RS = 20_000


def _append_winners(
    rows: DataFrame,
    count: int,
    settings: Settings,
    batch_id: int,
    app_id: str,
    plan: contract.Plan,
    writer: lake.Committer | None,
) -> None:
    """Append a batch's `count` new winners (`rows`, silver's columns) to silver once,
    under (`app_id`/silver-new, `batch_id`): a retry finds the id and skips it.

    With `writer` (a live batch on a local lake) and at most MAX_APPENDED_BY_DELTA_RS
    rows, delta-rs commits them, as it does the winners a batch replaces
    (`_merge_winners`). Either both are delta-rs's or neither: after a commit of
    delta-rs's without a checksum (before `delta_checksum`), Spark's next append
    rebuilt silver's state from the log to find its transaction ids
    (`lake.append_once`), 4 Spark jobs and about 1.2 CPU-s of a 1,300-record batch
    (docs/BENCHMARKS.md, issue 67). A batch with more rows than that in either
    commits both by Spark (`_settle`)."""
    live = writer if count <= MAX_APPENDED_BY_DELTA_RS else None
    what = f"silver batch {batch_id}: new winners"
    path = plan.tables.silver.path(settings)
    lake.append_live(rows, path, f"{app_id}/silver-new", batch_id, live, what)


def _settle_new(
    settings: Settings,
    checked: DataFrame,
    accepted: DataFrame,
    rejected: DataFrame | None,
    batch_id: int,
    app_id: str,
    result: BatchResult,
    plan: contract.Plan,
    writer: lake.Committer | None = None,
    quarantine: lake.Committer | None = None,
) -> None:
    """`_settle` for a batch whose accepted records are all new ids' first (`_history`
    returned None): each is a fresh winner, so silver gains them all and the quarantine
    the rejected only, in the same commits under the same transaction ids as
    `_settle` makes. Without the classification's shuffle and tally: 4 to 6 Spark
    jobs of a clean batch (docs/BENCHMARKS.md, issue 67)."""
    result.accepted = result.rows_in - sum(result.rejected.values())
    rows = to_silver_rows(accepted, plan)
    # One file per silver partition a batch touches, as `_settle`'s shuffle made them
    # (many small files slow every reader): a small batch in one task, a large one
    # laid out by silver's partitions.
    if result.accepted <= SMALL_BATCH:
        rows = rows.coalesce(1)
    else:
        rows = rows.repartition(*SILVER_PARTITIONS)
    with result.step("append"):
        _append_winners(rows, result.accepted, settings, batch_id, app_id, plan, writer)
    if rejected is not None:
        with result.step("quarantine"):
            _quarantine_once(settings, rejected, batch_id, app_id, plan, quarantine)


def _settle(
    spark: SparkSession,
    settings: Settings,
    checked: DataFrame,
    accepted: DataFrame,
    history: DataFrame,
    rejected: DataFrame | None,
    batch_id: int,
    app_id: str,
    result: BatchResult,
    plan: contract.Plan,
    own_placed: bool = False,
    writer: lake.Committer | None = None,
    quarantine: lake.Committer | None = None,
) -> None:
    """Bring silver and the conflict quarantine to the ledger's answer for the batch's ids,
    and quarantine the batch's `rejected` rows. `own_placed`: the batch's own conflicts
    are in the quarantine already (re-admission restates them there in place).
    `writer`, `quarantine`: see `process_checked`."""
    touched = accepted.select("event_id").distinct()
    classified = classify(history)
    decided = None
    with result.step("classify"):
        if writer is not None and result.rows_in <= MAX_APPENDED_BY_DELTA_RS:
            # A live batch's one shuffle (by id), run as one job, not one per stage
            # (AQE's). Set in the batch's own session (its query's), where `_history`
            # plans it: ingest's session is shared by its sources' queries, each in a
            # thread of its own. (From the whole ledger, `_joined_history`, it plans
            # in ingest's, and keeps AQE.)
            own = accepted.sparkSession
            with lake.session_conf(own, session_mod.few_shuffles_conf(own)):
                decided = Decided(classified.toArrow())
            state = spark.createDataFrame(decided.table, classified.schema)
        else:
            state = classified.localCheckpoint(eager=True)
    try:
        if decided is not None:
            tally = decided.tally()
        else:
            tally = {
                (r["status"], r["in_batch"], r["fresh"]): r["count"]
                for r in state.groupBy("status", "in_batch", "fresh").count().collect()
            }
        result.accepted = sum(n for (s, b, _), n in tally.items() if s == ACCEPTED and b)
        result.duplicates = sum(n for (s, b, _), n in tally.items() if s == DUPLICATE and b)
        result.conflicts = sum(n for (s, b, _), n in tally.items() if s == CONFLICT and b)
        result.replaced_winners = tally.get((ACCEPTED, True, False), 0)
        own_conflicts = 0 if own_placed else result.conflicts

        if decided is not None:
            # Named, not joined: a filter of the materialised batch, no shuffle.
            new_winners = lake.at_positions(accepted, decided.positions(decided.winners(True)))
            replaced = lake.at_positions(accepted, decided.positions(decided.winners(False)))
        else:
            winners = accepted.join(
                state.where((F.col("status") == ACCEPTED) & F.col("in_batch")).select(
                    "partition", "offset", "fresh"
                ),
                ["partition", "offset"],
            )
            new_winners, replaced = winners.where("fresh"), winners.where(~F.col("fresh"))
        silver_path = plan.tables.silver.path(settings)
        # A batch with no new id (all duplicates, conflicts or replacements) has
        # nothing to append: a retry computes the same tally and skips it again.
        fresh = tally.get((ACCEPTED, True, True), 0)
        # Both of the batch's commits to silver by delta-rs, or neither (`_append_winners`).
        if max(fresh, result.replaced_winners) > MAX_APPENDED_BY_DELTA_RS:
            writer = None
        if fresh:
            with result.step("append"):
                rows = to_silver_rows(new_winners, plan)
                _append_winners(rows, fresh, settings, batch_id, app_id, plan, writer)
        if result.replaced_winners:
            replacing = to_silver_rows(replaced, plan)
            if decided is not None:
                # On the driver once: delta-rs's MERGE takes them as Arrow, and where
                # silver holds them asks for their partitions.
                decided = replace(
                    decided,
                    replacing=replacing.toArrow(),
                    earlier=_earlier_raw(settings, decided, plan),
                )
                replacing = spark.createDataFrame(decided.replacing, replacing.schema)
            else:
                replacing = replacing.localCheckpoint(eager=True)
            try:
                with result.step("where held"):
                    held = _where_held(spark, settings, state, replacing, plan, decided)
                with result.step("merge"), lake.source_checkpointed(spark):
                    _merge_winners(
                        spark,
                        silver_path,
                        replacing,
                        f"silver batch {batch_id}: replacing winners",
                        held,
                        writer,
                        decided.replacing if decided is not None else None,
                    )
                with result.step("quarantine"):
                    _settle_replaced(
                        spark,
                        settings,
                        checked,
                        touched,
                        state,
                        replacing,
                        rejected,
                        batch_id,
                        app_id,
                        own_conflicts,
                        plan,
                        decided,
                        quarantine,
                    )
            finally:
                replacing.unpersist()
            return
        # Without a replacement, earlier records keep their status, so the batch's
        # own conflicts are all the quarantine gains: one append with its rejected
        # records, under the batch's transaction id (a retry skips it whole).
        with result.step("quarantine"):
            _quarantine_own(
                checked,
                state,
                rejected,
                own_conflicts,
                settings,
                batch_id,
                app_id,
                plan,
                writer=quarantine,
            )
    finally:
        state.unpersist()


def _quarantine_own(
    checked: DataFrame,
    state: DataFrame,
    rejected: DataFrame | None,
    conflicts: int,
    settings: Settings,
    batch_id: int,
    app_id: str,
    plan: contract.Plan,
    extra: DataFrame | None = None,
    writer: lake.Committer | None = None,
) -> None:
    """The batch's rejected records and its own `conflicts` conflicting ones (each
    with the record it lost to), and `extra` quarantine rows, in one append under
    the batch's transaction id (by delta-rs with `writer`, `_quarantine_once`)."""
    parts = [p for p in (rejected, extra) if p is not None]
    if conflicts:
        ours = state.where((F.col("status") == CONFLICT) & F.col("in_batch"))
        parts.append(
            to_conflict_rows(
                conflict_detail(ours).join(checked.select(*_RAW), ["partition", "offset"])
            )
        )
    if parts:
        rows = reduce(DataFrame.unionByName, parts)
        _quarantine_once(settings, rows, batch_id, app_id, plan, writer)


def _settle_replaced(
    spark: SparkSession,
    settings: Settings,
    checked: DataFrame,
    touched: DataFrame,
    state: DataFrame,
    replacing: DataFrame,
    rejected: DataFrame | None,
    batch_id: int,
    app_id: str,
    conflicts: int,
    plan: contract.Plan,
    decided: Decided | None = None,
    writer: lake.Committer | None = None,
) -> None:
    """The quarantine, after a batch replaced winners. Only the replaced ids' earlier
    records change status: a new winner makes its former winner a conflict (chaos
    traffic's conflicting copy under another customer, so another partition). Those
    new conflicts join the batch's own rejected and conflicting records in its one
    append; a MERGE keyed by position is left for when a conflict must also leave
    the quarantine (it became the winner, or a duplicate of it). A MERGE took 3 to
    5 s of a warm batch on 2 cores, an append about 0.5 s.

    A retry of a batch whose append is committed takes the slower way, all the
    touched ids' conflicts by MERGE: the first try may have stopped between its
    append and its MERGE, or before this split existed, with its conflicts not in
    the append.

    `decided`: `state` on the driver (a live batch), which names the earlier records'
    positions without a Spark job. `writer`: the quarantine's (`_quarantine_once`),
    which also says whether the append committed: after a commit of delta-rs's
    without a checksum, Spark would rebuild the table's state to find the ids."""
    quarantine = plan.tables.quarantine.path(settings)
    txn = _rejected_txn(app_id)
    # (A version 0 is falsy: `txn_version(...) or -1` took batch 0's retry for a first try.)
    done = lake.txn_version(spark, quarantine, txn) if writer is None else writer.txn_version(txn)
    if done is not None and done >= batch_id:
        _settle_conflicts(spark, settings, checked, touched, state, plan, decided=decided)
        return
    replaced = replacing.select("event_id")
    earlier = state.where(~F.col("in_batch")).join(replaced, "event_id", "left_semi")
    earlier_decided = decided.subset(decided.of_replaced(in_batch=False)) if decided else None
    with _conflict_changes(
        spark, settings, checked, replaced, earlier, plan, decided=earlier_decided
    ) as changes:
        # With conflicts to remove or to restate (their winner changed), the MERGE
        # adds the new ones too; else the append. `any_added` says cheaply whether
        # `adds` (it reads bronze) has rows.
        merging = changes.any_stale()
        extra = to_conflict_rows(changes.adds) if not merging and changes.any_added() else None
        _quarantine_own(
            checked, state, rejected, conflicts, settings, batch_id, app_id, plan, extra, writer
        )
        if merging:
            _quarantine_conflicts(
                spark, settings, changes.adds, changes.to_remove, plan, changes.positions
            )


def admitted_state(
    spark: SparkSession,
    settings: Settings,
    checked: DataFrame,
    batch_id: int,
    app_id: str,
    plan: contract.Plan,
) -> DataFrame:
    """For re-admission (`spark_jobs.engine.readmit`): the `classify` state of records once
    quarantined that now pass (`checked`, validated), whose ledger rows are committed
    under (`app_id`/ledger, `batch_id`), with every other accepted record of their
    ids. Materialised: the caller unpersists it."""
    accepted = checked.where(F.col("reject_reason").isNull())
    return classify(_joined_history(spark, settings, accepted, plan)).localCheckpoint(eager=True)


def finish_admitted(
    spark: SparkSession,
    settings: Settings,
    checked: DataFrame,
    batch_id: int,
    app_id: str,
    plan: contract.Plan,
) -> BatchResult:
    """Silver's half of re-admission, once the quarantine no longer holds the admitted
    records (or holds them as conflicts): their winners in silver, replacing a later
    one, and the conflicts of the winners they replaced in the quarantine. Under
    `app_id`'s transaction ids, as a micro-batch's."""
    result = BatchResult(batch_id)
    accepted = checked.where(F.col("reject_reason").isNull())
    history = _joined_history(spark, settings, accepted, plan)
    _settle(spark, settings, checked, accepted, history, None, batch_id, app_id, result, plan, True)
    return result


# Past this many records looked up by position, bronze is joined instead: the
# literal predicates that let Delta skip bronze's other files grow with them.
MAX_POSITIONS = 2_000


def named_positions(rows: DataFrame) -> list[tuple[int, int]] | None:
    """The distinct (partition, offset) of `rows` on the driver, to name as literals
    (`lake.at_positions`, `lake.positions_condition`); None past MAX_POSITIONS rows.
    The rows are records (a position each), so they are counted as they come: a
    `distinct` first added a shuffle, and with AQE a job (docs/BENCHMARKS.md, issue 67)."""
    found = rows.select("partition", "offset").limit(MAX_POSITIONS + 1).toArrow()
    if found.num_rows > MAX_POSITIONS:
        return None
    partitions, offsets = (found.column(c).to_pylist() for c in ("partition", "offset"))
    return sorted(set(zip(partitions, offsets, strict=True)))


def _named(rows: DataFrame, known: list[tuple[int, int]] | None) -> list[tuple[int, int]] | None:
    """`named_positions(rows)`, or without a Spark job the same from `known`, `rows`'
    positions found by the caller on the driver (`Decided`)."""
    if known is None:
        return named_positions(rows)
    return sorted(set(known)) if len(known) <= MAX_POSITIONS else None


@dataclass(frozen=True)
class Decided:
    """`classify`'s state of a live batch, brought to the driver by one action (its
    rows: the batch's accepted records, at most MAX_APPENDED_BY_DELTA_RS, and their
    ids' earlier ones). Its tally, its winners, the
    positions a batch that replaces winners names and the quarantine's conflicts
    (`_decided_changes`) come from it in Python, where each was a Spark action over
    the state, and most a join: 51 Spark jobs of a batch that replaces a winner in
    `test_silver.py`, 9 this way (docs/BENCHMARKS.md, issue 67). Spark's path
    (re-admission, recovery, S3, a catch-up) decides the same with joins."""

    table: pa.Table
    # The silver rows of the winners the batch replaces, once `_settle` has them.
    replacing: pa.Table | None = None
    # Bronze's raw records (`_RAW`) at the earlier positions of the ids whose winner
    # the batch replaces, read once by delta-rs (`_earlier_raw`): where silver holds
    # them, and the conflicts' records. None if there are too many to name.
    earlier: pa.Table | None = None

    def tally(self) -> dict[tuple[str, bool, bool], int]:
        """The records by (`status`, `in_batch`, `fresh`), as `_settle`'s groupBy counts."""
        by = ["status", "in_batch", "fresh"]
        counts = self.table.group_by(by).aggregate([([], "count_all")])
        keys = zip(*(counts.column(c).to_pylist() for c in by), strict=True)
        return dict(zip(keys, counts.column("count_all").to_pylist(), strict=True))

    @staticmethod
    def winners(fresh: bool) -> pc.Expression:
        """The batch's winners: of new ids (`fresh`) or replacing an earlier winner."""
        new = pc.field("fresh") if fresh else ~pc.field("fresh")
        return (pc.field("status") == ACCEPTED) & pc.field("in_batch") & new

    def of_replaced(self, *, in_batch: bool | None = None) -> pc.Expression:
        """Every record of the ids whose winner the batch replaces, or of them those
        `in_batch` or not."""
        # Combined: pyarrow's isin takes no empty ChunkedArray (no type to match).
        ids = self.table.filter(self.winners(False)).column("event_id").combine_chunks()
        of_ids = pc.field("event_id").isin(ids)
        if in_batch is None:
            return of_ids
        return of_ids & (pc.field("in_batch") if in_batch else ~pc.field("in_batch"))

    def positions(self, where: pc.Expression) -> list[tuple[int, int]]:
        """The (partition, offset) of the records that meet `where`."""
        rows = self.table.filter(where)
        partitions, offsets = (rows.column(c).to_pylist() for c in ("partition", "offset"))
        return list(zip(partitions, offsets, strict=True))

    def subset(self, where: pc.Expression) -> Decided:
        """The records that meet `where` (with the same `replacing` and `earlier`)."""
        return replace(self, table=self.table.filter(where))

    def conflicts(self) -> dict[tuple[int, int], dict[str, Any]]:
        """The conflicting records, by position, each with the `detail` the quarantine
        holds for it (`conflict_detail`)."""
        rows = self.table.filter(pc.field("status") == CONFLICT).to_pylist()
        return {
            (r["partition"], r["offset"]): {
                **r,
                "detail": CONFLICT_DETAIL
                % (r["event_id"], r["winner_partition"], r["winner_offset"]),
            }
            for r in rows
        }


def bronze_at(
    spark: SparkSession,
    settings: Settings,
    positions: DataFrame,
    plan: contract.Plan,
    known: list[tuple[int, int]] | None = None,
) -> DataFrame:
    """Bronze's records at `positions` (partition, offset). A few are named and read by
    delta-rs (`lake.read_at_positions`: bronze commits every batch, and Spark would
    rebuild its snapshot state to skip its files), so only the files whose offsets
    can hold them are read, not all of history; more are joined by Spark. `known`:
    the same positions, if the caller has them on the driver (`Decided`)."""
    key = ["partition", "offset"]
    path = plan.tables.bronze.path(settings)
    wanted = _named(positions, known)
    if wanted is None:
        bronze = spark.read.format("delta").load(path)
        return bronze.join(positions.select(*key).distinct(), key, "left_semi")
    where, options = settings.delta_rs(path)
    return lake.read_at_positions(spark, where, options, wanted, bronze_mod.BRONZE_SCHEMA)


@dataclass(frozen=True)
class Held:
    """Where silver can hold the row of some event ids: it holds one of their
    records, so one of their positions, in one of those records' partitions."""

    partitions: list[tuple[str, date]]
    positions: list[tuple[int, int]] | None  # None: too many to name

    def condition(self) -> str:
        """A MERGE condition on the target `t` naming only those: Delta reads the named
        partitions, and of them only the files whose offsets can hold the positions."""
        named = " OR ".join(
            f"(t.event_type = '{t}' AND t.event_date = DATE'{d.isoformat()}')"
            for t, d in sorted(set(self.partitions))
        )
        if self.positions is None:
            return f"({named or 'false'})"
        return f"({named or 'false'}) AND ({lake.positions_condition(self.positions, 't')})"


def _where_held(
    spark: SparkSession,
    settings: Settings,
    state: DataFrame,
    replacing: DataFrame,
    plan: contract.Plan,
    decided: Decided | None = None,
) -> Held | None:
    """Where silver holds the rows a batch replaces (`Held`): every record ever seen of
    those ids is in `state`, and silver holds one of them (the first in log order,
    or another while recovery has yet to reconcile, or the new winner when the
    batch is retried after its MERGE). None if there are too many to name.
    `decided`: `state` on the driver (a live batch), which names the positions
    without a Spark job."""
    of_ids = state.join(replacing.select("event_id"), "event_id", "left_semi")
    before = of_ids.where(~F.col("in_batch"))
    if decided is not None:
        positions = _named(of_ids, decided.positions(decided.of_replaced()))
        earlier = decided.positions(decided.of_replaced(in_batch=False))
    else:
        positions, earlier = named_positions(of_ids), None

    def old() -> DataFrame:
        # Settled records read the same under the newest contract, whichever admitted them.
        newest = contract.newest(plan)
        return to_silver_rows(
            contract.validate(bronze_at(spark, settings, before, plan, earlier), newest), newest
        )

    few = earlier is not None and len(earlier) <= MAX_POSITIONS
    if decided is not None and decided.replacing is not None and few:
        # No distinct (a shuffle, and with AQE a job of its own): a few rows, on the driver.
        parts = _partitions(decided.replacing)
        if earlier:
            # Their partitions from their raw records, without planning the validation
            # (about 1.5 s of a chaos batch's 1.9 s here, docs/BENCHMARKS.md, issue 67).
            read = _raw_partitions(decided.earlier, plan)
            parts |= (
                read
                if read is not None
                else _partitions(old().select(*SILVER_PARTITIONS).toArrow())
            )
        return Held(sorted(parts), positions) if len(parts) <= MAX_POSITIONS else None
    found = (
        old()
        .select("event_type", "event_date")
        .unionByName(replacing.select("event_type", "event_date"))
        .distinct()
        .limit(MAX_POSITIONS + 1)
        .collect()
    )
    if len(found) > MAX_POSITIONS:
        return None
    return Held([(r["event_type"], r["event_date"]) for r in found], positions)


def _partitions(rows: pa.Table) -> set[tuple[str, date]]:
    """The silver partitions (`SILVER_PARTITIONS`) of these rows."""
    event_types, dates = (rows.column(c).to_pylist() for c in SILVER_PARTITIONS)
    return set(zip(event_types, dates, strict=True))


def _raw_partitions(raw: pa.Table | None, plan: contract.Plan) -> set[tuple[str, date]] | None:
    """The silver partitions of accepted records, from their raw values (`raw`, bronze's
    `_RAW` columns) in Python (`contract.accepted_partition`); None if `raw` is, or
    if any value does not read as validated, for Spark's validation to answer."""
    if raw is None:
        return None
    found: set[tuple[str, date]] = set()
    for value in raw.column("value").to_pylist():
        part = contract.accepted_partition(value, plan)
        if part is None:
            return None
        found.add(part)
    return found


def _earlier_raw(settings: Settings, decided: Decided, plan: contract.Plan) -> pa.Table | None:
    """Bronze's raw records (`_RAW`) at the earlier positions of the ids whose winner a
    live batch replaces, by delta-rs; None past MAX_POSITIONS (the caller joins)."""
    positions = sorted(set(decided.positions(decided.of_replaced(in_batch=False))))
    schema = StructType([_ADDS_SCHEMA[c] for c in _RAW])
    if len(positions) > MAX_POSITIONS:
        return None
    if not positions:
        return to_arrow_schema(schema, timezone="UTC").empty_table()
    where, options = settings.delta_rs(plan.tables.bronze.path(settings))
    return lake.arrow_at_positions(where, options, positions, schema)


def _merge_winners(
    spark: SparkSession,
    silver_path: str,
    winners: DataFrame,
    what: str,
    held: Held | None = None,
    writer: lake.Committer | None = None,
    rows: pa.Table | None = None,
) -> None:
    """Make these silver's rows for their event ids, replacing another winner if there is one.

    `held`: where silver holds a row of those ids, if known (a literal condition
    on the target, so Delta reads only the files that can hold them).
    `writer`: silver's delta-rs committer (a live batch on a local lake): the MERGE
    is then delta-rs's, as gold's is (`lake.Committer`), Spark's if it refuses;
    `rows`: `winners` as Arrow, if the caller has them on the driver.

    Safe to repeat: it writes the ledger's answer, and a conflicting commit
    (maintenance, an operator) aborted the first try whole.
    """
    if writer is not None and _merge_winners_rs(spark, winners, what, held, writer, rows):
        return
    condition = "t.event_id = s.event_id"
    if held is not None:
        condition += f" AND {held.condition()}"
    lake.retry_on_conflict(
        lambda: (
            DeltaTable.forPath(spark, silver_path)
            .alias("t")
            .merge(winners.alias("s"), condition)
            .whenMatchedUpdateAll(condition="t.partition <> s.partition OR t.offset <> s.offset")
            .whenNotMatchedInsertAll()
            .execute()
        ),
        what,
    )


def _merge_winners_rs(
    spark: SparkSession,
    winners: DataFrame,
    what: str,
    held: Held | None,
    writer: lake.Committer,
    rows: pa.Table | None = None,
) -> bool:
    """`_merge_winners` by delta-rs: whether it was done (False: delta-rs refused, for
    Spark's MERGE). The winners, materialised by the caller and a few dozen rows,
    come to the driver in one Spark job; the commit takes none, where Spark's MERGE
    ran about 12 jobs and 2 JVM CPU-s of a batch that replaces winners, and built
    the new snapshot's state from the log (docs/BENCHMARKS.md, issue 67). delta-rs
    writes the change feed's update pre- and post-images, which the views read."""
    if rows is None:
        rows = winners.toArrow()
    columns = list(rows.column_names)
    # Quoted: DataFusion folds unquoted names to lower case, and `offset` and
    # `partition` are keywords.
    condition = "t.`event_id` = s.`event_id`" + (f" AND {held.condition()}" if held else "")
    tag = spark.conf.get(lake.USER_METADATA, None)
    try:
        lake.retry_on_conflict(
            lambda: writer.merge(
                rows,
                condition,
                columns=columns,
                delete_when="false",
                update_when="t.`partition` <> s.`partition` OR t.`offset` <> s.`offset`",
                insert_when="true",
                txn=None,
                user_metadata=tag or None,
            ),
            what,
        )
    except lake.MergeRefused as exc:
        log.warning("%s: delta-rs could not merge (%s); merging with Spark instead", what, exc)
        return False
    return True


def _settle_conflicts(
    spark: SparkSession,
    settings: Settings,
    checked: DataFrame,
    touched: DataFrame,
    state: DataFrame,
    plan: contract.Plan,
    narrow: bool = True,
    decided: Decided | None = None,
) -> None:
    """Quarantine exactly the conflicting records of the touched ids, no more, no fewer.

    `narrow`: read the quarantine only at the positions of the ids' earlier records
    (a batch); `decided`: `state` on the driver, if the caller has it. Recovery
    reads all of it: a conflict left at a position the ledger no longer holds (an
    erasure stopped halfway) is there for it to remove."""
    with _conflict_changes(
        spark, settings, checked, touched, state, plan, narrow, decided
    ) as changes:
        _quarantine_conflicts(
            spark, settings, changes.adds, changes.to_remove, plan, changes.positions
        )


@dataclass(frozen=True)
class ConflictChanges:
    """What the quarantine's conflicts of some ids must become (`_conflict_changes`)."""

    adds: DataFrame  # conflicts to add or restate, with detail and raw value
    to_remove: DataFrame  # positions of conflicts that are one no longer
    # Whether any conflict is to be added or restated, and whether any held must change
    # or go: asked of materialised frames, or known on the driver (`Decided`).
    any_added: Callable[[], bool]
    any_stale: Callable[[], bool]
    # Those of `adds` and `to_remove`, if known on the driver (`Decided`).
    positions: list[tuple[int, int]] | None = None


@contextlib.contextmanager
def _conflict_changes(
    spark: SparkSession,
    settings: Settings,
    checked: DataFrame,
    touched: DataFrame,
    state: DataFrame,
    plan: contract.Plan,
    narrow: bool = True,
    decided: Decided | None = None,
) -> Iterator[ConflictChanges]:
    """The conflicts of the touched ids to add to the quarantine or restate, and those
    to remove from it, materialised while in use (`_settle_conflicts` says what
    `narrow` does).

    A conflict already held is restated when its winner changed: its detail names
    the record it lost to, and a record earlier in log order may have replaced that
    one since (the audit re-derives the detail from bronze and would name it).

    `decided`: `state`'s rows on the driver, if the caller has them (a live batch):
    the changes are then found there, in Python (`_decided_changes`)."""
    key = ["partition", "offset"]
    quarantine = plan.tables.quarantine.path(settings)
    if narrow and decided is not None:
        earlier = decided.positions(~pc.field("in_batch"))
        if len(earlier) <= MAX_POSITIONS:
            yield _decided_changes(spark, settings, checked, decided, earlier, plan)
            return
    # What may have to leave the quarantine is a conflict of an earlier record (its
    # winner changed): read at their positions only, if few, by delta-rs (the
    # quarantine commits most batches: Spark would rebuild its snapshot state). A
    # batch's own conflicts already there (a retry) need no look: the MERGE is keyed
    # by position.
    named = named_positions(state.where(~F.col("in_batch"))) if narrow else None
    if named is not None:
        where, options = settings.delta_rs(quarantine)
        needed = StructType([QUARANTINE_SCHEMA[c] for c in (*key, "detail", "event_id", "reason")])
        conflicts = lake.read_at_positions(spark, where, options, named, needed)
    else:
        conflicts = spark.read.format("delta").load(quarantine)
    conflicts = conflicts.where(F.col("reason") == CONFLICT)
    # Materialised: the quarantine is read once.
    present = (
        conflicts.join(F.broadcast(touched), "event_id", "left_semi")
        .select(*key, "detail")
        .localCheckpoint(eager=True)
    )
    wanted = conflict_detail(state.where(F.col("status") == CONFLICT))
    # Materialised: the positions below are known.
    to_add = wanted.join(present, [*key, "detail"], "left_anti").localCheckpoint(eager=True)
    to_remove = present.join(wanted.select(*key), key, "left_anti").select(*key)
    stale = present.join(wanted.select(*key, "detail"), [*key, "detail"], "left_anti")
    # A record that turns conflicting in a later batch (a former winner, or a
    # duplicate of one) is no longer in hand: its raw value comes from bronze,
    # read at those positions only.
    from_batch = to_add.join(checked.select(*_RAW), key)
    older = to_add.join(checked.select(*key), key, "left_anti")
    from_bronze = older.join(bronze_at(spark, settings, older, plan).select(*_RAW), key)
    try:
        yield ConflictChanges(
            from_batch.unionByName(from_bronze),
            to_remove,
            lambda: not to_add.isEmpty(),
            lambda: not stale.isEmpty(),
        )
    finally:
        to_add.unpersist()
        present.unpersist()


_RAW = ["partition", "offset", "kafka_timestamp", "value"]
# A conflict to add, with its raw record (`to_conflict_rows`'s input).
_ADDS_SCHEMA = StructType(
    [
        *_POSITION,
        QUARANTINE_SCHEMA["kafka_timestamp"],
        StructField("value", BinaryType(), True),
        QUARANTINE_SCHEMA["detail"],
        QUARANTINE_SCHEMA["event_id"],
        QUARANTINE_SCHEMA["content_hash"],
    ]
)


def _decided_changes(
    spark: SparkSession,
    settings: Settings,
    checked: DataFrame,
    decided: Decided,
    earlier: list[tuple[int, int]],
    plan: contract.Plan,
) -> ConflictChanges:
    """`_conflict_changes` of a live batch, found on the driver: the quarantine's rows
    at the `earlier` positions and the raw records of the conflicts to add come as
    Arrow (by delta-rs, and one Spark job for any of the batch's own), and are
    compared in Python, where Spark's joins, checkpoints and emptiness checks were
    about a dozen jobs of a batch that replaces a winner (docs/BENCHMARKS.md, issue
    67). The same answer as the joins: a conflict is added or restated unless held
    with the same detail; one held is stale unless wanted with the same detail."""
    key = ["partition", "offset"]
    where, options = settings.delta_rs(plan.tables.quarantine.path(settings))
    needed = StructType([QUARANTINE_SCHEMA[c] for c in (*key, "detail", "event_id", "reason")])
    present: dict[tuple[int, int], str | None] = {}
    if earlier:
        held = lake.arrow_at_positions(where, options, sorted(set(earlier)), needed).filter(
            (pc.field("reason") == CONFLICT)
            & pc.field("event_id").isin(decided.table.column("event_id").combine_chunks())
        )
        present = {(r["partition"], r["offset"]): r["detail"] for r in held.to_pylist()}
    wanted = decided.conflicts()
    to_add = [k for k in sorted(wanted) if present.get(k) != wanted[k]["detail"]]
    to_remove = sorted(k for k in present if k not in wanted)
    stale = sorted(
        k for k, d in present.items() if d is None or k not in wanted or wanted[k]["detail"] != d
    )
    # Their raw records: the batch's own from it, a former winner's from bronze.
    ours = [k for k in to_add if wanted[k]["in_batch"]]
    raw_schema = StructType([_ADDS_SCHEMA[c] for c in _RAW])
    raw = [lake.at_positions(checked, ours).select(*_RAW).toArrow()] if ours else []
    older = [k for k in to_add if not wanted[k]["in_batch"]]
    if older and decided.earlier is not None:
        # Read for `_where_held`: the earlier records of the replaced ids. A retry's
        # `decided` holds every touched id's, whose older conflicts may be others.
        raw.append(decided.earlier)
        read = decided.earlier.select(key).to_pylist()
        have = {(r["partition"], r["offset"]) for r in read}
        older = [k for k in older if k not in have]
    if older:
        where, options = settings.delta_rs(plan.tables.bronze.path(settings))
        raw.append(lake.arrow_at_positions(where, options, older, raw_schema))
    values = {(r["partition"], r["offset"]): r for t in raw for r in t.to_pylist()}
    # As the joins: a conflict whose record bronze no longer holds (erased) is not added.
    adds = [
        {**values[k], **{c: wanted[k][c] for c in ("detail", "event_id", "content_hash")}}
        for k in to_add
        if k in values
    ]
    arrow = to_arrow_schema(_ADDS_SCHEMA, timezone="UTC")
    position_schema = StructType(_POSITION)
    return ConflictChanges(
        adds=spark.createDataFrame(pa.Table.from_pylist(adds, schema=arrow), _ADDS_SCHEMA),
        to_remove=spark.createDataFrame(to_remove, position_schema),
        any_added=lambda: bool(adds),
        any_stale=lambda: bool(stale),
        positions=sorted({*(k for k in to_add if k in values), *to_remove}),
    )


def _quarantine_conflicts(
    spark: SparkSession,
    settings: Settings,
    to_add: DataFrame,
    to_remove: DataFrame,
    plan: contract.Plan,
    positions: list[tuple[int, int]] | None = None,
) -> None:
    """MERGE conflicting records (with detail and raw value) in, restate the detail of
    those held whose winner changed, and take stale ones out. `positions`: those of
    `to_add` and `to_remove`, if the caller knows them (`ConflictChanges`).

    Keyed by position, so running it twice leaves the same rows.
    """
    key = ["partition", "offset"]
    source = (
        to_conflict_rows(to_add)
        .withColumn("_op", F.lit("add"))
        .unionByName(
            to_remove.select(
                *key,
                *[
                    F.lit(None).cast(f.dataType).alias(f.name)
                    for f in QUARANTINE_SCHEMA.fields
                    if f.name not in key
                ],
                F.lit("remove").alias("_op"),
            )
        )
    )
    condition = "t.partition = s.partition AND t.offset = s.offset"
    # Materialised: its positions are collected first, and it reads bronze and the
    # quarantine the MERGE changes.
    source = source.localCheckpoint(eager=True)
    try:
        # Named as literals too, if few: Delta then reads only the quarantine's files
        # that can hold them, not all of it.
        named = _named(source, positions)
        if named == []:
            return  # nothing to add or remove: no commit
        # After the check: Spark's snapshot of a table whose newest commit has no
        # checksum (delta-rs's, where `delta_checksum` wrote none) reads its log.
        quarantine = DeltaTable.forPath(spark, plan.tables.quarantine.path(settings))
        if named is not None:
            condition += f" AND ({lake.positions_condition(named, 't')})"
        with lake.source_checkpointed(spark):
            lake.retry_on_conflict(
                lambda: (
                    quarantine.alias("t")
                    .merge(source.alias("s"), condition)
                    .whenMatchedDelete(
                        condition="s._op = 'remove' AND t.reason = 'conflicting_duplicate'"
                    )
                    # A conflict whose winner changed: it now names the new one.
                    .whenMatchedUpdate(
                        condition="s._op = 'add' AND t.reason = 'conflicting_duplicate'",
                        set={"detail": "s.detail"},
                    )
                    .whenNotMatchedInsert(
                        condition="s._op = 'add'",
                        values={f.name: F.col(f"s.{f.name}") for f in QUARANTINE_SCHEMA.fields},
                    )
                    .execute()
                ),
                "quarantine: conflicting duplicates",
            )
    finally:
        source.unpersist()


# -- recovery ------------------------------------------------------------------------
def app_id(spark: SparkSession, settings: Settings, source: str = registry.SHOP_SOURCE) -> str:
    """The txnAppId of ingest's checkpoint: new when the checkpoint is new.

    A fixed id would make a fresh checkpoint (batch ids from 0 again) skip
    every write as "already committed", so the id lives inside the checkpoint.
    """
    checkpoint = registry.source_tables(source).ingest_checkpoint(settings)
    return lake.checkpoint_app_id(spark, checkpoint, "regauge-ingest")


def _positions(spark: SparkSession, path: str, version: int) -> DataFrame:
    return lake.read_version(spark, path, version).select("partition", "offset")


def recover(
    spark: SparkSession,
    settings: Settings,
    txn_app: str,
    plan: contract.Plan = contract.PLAN,
) -> bool:
    """Before ingest's query starts without a checkpoint, settle what bronze holds.

    Without a checkpoint, ingest reads Kafka from after bronze's last copied
    offsets (`bronze.starting_offsets`), so whatever bronze holds must already be
    settled: a checkpoint lost after a batch's bronze append and before its
    silver commits, or a lake that the two queries of earlier releases wrote
    (bronze ahead of silver). False when there was nothing to do: the checkpoint
    has progress (the query resumes there) or bronze is empty.

    The plan is written before any work and fixes the versions read, so a crash
    part-way repeats the same chunks under the same transaction ids: their
    appends are skipped as committed and their MERGEs write the same state again.
    """
    checkpoint = plan.tables.ingest_checkpoint(settings)
    if lake.checkpoint_has_progress(spark, checkpoint):
        return False
    todo_file = checkpoint + "/regauge_recovery.json"
    text = lake.read_text(spark, todo_file)
    if text:
        todo = json.loads(text)
    else:
        bronze = plan.tables.bronze.path(settings)
        todo = {
            "bronze_version": lake.newest_version(spark, bronze),
            "ledger_version": lake.newest_version(spark, plan.tables.ledger.path(settings)),
            "quarantine_version": lake.newest_version(spark, plan.tables.quarantine.path(settings)),
            "settled": False,
        }
        if _positions(spark, bronze, todo["bronze_version"]).limit(1).count() == 0:
            return False
        lake.write_text(spark, todo_file, json.dumps(todo) + "\n")
    if not todo["settled"]:
        log.warning(
            "ingest has no checkpoint but bronze already holds records: settling the bronze "
            "records (up to bronze version %d) that neither the ledger nor the quarantine "
            "holds; Kafka is then read from after bronze's last copied offsets",
            todo["bronze_version"],
        )
        _settle_unsettled(spark, settings, todo, f"{txn_app}/recovery", plan)
        fixed = reconcile(spark, settings, plan)
        log.info("recovery: %d event ids brought to the ledger's answer", fixed)
        todo["settled"] = True
        lake.write_text(spark, todo_file, json.dumps(todo) + "\n")
    return True


def _settle_unsettled(
    spark: SparkSession,
    settings: Settings,
    todo: dict[str, Any],
    txn_app: str,
    plan: contract.Plan,
) -> None:
    """Bronze records in neither the ledger nor the quarantine, as micro-batches of the
    usual size. Chunks are chosen by position over fixed versions: a rerun makes the same."""
    settled = _positions(
        spark, plan.tables.ledger.path(settings), todo["ledger_version"]
    ).unionByName(
        _positions(spark, plan.tables.quarantine.path(settings), todo["quarantine_version"])
    )
    unsettled = (
        lake.read_version(spark, plan.tables.bronze.path(settings), todo["bronze_version"])
        .join(settled, ["partition", "offset"], "left_anti")
        .localCheckpoint(eager=True)
    )
    try:
        total = unsettled.count()
        chunks = max(1, -(-total // settings.ingest_max_records_per_batch))
        chunk = F.pmod(F.xxhash64("partition", "offset"), F.lit(chunks))
        for n in range(chunks):
            result = process_batch(
                spark, settings, unsettled.where(chunk == n), n, txn_app, plan=plan
            ).record()
            log.info("recovery %d of %d: %s", n + 1, chunks, result.describe())
    finally:
        unsettled.unpersist()


def reconcile(spark: SparkSession, settings: Settings, plan: contract.Plan = contract.PLAN) -> int:
    """Bring silver and the conflict quarantine to the ledger's answer wherever they differ.

    A batch that stopped between its commits (the ledger appended, silver and
    the quarantine not yet) is finished by its rerun from the checkpoint.
    Without the checkpoint, `recover` finishes it: `_settle_unsettled` settles
    its rejected records (in neither the ledger nor the quarantine), and this
    brings its winners and conflicts to the ledger's answer. It reads the whole
    ledger, silver and the quarantine, so it is for recovery, not for every
    batch. Returns the event ids it fixed.
    """
    id_pos = ["event_id", "partition", "offset"]
    state = classify(
        spark.read.format("delta")
        .load(plan.tables.ledger.path(settings))
        .withColumn("in_batch", F.lit(False))
    ).localCheckpoint(eager=True)
    quarantined = (
        spark.read.format("delta")
        .load(plan.tables.quarantine.path(settings))
        .where(F.col("reason") == CONFLICT)
        .select(*id_pos)
    )
    winners = state.where(F.col("status") == ACCEPTED).select(*id_pos)
    conflicts = state.where(F.col("status") == CONFLICT).select(*id_pos)
    in_silver = spark.read.format("delta").load(plan.tables.silver.path(settings)).select(*id_pos)
    ids = (
        winners.join(in_silver, id_pos, "left_anti")
        .unionByName(conflicts.join(quarantined, id_pos, "left_anti"))
        .unionByName(quarantined.join(conflicts, id_pos, "left_anti"))
        .select("event_id")
        .distinct()
        .localCheckpoint(eager=True)
    )
    try:
        fixed = ids.count()
        if not fixed:
            return 0
        of_ids = state.join(ids, "event_id", "left_semi")
        key = ["partition", "offset"]
        # Ledger records: accepted once, so read alike by the newest contract.
        checked = contract.validate(
            spark.read.format("delta")
            .load(plan.tables.bronze.path(settings))
            .join(of_ids.select(*key), key, "left_semi"),
            contract.newest(plan),
        ).localCheckpoint(eager=True)
        _merge_winners(
            spark,
            plan.tables.silver.path(settings),
            to_silver_rows(
                checked.join(of_ids.where(F.col("status") == ACCEPTED).select(*key), key), plan
            ),
            "recovery: winners",
        )
        _settle_conflicts(spark, settings, checked, ids, of_ids, plan, narrow=False)
        return fixed
    finally:
        ids.unpersist()
        state.unpersist()
