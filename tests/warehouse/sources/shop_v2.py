"""The shop as docs/contract.md §10 evolves it: contract version 2 adds `order_placed`
schema_version 2, which has a `discount` (v1 records read 0.00) and total = Σ
quantity x unit_price - discount. Tests compile and check it before the shop's
own declaration takes it."""

from __future__ import annotations

import dataclasses

from warehouse.base.declare import Field, Money, Shape, SumOf
from warehouse.sources import shop

_types = {t.name: t for t in shop.SOURCE.event_types}
_v1 = _types["order_placed"].shape(1)
ORDER_V2 = Shape(
    2,
    (*_v1.fields, Field("discount", Money(), default="0.00")),
    rules=(SumOf("total", "items", ("quantity", "unit_price"), less="discount"),),
    since=2,
)
SHOP_V2 = dataclasses.replace(
    shop.SOURCE,
    event_types=tuple(
        dataclasses.replace(t, shapes=(*t.shapes, ORDER_V2)) if t.name == "order_placed" else t
        for t in shop.SOURCE.event_types
    ),
)
