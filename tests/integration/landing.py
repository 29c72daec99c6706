"""What a generator run became in the lake, next to what the contract says it must become."""

from __future__ import annotations

import random
import time
from collections import Counter
from dataclasses import dataclass

from pyspark.sql import SparkSession

from spark_jobs.producer import GeneratedRun
from warehouse import registry
from warehouse.settings import Settings


def fresh_seed() -> int:
    """A seed no earlier run used: event ids carry it, and the lake outlives a test run."""
    return random.SystemRandom().randrange(10**6, 10**9)


@dataclass
class Landing:
    bronze: int
    silver: dict[str, tuple[int, int]]  # event_id -> position
    quarantine: dict[tuple[int, int], str]  # position -> reason
    silver_total_rows: int
    silver_distinct_ids: int

    @property
    def settled(self) -> int:
        return len(self.silver) + len(self.quarantine)


def landing(spark: SparkSession, settings: Settings, run: GeneratedRun) -> Landing:
    """The run's records as the lake holds them now, found by their Kafka positions."""
    positions = spark.createDataFrame(
        [p for p in run.positions if p is not None], "partition int, offset bigint"
    ).cache()
    read = spark.read.format("delta").load
    silver = read(registry.SILVER_EVENTS.path(settings))
    totals = silver.selectExpr("count(*) AS n", "count(DISTINCT event_id) AS ids").first()
    assert totals is not None
    try:
        return Landing(
            bronze=read(registry.BRONZE_EVENTS.path(settings))
            .join(positions, ["partition", "offset"], "left_semi")
            .count(),
            silver={
                r.event_id: (r.partition, r.offset)
                for r in silver.join(positions, ["partition", "offset"], "left_semi")
                .select("event_id", "partition", "offset")
                .collect()
            },
            quarantine={
                (r.partition, r.offset): r.reason
                for r in read(registry.SILVER_QUARANTINE.path(settings))
                .join(positions, ["partition", "offset"], "left_semi")
                .select("partition", "offset", "reason")
                .collect()
            },
            silver_total_rows=totals["n"],
            silver_distinct_ids=totals["ids"],
        )
    finally:
        positions.unpersist()


def wait_until_settled(
    spark: SparkSession, settings: Settings, run: GeneratedRun, timeout: float = 600
) -> Landing:
    """Poll until every produced record of the run is in silver, quarantine or counted."""
    expected = run.expected()
    want = len(expected.silver) + len(expected.quarantine)
    deadline = time.monotonic() + timeout
    while True:
        now = landing(spark, settings, run)
        if now.bronze == run.summary.produced and now.settled >= want:
            return now
        if time.monotonic() > deadline:
            return now  # the caller's assertions say what is missing
        time.sleep(3)


def assert_exact(run: GeneratedRun, got: Landing) -> None:
    """Nothing lost, nothing doubled: the lake equals the contract's answer for the run."""
    exp = run.expected()
    assert run.summary.ok, run.summary.errors
    assert got.bronze == run.summary.produced == len(run.records)
    assert got.silver == exp.silver
    assert got.quarantine == exp.quarantine
    assert Counter(got.quarantine.values()) == exp.by_reason()
    duplicates = got.bronze - len(got.silver) - len(got.quarantine)
    assert duplicates == len(exp.duplicates)
    # Silver as a whole never holds an event id twice.
    assert got.silver_total_rows == got.silver_distinct_ids
