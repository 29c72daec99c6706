"""The Spark core's steps as operators run them: the Spark work, then what it made
published to Trino (and, for generated traffic, the reference data it names
seeded into PostgreSQL).

The Spark core (`spark_jobs`) never calls Trino or PostgreSQL: it sits below
them in the layers (pyproject.toml's import-linter contract). Whoever runs a
core step and wants analysts to see the result calls it through here.
"""

from __future__ import annotations

import threading
from datetime import datetime
from pathlib import Path

from pyspark.sql import SparkSession
from pyspark.sql.streaming import StreamingQuery

from spark_jobs import erasure, generator, ingest, producer
from spark_jobs.views import restatements, runner
from spark_jobs.views.base import View
from warehouse.base.settings import Settings
from warehouse.ops.stack import kafka
from warehouse.sql import catalog, reference


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
) -> producer.GeneratedRun:
    """Seed the customers and products `count` generated records name, then send them."""
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
    )


def publish_ingest_tables(settings: Settings) -> None:
    for table in (*ingest.TABLES, erasure.FORGOTTEN):
        catalog.publish(table, settings)


def prepare_ingest(spark: SparkSession, settings: Settings) -> None:
    """Create bronze, silver, the quarantine and the ledger, and publish them."""
    ingest.prepare(spark, settings)
    publish_ingest_tables(settings)


def ingest_once(spark: SparkSession, settings: Settings, *, accept_data_loss: bool = False) -> None:
    """Catch up Kafka -> bronze -> silver once (creating the tables), then publish them.

    No row counts: 4 Spark jobs (seconds in a fresh session) that most callers,
    the erasure's catch-up among them, would throw away. `ingest.counts` has them."""
    ingest.run_once(spark, settings, accept_data_loss=accept_data_loss)
    publish_ingest_tables(settings)


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


def replay(spark: SparkSession, settings: Settings, view: View, source: str = "bronze") -> int:
    """`runner.replay`, then the table published; returns the silver version it was built from."""
    after = runner.replay(spark, settings, view, source=source)
    catalog.publish(runner.gold_table(view), settings)
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
        catalog.publish(runner.gold_table(view), settings)
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
