"""The shop's declaration is docs/contract.md §1, word for word."""

from __future__ import annotations

import subprocess
import sys

import pytest

from warehouse import sources
from warehouse.base import registry
from warehouse.base.declare import Count, Field, Items, Money, OneOf, SumOf, Text


def test_the_shop_source_is_found_by_its_file_and_keeps_its_topic():
    shop = sources.get("shop")
    assert "shop" in sources.discover()
    assert shop.topic == registry.TOPIC == "shop.events"
    assert (shop.key, shop.id_field, shop.time_field, shop.subject_field) == (
        "customer_id",
        "event_id",
        "event_time",
        "customer_id",
    )


def test_the_shop_declares_contract_section_1s_payloads():
    currency = OneOf(("EUR", "USD", "GBP"))
    item = {"product_id": Text(), "quantity": Count(), "unit_price": Money()}
    want: dict[str, dict[str, object]] = {
        "cart_item_added": {"product_id": Text(), "quantity": Count()},
        "cart_item_removed": {"product_id": Text(), "quantity": Count()},
        "order_placed": {
            "order_id": Text(),
            "currency": currency,
            "items": "items",
            "total": Money(),
        },
        "order_cancelled": {"order_id": Text(), "reason": Text()},
        "payment_captured": {"order_id": Text(), "amount": Money(), "currency": currency},
    }
    shop = sources.get("shop").at(1)  # §1 is contract version 1
    got: dict[str, dict[str, object]] = {}
    for etype in shop.event_types:
        assert [s.version for s in etype.shapes] == [1]
        got[etype.name] = {
            f.name: "items" if isinstance(f.kind, Items) else f.kind for f in etype.newest.fields
        }
    # Dicts compare without order; the order of checks is held by the lists.
    assert got == want
    assert [list(fields) for fields in got.values()] == [list(f) for f in want.values()]
    (placed,) = [t for t in shop.event_types if t.name == "order_placed"]
    (items,) = [f.kind for f in placed.newest.fields if isinstance(f.kind, Items)]
    assert {f.name: f.kind for f in items.fields} == item
    assert [f.name for f in items.fields] == list(item)
    assert placed.newest.rules == (SumOf("total", "items", ("quantity", "unit_price")),)


def test_contract_version_2_adds_section_10s_order_v2_and_nothing_else():
    shop = sources.get("shop")
    assert shop.contract_version == 2
    versions = {t.name: [(s.version, s.since) for s in t.shapes] for t in shop.event_types}
    assert versions.pop("order_placed") == [(1, 1), (2, 2)]
    assert all(v == [(1, 1)] for v in versions.values())
    (placed,) = [t for t in shop.event_types if t.name == "order_placed"]
    v1, v2 = placed.shapes
    assert v2.fields[:-1] == v1.fields
    assert v2.fields[-1] == Field("discount", Money(), default="0.00")
    assert v2.rules == (SumOf("total", "items", ("quantity", "unit_price"), less="discount"),)


def test_an_unknown_source_is_named_with_those_there_are():
    with pytest.raises(KeyError, match="unknown source 'pos'; known: shop, web"):
        sources.get("pos")


def test_declarations_load_without_spark():
    """In a fresh interpreter: this one may have Spark loaded by other tests."""
    code = (
        "import sys; from warehouse import sources; sources.discover(); "
        "sys.exit(1 if 'pyspark' in sys.modules else 0)"
    )
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0
