"""Testing a source's declaration: records judged by its compiled contract, as ingest
judges them (docs/architecture.md, "Adding a source").

A declaration's test needs Spark and nothing else: no Kafka, no lake. `judge` compiles
the declaration (`contract.plan`) and runs the same validation ingest runs on every
micro-batch; deduplication and the tables are the engine's, the same for every source,
and tested once there.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from pyspark.sql import Row, SparkSession

from spark_jobs.engine import contract
from warehouse.base.declare import Source

# The Kafka timestamp every judged record carries: a fixed one, so a test's verdicts
# do not depend on the clock.
JUDGED_AT = datetime(2026, 1, 1, 12, 0, 0)


def _value(event: dict[str, Any] | str | bytes) -> bytes:
    if isinstance(event, bytes):
        return event
    return (event if isinstance(event, str) else json.dumps(event)).encode()


def judge(
    spark: SparkSession,
    source: Source,
    *events: dict[str, Any] | str | bytes,
    contract_version: int | None = None,
) -> list[Row]:
    """Each event (a dict, sent as JSON; or the record's raw text or bytes) as one Kafka
    record, in order, judged by `source`'s contract (its newest version by default):
    one row each, in the same order, with `reject_reason` (None: accepted),
    `reject_detail` and the typed columns silver would hold."""
    plan = contract.plan(source, contract_version)
    rows = [(i, 0, i, JUDGED_AT, _value(e)) for i, e in enumerate(events)]
    records = spark.createDataFrame(
        rows, "n int, partition int, offset long, kafka_timestamp timestamp, value binary"
    )
    return contract.validate(records, plan).orderBy("n").collect()
