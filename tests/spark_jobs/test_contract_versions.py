"""Schema versions (docs/contract.md §10), compiled from a declaration: the shop as its
contract version 2 declares it, with `order_placed` v2 (a `discount`; total = Σ
quantity x unit_price - discount), against real Spark.

One validation of every case, shared by the tests (a module fixture)."""

from __future__ import annotations

import json
from datetime import datetime
from decimal import Decimal

import pytest
from pyspark.sql import functions as F

from spark_jobs.engine import contract, lake, silver
from tests.spark_jobs.conftest import judge
from warehouse.sources import shop

SHOP_V2 = shop.SOURCE  # contract version 2: order_placed v2 (§10)
SHOP_V1 = shop.SOURCE.at(1)  # the shop before it
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


def order(version: object = 2, **payload: object) -> bytes:
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
    # A version the contract does not know is checked by the fields every version keeps.
    "v3 order lacking v2's discount": (
        order(3, discount=None),
        "unsupported_schema_version",
        "schema_version 3 is not supported for order_placed (only 1, 2)",
    ),
    "v1 order whose version is a string": (
        order("1", total=12.5, discount=None),
        "invalid_field",
        "schema_version must be an integer",
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
    return judge(spark, CASES, contract.plan(SHOP_V2))


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


def test_at_contract_version_1_records_are_judged_as_today_and_silver_keeps_its_columns(spark):
    """Deployed at contract version 1, the evolved declaration judges every record as
    the shop's declaration of today does (a v2 order is unsupported), while silver's
    columns stay the whole declaration's, so moving between versions never changes its
    schema."""
    at_1 = contract.plan(SHOP_V2, 1)
    assert at_1.event_schema == contract.plan(SHOP_V2).event_schema
    rows = [(n, 0, i, KAFKA_TS, value) for i, (n, (value, _, _)) in enumerate(CASES.items())]
    records = spark.createDataFrame(
        rows, "name string, partition int, offset long, kafka_timestamp timestamp, value binary"
    )

    def judged(plan):
        found = contract.validate(records, plan).select("name", "reject_reason", "reject_detail")
        return {r.name: (r.reject_reason, r.reject_detail) for r in found.collect()}

    today = judged(contract.plan(SHOP_V1))
    assert judged(at_1) == today
    assert today["v2 order"] == (
        "unsupported_schema_version",
        "schema_version 2 is not supported (only 1)",
    )
    (v1,) = contract.validate(records, at_1).where("name = 'v1 order'").collect()
    assert v1.discount == Decimal("0.00")


def test_a_silver_made_before_v2_gains_its_column_and_v1_orders_read_the_default(spark, tmp_path):
    """Silver made under the shop of today, then brought to the evolved declaration:
    the discount column is added, a v1 order reads 0.00 there (as one validated under
    contract 2 would), a cart reads null, and a second run changes nothing."""
    path = str(tmp_path / "silver")
    today = contract.plan(SHOP_V1)
    records = spark.createDataFrame(
        [
            (0, 0, KAFKA_TS, order(1, total=12.5, discount=None)),
            (0, 1, KAFKA_TS, _record("cart_item_added", 1, CART)),
        ],
        "partition int, offset long, kafka_timestamp timestamp, value binary",
    )
    checked = contract.validate(records, today).withColumn("content_hash", F.lit("h"))
    before = silver.silver_schema(today.event_schema)
    lake.ensure_table(spark, path, before)
    checked.withColumn("event_date", F.to_date("event_time")).select(
        *before.fieldNames()
    ).write.format("delta").mode("append").save(path)

    evolved = contract.plan(SHOP_V2)
    silver.evolve(spark, path, evolved)
    table = spark.read.format("delta").load(path)
    assert table.schema == silver.silver_schema(evolved.event_schema)
    got = {r.event_type: r.discount for r in table.collect()}
    assert got == {"order_placed": Decimal("0.00"), "cart_item_added": None}
    want = contract.validate(records, evolved).where("event_type = 'order_placed'").first()
    assert want is not None and want.discount == got["order_placed"]
    commits = spark.sql(f"DESCRIBE HISTORY delta.`{path}`").count()
    silver.evolve(spark, path, evolved)
    assert spark.sql(f"DESCRIBE HISTORY delta.`{path}`").count() == commits
