"""The Spark core's steps as operators run them: the Spark work, then what it made
published to Trino (and, for generated traffic, the reference data it names
seeded into PostgreSQL).

The Spark core (`spark_jobs`) never calls Trino or PostgreSQL: it sits below
them in the layers (pyproject.toml's import-linter contract). Whoever runs a
core step and wants analysts to see the result calls it through here.
"""

from __future__ import annotations

import logging
import threading
from datetime import datetime
from pathlib import Path

from pyspark.sql import SparkSession
from pyspark.sql.streaming import StreamingQuery

from spark_jobs import generator, producer
from spark_jobs.engine import gold_writes, ingest, restatements, runner
from spark_jobs.engine.inputs import Position
from spark_jobs.views.base import View
from warehouse.base import registry
from warehouse.base.settings import Settings
from warehouse.ops import lag
from warehouse.ops.stack import kafka
from warehouse.sql import catalog, reference

log = logging.getLogger(__name__)


def produce(
    settings: Settings,
    *,
    seed: int,
    count: int,
    chaos: bool = False,
    rate: float | None = None,
    start: datetime = generator.DEFAULT_START,
    days: float = 7.0,
    progress: bool = False,
    source: str = registry.SHOP_SOURCE,
    follows: int | None = None,
) -> producer.GeneratedRun:
    """Seed the customers and products `count` generated records name, then send them
    (`source`'s records: the web's browse the same customers and products; `follows`,
    as for `producer.produce_generated`)."""
    reference.seed(settings, generator.customers_for(count), generator.products())
    return producer.produce_generated(
        settings,
        seed=seed,
        count=count,
        chaos=chaos,
        rate=rate,
        start=start,
        days=days,
        progress=progress,
        source=source,
        follows=follows,
    )


def publish_ingest_tables(settings: Settings, source: str | None = None) -> None:
    """`source`'s, or every declared source's, bronze, silver, quarantine, ledger and
    forgotten positions. One source's ingest makes only its own tables: on a new lake
    the others' are not there to publish (Trino refuses a table without a log)."""
    for name in [source] if source else ingest.source_names():
        for table in registry.source_tables(name).tables:
            catalog.publish(table, settings)


def prepare_ingest(spark: SparkSession, settings: Settings) -> None:
    """Create every source's bronze, silver, quarantine and ledger, and publish them."""
    for name in ingest.source_names():
        ingest.prepare(spark, settings, name)
    publish_ingest_tables(settings)


def ingest_once(
    spark: SparkSession,
    settings: Settings,
    *,
    accept_data_loss: bool = False,
    source: str | None = None,
) -> None:
    """Catch up Kafka -> bronze -> silver once for `source`, or for every declared
    source (creating the tables), then publish them. A source whose last finished
    batch ended at Kafka's end offsets has nothing to catch up: no query starts
    (a start settles, indexes and plans, 2-3 s warm and about 10 in a new driver).

    No row counts: 4 Spark jobs (seconds in a fresh session) that most callers,
    the erasure's catch-up among them, would throw away. `ingest.counts` has them."""
    for name in [source] if source else ingest.source_names():
        if not accept_data_loss and caught_up(spark, settings, name):
            # The tables made and evolved all the same, as a start would (a
            # declaration's new column after an upgrade), then published below.
            ingest.prepare(spark, settings, name)
            log.info("%s: its last batch ended at Kafka's end offsets; nothing to ingest", name)
            continue
        ingest.run_once(spark, settings, accept_data_loss=accept_data_loss, source=name)
    publish_ingest_tables(settings, source)


def caught_up(spark: SparkSession, settings: Settings, source: str) -> bool:
    """Whether bronze and silver hold every record Kafka has of `source`'s topic:
    its ingest's last finished batch ended at Kafka's end offsets, partition for
    partition. Unknown (no finished batch, Kafka not answering) is not caught up."""
    finished = ingest.finished_at(spark, settings, source)
    if not finished:
        return False
    topic = registry.source_tables(source).topic
    try:
        # A watermark is None when Kafka did not answer in time: unknown.
        ends = {p: w[1] for p, w in lag.kafka_watermarks(settings, 5, topic).items()}
    except Exception as exc:  # the query's start says what is wrong, in its own words
        log.debug("%s: Kafka's end offsets unknown (%s); ingesting", source, exc)
        return False
    return ends == finished


def run_ingest(
    spark: SparkSession,
    settings: Settings,
    stop: threading.Event,
    *,
    status_file: Path,
    trigger: str | None = None,
) -> None:
    """Run ingest until `stop` is set, its tables published before the first batch."""
    prepare_ingest(spark, settings)
    ingest.run(spark, settings, stop, trigger=trigger, status_file=status_file)


def ensure_restatements(spark: SparkSession, settings: Settings) -> None:
    restatements.ensure_table(spark, settings)
    catalog.publish(restatements.RESTATEMENTS, settings)


def replay(spark: SparkSession, settings: Settings, view: View, source: str = "bronze") -> Position:
    """`runner.replay`, then the table published; returns the position it was built from."""
    after = runner.replay(spark, settings, view, source=source)
    catalog.publish(gold_writes.gold_table(view), settings)
    return after


def stream(
    spark: SparkSession,
    settings: Settings,
    view: View,
    *,
    trigger: str | None = None,
    available_now: bool = False,
) -> StreamingQuery:
    """`runner.stream` with its gold commits pushed to Kafka, then its tables published
    to Trino (the runner makes both before the query starts; a replay makes only the
    gold table, so only a stream publishes the restatements)."""
    kafka.ensure_view_topic(settings, view.name, view.version)
    query = runner.stream(
        spark, settings, view, trigger=trigger, available_now=available_now, publish=True
    )
    try:
        catalog.publish(gold_writes.gold_table(view), settings)
        catalog.publish(restatements.RESTATEMENTS, settings)
    except BaseException:
        # The caller never gets the query to stop: a retry would find it running.
        runner.release(query)
        raise
    return query


def catch_up(spark: SparkSession, settings: Settings, view: View) -> None:
    """Run the view's stream until it has taken in all of silver, then release it."""
    query = stream(spark, settings, view, available_now=True)
    try:
        query.awaitTermination()
    finally:
        runner.release(query)
