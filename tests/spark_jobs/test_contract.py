"""One test per contract rule (docs/contract.md §1) and per precedence case."""

import json
from datetime import datetime

import pytest
from pyspark.sql import functions as F

from spark_jobs.engine import contract
from spark_jobs.engine.contract import EVENT_SCHEMA, REASONS, validate
from spark_jobs.engine.silver import to_silver_rows
from tests.frames import assert_df_equality

KAFKA_TS = datetime(2026, 1, 1, 12, 0, 0)
ORDER = {
    "order_id": "o1",
    "currency": "EUR",
    "items": [
        {"product_id": "p1", "quantity": 2, "unit_price": 1.25},
        {"product_id": "p2", "quantity": 1, "unit_price": 10},
    ],
    "total": 12.50,
}


def event(**fields) -> bytes:
    base = {
        "event_id": "e-1_A",
        "event_type": "cart_item_added",
        "event_time": "2026-01-01T11:00:00.000Z",
        "customer_id": "c1",
        "schema_version": 1,
        "payload": {"product_id": "p1", "quantity": 2},
    }
    return json.dumps({**base, **fields}).encode()


def order(**payload) -> bytes:
    return event(event_type="order_placed", payload={**ORDER, **payload})


def literal(payload: str, event_type: str = "cart_item_added", **envelope: str) -> bytes:
    """An event as literal JSON text, so a number keeps the spelling under test
    (json.dumps would write 12.500 as 12.5 and 1e2 as 100.0)."""
    fields = {
        "event_id": '"e-1_A"',
        "event_type": f'"{event_type}"',
        "event_time": '"2026-01-01T11:00:00.000Z"',
        "customer_id": '"c1"',
        "schema_version": "1",
        **envelope,
        "payload": payload,
    }
    return ("{" + ", ".join(f'"{k}": {v}' for k, v in fields.items()) + "}").encode()


def cart(quantity: str) -> bytes:
    return literal(f'{{"product_id": "p1", "quantity": {quantity}}}')


def priced(unit_price: str, total: str, quantity: str = "2") -> bytes:
    item = f'{{"product_id": "p1", "quantity": {quantity}, "unit_price": {unit_price}}}'
    payload = f'{{"order_id": "o1", "currency": "EUR", "items": [{item}], "total": {total}}}'
    return literal(payload, "order_placed")


def paid(amount: str) -> bytes:
    return literal(
        f'{{"order_id": "o1", "amount": {amount}, "currency": "EUR"}}', "payment_captured"
    )


