"""revenue_hourly v1 on small silver tables (docs/contract.md §3)."""

from __future__ import annotations

from decimal import Decimal

from spark_jobs.engine import scoping
from spark_jobs.views import revenue_hourly_v1
from tests.frames import assert_df_equality
from tests.spark_jobs.conftest import at, cancel, order, restated

VIEW = revenue_hourly_v1.VIEW
H10, H11, H12 = at(), at(hours=1), at(hours=2)


def _v1(spark, rows):
    return spark.createDataFrame(rows, revenue_hourly_v1.SCHEMA)


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


def test_v1_hours_with_no_orders_have_no_rows(spark, silver_df):
    silver = silver_df([cancel("o9", at()), order("o1", at(hours=5), "1.00")])
    assert revenue_hourly_v1.compute(silver).count() == 1


# -- scopes: derived from the declaration --------------------------------------------------
def test_v1_an_order_scopes_its_own_hour_and_currency_and_a_cancellation_nothing(silver_df):
    silver = silver_df(
        [
            order("o1", at(59, ms=59_999), "1.00"),
            order("o2", at(60), "1.00", currency="USD"),
            cancel("o1", at(70)),
        ]
    )
    got = {tuple(r) for r in scoping.scopes_of(VIEW, silver, silver).collect()}
    assert got == {(H10, H11, "EUR"), (H11, H12, "USD")}
    assert (
        scoping.scopes_of(VIEW, silver.where("event_type = 'order_cancelled'"), silver).count() == 0
    )


def test_v1_restrict_keeps_exactly_the_orders_of_the_scopes_asked_for(silver_df):
    silver = silver_df(
        [
            order("in", at(10), "1.00", event_id="in"),
            order("other-hour", at(70), "1.00"),
            order("other-currency", at(10), "1.00", currency="USD"),
            cancel("in", at(20)),
        ]
    )
    scopes = scoping.scopes_of(VIEW, silver.where("event_id = 'in'"), silver)
    kept = scoping.restrict(VIEW, silver, scopes)
    assert kept.columns == silver.columns  # silver's rows, as they are
    assert [r.event_id for r in kept.collect()] == ["in"]


# -- restatements -------------------------------------------------------------------------
def test_v1_an_order_restates_its_hour_only_once_the_watermark_passed_it(spark, silver_df):
    # newest event 20:00, allowed lateness 2 h: the watermark is 18:00.
    landed = silver_df(
        [
            order("old", at(0), "1.00", event_id="old"),  # 10:00-11:00: final
            order("edge", at(hours=7, minutes=30), "1.00", event_id="edge"),  # ends 18:00: final
            order("open", at(hours=8), "1.00", event_id="open"),  # 18:00-19:00: open
        ]
    )
    got = restated(spark, VIEW, landed, landed, None, at(hours=10))
    assert got == [
        ("edge", at(hours=7), "EUR", 2 * 3600),
        ("old", at(0), "EUR", 9 * 3600),
    ]


def test_nothing_is_final_before_any_event_was_seen(spark, silver_df):
    landed = silver_df([order("o", at(0), "1.00")])
    assert restated(spark, VIEW, landed, landed, None, None) == []
