"""Which final windows a late event restates, for each view (CONTRACT.md §3, finality)."""

from __future__ import annotations

from spark_jobs import views
from spark_jobs.views import runner
from tests.spark_jobs.conftest import at, cancel, cart, order


def _newest(spark, when):
    return spark.createDataFrame([(when,)], "newest timestamp")


def _restated(spark, view, landed, silver, gold, newest):
    rows = runner.restatements(view, landed, silver, gold, _newest(spark, newest)).collect()
    return sorted((r.event_id, r.window_start, r.window_key, r.lateness) for r in rows)


def test_v1_an_order_restates_its_hour_only_once_the_watermark_passed_it(spark, silver_df):
    view = views.get("revenue_hourly", 1)
    # newest event 20:00, allowed lateness 2 h: the watermark is 18:00.
    landed = silver_df(
        [
            order("old", at(0), "1.00", event_id="old"),  # 10:00-11:00: final
            order("edge", at(hours=7, minutes=30), "1.00", event_id="edge"),  # ends 18:00: final
            order("open", at(hours=8), "1.00", event_id="open"),  # 18:00-19:00: open
        ]
    )
    got = _restated(spark, view, landed, landed, None, at(hours=10))
    assert got == [
        ("edge", at(hours=7), "EUR", 2 * 3600),
        ("old", at(0), "EUR", 9 * 3600),
    ]


def test_nothing_is_final_before_any_event_was_seen(spark, silver_df):
    view = views.get("revenue_hourly", 1)
    landed = silver_df([order("o", at(0), "1.00")])
    assert _restated(spark, view, landed, landed, None, None) == []


def test_v2_a_cancellation_restates_its_orders_hour_even_though_it_is_recent(spark, silver_df):
    view = views.get("revenue_hourly", 2)
    silver = silver_df(
        [
            order("o1", at(0), "5.00", event_id="placed"),
            cancel("o1", at(hours=30), event_id="late-cancel"),
            cancel("nobody", at(hours=30), event_id="orphan"),
        ]
    )
    landed = silver.where("event_type = 'order_cancelled'")
    got = _restated(spark, view, landed, silver, None, at(hours=30))
    assert got == [("late-cancel", at(0), "EUR", 29 * 3600)]


def test_sessions_a_late_event_restates_the_session_that_holds_it(spark, silver_df):
    view = views.get("cart_sessions", 1)
    silver = silver_df([cart("c1", at(0)), cart("c1", at(20)), cart("c1", at(hours=5))])
    gold = view.compute(silver)
    landed = silver_df([{**cart("c1", at(20)), "event_id": "late"}])
    got = _restated(spark, view, landed, silver, gold, at(hours=5))
    assert got == [("late", at(0), "c1", (5 * 60 - 50) * 60)]
