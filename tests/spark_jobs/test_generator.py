"""The generator: deterministic, realistic, and honest about what each record must become."""

from __future__ import annotations

import json
from collections import Counter
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest

from spark_jobs import generator
from spark_jobs.engine import contract
from spark_jobs.engine.bronze import BRONZE_SCHEMA


def test_same_seed_same_records_other_seed_other_records():
    first = [r.value for r in generator.records(5, 2000, chaos=True)]
    assert first == [r.value for r in generator.records(5, 2000, chaos=True)]
    assert first != [r.value for r in generator.records(6, 2000, chaos=True)]
    assert len(first) == 2000


def test_clean_traffic_is_a_shop():
    events = generator.traffic(seed=1, count=3000)
    types = Counter(e["event_type"] for e in events)
    assert set(types) == set(contract.EVENT_TYPES)
    assert types["cart_item_added"] > types["order_placed"] > types["order_cancelled"] > 0
    placed = {e["payload"]["order_id"]: e for e in events if e["event_type"] == "order_placed"}
    for e in events:
        if e["event_type"] == "payment_captured":
            order = placed.get(e["payload"]["order_id"])
            if order is not None:  # the cut at `count` may drop an order's start
                assert e["payload"]["amount"] == order["payload"]["total"]
                assert e["payload"]["currency"] == order["payload"]["currency"]
    # Cancellations come minutes to days after their order, later in the stream.
    position = {e["event_id"]: i for i, e in enumerate(events)}
    for e in events:
        if e["event_type"] == "order_cancelled" and e["payload"]["order_id"] in placed:
            assert position[e["event_id"]] > position[placed[e["payload"]["order_id"]]["event_id"]]
    customers = {c.customer_id for c in generator.customers_for(3000)}
    assert {e["customer_id"] for e in events} <= customers


def test_money_is_written_as_exact_decimals():
    assert generator.encode({"total": Decimal("10.10"), "n": 2}) == b'{"total":10.10,"n":2}'
    order = next(
        r
        for r in generator.records(1, 500)
        if r.content is not None and r.content["event_type"] == "order_placed"
    )
    parsed = json.loads(order.value, parse_float=Decimal)
    items = parsed["payload"]["items"]
    assert parsed["payload"]["total"] == sum(i["quantity"] * i["unit_price"] for i in items)


def test_chaos_holds_every_quarantine_reason_and_every_kind_of_duplicate():
    recs = generator.records(2, 5000, chaos=True)
    reasons = {r.expect for r in recs} - {generator.VALID}
    # conflicting_duplicate is decided by position, so it is not a label.
    assert reasons == set(contract.REASONS) - {"conflicting_duplicate"}
    kinds = Counter(r.kind for r in recs)
    for kind in ("resend", "resend_reordered", "conflicting", "very_late", "not_utf8", "oversize"):
        assert kinds[kind] > 0, kind


def test_no_event_id_recurs_in_another_run():
    """Event ids carry the run's seed, bad ones too: the lake outlives a run, so an id
    that recurs would read as a re-send there, and after an erasure as a forgotten
    id back (the audit's `forgotten` check; CI failed on a constant bad id)."""

    def ids(seed: int) -> set[str]:
        found = set()
        for r in generator.records(seed, 3000, chaos=True):
            try:
                event = json.loads(r.value)
            except ValueError:  # not UTF-8, not JSON: no id to recur
                continue
            if isinstance(event, dict) and isinstance(event.get("event_id"), str):
                found.add(event["event_id"])
        return found

    first, second = ids(11), ids(12)
    assert len(first) > 2000 and len(second) > 2000
    assert first & second == set()


def test_the_generators_labels_agree_with_the_contract(spark):
    """Every record's own label equals what validation decides for it."""
    recs = generator.records(3, 3000, chaos=True)
    now = datetime.now(UTC).replace(tzinfo=None)
    bronze = spark.createDataFrame(
        [("shop.events", 0, i, now, r.key.decode(), r.value, now) for i, r in enumerate(recs)],
        BRONZE_SCHEMA,
    )
    got = {
        row["offset"]: row["reject_reason"] or generator.VALID
        for row in contract.validate(bronze).select("offset", "reject_reason").collect()
    }
    wrong = {i: (r.kind, r.expect, got[i]) for i, r in enumerate(recs) if got[i] != r.expect}
    assert wrong == {}


