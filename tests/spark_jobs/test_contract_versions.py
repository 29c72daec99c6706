"""Schema versions (CONTRACT.md §10), compiled from a declaration: the shop as its
contract version 2 declares it, with `order_placed` v2 (a `discount`; total = Σ
quantity x unit_price - discount), against real Spark.

One validation of every case, shared by the tests (a module fixture)."""

from __future__ import annotations

import json
from datetime import datetime
from decimal import Decimal

import pytest

from spark_jobs import contract
from tests.spark_jobs.test_contract_compiled import _fingerprints
from tests.warehouse.sources.shop_v2 import SHOP_V2

KAFKA_TS = datetime(2026, 1, 1, 12, 0, 0)
ITEMS = [
    {"product_id": "p1", "quantity": 2, "unit_price": 1.25},
    {"product_id": "p2", "quantity": 1, "unit_price": 10},
]  # Σ = 12.50


def _record(event_type: str, version: object, payload: dict) -> bytes:
    return json.dumps(
        {
            "event_id": "e1",
            "event_type": event_type,
            "event_time": "2026-01-01T11:00:00.000Z",
            "customer_id": "c1",
            "schema_version": version,
            "payload": payload,
        }
    ).encode()


def order(version: int = 2, **payload: object) -> bytes:
    base = {"order_id": "o1", "currency": "EUR", "items": ITEMS, "total": 10.00, "discount": 2.5}
    return _record("order_placed", version, {**base, **payload})


CART = {"product_id": "p1", "quantity": 1}
# name -> (record, reason, detail)
CASES: dict[str, tuple[bytes, str | None, str | None]] = {
    "v2 order": (order(), None, None),
    "v2 order, no discount": (order(total=12.5, discount=0), None, None),
    "v1 order": (order(1, total=12.5, discount=None), None, None),
    "v1 order carrying a discount": (order(1, total=12.5, discount=9), None, None),
    "v1 order with a v2 total": (
        order(1),
        "total_mismatch",
        "total 10.00 is not the sum of quantity x unit_price (12.50)",
    ),
    "v2 order without discount": (
        order(discount=None),
        "missing_field",
        "payload.discount is missing or null",
    ),
    "v2 order, discount over the sum": (
        order(total=0, discount=12.51),
        "invalid_field",
        "payload.discount must be at most Σ items[].quantity x items[].unit_price",
    ),
    "v2 order, discount of three decimals": (
        order(discount=2.505),
        "invalid_field",
        "payload.discount must be a number >= 0 with at most 2 decimals",
    ),
    "v2 order with a v1 total": (
        order(total=12.5),
        "total_mismatch",
        "total 12.50 is not the sum of quantity x unit_price less discount (10.00)",
    ),
    "v3 order": (
        order(3),
        "unsupported_schema_version",
        "schema_version 3 is not supported for order_placed (only 1, 2)",
    ),
    "v3 order lacking v2's discount": (
        order(3, discount=None),
        "missing_field",
        "payload.discount is missing or null",
    ),
    "v2 cart": (
        _record("cart_item_added", 2, CART),
        "unsupported_schema_version",
        "schema_version 2 is not supported for cart_item_added (only 1)",
    ),
    "v1 cart": (_record("cart_item_added", 1, CART), None, None),
}


@pytest.fixture(scope="module")
def verdicts(spark):
    rows = [(n, 0, i, KAFKA_TS, value) for i, (n, (value, _, _)) in enumerate(CASES.items())]
    records = spark.createDataFrame(
        rows, "name string, partition int, offset long, kafka_timestamp timestamp, value binary"
    )
    found = contract.validate(records, contract.plan(SHOP_V2)).collect()
    return {r["name"]: r for r in found}


def test_each_record_is_judged_by_its_own_schema_version(verdicts):
    got = {n: (r.reject_reason, r.reject_detail) for n, r in verdicts.items()}
    assert got == {n: (reason, detail) for n, (_, reason, detail) in CASES.items()}


def test_silver_holds_the_newest_shape_and_older_records_read_the_declared_default(verdicts):
    def read(name):
        r = verdicts[name]
        return r.schema_version, r.discount, r.total

    assert read("v2 order") == (2, Decimal("2.50"), Decimal("10.00"))
    assert read("v1 order") == (1, Decimal("0.00"), Decimal("12.50"))
    # v1 has no discount: a v1 record's own is ignored, as any unknown field is.
    assert read("v1 order carrying a discount") == (1, Decimal("0.00"), Decimal("12.50"))
    assert verdicts["v1 cart"].discount is None  # not an order: no discount at all
    names = [f.name for f in contract.plan(SHOP_V2).event_schema.fields]
    assert names[-2:] == ["amount", "discount"]  # new columns come last


def test_at_contract_version_1_a_v2_order_is_unsupported_and_silver_keeps_its_columns(spark):
    """Deployed at contract version 1, the evolved declaration accepts what today's
    contract does: a v2 order is unsupported, as it is today. Silver's columns stay
    the whole declaration's, so moving between versions never changes its schema."""
    at_1 = contract.plan(SHOP_V2, 1)
    assert at_1.event_schema == contract.plan(SHOP_V2).event_schema
    records = spark.createDataFrame(
        [(0, 0, KAFKA_TS, order()), (0, 1, KAFKA_TS, order(1, total=12.5, discount=None))],
        "partition int, offset long, kafka_timestamp timestamp, value binary",
    )
    v2, v1 = contract.validate(records, at_1).orderBy("offset").collect()
    assert (v2.reject_reason, v2.reject_detail) == (
        "unsupported_schema_version",
        "schema_version 2 is not supported (only 1)",
    )
    assert (v1.reject_reason, v1.discount) == (None, Decimal("0.00"))
    # The declaration as contract version 1 knew it compiles to today's contract.
    assert _fingerprints(contract.plan(SHOP_V2.at(1))) == _fingerprints()
