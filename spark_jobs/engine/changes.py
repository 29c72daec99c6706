"""Pushing a live view version's committed changes to Kafka (docs/contract.md §9).

Every gold commit of a view version goes to the compacted topic
`regauge.view.<view>_v<N>` in one Kafka transaction of its own: an upsert per
row written (key: the row's key as a JSON object; value: the row as a JSON
object with `_gold_version`, the commit), a tombstone per row deleted. A
subscriber that applies the records in order holds the table as of the last
commit it read; one that reads the compacted topic from its start rebuilds it.

Exactly once per gold commit. The last commit published is kept in Kafka, in
the same transaction as that commit's records: as the committed offset
(commit + 1) of a consumer group that consumes nothing
(`send_offsets_to_transaction`). A publish therefore lands whole with its
mark, or not at all; a repeated micro-batch, or a host killed between its
MERGE and the publish, finds the mark where the last whole publish left it.
What to publish comes from the gold table's change feed, from the commit after
the mark to the newest, so a commit made while nobody published (the crash
above, or a replay before the stream starts) is published by the next call,
each commit in its own transaction. A live micro-batch's own commit, when it is
the only one after the mark, is published from the rows its MERGE wrote
instead (`Staged`): what its change feed holds, without reading it back. A
version's first publish, and one after the change feed is missing, is the whole
table as of its newest commit.

The transactional id is the view version's: a second publisher of it (a view
host nobody knew of) fences the first, which then fails instead of writing.
The topic must exist (the operations create it, compacted, before a stream starts).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterable, Iterator
from itertools import chain, groupby
from typing import NamedTuple

from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from spark_jobs.engine import lake
from spark_jobs.views.base import View
from warehouse.base import kafka_conf, registry
from warehouse.base.settings import Settings
from warehouse.base.text import first_line

log = logging.getLogger(__name__)

# The partition whose committed offset for the publisher's group is the mark.
MARK_PARTITION = 0
HEADER = "gold_version"
# A version's first publish (its whole table) may take minutes on a large view:
# the broker's own ceiling (transaction.max.timeout.ms) is 15 minutes.
TRANSACTION_TIMEOUT_MS = 900_000
CDF_PROPERTY = "delta.enableChangeDataFeed"
# The group coordinator's answers that mean "not yet, ask again": a broker that has
# just started is still loading its offsets topic, or a group is moving between
# brokers. `committed` raises them once librdkafka's own few retries are spent, and
# the first publish of a stream started then failed; with no new batch after it
# (no traffic), nothing published the table.
COORDINATOR_NOT_READY = frozenset(
    {
        KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
        KafkaError.COORDINATOR_NOT_AVAILABLE,
        KafkaError.NOT_COORDINATOR,
    }
)
# A stream's start waits this long at most for its first publish.
MARK_LOOKUP_S = 30

# One record: (gold commit, key JSON, value JSON or None for a tombstone).
Record = tuple[int, str, str | None]
Headers = list[tuple[str, str | bytes | None]]


def key_json(view: View) -> Column:
    """A gold row's key as its record's key: a JSON object."""
    return F.to_json(F.struct(*[F.col(k) for k in view.key]))


def value_json(view: View, commit: Column) -> Column:
    """A gold row as its record's value: a JSON object with the commit it belongs to."""
    return F.to_json(
        F.struct(*[F.col(f.name) for f in view.schema.fields], commit.alias("_gold_version"))
    )


def records(rows: DataFrame, view: View, version: int | None = None) -> DataFrame:
    """Gold rows (with `_commit_version`, or all of one `version`) -> one record per
    (commit, key): the row as it ends in that commit, or a tombstone (null value).

    Pure: from a change feed, a key's rows in one commit net to what the commit
    left (an overwrite deletes every row and inserts the new table, so a kept key
    has both); pre-images of updates say nothing the post-image does not.
    """
    commit = F.lit(version) if version is not None else F.col("_commit_version")
    kind = F.col("_change_type") if "_change_type" in rows.columns else F.lit("insert")
    return (
        rows.where(kind != "update_preimage")
        .select(
            commit.alias("commit"),
            key_json(view).alias("key"),
            F.when(kind == "delete", F.lit(None).cast("string"))
            .otherwise(value_json(view, commit))
            .alias("value"),
        )
        # max ignores nulls: any row written beats the key's delete.
        .groupBy("commit", "key")
        .agg(F.max("value").alias("value"))
    )


def staged_columns(view: View, commit: int) -> list[Column]:
    """`key` and `value` of a MERGE source's rows (gold's columns and `_op`, one row
    per key, see `gold_writes.differences`) as the records of the commit the MERGE makes:
    an upsert is the row, a delete a tombstone."""
    return [
        key_json(view).alias("key"),
        F.when(F.col("_op") == "delete", F.lit(None).cast("string"))
        .otherwise(value_json(view, F.lit(commit)))
        .alias("value"),
    ]


