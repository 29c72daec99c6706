"""A live stream of revenue_hourly v2 reads cancellations, and the orders they
cancel, from the days of silver its link index names, not from all of history."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path

import pytest
from pyspark.sql import Row
from pyspark.sql import functions as F

from spark_jobs.engine import gold_writes, lake, scoping
from spark_jobs.engine import silver as silver_mod
from spark_jobs.engine.links import LinkIndex, Rows
from spark_jobs.views import cart_sessions_v1, revenue_hourly_v1, revenue_hourly_v2
from tests.frames import assert_df_equality
from tests.spark_jobs.conftest import at, cancel, cart, order

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


@pytest.mark.parametrize("reads", ["spark", "delta-rs", "past-the-limit"])
def test_a_live_batch_reads_only_the_days_its_links_are_on(
    spark, silver_df, tmp_path, reads, monkeypatch
):
    """Every way a batch reads silver's rows: Spark's scans; delta-rs's read of the
    rows the batch names (`pick`, as a live stream does); and, past the event time
    a batch reads that way (`MAX_PICKED_MICROS`, here none at all), Spark's scans
    again but for the `of` events of its linked keys."""
    silver_path, gold = tmp_path / "silver", str(tmp_path / "gold")
    read = spark.read.format("delta").load
    asked: list[str] = []
    if reads == "past-the-limit":
        monkeypatch.setattr(gold_writes, "MAX_PICKED_MICROS", -1)

    def picker():
        if reads == "spark":
            return {}
        version = lake.newest_version(spark, str(silver_path))

        def pick(condition):
            asked.append(condition)
            return lake.read_where(spark, str(silver_path), {}, version, condition)

        def pick_gold(at, condition):
            asked.append(condition)
            return lake.read_where(spark, gold, {}, at, condition)

        return {"pick": pick, "pick_gold": pick_gold}

    history = _rows(silver_df, HISTORY, 0)
    _append(silver_path, history)
    gold_writes.gold_rows(VIEW, history).write.format("delta").save(gold)
    gold_writes.ensure_gold(spark, gold, VIEW)
    # Built at the first batch, from the silver it reads; the second adds its rows.
    links = LinkIndex(VIEW)

    first = _rows(silver_df, FIRST, 10)
    _append(silver_path, first)
    gold_writes.apply_changes(spark, gold, VIEW, first, read(str(silver_path)), links, **picker())

    second = _rows(silver_df, SECOND, 20)
    _append(silver_path, second)
    silver = read(str(silver_path))
    spark_reads: list[int] = []

    def whole():
        spark_reads.append(1)
        return silver

    unindexed = str(tmp_path / "unindexed")
    gold_writes.ensure_gold(spark, unindexed, VIEW)
    # Reading a moved file fails: the batch must not touch these days.
    for part in UNNEEDED:
        (silver_path / part).rename(silver_path / (part.replace("/", "-") + ".away"))
    try:
        with pytest.raises(Exception, match=r"FileNotFound|does not exist|FAILED_READ_FILE"):
            # Without the index, every cancellation in history is read.
            gold_writes.apply_changes(spark, unindexed, VIEW, second, silver)
        applied = gold_writes.apply_changes(spark, gold, VIEW, second, whole, links, **picker())
    finally:
        for part in UNNEEDED:
            (silver_path / (part.replace("/", "-") + ".away")).rename(silver_path / part)
    assert applied.scopes == 2
    # Silver's snapshot in Spark only where delta-rs's picks do not serve the batch
    # (a DataFrame of a version has Spark build its snapshot), and then once.
    assert len(spark_reads) == (0 if reads == "delta-rs" else 1), spark_reads
    if reads == "past-the-limit":
        # ("false": a batch without linked events asks for none.)
        assert asked and all('"order_id" IN' in c or c == "false" for c in asked), asked
    elif reads == "spark":
        assert not asked
    else:  # silver's `of` events by key, gold by window, silver by time
        for each in ('"order_id" IN', '"window_start" BETWEEN', '"event_time" >='):
            assert any(each in c for c in asked), (each, asked)
        # Gold in both batches, the second's two hours two days apart each on its own:
        # one range from the first to the last would pass MAX_PICKED_MICROS and leave
        # gold to Spark's scan of every row in between (as a late event did, stop 100).
        gold_reads = [c for c in asked if '"window_start" BETWEEN' in c]
        assert len(gold_reads) == 2 and gold_reads[1].count("BETWEEN") == 2, asked

    assert_df_equality(
        read(gold),
        gold_writes.gold_rows(VIEW, read(str(silver_path))),
        ignore_row_order=True,
        ignore_nullable=True,
    )
    o3_hour = read(gold).where(f"window_start = '{at(hours=48)}'").first()
    assert (o3_hour.orders_placed, o3_hour.orders_cancelled) == (2, 2)


def _micros(when: datetime) -> int:
    return (when.replace(tzinfo=UTC) - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(
        microseconds=1
    )


def _day(when: datetime) -> int:
    return (when.date() - datetime(1970, 1, 1).date()).days


_US = timedelta(microseconds=1)
# Rows on the edges the filters draw: an hour's first and last microsecond, the one
# after it, and the last microsecond of a day with the first of the next.
EDGES = [
    order("h0", at(hours=49), "1.00"),
    order("h1", at(hours=50) - _US, "1.00"),
    order("h2", at(hours=50), "1.00"),
    order("d0", at(hours=62) - _US, "1.00"),  # 01-03 23:59:59.999999
    order("d1", at(hours=62), "1.00"),  # 01-04 00:00
    cancel("h0", at(hours=63)),
    cancel("d1", at(hours=64)),
]


def test_the_sql_a_live_batch_reads_by_keeps_what_spark_s_filters_keep(spark, silver_df, tmp_path):
    """`scoping.narrowed_sql` and `of_on_days_sql`, read by delta-rs, keep the rows
    `narrowed` and `of_on_days` keep, edges of hours and days included: a live batch
    reads silver's rows that way, and what decides gold's rows is then picked out of
    them by scope (`restrict`, `restrict_near`), not by these filters again."""
    path = str(tmp_path / "silver")
    _append(tmp_path / "silver", _rows(silver_df, [*HISTORY, *FIRST, *SECOND, *EDGES], 0))
    read = partial(lake.read_where, spark, path, {}, lake.newest_version(spark, path))
    silver = spark.read.format("delta").load(path)

    def ids(rows) -> set[str]:
        return {r.event_id for r in rows.select("event_id").collect()}

    hour = (_micros(at(hours=49)), _micros(at(hours=50)))
    midnight = (_micros(at(hours=61)), _micros(at(hours=63)))
    cases = [
        (revenue_hourly_v2.VIEW, [hour], [_day(at(hours=63))]),
        (revenue_hourly_v2.VIEW, [hour, midnight], [_day(at(hours=72)), _day(at(hours=63))]),
        (revenue_hourly_v2.VIEW, [midnight], []),
        (revenue_hourly_v1.VIEW, [hour], None),
        (revenue_hourly_v1.VIEW, [hour, midnight], None),
    ]
    for view, ranges, linked_days in cases:
        sql = scoping.narrowed_sql(view, ranges, linked_days)
        assert sql is not None
        kept = ids(scoping.narrowed(view, silver, ranges, linked_days))
        assert kept and ids(read(sql)) == kept, (view.table_name, ranges, linked_days)
    # Without the days of its linked events, a linked view must read them all.
    assert scoping.narrowed_sql(revenue_hourly_v2.VIEW, [hour], None) is None
    assert scoping.narrowed_sql(revenue_hourly_v1.VIEW, [], None) is None

    days = [_day(at(hours=48)), _day(at(hours=62))]
    on_days = scoping.of_on_days(VIEW, silver, days)
    assert ids(read(scoping.of_on_days_sql(VIEW, days))) == ids(on_days)
    keys = ["o3", "d1", "o'x"]
    assert (
        ids(read(scoping.of_on_days_sql(VIEW, days, keys)))
        == ids(on_days.where(F.col("order_id").isin(keys)))
        == {"e2", "e13"}
    )
    assert ids(read(scoping.of_on_days_sql(VIEW, days, []))) == set()
    # The keys come from the batch's linked events, as the link index reads them.
    assert Rows.of(VIEW, silver).linked_keys == ["d1", "h0", "o1", "o2", "o3", "o4"]

    # A lower bound a few microseconds under a file's only row keeps it, though
    # Delta's statistics hold that row's time in milliseconds, cut down.
    one = str(tmp_path / "one")
    _append(tmp_path / "one", _rows(silver_df, [order("u1", at(ms=7) + 500 * _US, "1.00")], 0))
    first = (_micros(at(ms=7)) + 400, _micros(at(hours=1)))
    sql = scoping.narrowed_sql(revenue_hourly_v1.VIEW, [first], None)
    assert sql is not None
    edge = scoping.narrowed(revenue_hourly_v1.VIEW, spark.read.format("delta").load(one), [first])
    edge_picked = lake.read_where(spark, one, {}, lake.newest_version(spark, one), sql)
    assert ids(edge_picked) == ids(edge) == {"e0"}

    # Gold's rows by when their windows start, both bounds taken.
    gold = str(tmp_path / "gold")
    gold_writes.gold_rows(VIEW, silver).write.format("delta").save(gold)
    windows = partial(lake.read_where, spark, gold, {}, lake.newest_version(spark, gold))
    lo, hi = _micros(at(hours=48)), _micros(at(hours=61))
    starting = scoping.starting_in(VIEW, spark.read.format("delta").load(gold), lo, hi)
    picked = windows(scoping.starting_in_sql(VIEW, [(lo, hi + 1)]))
    assert sorted(picked.collect()) == sorted(starting.collect())
    assert {r.window_start for r in picked.collect()} == {at(hours=h) for h in (48, 49, 50, 61)}
    # Ranges apart pick each one's rows, and none of those between them.
    apart = [(lo, lo + 1), (hi, hi + 1)]
    picked = windows(scoping.starting_in_sql(VIEW, apart))
    assert {r.window_start for r in picked.collect()} == {at(hours=h) for h in (48, 61)}


def test_the_customers_near_a_change_narrow_a_sessions_read_and_computed_scopes_do_not():
    """`scoping.scopes_sql`: a scope of plain string columns (a customer) names its
    values, quoted; a computed scope (an hour) or a value that is not a string, none."""
    spans = [Row(customer_id="c'1", lo=1, hi=2), Row(customer_id="c2", lo=3, hi=4)]
    assert scoping.scopes_sql(cart_sessions_v1.VIEW, spans) == "\"customer_id\" IN ('c''1', 'c2')"
    assert scoping.scopes_sql(cart_sessions_v1.VIEW, []) == "false"
    assert scoping.scopes_sql(cart_sessions_v1.VIEW, [Row(customer_id=None, lo=1, hi=2)]) is None
    assert scoping.scopes_sql(VIEW, [Row(window_start=at(), currency="EUR")]) is None


def test_a_sessions_gold_read_by_delta_rs_keeps_what_spark_s_filters_keep(
    spark, silver_df, tmp_path
):
    """`scoping.around_sql` keeps the rows `around` keeps, sessions that end exactly
    where it starts looking or start exactly a gap past its end included."""
    view = cart_sessions_v1.VIEW
    gap = view.scope.gap
    assert gap is not None
    events = [
        cart("c1", at()),  # a session ending at 10:00 + gap
        cart("c2", at(hours=2)),
        cart("c3", at(hours=4)),
        cart("c3", at(hours=4, minutes=10)),
    ]
    gold = str(tmp_path / "gold")
    gold_writes.gold_rows(view, silver_df(events, view)).write.format("delta").save(gold)
    read = partial(lake.read_where, spark, gold, {}, lake.newest_version(spark, gold))
    rows = spark.read.format("delta").load(gold)
    cases = [
        (_micros(at() + gap), _micros(at(hours=2)) - (gap // _US)),
        (_micros(at(hours=1)), _micros(at(hours=1, minutes=30))),
        (_micros(at(hours=4, minutes=5)), _micros(at(hours=5))),
    ]
    for lo, hi in cases:
        kept = sorted(scoping.around(view, rows, lo, hi).collect())
        assert kept and sorted(read(scoping.around_sql(view, [(lo, hi + 1)])).collect()) == kept, (
            lo,
            hi,
        )
    # Changes at times apart: the rows around each, and not c2's between them.
    (first, _), _, (last, _) = cases
    kept = sorted(
        scoping.around(view, rows, first, first)
        .union(scoping.around(view, rows, last, last))
        .collect()
    )
    around_both = read(scoping.around_sql(view, [(first, first + 1), (last, last + 1)]))
    assert sorted(around_both.collect()) == kept
    assert {r.customer_id for r in kept} == {"c1", "c3"}
