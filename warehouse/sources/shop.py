"""The shop's events (docs/contract.md §1): carts, orders and payments, keyed by customer."""

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
                    (
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
                    ),
                    rules=(SumOf("total", "items", ("quantity", "unit_price")),),
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