class Staged(NamedTuple):
    """One gold commit's records, read off the MERGE that made it (see `publish`)."""

    commit: int
    records: list[Record]


class Publisher:
    """Publishes one view version's gold commits, each exactly once (see the module)."""

    def __init__(
        self,
        spark: SparkSession,
        settings: Settings,
        view: View,
        path: str,
        writer: lake.Committer | None = None,
    ) -> None:
        """`writer`: the stream's delta-rs committer of gold, which reads gold's newest
        version without Spark's snapshot of it."""
        self.spark, self.settings, self.view, self.path = spark, settings, view, path
        self.writer = writer
        self.topic = registry.view_topic(view.name, view.version)
        self.group = registry.view_publisher_group(view.name, view.version)
        self._producer: Producer | None = None
        self._consumer: Consumer | None = None
        self._mark: int | None = None

    # -- setup ----------------------------------------------------------------------
    def _connect(self) -> None:
        if self._producer is not None:
            return
        conf = kafka_conf.client_conf(self.settings)
        enable_change_feed(self.spark, self.path)
        producer = Producer(
            {
                **conf,
                "transactional.id": f"regauge-view-{self.view.table_name}",
                "transaction.timeout.ms": TRANSACTION_TIMEOUT_MS,
                "linger.ms": 20,
            }
        )
        # Fences an older producer of this version, and finishes or aborts whatever
        # transaction it left open (a host killed mid-publish).
        producer.init_transactions(60)
        self._consumer = Consumer({**conf, "group.id": self.group, "enable.auto.commit": False})
        self._producer = producer

    def close(self) -> None:
        if self._producer is not None:
            self._producer.flush(30)
        if self._consumer is not None:
            self._consumer.close()
        self._producer = self._consumer = None
        self._mark = None

    # -- the mark -------------------------------------------------------------------
    def published_through(self) -> int:
        """The last gold commit published (-1: none yet)."""
        self._connect()
        if self._mark is None:
            deadline = time.monotonic() + MARK_LOOKUP_S
            while (error := self._mark_error()) is not None:
                if error.code() not in COORDINATOR_NOT_READY or time.monotonic() >= deadline:
                    # Never read as "nothing published": that would publish the
                    # table again.
                    raise KafkaException(error)
                log.info(
                    "%s: the group coordinator is not ready (%s); asking again",
                    self.topic,
                    error.name(),
                )
                time.sleep(1)
        assert self._mark is not None
        return self._mark

    def _mark_error(self) -> KafkaError | None:
        """Read the mark into `_mark`; the error Kafka answered instead, if any. A
        request the coordinator refused whole raises; a partition's error comes back
        on the partition."""
        assert self._consumer is not None
        try:
            (tp,) = self._consumer.committed(
                [TopicPartition(self.topic, MARK_PARTITION)], timeout=30
            )
        except KafkaException as exc:
            if exc.args and isinstance(exc.args[0], KafkaError):
                return exc.args[0]
            raise
        if tp.error is not None:
            return tp.error
        self._mark = tp.offset - 1 if tp.offset >= 0 else -1
        return None

    # -- publishing -----------------------------------------------------------------
    def publish(self, *, renew: bool = False, staged: Staged | None = None) -> int:
        """Publish every gold commit after the mark; return how many records went out.

        `renew` commits the mark again even if nothing is new (a stream's start): a
        group's offsets expire after the broker's offsets.retention.minutes without
        a commit, and an expired mark would publish the whole table again.

        `staged` is a micro-batch's own commit, its records read off the MERGE's
        source. They are sent as they are when that commit is the only one after
        the mark: the change feed would say the same, and reading it back costs a
        live batch Spark jobs and a snapshot of gold (about 0.6 s of a 4 s batch
        alone on 2 cores). Otherwise the change feed decides, as for any commit.
        """
        started = time.monotonic()
        mark = self.published_through()
        newest = (
            self.writer.version()
            if self.writer is not None
            else lake.newest_version(self.spark, self.path)
        )
        if staged is not None and mark == staged.commit - 1 and newest == staged.commit:
            sent = self._send(newest, iter(staged.records))
            self._said(sent, newest, newest, started)
            return sent
        if newest == mark:
            if renew:
                self._send(newest, iter(()))
            return 0
        rows = None
        if 0 <= mark < newest:
            try:
                # Materialised here: Delta finds a missing change feed only when it
                # plans the read, and vacuumed change files only when it reads them.
                rows = self._changes(mark + 1, newest).localCheckpoint(eager=True)
            except Exception as exc:
                log.warning(
                    "%s: cannot read the change feed of gold commits %d-%d (%s); publishing "
                    "the whole table as of commit %d instead",
                    self.topic,
                    mark + 1,
                    newest,
                    first_line(exc),
                    newest,
                )
        if rows is None:
            if mark > newest:
                log.warning(
                    "%s: published through gold commit %d but the table's newest is %d "
                    "(was it recreated?); publishing it whole",
                    self.topic,
                    mark,
                    newest,
                )
            rows = records(
                lake.read_version(self.spark, self.path, newest), self.view, newest
            ).localCheckpoint(eager=True)
            found: Iterator[Record] = chain(_ordered(rows), self._gone(rows, newest))
        else:
            found = _ordered(rows)
        sent = commits = 0
        try:
            for commit, group in groupby(found, key=lambda r: r[0]):
                sent += self._send(commit, group)
                commits += 1
            if commits == 0 or self._mark != newest:
                # Commits that changed no row (a table's creation, a compaction) move
                # the mark too, so the next call does not read their empty feed again.
                self._send(newest, iter(()))
        finally:
            rows.unpersist()
        self._said(sent, mark + 1, newest, started)
        return sent

    def _said(self, sent: int, first: int, last: int, started: float) -> None:
        log.info(
            "%s: published %d records of gold commits %d-%d (%.1f s)",
            self.topic,
            sent,
            first,
            last,
            time.monotonic() - started,
        )

    def _gone(self, table: DataFrame, commit: int) -> Iterator[Record]:
        """Tombstones for the keys the topic still holds and the table no longer has:
        a whole-table publish over a topic that missed some commits."""
        live = live_keys(self.settings, self.topic)
        if live:
            for row in table.select("key").toLocalIterator():
                live.discard(row["key"])
        for key in sorted(live):
            yield commit, key, None

    def _changes(self, first: int, last: int) -> DataFrame:
        feed = (
            self.spark.read.format("delta")
            .option("readChangeFeed", "true")
            .option("startingVersion", first)
            .option("endingVersion", last)
            .load(self.path)
        )
        return records(feed, self.view)

    def _send(self, commit: int, rows: Iterable[Record]) -> int:
        """One Kafka transaction: the commit's records and the mark moved to it."""
        producer, consumer = self._producer, self._consumer
        assert producer is not None and consumer is not None
        headers: Headers = [(HEADER, str(commit).encode())]
        producer.begin_transaction()
        n = 0
        # BaseException: a read of the rows that fails (or an interrupt) must not
        # leave the transaction open for the next publish to trip over.
        try:
            for _, key, value in rows:
                _produce(producer, self.topic, key, value, headers)
                n += 1
            producer.send_offsets_to_transaction(
                [TopicPartition(self.topic, MARK_PARTITION, commit + 1)],
                consumer.consumer_group_metadata(),
                60,
            )
            producer.commit_transaction(TRANSACTION_TIMEOUT_MS / 1000)
        except BaseException:
            # Aborting may itself fail (fenced): the next publish starts over from the
            # mark Kafka holds, so forget the one cached here.
            self._mark = None
            try:
                producer.abort_transaction(60)
            except KafkaException:
                self.close()
            raise
        self._mark = commit
        return n


