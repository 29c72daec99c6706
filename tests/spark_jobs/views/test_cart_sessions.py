"""cart_sessions v1 on small silver tables (CONTRACT.md §3)."""

from __future__ import annotations

from chispa import assert_df_equality

from spark_jobs.views import cart_sessions_v1
from tests.spark_jobs.conftest import at, cart, order


def _sessions(spark, rows):
    return spark.createDataFrame(rows, cart_sessions_v1.SCHEMA)


def test_events_exactly_30_minutes_apart_share_a_session(spark, silver_df):
    silver = silver_df([cart("c1", at(0)), cart("c1", at(30))])
    expected = _sessions(spark, [("c1", at(0), at(60), 2, 2, 0, False)])
    assert_df_equality(
        cart_sessions_v1.compute(silver), expected, ignore_row_order=True, ignore_nullable=True
    )


def test_events_30_minutes_and_1_ms_apart_are_two_sessions(spark, silver_df):
    silver = silver_df([cart("c1", at(0), 2), cart("c1", at(30, ms=1), 1, removed=True)])
    expected = _sessions(
        spark,
        [
            ("c1", at(0), at(30), 1, 2, 0, False),
            ("c1", at(30, ms=1), at(60, ms=1), 1, 0, 1, False),
        ],
    )
    assert_df_equality(
        cart_sessions_v1.compute(silver), expected, ignore_row_order=True, ignore_nullable=True
    )


def test_a_late_event_bridging_two_sessions_merges_them(spark, silver_df):
    before = [cart("c1", at(0)), cart("c1", at(50))]
    assert cart_sessions_v1.compute(silver_df(before)).count() == 2
    bridged = cart_sessions_v1.compute(silver_df([*before, cart("c1", at(25))]))
    expected = _sessions(spark, [("c1", at(0), at(80), 3, 3, 0, False)])
    assert_df_equality(bridged, expected, ignore_row_order=True, ignore_nullable=True)


def test_sessions_are_per_customer_and_an_order_converts(spark, silver_df):
    silver = silver_df(
        [
            cart("c2", at(10)),
            cart("c1", at(0), 3),
            order("o1", at(5), "1.00", customer_id="c1"),
            {"event_type": "payment_captured", "customer_id": "c1", "event_time": at(6)},
        ]
    )
    expected = _sessions(
        spark,
        [
            ("c1", at(0), at(35), 2, 3, 0, True),
            ("c2", at(10), at(40), 1, 1, 0, False),
        ],
    )
    assert_df_equality(
        cart_sessions_v1.compute(silver), expected, ignore_row_order=True, ignore_nullable=True
    )


def test_the_registry_finds_every_view_version():
    from spark_jobs import views

    assert sorted(views.discover()) == [
        ("cart_sessions", 1),
        ("revenue_hourly", 1),
        ("revenue_hourly", 2),
    ]
    assert views.get("revenue_hourly", 2).table_name == "revenue_hourly_v2"