CASES = {
    # accepted
    "cart event": (event(), None),
    "order": (order(), None),
    "cancellation": (
        event(event_type="order_cancelled", payload={"order_id": "o", "reason": "r"}),
        None,
    ),
    "payment": (
        event(
            event_type="payment_captured",
            payload={"order_id": "o", "amount": 3.5, "currency": "GBP"},
        ),
        None,
    ),
    "offset time": (event(event_time="2026-01-01T13:00:00.123456+02:00"), None),
    "unknown extra field": (event(note="ignored"), None),
    "trailing zeros are not decimals": (priced("6.250", "12.500"), None),
    "quantity spelled 3.0": (cart("3.0"), None),
    "quantity in exponent form": (cart("3e0"), None),
    "largest quantity": (cart("2147483647"), None),
    "price in exponent form": (priced("1e2", "200"), None),
    "cents in exponent form": (priced("1.234e1", "24.68"), None),
    "total in exponent form": (priced("50", "1.0E2"), None),
    "amount in exponent form": (paid("7e-2"), None),
    "schema version spelled 1.0": (
        literal('{"product_id": "p1", "quantity": 2}', schema_version="1.0"),
        None,
    ),
    "schema version 1e0": (
        literal('{"product_id": "p1", "quantity": 2}', schema_version="1e0"),
        None,
    ),
    # one per reason
    "oversize": (b'{"x":"' + b"a" * 70_000 + b'"}', "oversize"),
    "not utf-8": (b"\xff\xfe{}", "malformed_json"),
    "not json": (b"{nope", "malformed_json"),
    "json array": (b"[1, 2]", "malformed_json"),
    "json string": (b'"text"', "malformed_json"),
    "missing customer": (event(customer_id=None), "missing_field"),
    "missing payload field": (event(payload={"product_id": "p1"}), "missing_field"),
    "missing item field": (order(items=[{"product_id": "p1", "quantity": 2}]), "missing_field"),
    "quantity as string": (event(payload={"product_id": "p1", "quantity": "2"}), "invalid_field"),
    "quantity zero": (event(payload={"product_id": "p1", "quantity": 0}), "invalid_field"),
    "three decimals": (order(total=12.505), "invalid_field"),
    "negative money": (
        event(
            event_type="payment_captured",
            payload={"order_id": "o", "amount": -1, "currency": "EUR"},
        ),
        "invalid_field",
    ),
    "bad currency": (order(currency="JPY"), "invalid_field"),
    "empty items": (order(items=[], total=0), "invalid_field"),
    "bad id characters": (event(event_id="a b"), "invalid_field"),
    "id ending in a newline": (
        literal('{"product_id": "p1", "quantity": 2}', event_id=r'"nl-1\n"'),
        "invalid_field",
    ),
    "time ending in a newline": (
        literal('{"product_id": "p1", "quantity": 2}', event_time=r'"2026-01-01T11:00:00.000Z\n"'),
        "invalid_field",
    ),
    "quantity beyond INT": (cart("3000000000"), "invalid_field"),
    "quantity with a fraction": (cart("2.5"), "invalid_field"),
    "quantity 25e-1": (cart("25e-1"), "invalid_field"),
    "three decimals in exponent form": (priced("1.2345e1", "24.69"), "invalid_field"),
    "price as a string": (priced('"100"', "200"), "invalid_field"),
    "tiny amount": (paid("1e-5"), "invalid_field"),
    "huge total": (priced("1", "1e999999999"), "invalid_field"),
    # Not re-read from the text (it would take hours): the price cannot be judged.
    "a number too long to re-read": (priced("1e2", "0e-999999999"), "invalid_field"),
    "schema version 1.5": (
        literal('{"product_id": "p1", "quantity": 2}', schema_version="1.5"),
        "invalid_field",
    ),
    "schema version 1e999999999": (
        literal('{"product_id": "p1", "quantity": 2}', schema_version="1e999999999"),
        "unsupported_schema_version",
    ),
    "time without offset": (event(event_time="2026-01-01T11:00:00.000"), "invalid_field"),
    "time without millis": (event(event_time="2026-01-01T11:00:00Z"), "invalid_field"),
    "schema version as string": (event(schema_version="1"), "invalid_field"),
    "unknown type": (event(event_type="refund_issued"), "unknown_event_type"),
    "schema version 2": (event(schema_version=2), "unsupported_schema_version"),
    "before 2000": (event(event_time="1999-12-31T23:59:59.999Z"), "event_time_out_of_range"),
    "too far ahead": (event(event_time="2026-01-02T12:00:00.001Z"), "event_time_out_of_range"),
    "total mismatch": (order(total=12.51), "total_mismatch"),
    # precedence: the first reason in the contract's table wins
    "oversize beats malformed": (b"{" * 70_000, "oversize"),
    "missing beats invalid": (event(customer_id=None, event_id="bad id"), "missing_field"),
    "invalid beats unknown type": (event(event_type="refund", event_id="bad id"), "invalid_field"),
    "unknown type beats version": (
        event(event_type="refund", schema_version=9),
        "unknown_event_type",
    ),
    "version beats time range": (
        event(schema_version=2, event_time="1990-01-01T00:00:00.000Z"),
        "unsupported_schema_version",
    ),
    "time range beats total": (
        event(
            event_type="order_placed",
            payload={**ORDER, "total": 1},
            event_time="1990-01-01T00:00:00.000Z",
        ),
        "event_time_out_of_range",
    ),
}


@pytest.fixture(scope="module")
def verdicts(spark):
    rows = [(name, 0, i, KAFKA_TS, value) for i, (name, (value, _)) in enumerate(CASES.items())]
    records = spark.createDataFrame(
        rows, "name string, partition int, offset long, kafka_timestamp timestamp, value binary"
    )
    return validate(records).cache()


def test_every_record_gets_the_contracts_reason(spark, verdicts):
    expected = spark.createDataFrame(
        [(name, reason) for name, (_, reason) in CASES.items()], "name string, reason string"
    )
    actual = verdicts.select("name", F.col("reject_reason").alias("reason"))
    assert_df_equality(actual, expected, ignore_row_order=True, ignore_nullable=True)


def test_every_reason_is_covered_and_explained(verdicts):
    rejected = verdicts.filter("reject_reason IS NOT NULL")
    assert rejected.filter("reject_detail IS NULL OR reject_detail = ''").count() == 0
    seen = {r.reject_reason for r in rejected.select("reject_reason").distinct().collect()}
    assert seen == set(REASONS) - {"conflicting_duplicate"}  # that one needs history


def test_money_is_exact_decimal_and_time_is_utc(verdicts):
    row = verdicts.filter("name = 'order'").first()
    assert str(row.total) == "12.50"
    assert [(i.product_id, i.quantity, str(i.unit_price)) for i in row["items"]] == [
        ("p1", 2, "1.25"),
        ("p2", 1, "10.00"),
    ]
    shifted = verdicts.filter("name = 'offset time'").first()
    assert shifted.event_time == datetime(2026, 1, 1, 11, 0, 0, 123456)