def live_keys(settings: Settings, topic: str) -> set[str]:
    """The keys whose latest committed record in `topic` is not a tombstone."""
    consumer = Consumer(
        {
            **kafka_conf.client_conf(settings),
            "group.id": f"regauge-keys-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
        }
    )
    try:
        low, high = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=30)
        if high <= low:
            return set()
        consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        live: set[str] = set()
        # Transaction markers take offsets too, so the last record may sit below
        # high - 1: done once the position passes the end, or nothing more comes.
        idle = 0
        while idle < 5:
            msg = consumer.poll(1.0)
            if msg is None:
                if consumer.position([TopicPartition(topic, 0)])[0].offset >= high:
                    break
                idle += 1
                continue
            idle = 0
            if msg.error() is not None:
                continue
            key = (msg.key() or b"").decode()
            if msg.value() is None:
                live.discard(key)
            else:
                live.add(key)
            if (msg.offset() or 0) >= high - 1:
                break
        return live
    finally:
        consumer.close()


def _ordered(rows: DataFrame) -> Iterator[Record]:
    """The records in commit order, streamed to the driver: one task sorts them, which
    costs a micro-batch one job instead of a global sort's sampling and shuffle."""
    for row in rows.coalesce(1).sortWithinPartitions("commit").toLocalIterator():
        yield int(row["commit"]), row["key"], row["value"]


def _produce(producer: Producer, topic: str, key: str, value: str | None, headers: Headers) -> None:
    while True:
        try:
            producer.produce(topic, key=key, value=value, headers=headers)
            return
        except BufferError:
            # The local queue is full: let librdkafka send some first.
            producer.poll(0.5)


def enable_change_feed(spark: SparkSession, path: str) -> None:
    """Turn the gold table's change feed on (publishing reads it), once."""
    lake.ensure_properties(spark, path, {CDF_PROPERTY: "true"})
