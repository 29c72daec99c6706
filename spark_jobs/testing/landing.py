"""What a generator run became in the lake, next to what the contract says it must become.

`landing` reads the run's records back from bronze, silver and the quarantine
by the Kafka positions the producer got; `score` (pure) compares that with the
generator's own expectation and counts what was lost and what was doubled.
The integration tests and `make chaos` both judge the pipeline with these.
"""

from __future__ import annotations

import operator
import random
import time
from collections import Counter
from dataclasses import dataclass, field, replace
from functools import reduce

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from spark_jobs.engine import lake
from spark_jobs.producer import GeneratedRun
from warehouse.base import registry
from warehouse.base.settings import Settings

Position = tuple[int, int]


def fresh_seed() -> int:
    """A seed no earlier run used: event ids carry it, and the lake outlives a run."""
    return random.SystemRandom().randrange(10**6, 10**9)


@dataclass
class Landing:
    bronze: Counter[Position]  # position -> how many bronze rows hold it
    silver: dict[str, Position]  # event_id -> position
    quarantine: dict[Position, str]  # position -> reason
    silver_total_rows: int
    silver_distinct_ids: int

    @property
    def settled(self) -> int:
        return len(self.silver) + len(self.quarantine)


@dataclass
class Score:
    """How far the lake is from the contract's answer for one run; all zero when exact."""

    produced: int
    in_silver: int
    lost: int
    doubled: int
    problems: list[str] = field(default_factory=list)

    @property
    def exact(self) -> bool:
        return not self.problems


def landing(
    spark: SparkSession, settings: Settings, run: GeneratedRun, totals: bool = True
) -> Landing:
    """The run's records as the lake holds them now, found by their Kafka positions;
    with silver's row and id counts unless `totals` is false (a pass over silver)."""
    return _Reader(spark, settings, run).read(totals)


class _Reader:
    """Reads a run's positions back; made once for every poll of a wait."""

    def __init__(self, spark: SparkSession, settings: Settings, run: GeneratedRun) -> None:
        self.spark, self.settings = spark, settings
        delivered = [p for p in run.positions if p is not None]
        self.positions = spark.createDataFrame(delivered, "partition int, offset bigint")
        # The run's offset range in each partition, as a filter Delta can skip files
        # by (their partition and offset statistics): the semi-join alone reads every
        # file of each table, and a wait polls every few seconds. On a lake of 360 k
        # events that was about 6 CPU-s a poll, while the pipeline it waited for
        # needed the same two cores.
        spans: dict[int, tuple[int, int]] = {}
        for partition, offset in delivered:
            lo, hi = spans.get(partition, (offset, offset))
            spans[partition] = (min(lo, offset), max(hi, offset))
        self.span = reduce(
            operator.or_,
            [
                (F.col("partition") == p) & F.col("offset").between(lo, hi)
                for p, (lo, hi) in sorted(spans.items())
            ],
            F.lit(False),
        )

    def _at_positions(self, table: registry.Table) -> DataFrame:
        rows = self.spark.read.format("delta").load(table.path(self.settings))
        return rows.where(self.span).join(self.positions, ["partition", "offset"], "left_semi")

    def read(self, totals: bool = True) -> Landing:
        rows, ids = _silver_totals(self.spark, self.settings) if totals else (0, 0)
        bronze = self._at_positions(registry.BRONZE_EVENTS).groupBy("partition", "offset").count()
        silver = self._at_positions(registry.SILVER_EVENTS)
        quarantine = self._at_positions(registry.SILVER_QUARANTINE)
        return Landing(
            bronze=Counter({(r.partition, r.offset): r["count"] for r in bronze.collect()}),
            silver={
                r.event_id: (r.partition, r.offset)
                for r in silver.select("event_id", "partition", "offset").collect()
            },
            quarantine={
                (r.partition, r.offset): r.reason
                for r in quarantine.select("partition", "offset", "reason").collect()
            },
            silver_total_rows=rows,
            silver_distinct_ids=ids,
        )


def _silver_totals(spark: SparkSession, settings: Settings) -> tuple[int, int]:
    """Silver's rows and distinct event ids: equal unless an event is there twice."""
    silver = spark.read.format("delta").load(registry.SILVER_EVENTS.path(settings))
    totals = silver.selectExpr("count(*) AS n", "count(DISTINCT event_id) AS ids").first()
    assert totals is not None
    return int(totals["n"]), int(totals["ids"])