DETAILS = {
    "id ending in a newline": "event_id must be 1-64 characters of A-Z a-z 0-9 _ -",
    "quantity beyond INT": "payload.quantity must be an integer from 1 to 2147483647",
    "three decimals in exponent form": (
        "payload.items[].unit_price must be a number >= 0 with at most 2 decimals"
    ),
    "price as a string": "payload.items[].unit_price must be a number >= 0 with at most 2 decimals",
    "empty items": "payload.items must be a non-empty array of items",
    "huge total": "payload.total must be a number >= 0 with at most 2 decimals",
}


def test_the_detail_names_the_field_that_failed(verdicts):
    rows = verdicts.filter(F.col("name").isin(*DETAILS)).select("name", "reject_detail")
    assert {r.name: r.reject_detail for r in rows.collect()} == DETAILS


def test_numbers_are_judged_by_value_whatever_their_spelling(verdicts):
    def typed(name: str):
        return verdicts.filter(F.col("name") == name).first()

    assert typed("quantity spelled 3.0").quantity == 3
    assert typed("quantity in exponent form").quantity == 3
    assert typed("largest quantity").quantity == 2_147_483_647
    exp = typed("price in exponent form")
    assert (str(exp["items"][0].unit_price), str(exp.total)) == ("100.00", "200.00")
    assert str(typed("cents in exponent form")["items"][0].unit_price) == "12.34"
    assert str(typed("amount in exponent form").amount) == "0.07"
    assert typed("schema version 1e0").schema_version == 1


def test_the_same_event_spelled_differently_hashes_the_same(spark):
    a = b'{"event_id":"e","payload":{"quantity":2,"product_id":"p"},"total":1.50}'
    b = b'{"total":1.5, "payload":{"product_id":"p","quantity":2}, "event_id":"e"}'
    c = b'{"event_id":"e","payload":{"quantity":3,"product_id":"p"},"total":1.50}'
    records = spark.createDataFrame(
        [(0, i, KAFKA_TS, v) for i, v in enumerate([a, b, c])],
        "partition int, offset long, kafka_timestamp timestamp, value binary",
    )
    hashes = [r.content_hash for r in validate(records).orderBy("offset").collect()]
    assert hashes[0] == hashes[1] != hashes[2]


def test_typed_columns_are_the_declared_event_schema(verdicts):
    typed = verdicts.select(*[f.name for f in EVENT_SCHEMA.fields]).schema
    assert [(f.name, f.dataType) for f in typed] == [
        (f.name, f.dataType) for f in EVENT_SCHEMA.fields
    ]


def test_validations_of_different_records_share_expressions_but_not_answers(spark):
    """`validate` reuses one set of column expressions for every call (building them
    costs seconds): two validations joined must still each give their own verdicts."""
    schema = "partition int, offset long, kafka_timestamp timestamp, value binary"
    good = spark.createDataFrame([(0, 1, KAFKA_TS, event())], schema)
    bad = spark.createDataFrame([(0, 1, KAFKA_TS, event(schema_version=2))], schema)
    first, second = validate(good), validate(bad)
    joined = first.alias("a").join(second.alias("b"), ["partition", "offset"])
    (row,) = joined.select("a.reject_reason", "b.reject_reason", "a.event_id").collect()
    assert tuple(row) == (None, "unsupported_schema_version", "e-1_A")


def test_an_accepted_records_silver_partition_reads_the_same_in_python(spark):
    """`contract.accepted_partition` (a live batch's `_where_held`, issue 67) gives the
    partition Spark's validation gives an accepted record: its event type and the UTC
    date of its time, across midnight either way, with any fraction; and None
    for what validation does not accept, for the caller to ask Spark."""
    times = [
        "2026-01-01T23:30:00.000-02:00",  # the next day in UTC
        "2026-01-01T00:30:00.000+02:00",  # the day before
        "2026-01-01T11:00:00.123456789Z",
        "2025-12-31T23:59:59.999999999+00:00",
        "2026-01-02T05:00:00.000+14:00",
        "2024-02-29T23:00:00.500-01:00",
    ]
    values = [event(event_time=t) for t in times] + [
        order().replace(b"2026-01-01T11:00:00.000Z", t.encode()) for t in times
    ]
    records = spark.createDataFrame(
        [(0, i, KAFKA_TS, v) for i, v in enumerate(values)],
        "partition int, offset long, kafka_timestamp timestamp, value binary",
    )
    checked = validate(records)
    assert (
        checked.where("reject_reason IS NOT NULL").select("offset", "reject_detail").collect() == []
    )
    rows = to_silver_rows(checked).orderBy("offset").select("event_type", "event_date").collect()
    want = [(r.event_type, r.event_date) for r in rows]
    assert {d for _, d in want} > {datetime(2026, 1, 2).date(), datetime(2025, 12, 31).date()}
    assert [contract.accepted_partition(v, contract.PLAN) for v in values] == want
    for unread in (None, b"not json", b"[1]", event(event_time="2026-01-01T11:00:00Z")):
        assert contract.accepted_partition(unread, contract.PLAN) is None
