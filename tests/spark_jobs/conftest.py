"""Build small silver DataFrames for view tests: only the columns a test cares about."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from pyspark.sql import SparkSession

from spark_jobs.engine import inputs, restatements
from spark_jobs.engine.session import INTERPRETED_CONF, build_session
from spark_jobs.engine.silver import SILVER_SCHEMA
from spark_jobs.views.base import View

T0 = datetime(2026, 1, 1, 10, 0, 0)


@pytest.fixture(scope="session")
def spark(settings) -> Iterator[SparkSession]:
    """tests/conftest.py's session (one per worker, interpreted), with the JIT's first
    tier only, as the commands that run once get it (`one_shot`): these tests are
    many small queries, each a little different, for which the second tier's
    compiling costs more than it gains. This directory in two workers, alone on 2
    cores: 967 CPU-s and 530 s with it, 1,144 and 594 s without (stop 105);
    `test_silver.py` alone 187 and 198 CPU-s against 211 and 224, though in 164
    and 176 s against 144 and 148. The integration tests' session keeps both
    tiers: with the first alone there too, the integration tests took 1,999 s and
    2,654 CPU-s in stop 105's run against 1,824 and 2,439 in `07e4bd4`'s
    (`test_chaos.py` 890 CPU-s against 777 in `e277495`'s); but a second run of
    this code took 2,004 s and 2,752 CPU-s, so the runs' spread, not the first
    tier: untried beyond that one run."""
    session = build_session(
        "regauge-tests", settings, ui=False, extra_conf=INTERPRETED_CONF, one_shot=True
    )
    yield session
    session.stop()


# A record's verdict case: (its Kafka value, the reason it must be quarantined by or
# None, the detail that reason must carry).
Case = tuple[bytes, str | None, str | None]
JUDGED_AT = datetime(2026, 1, 1, 12, 0, 0)


def judge(spark, cases: dict[str, Case], plan) -> dict[str, Any]:
    """Each case's record, one Kafka record each (partition 0, in order), through
    `contract.validate` by `plan`: name -> its validated row."""
    from spark_jobs.engine import contract

    rows = [(n, 0, i, JUDGED_AT, value) for i, (n, (value, _, _)) in enumerate(cases.items())]
    records = spark.createDataFrame(
        rows, "name string, partition int, offset long, kafka_timestamp timestamp, value binary"
    )
    return {r["name"]: r for r in contract.validate(records, plan).collect()}


def all_heard(spark) -> None:
    """Wait until Spark's listener bus has delivered every event posted so far. The
    status tracker hears of jobs through it, so a count of jobs read right after an
    action can miss some; on busy cores (`make test` runs these tests beside the
    integration tests, at the lowest priority) by seconds. A job missed from the
    count before a batch is counted as the batch's."""
    spark.sparkContext._jsc.sc().listenerBus().waitUntilEmpty(120_000)


def jobs_so_far(spark) -> int:
    """The newest Spark job id of the session's application (-1: none yet), every
    job so far heard of."""
    all_heard(spark)
    return max(spark.sparkContext.statusTracker().getJobIdsForGroup(None), default=-1)


def at(minutes: float = 0, *, ms: int = 0, hours: float = 0) -> datetime:
    return T0 + timedelta(minutes=minutes, hours=hours, milliseconds=ms)


def order(order_id: str, when: datetime, total: str, currency: str = "EUR", **kw: Any) -> dict:
    return {
        "event_type": "order_placed",
        "order_id": order_id,
        "event_time": when,
        "currency": currency,
        "total": Decimal(total),
        **kw,
    }


def cancel(order_id: str, when: datetime, **kw: Any) -> dict:
    return {"event_type": "order_cancelled", "order_id": order_id, "event_time": when, **kw}


def cart(customer: str, when: datetime, quantity: int = 1, removed: bool = False) -> dict:
    return {
        "event_type": "cart_item_removed" if removed else "cart_item_added",
        "customer_id": customer,
        "event_time": when,
        "product_id": "prod-0001",
        "quantity": quantity,
    }


def web_session(customer: str, when: datetime, session: str, referrer: str = "search") -> dict:
    return {
        "event_type": "session_started",
        "customer_id": customer,
        "event_time": when,
        "session_id": session,
        "referrer": referrer,
    }


def web_view(customer: str, when: datetime, session: str, product: str) -> dict:
    return {
        "event_type": "product_viewed",
        "customer_id": customer,
        "event_time": when,
        "session_id": session,
        "product_id": product,
    }


def item(product: str, quantity: int = 1, unit_price: str = "1.00") -> tuple:
    """One of an order's items, as silver's `items` holds it."""
    return (product, quantity, Decimal(unit_price))


def silver_rows(spark, rows: list[dict], view: View | None = None):
    """A DataFrame with silver's schema, unknown columns null; with `view`, the schema
    of that view's input (its sources' silvers, one union). Row i is event `e<i>` at
    partition 0 offset i."""
    schema = SILVER_SCHEMA if view is None else inputs.schema(view)
    full = []
    for i, row in enumerate(rows):
        base: dict[str, Any] = {f.name: None for f in schema.fields}
        base.update(
            event_id=f"e{i}",
            customer_id="cust-1",
            schema_version=1,
            partition=0,
            offset=i,
            content_hash=f"h{i}",
        )
        base.update(row)
        # Produced when it happened, unless a test says otherwise.
        if base["kafka_timestamp"] is None:
            base["kafka_timestamp"] = base["event_time"] or T0
        # As silver derives it: the partition column follows the event time.
        if base["event_time"] is not None and "event_date" not in row:
            base["event_date"] = base["event_time"].date()
        full.append(tuple(base[f.name] for f in schema.fields))
    return spark.createDataFrame(full, schema)


@pytest.fixture
def silver_df(spark):
    """silver_df([{...}, ...]) -> `silver_rows(spark, ...)`."""

    def make(rows: list[dict], view: View | None = None):
        return silver_rows(spark, rows, view)

    return make


def restated(spark, view, landed, silver, gold, newest: datetime | None) -> list[tuple]:
    """The final windows `landed` restated, given the newest event time seen before:
    sorted (event_id, window_start, window_key, lateness)."""
    newest_df = spark.createDataFrame([(newest,)], "newest timestamp")
    rows = restatements.restated(view, landed, silver, gold, newest_df).collect()
    return sorted((r.event_id, r.window_start, r.window_key, r.lateness) for r in rows)


def assert_staged_is_the_newest_commit(spark, path: str, view, staged) -> None:
    """What a batch publishes, read off its MERGE (`gold_writes.Applied.staged`), is the
    newest commit of gold at `path` and the records its change feed gives."""
    from spark_jobs.engine import changes, lake

    newest = lake.newest_version(spark, path)
    assert staged is not None and staged.commit == newest
    feed = (
        spark.read.format("delta")
        .option("readChangeFeed", "true")
        .option("startingVersion", newest)
        .load(path)
    )
    published = [tuple(r) for r in changes.records(feed, view).collect()]
    assert published
    assert sorted(staged.records) == sorted(published)
