"""The forgotten positions of a source (docs/contract.md §8): the ignore list.

The erasure writes them; bronze ingest and a replay from Kafka skip them while Kafka
still holds the records. Kept apart from `erasure` so that ingest reads the list
without importing the job that excises data (`make lint` holds that).
"""

from __future__ import annotations

from delta.tables import DeltaTable
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import (
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from spark_jobs.engine import lake
from warehouse.base import registry
from warehouse.base.settings import Settings

FORGOTTEN_SCHEMA = StructType(
    [
        StructField("erasure_id", StringType(), False),
        StructField("partition", IntegerType(), False),
        StructField("offset", LongType(), False),
        # SHA-256 of the record's event id, if it had one: lets the audit find an
        # event that came back under another position, without keeping the id.
        StructField("event_id_sha256", StringType(), True),
        StructField("forgotten_at", TimestampType(), False),
    ]
)
POSITION = ["partition", "offset"]


def ensure_table(
    spark: SparkSession, settings: Settings, src: registry.SourceTables = registry.SHOP
) -> None:
    lake.ensure_table(spark, src.forgotten.path(settings), FORGOTTEN_SCHEMA)


def read_forgotten(
    spark: SparkSession, settings: Settings, src: registry.SourceTables = registry.SHOP
) -> DataFrame:
    """The forgotten positions (an empty frame before the first erasure)."""
    path = src.forgotten.path(settings)
    if not DeltaTable.isDeltaTable(spark, path):
        return spark.createDataFrame([], FORGOTTEN_SCHEMA)
    return spark.read.format("delta").load(path)


def without_forgotten(records: DataFrame, forgotten: DataFrame) -> DataFrame:
    """Kafka or bronze rows minus the forgotten positions (the ignore list)."""
    return records.join(F.broadcast(forgotten.select(*POSITION)), POSITION, "left_anti")