def score(run: GeneratedRun, got: Landing) -> Score:
    """Compare the lake with the contract's answer for the run.

    lost: produced records missing from bronze, and expected silver events or
    quarantine rows missing although their record is in bronze. doubled: extra
    bronze copies of a position, and silver rows beyond one per event id.
    """
    exp = run.expected()
    delivered = [p for p in run.positions if p is not None]
    missing_bronze = [p for p in delivered if p not in got.bronze]
    lost = (
        len(missing_bronze)
        + sum(1 for i, p in exp.silver.items() if p in got.bronze and i not in got.silver)
        + sum(1 for p in exp.quarantine if p in got.bronze and p not in got.quarantine)
    )
    doubled = sum(n - 1 for n in got.bronze.values()) + (
        got.silver_total_rows - got.silver_distinct_ids
    )
    problems = [f"producer: {e}" for e in run.summary.errors]
    if run.summary.produced != len(run.records):
        problems.append(f"produced {run.summary.produced:,} of {len(run.records):,} records")
    if missing_bronze:
        problems.append(
            f"{len(missing_bronze):,} positions not in bronze, e.g. {missing_bronze[:5]}"
        )
    if doubled:
        problems.append(f"{doubled:,} doubled rows in bronze or silver")
    wrong = {i: (p, got.silver.get(i)) for i, p in exp.silver.items() if got.silver.get(i) != p}
    extra = set(got.silver) - set(exp.silver)
    if wrong or extra:
        sample = list(wrong.items())[:5]
        problems.append(
            f"silver differs: {len(wrong):,} expected ids missing or at another position "
            f"(id: (expected, found)) {sample}; {len(extra):,} unexpected ids {sorted(extra)[:5]}"
        )
    if got.quarantine != exp.quarantine:
        diff = set(got.quarantine.items()) ^ set(exp.quarantine.items())
        problems.append(f"quarantine differs at {len(diff):,} (position, reason) pairs")
    duplicates = sum(got.bronze.values()) - got.settled
    if not doubled and duplicates != len(exp.duplicates):
        problems.append(
            f"{duplicates:,} exact duplicates counted; expected {len(exp.duplicates):,}"
        )
    return Score(run.summary.produced, len(got.silver), lost, doubled, problems)


def wait_until_settled(
    spark: SparkSession, settings: Settings, run: GeneratedRun, timeout: float = 600
) -> Landing:
    """Poll until every produced record of the run is in silver, quarantine or counted."""
    expected = run.expected()
    want = len(expected.silver) + len(expected.quarantine)
    deadline = time.monotonic() + timeout
    reader = _Reader(spark, settings, run)
    read_at: tuple[int, ...] | None = None
    now: Landing | None = None
    while True:
        # Read again only once a table has a new commit: a read is three Spark
        # queries (3-4 s of both cores on 2), and ingest commits every 1-15 s
        # under the chaos cases, so most polls would find what the last one did.
        # Listed before reading: a commit landing meanwhile is read at the next poll.
        versions = _newest_commits(spark, settings)
        if now is None or versions != read_at:
            # Silver's totals (a count of distinct ids over all of it) once, at the end.
            now = reader.read(totals=False)
            # The read spans three tables, one after another: a batch that commits
            # meanwhile (its MERGE into silver, then its quarantine append) can show
            # silver before it and the quarantine after, a state no batch left, and
            # look settled. So only a read that no commit overlapped may settle.
            read_at = versions if _newest_commits(spark, settings) == versions else None
            settled = (
                read_at is not None
                and sum(now.bronze.values()) >= run.summary.produced
                and now.settled >= want
            )
        # Out of time, the caller's score says what is missing.
        if settled or time.monotonic() > deadline:
            rows, ids = _silver_totals(spark, settings)
            return replace(now, silver_total_rows=rows, silver_distinct_ids=ids)
        time.sleep(1)  # a poll without a new commit is three listings


def _newest_commits(spark: SparkSession, settings: Settings) -> tuple[int, ...]:
    """The newest commit of bronze, silver and the quarantine, from their logs' file
    names: a listing, no Spark job."""
    return tuple(
        max(
            (
                int(name[:-5])
                for name in lake.list_names(spark, f"{table.path(settings)}/_delta_log")
                if name.endswith(".json") and name[:-5].isdigit()
            ),
            default=-1,
        )
        for table in (registry.BRONZE_EVENTS, registry.SILVER_EVENTS, registry.SILVER_QUARANTINE)
    )


def assert_exact(run: GeneratedRun, got: Landing) -> None:
    """Nothing lost, nothing doubled: the lake equals the contract's answer for the run."""
    result = score(run, got)
    assert result.exact, "\n".join(result.problems)
    assert (result.lost, result.doubled) == (0, 0)
