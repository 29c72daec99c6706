"""The shop's events (docs/contract.md §1): carts, orders and payments, keyed by customer.

Contract version 2 (§10) adds `order_placed` schema_version 2. A deployment starts at
contract version 1 and moves with `regauge sources deploy shop 2`."""

from __future__ import annotations

from warehouse.base.declare import (
    Count,
    EventType,
    Field,
    Items,
    Money,
    OneOf,
    Shape,
    Source,
    SumOf,
    Text,
)

CURRENCY = OneOf(("EUR", "USD", "GBP"))
_CART = Shape(1, (Field("product_id", Text()), Field("quantity", Count())))
_ORDER_V1 = (
    Field("order_id", Text()),
    Field("currency", CURRENCY),
    Field(
        "items",
        Items(
            (
                Field("product_id", Text()),
                Field("quantity", Count()),
                Field("unit_price", Money()),
            )
        ),
    ),
    Field("total", Money()),
)

SOURCE = Source(
    name="shop",
    topic="shop.events",
    key="customer_id",
    id_field="event_id",
    time_field="event_time",
    subject_field="customer_id",
    event_types=(
        EventType("cart_item_added", (_CART,)),
        EventType("cart_item_removed", (_CART,)),
        EventType(
            "order_placed",
            (
                Shape(
                    1,
                    _ORDER_V1,
                    rules=(SumOf("total", "items", ("quantity", "unit_price")),),
                ),
                # §10: contract version 2 learns a discount; v1 orders read 0.00.
                Shape(
                    2,
                    (*_ORDER_V1, Field("discount", Money(), default="0.00")),
                    rules=(SumOf("total", "items", ("quantity", "unit_price"), less="discount"),),
                    since=2,
                ),
            ),
        ),
        EventType(
            "order_cancelled", (Shape(1, (Field("order_id", Text()), Field("reason", Text()))),)
        ),
        EventType(
            "payment_captured",
            (
                Shape(
                    1,
                    (
                        Field("order_id", Text()),
                        Field("amount", Money()),
                        Field("currency", CURRENCY),
                    ),
                ),
            ),
        ),
    ),
)
