"""Delta table mechanics every layer shares."""

from __future__ import annotations

from delta.tables import DeltaTable
from pyspark.sql import SparkSession
from pyspark.sql.types import StructType


def ensure_table(
    spark: SparkSession, path: str, schema: StructType, properties: dict[str, str] | None = None
) -> None:
    """Create the Delta table at `path` (with its first commit) if it does not exist yet."""
    builder = DeltaTable.createIfNotExists(spark).location(path).addColumns(schema)
    for key, value in (properties or {}).items():
        builder = builder.property(key, value)
    builder.execute()


def merge_condition(key: tuple[str, ...] | list[str]) -> str:
    """`t.a = s.a AND t.b = s.b`: a MERGE's match on key columns, target `t`, source `s`."""
    return " AND ".join(f"t.{k} = s.{k}" for k in key)
