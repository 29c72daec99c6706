"""A live stream of revenue_hourly v2 reads cancellations, and the orders they
cancel, from the days of silver its link index names, not from all of history."""

from __future__ import annotations

from pathlib import Path

import pytest

from spark_jobs.engine import gold_writes
from spark_jobs.engine import silver as silver_mod
from spark_jobs.engine.links import LinkIndex
from spark_jobs.views import revenue_hourly_v2
from tests.frames import assert_df_equality
from tests.spark_jobs.conftest import at, cancel, order

VIEW = revenue_hourly_v2.VIEW

HISTORY = [
    order("o1", at(), "10.00"),  # 2026-01-01
    order("o2", at(hours=24), "5.00"),  # 01-02
    order("o3", at(hours=48), "7.00"),  # 01-03
    cancel("o1", at(hours=72)),  # 01-04
    cancel("o2", at(hours=96)),  # 01-05
    cancel("o3", at(hours=120)),  # 01-06
]
# A new order in o3's hour (scopes: 01-03 10:00 EUR).
FIRST = [order("o4", at(hours=48, minutes=5), "3.00")]
# A second cancellation of o1 and one of o4 (scopes: o1's hour and o4's).
SECOND = [cancel("o1", at(hours=144)), cancel("o4", at(hours=168))]  # 01-07, 01-08
# Nothing in the second batch's scopes needs these: o2's order and its cancellation.
UNNEEDED = [
    "event_type=order_placed/event_date=2026-01-02",
    "event_type=order_cancelled/event_date=2026-01-05",
]


def _append(path: Path, rows) -> None:
    rows.write.format("delta").mode("append").partitionBy(*silver_mod.SILVER_PARTITIONS).save(
        str(path)
    )


def _rows(silver_df, rows: list[dict], first: int):
    # Event ids go on across batches: silver_df numbers each list from e0.
    out = silver_df(rows)
    return out.withColumn("event_id", out.event_id.substr(2, 9).cast("int") + first).selectExpr(
        "concat('e', event_id) AS event_id", *[c for c in out.columns if c != "event_id"]
    )


def test_a_live_batch_reads_only_the_days_its_links_are_on(spark, silver_df, tmp_path):
    silver_path, gold = tmp_path / "silver", str(tmp_path / "gold")
    read = spark.read.format("delta").load
    history = _rows(silver_df, HISTORY, 0)
    _append(silver_path, history)
    gold_writes.gold_rows(VIEW, history).write.format("delta").save(gold)
    gold_writes.ensure_gold(spark, gold, VIEW)
    # Built at the first batch, from the silver it reads; the second adds its rows.
    links = LinkIndex(VIEW)

    first = _rows(silver_df, FIRST, 10)
    _append(silver_path, first)
    gold_writes.apply_changes(spark, gold, VIEW, first, read(str(silver_path)), links)

    second = _rows(silver_df, SECOND, 20)
    _append(silver_path, second)
    silver = read(str(silver_path))
    unindexed = str(tmp_path / "unindexed")
    gold_writes.ensure_gold(spark, unindexed, VIEW)
    # Reading a moved file fails: the batch must not touch these days.
    for part in UNNEEDED:
        (silver_path / part).rename(silver_path / (part.replace("/", "-") + ".away"))
    try:
        with pytest.raises(Exception, match=r"FileNotFound|does not exist|FAILED_READ_FILE"):
            # Without the index, every cancellation in history is read.
            gold_writes.apply_changes(spark, unindexed, VIEW, second, silver)
        applied = gold_writes.apply_changes(spark, gold, VIEW, second, silver, links)
    finally:
        for part in UNNEEDED:
            (silver_path / (part.replace("/", "-") + ".away")).rename(silver_path / part)
    assert applied.scopes == 2

    assert_df_equality(
        read(gold),
        gold_writes.gold_rows(VIEW, read(str(silver_path))),
        ignore_row_order=True,
        ignore_nullable=True,
    )
    o3_hour = read(gold).where(f"window_start = '{at(hours=48)}'").first()
    assert (o3_hour.orders_placed, o3_hour.orders_cancelled) == (2, 2)
