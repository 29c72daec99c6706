"""The shop's web site: signed-in customers' sessions and the products they look at.

The second source (docs/contract.md §10), declared as any data engineer would declare
their own: topic `web.events`, tables `bronze.web_events`, `silver.web_events` and
the silver tables beside it. Keyed, and erased (§8), by `customer_id`, as the shop's
events are, so one erasure finds a customer in both. A view that reads both sources
joins a session's product views to the orders that followed (conversion)."""

from __future__ import annotations

from warehouse.base.declare import EventType, Field, OneOf, Shape, Source, Text

SOURCE = Source(
    name="web",
    topic="web.events",
    key="customer_id",
    id_field="event_id",
    time_field="event_time",
    subject_field="customer_id",
    event_types=(
        EventType(
            "session_started",
            (
                Shape(
                    1,
                    (
                        Field("session_id", Text()),
                        Field("referrer", OneOf(("direct", "search", "ads", "email", "social"))),
                    ),
                ),
            ),
        ),
        EventType(
            "product_viewed",
            (Shape(1, (Field("session_id", Text()), Field("product_id", Text()))),),
        ),
    ),
)
