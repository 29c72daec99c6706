"""visits v1: a customer's visits across the web site and the shop, and whether each
converted (docs/contract.md §3). The first view over two sources (§10): `web`'s
sessions and product views, and `shop`'s orders.

A visit is a session window per customer over their `session_started`,
`product_viewed` and `order_placed` events, with a 30-minute inactivity gap (the
semantics of `cart_sessions`, whatever source each event came from). It converted
if an order in it holds a product the customer viewed earlier in it.
"""

from __future__ import annotations

from datetime import timedelta

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import (
    BooleanType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from spark_jobs.views.base import Scope, View, gap_sessions

VISIT_GAP = timedelta(minutes=30)
GAP = f"INTERVAL {int(VISIT_GAP.total_seconds())} SECONDS"
WEB_TYPES = ("session_started", "product_viewed")
EVENT_TYPES = (*WEB_TYPES, "order_placed")

SCHEMA = StructType(
    [
        StructField("customer_id", StringType(), False),
        StructField("visit_start", TimestampType(), False),
        StructField("visit_end", TimestampType(), False),
        StructField("events", LongType(), False),
        StructField("web_sessions", LongType(), False),
        StructField("products_viewed", LongType(), False),
        StructField("orders", LongType(), False),
        StructField("converted", BooleanType(), False),
    ]
)


def compute(silver: DataFrame) -> DataFrame:
    events = silver.where(F.col("event_type").isin(*EVENT_TYPES)).select(
        "customer_id", "event_time", "event_type", "session_id", "product_id", "items"
    )
    numbered = gap_sessions(events, "customer_id", VISIT_GAP, "_visit")
    visit = ["customer_id", "_visit"]

    def count_of(event_type: str) -> F.Column:
        return F.count(F.when(F.col("event_type") == event_type, F.lit(1)))

    # An order converts its visit if it holds a product viewed before it in the visit.
    viewed = numbered.where(F.col("event_type") == "product_viewed").select(
        *visit, "product_id", F.col("event_time").alias("_viewed_at")
    )
    ordered = numbered.where(F.col("event_type") == "order_placed").select(
        *visit,
        F.explode("items.product_id").alias("product_id"),
        F.col("event_time").alias("_ordered_at"),
    )
    converted = (
        viewed.join(ordered, [*visit, "product_id"])
        .where(F.col("_viewed_at") <= F.col("_ordered_at"))
        .select(*visit)
        .distinct()
        .withColumn("converted", F.lit(True))
    )
    return (
        numbered.groupBy(*visit)
        .agg(
            F.min("event_time").alias("visit_start"),
            (F.max("event_time") + F.expr(GAP)).alias("visit_end"),
            F.count(F.lit(1)).alias("events"),
            F.count_distinct("session_id").alias("web_sessions"),
            count_of("product_viewed").alias("products_viewed"),
            count_of("order_placed").alias("orders"),
        )
        .join(converted, visit, "left")
        .withColumn("converted", F.coalesce("converted", F.lit(False)))
        .drop("_visit")
    )


VIEW = View(
    name="visits",
    version=1,
    key=("customer_id", "visit_start"),
    schema=SCHEMA,
    compute=compute,
    # As cart_sessions: an event rescopes the visits within the gap of it.
    scope=Scope(columns={"customer_id": "customer_id"}, of=EVENT_TYPES, gap=VISIT_GAP),
    window=("visit_start", "visit_end"),
    description="visits per customer across the web and the shop, 30-minute gap; converted "
    "if an order holds a product viewed before it in the visit",
    sources=("shop", "web"),
)
