"""revenue_hourly v1 and v2 on small silver tables (CONTRACT.md §3)."""

from __future__ import annotations

from decimal import Decimal

from chispa import assert_df_equality

from spark_jobs.views import revenue_hourly_v1, revenue_hourly_v2
from tests.spark_jobs.conftest import at, cancel, order

H10, H11, H12 = at(), at(hours=1), at(hours=2)


def _v1(spark, rows):
    return spark.createDataFrame(rows, revenue_hourly_v1.SCHEMA)


def _v2(spark, rows):
    return spark.createDataFrame(rows, revenue_hourly_v2.SCHEMA)


def test_v1_sums_orders_per_hour_and_currency_in_any_arrival_order(spark, silver_df):
    silver = silver_df(
        [
            order("o3", at(75), "5.00"),  # 11:15, arrives first
            order("o1", at(0), "10.10"),  # 10:00 exactly: start-inclusive
            order("o2", at(59, ms=59_999), "0.90"),  # 10:59:59.999
            order("o4", at(30), "7.00", currency="USD"),
            cancel("o1", at(5)),  # v1 ignores cancellations
        ]
    )
    expected = _v1(
        spark,
        [
            (H10, H11, "EUR", 2, Decimal("11.00")),
            (H10, H11, "USD", 1, Decimal("7.00")),
            (H11, H12, "EUR", 1, Decimal("5.00")),
        ],
    )
    assert_df_equality(
        revenue_hourly_v1.compute(silver), expected, ignore_row_order=True, ignore_nullable=True
    )


def test_v1_counts_an_event_far_beyond_the_allowed_lateness(spark, silver_df):
    # An order from days ago (kafka_timestamp much later) still counts in its hour.
    silver = silver_df([order("late", at(hours=-72), "3.00"), order("now", at(), "1.00")])
    got = {r.window_start: r.orders for r in revenue_hourly_v1.compute(silver).collect()}
    assert got == {at(hours=-72): 1, H10: 1}


def test_v2_attributes_cancellations_to_the_orders_hour(spark, silver_df):
    silver = silver_df(
        [
            cancel("o1", at(-30)),  # a cancellation before its order
            order("o1", at(10), "10.00"),
            order("o2", at(20), "4.50"),
            cancel("o2", at(hours=50)),  # days later
            cancel("o2", at(hours=51)),  # twice: counts once
            order("o3", at(70), "1.00"),
            cancel("ghost", at(5)),  # no such order: changes nothing
        ]
    )
    expected = _v2(
        spark,
        [
            (H10, H11, "EUR", 2, 2, Decimal("14.50"), Decimal("14.50"), Decimal("0.00")),
            (H11, H12, "EUR", 1, 0, Decimal("1.00"), Decimal("0.00"), Decimal("1.00")),
        ],
    )
    assert_df_equality(
        revenue_hourly_v2.compute(silver), expected, ignore_row_order=True, ignore_nullable=True
    )


def test_v2_a_repeated_order_id_is_two_orders_and_one_cancel_cancels_both(spark, silver_df):
    silver = silver_df(
        [
            order("dup", at(1), "2.00"),
            order("dup", at(2), "3.00"),
            order("keep", at(3), "5.00"),
            cancel("dup", at(4)),
        ]
    )
    (row,) = revenue_hourly_v2.compute(silver).collect()
    assert (row.orders_placed, row.orders_cancelled) == (3, 2)
    assert (row.gross_revenue, row.cancelled_revenue, row.net_revenue) == (
        Decimal("10.00"),
        Decimal("5.00"),
        Decimal("5.00"),
    )


def test_hours_with_no_orders_have_no_rows(spark, silver_df):
    silver = silver_df([cancel("o9", at()), order("o1", at(hours=5), "1.00")])
    assert revenue_hourly_v1.compute(silver).count() == 1
    assert revenue_hourly_v2.compute(silver).count() == 1