def test_a_skewed_producer_clock_labels_agree_with_the_contract(spark):
    """Kafka keeps the producer's timestamp: events over 24 h past it are out of range."""
    now = datetime(2026, 11, 22, 12, tzinfo=UTC)
    behind = generator.skewed(5, 600, producer_clock=now - timedelta(days=2), now=now)
    ahead = generator.skewed(6, 200, producer_clock=now + timedelta(minutes=30), now=now)
    recs = behind + ahead
    assert {r.kind for r in recs} == {"clock_skew"}
    labels = Counter(r.expect for r in behind)
    # Three days of events against a clock two days slow: about a third too new.
    assert 100 < labels["event_time_out_of_range"] < 300 and labels[generator.VALID] > 300
    assert {r.expect for r in ahead} == {generator.VALID}
    bronze = spark.createDataFrame(
        [
            (
                "shop.events",
                0,
                i,
                datetime.fromtimestamp(r.timestamp_ms / 1000, UTC).replace(tzinfo=None),
                r.key.decode(),
                r.value,
                now.replace(tzinfo=None),
            )
            for i, r in enumerate(recs)
            if r.timestamp_ms is not None
        ],
        BRONZE_SCHEMA,
    )
    got = {
        row["offset"]: row["reject_reason"] or generator.VALID
        for row in contract.validate(bronze).select("offset", "reject_reason").collect()
    }
    assert len(got) == len(recs)
    assert {i: r.expect for i, r in enumerate(recs)} == got


def test_recent_traffic_is_sent_at_once_and_a_cancellation_a_day_ahead_is_out_of_range():
    sent_at = datetime(2026, 11, 28, 7, tzinfo=UTC)
    recs = generator.recent(9, 20_000, sent_at=sent_at, span=timedelta(hours=1))
    assert len(recs) == 20_000
    assert {r.timestamp_ms for r in recs} == {int(sent_at.timestamp() * 1000)}
    limit = sent_at + timedelta(hours=24)
    by_label: Counter[tuple[str, bool]] = Counter()
    for r in recs:
        assert r.content is not None
        t = datetime.fromisoformat(r.content["event_time"].replace("Z", "+00:00"))
        assert t >= sent_at - timedelta(hours=1)
        if r.content["event_type"] != "order_cancelled":
            # A session lasts minutes: every other event happened about when sent.
            assert t <= sent_at + timedelta(hours=1)
        by_label[(r.expect, t > limit)] += 1
    # Out of range exactly when more than 24 h ahead; some of each.
    assert set(by_label) == {(generator.VALID, False), ("event_time_out_of_range", True)}
    assert by_label[("event_time_out_of_range", True)] > 0


def test_v2_orders_pass_contract_version_2_and_wait_under_version_1(spark):
    """The demo's producer after it moves to schema_version 2 (docs/contract.md §10)."""
    hour = datetime(2026, 1, 3, 14, tzinfo=UTC)
    recs = generator.orders_v2(7, 30, hour)
    assert recs == generator.orders_v2(7, 30, hour)  # the same seed, the same records
    now = datetime.now(UTC).replace(tzinfo=None)
    bronze = spark.createDataFrame(
        [("shop.events", 0, i, now, k.decode(), v, now) for i, (k, v) in enumerate(recs)],
        BRONZE_SCHEMA,
    )
    v2 = contract.validate(bronze, contract.shop_plan(2)).collect()
    assert [r.reject_reason for r in v2] == [None] * 30
    assert {r.event_time.replace(minute=0, second=0, microsecond=0) for r in v2} == {
        hour.replace(tzinfo=None)
    }
    assert all(r.currency == "EUR" and 0 < r.discount < r.total + r.discount for r in v2)
    v1 = contract.validate(bronze).select("reject_reason").collect()
    assert {r.reject_reason for r in v1} == {"unsupported_schema_version"}


