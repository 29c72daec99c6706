"""cart_sessions v1: shopping sessions per customer, 30-minute inactivity gap (docs/contract.md §3).

Same semantics as Spark's session_window: a session ends 30 minutes after its
last event, and events at most 30 minutes apart share a session (`gap_sessions`,
which says why it is not session_window).
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

SESSION_GAP = timedelta(minutes=30)
GAP = f"INTERVAL {int(SESSION_GAP.total_seconds())} SECONDS"
EVENT_TYPES = ("cart_item_added", "cart_item_removed", "order_placed")

SCHEMA = StructType(
    [
        StructField("customer_id", StringType(), False),
        StructField("session_start", TimestampType(), False),
        StructField("session_end", TimestampType(), False),
        StructField("events", LongType(), False),
        StructField("items_added", LongType(), False),
        StructField("items_removed", LongType(), False),
        StructField("converted", BooleanType(), False),
    ]
)


def compute(silver: DataFrame) -> DataFrame:
    events = silver.where(F.col("event_type").isin(*EVENT_TYPES)).select(
        "customer_id", "event_time", "event_type", "quantity"
    )
    numbered = gap_sessions(events, "customer_id", SESSION_GAP, "_session")

    def quantity_of(event_type: str) -> F.Column:
        return F.coalesce(
            F.sum(F.when(F.col("event_type") == event_type, F.col("quantity"))), F.lit(0)
        ).cast("bigint")

    return (
        numbered.groupBy("customer_id", "_session")
        .agg(
            F.min("event_time").alias("session_start"),
            (F.max("event_time") + F.expr(GAP)).alias("session_end"),
            F.count(F.lit(1)).alias("events"),
            quantity_of("cart_item_added").alias("items_added"),
            quantity_of("cart_item_removed").alias("items_removed"),
            F.max(F.col("event_type") == "order_placed").alias("converted"),
        )
        .drop("_session")
    )


VIEW = View(
    name="cart_sessions",
    version=1,
    key=("customer_id", "session_start"),
    schema=SCHEMA,
    compute=compute,
    # A customer's sessions can merge or split, so an event rescopes the sessions
    # within the gap of it (the runner reads those from gold). Each event lands in
    # the session (as recomputed) that holds it.
    scope=Scope(columns={"customer_id": "customer_id"}, of=EVENT_TYPES, gap=SESSION_GAP),
    window=("session_start", "session_end"),
    description="shopping sessions per customer with a 30-minute inactivity gap",
)
