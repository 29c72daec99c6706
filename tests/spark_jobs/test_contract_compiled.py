"""The shop contract's compiled expressions are exactly those of the hand-written
contract they replaced (issue 66): the same column text gives the same plan, so
the same verdicts, details, typed values and speed.

`data/shop_expressions.json` holds a sha256 of each expression's text, taken
from the hand-written contract (commit 9d50de1). Regenerate it only for a change
meant to alter validation, with `REGAUGE_WRITE_FINGERPRINT=1`, and say why in
the commit.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
from pathlib import Path

import pytest

from spark_jobs.engine import contract
from warehouse.base.declare import Count, EventType, Field, Shape, Source, Text
from warehouse.sources import shop

GOLDEN = Path(__file__).parent / "data" / "shop_expressions.json"
# A lambda's variables get fresh names per build (`x_12`), from a counter the
# whole JVM shares: the same expression reads `x_3` in one run and `x_41` in another.
_FRESH = re.compile(r"\b([A-Za-z]+)_\d+\b")


def _text(column: object) -> str:
    return _FRESH.sub(r"\1_#", str(column))


def _fingerprints(plan: contract.Plan | None = None) -> dict[str, str]:
    """The fingerprints of `plan`'s expressions; by default, of the shop's declaration
    as its contract version 1 knew it, which the hand-written contract was."""
    built = contract._build_expressions(plan or contract.plan(shop.SOURCE.at(1)))
    found = {}
    for field in dataclasses.fields(built):
        value = getattr(built, field.name)
        values = value if isinstance(value, list) else [value]
        text = "\n".join(v if isinstance(v, str) else _text(v) for v in values)
        found[field.name] = hashlib.sha256(text.encode()).hexdigest()
    return found


def test_the_compiled_shop_contract_builds_the_expressions_it_replaced(spark):
    # The text is the whole expression, so a fingerprint covers every check: the
    # first check's detail and the last's are both in it.
    verdict = _text(contract._build_expressions(contract.plan(shop.SOURCE.at(1))).verdict)
    assert "value is %d bytes; the limit is 65536" in verdict
    assert "total %s is not the sum of quantity x unit_price (%s)" in verdict
    got = _fingerprints()
    assert got == _fingerprints()  # the same in every build
    if os.environ.get("REGAUGE_WRITE_FINGERPRINT") == "1":
        GOLDEN.write_text(json.dumps(got, indent=2, sort_keys=True) + "\n")
    want = json.loads(GOLDEN.read_text())
    changed = sorted(name for name in want if got.get(name) != want[name])
    assert got.keys() == want.keys()
    assert not changed, f"validate's expressions changed: {', '.join(changed)}"


def _source(*event_types: EventType) -> Source:
    return dataclasses.replace(shop.SOURCE, event_types=event_types)


CART = Shape(1, (Field("product_id", Text()), Field("quantity", Count())))


def test_the_plan_types_each_payload_field_once_in_order_of_first_declaration():
    plan = contract.plan(shop.SOURCE)
    assert [f.name for f in plan.columns] == [
        "product_id",
        "quantity",
        "order_id",
        "currency",
        "items",
        "total",
        "reason",
        "amount",
        "discount",  # contract version 2's, last: silver gains it at the end
    ]
    assert plan.number_paths == [
        "$.payload.quantity",
        "$.payload.total",
        "$.payload.amount",
        "$.payload.discount",
    ]
    assert [f.name for f in contract.EVENT_SCHEMA.fields][:5] == [
        "event_id",
        "event_type",
        "event_time",
        "customer_id",
        "schema_version",
    ]


@pytest.mark.parametrize(
    ("event_types", "message"),
    [
        (
            (EventType("a", (CART, Shape(2, (*CART.fields, Field("note", Text())), since=2))),),
            "a v2: field note has no default for records of v1",
        ),
        (
            (EventType("a", (CART, Shape(2, CART.fields[:1], since=2))),),
            r"a v1: fields \['quantity'\] are not in the newest version",
        ),
        (
            (EventType("a", (Shape(1, (Field("customer_id", Text()),)),)),),
            r"payload fields \['customer_id'\] clash with the envelope",
        ),
    ],
)
def test_the_plan_refuses_what_silver_could_not_hold(event_types, message):
    with pytest.raises(ValueError, match=message):
        contract.plan(_source(*event_types))