def test_web_traffic_is_the_shop_s_customers_viewing_what_they_then_add():
    """The web source's generator (warehouse/sources/web.py): exactly `count` events that
    its contract accepts, each customer's views in sessions opened by session_started,
    and every product a shop customer adds to a cart viewed by them before."""
    web = generator.web_traffic(5, 400)
    assert web == generator.web_traffic(5, 400)  # same seed, same events
    assert len(web) == 400 and len({e["event_id"] for e in web}) == 400
    times = [datetime.fromisoformat(e["event_time"]) for e in web]
    assert times == sorted(times)
    opened = {e["payload"]["session_id"] for e in web if e["event_type"] == "session_started"}
    views = [e for e in web if e["event_type"] == "product_viewed"]
    assert views and all(v["payload"]["session_id"] in opened for v in views[20:])
    last_view = max(datetime.fromisoformat(v["event_time"]) for v in web)
    added = [
        e
        for e in generator.traffic(5, 400)
        if e["event_type"] == "cart_item_added"
        and datetime.fromisoformat(e["event_time"]) < last_view
    ]
    viewed = {
        (v["customer_id"], v["payload"]["product_id"], datetime.fromisoformat(v["event_time"]))
        for v in views
    }
    for a in added:
        t = datetime.fromisoformat(a["event_time"])
        assert any(
            c == a["customer_id"] and p == a["payload"]["product_id"] and seen < t
            for c, p, seen in viewed
        ), a


def test_web_traffic_that_follows_a_shop_run_browses_that_run_s_own_carts():
    """`follows` (`regauge produce --source web --follows N`, make demo): the web browses
    the very carts of the shop's chaos run of N records, whole customers at a time, so
    every cart add of a customer it keeps was viewed before; without it, the web
    follows a shop run sized to its own count, whose carts are other ones."""
    run = generator.records(5, 800, chaos=True)
    shop = [r.content for r in run if r.kind in ("event", "very_late")]
    clean = generator.clean_count(800, chaos=True)
    assert clean == len(shop)  # the run's clean events, late ones too
    web = generator.web_traffic(5, 300, follows=clean)
    assert len(web) == 300 and web == generator.web_traffic(5, 300, follows=clean)
    kept = {e["customer_id"] for e in web}
    viewed = {
        (v["customer_id"], v["payload"]["product_id"])
        for v in web
        if v["event_type"] == "product_viewed"
    }
    adds = [e for e in shop if e and e["event_type"] == "cart_item_added"]
    last = max(datetime.fromisoformat(e["event_time"]) for e in web)
    mine = [
        a
        for a in adds
        if a["customer_id"] in kept and datetime.fromisoformat(a["event_time"]) < last
    ]
    assert len(mine) > 20
    # All but the last customer drawn (cut to the count) are kept whole.
    seen = sum((a["customer_id"], a["payload"]["product_id"]) in viewed for a in mine)
    assert seen >= len(mine) - 5
    unaligned = generator.web_traffic(5, 300)
    other = {
        (v["customer_id"], v["payload"]["product_id"])
        for v in unaligned
        if v["event_type"] == "product_viewed"
    }
    assert sum((a["customer_id"], a["payload"]["product_id"]) in other for a in mine) < seen / 2
    with pytest.raises(ValueError, match="ask for at most"):
        generator.web_traffic(5, 100_000, follows=clean)


def test_web_chaos_holds_one_record_of_every_way_to_fail_the_web_contract(spark):
    records = generator.web_records(9, 600, chaos=True)
    assert len(records) == 600
    kinds = Counter(r.kind for r in records)
    assert kinds["resend"] + kinds["resend_reordered"] == 18 and kinds["conflicting"] == 6
    bad = [r for r in records if r.expect != generator.VALID]
    now = datetime.now(UTC).replace(tzinfo=None)
    rows = [("web.events", 0, n, now, r.key.decode(), r.value, now) for n, r in enumerate(bad)]
    checked = contract.validate(
        spark.createDataFrame(rows, BRONZE_SCHEMA), contract.source_plan("web")
    ).collect()
    assert [c["reject_reason"] for c in checked] == [r.expect for r in bad]
    assert set(r.expect for r in bad) == {
        "malformed_json",
        "missing_field",
        "invalid_field",
        "unknown_event_type",
        "unsupported_schema_version",
        "event_time_out_of_range",
    }
