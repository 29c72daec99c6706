"""What a view version publishes per gold commit (docs/contract.md §9): applied in order, the
records of every commit rebuild the table, whatever the commit did to it (append,
MERGE with updates and deletes, a replay's overwrite)."""

from __future__ import annotations

import dataclasses
import json
from datetime import datetime
from decimal import Decimal

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition
from delta.tables import DeltaTable
from pyspark.sql import DataFrame, SparkSession

from spark_jobs.engine import changes, lake
from spark_jobs.views import revenue_hourly_v2
from warehouse.ops.subscribe import Copy, parse

VIEW = revenue_hourly_v2.VIEW


def _rows(spark: SparkSession, *rows: tuple[int, str, int]) -> DataFrame:
    """Gold rows from (hour, currency, orders placed); the other measures follow."""
    return spark.createDataFrame(
        [
            (
                datetime(2026, 1, 1, hour),
                datetime(2026, 1, 1, hour + 1),
                currency,
                placed,
                0,
                Decimal(placed),
                Decimal(0),
                Decimal(placed),
            )
            for hour, currency, placed in rows
        ],
        VIEW.schema,
    )


def _apply(copy: Copy, records: DataFrame) -> list[tuple[int, str | None]]:
    """Apply records in commit order, as a subscriber would; return (commit, value)s."""
    seen = []
    for row in records.orderBy("commit", "key").collect():
        copy.apply(parse(VIEW.name, VIEW.version, row["key"].encode(), _bytes(row["value"])))
        seen.append((row["commit"], row["value"]))
    return seen


def _bytes(value: str | None) -> bytes | None:
    return value.encode() if value is not None else None


def _as_copy(spark: SparkSession, path: str, version: int) -> dict[str, dict[str, object]]:
    copy = Copy()
    _apply(copy, changes.records(lake.read_version(spark, path, version), VIEW, version))
    return copy.rows


def test_applying_each_commit_s_records_in_order_rebuilds_the_table(spark, tmp_path):
    path = str(tmp_path / "gold")
    lake.ensure_table(spark, path, VIEW.schema, {changes.CDF_PROPERTY: "true"})
    _rows(spark, (1, "EUR", 1), (2, "EUR", 2)).write.format("delta").mode("append").save(path)
    # A MERGE that updates one row and inserts one (a live batch), then a delete.
    source = _rows(spark, (1, "EUR", 5), (3, "GBP", 3))
    gold = DeltaTable.forPath(spark, path)
    gold.alias("t").merge(
        source.alias("s"), "t.window_start = s.window_start AND t.currency = s.currency"
    ).whenMatchedUpdateAll().whenNotMatchedInsertAll().execute()
    gold.delete("orders_placed = 2")
    # A replay's overwrite: every row deleted, the new table inserted.
    _rows(spark, (3, "GBP", 4), (4, "USD", 1)).write.format("delta").mode("overwrite").save(path)
    newest = lake.newest_version(spark, path)
    assert newest == 4

    copy = Copy()
    feed = (
        spark.read.format("delta")
        .option("readChangeFeed", "true")
        .option("startingVersion", 1)
        .load(path)
    )
    seen = _apply(copy, changes.records(feed, VIEW))
    for version in range(1, newest + 1):
        partial = Copy()
        _apply(partial, changes.records(feed.where(f"_commit_version <= {version}"), VIEW))
        assert partial.rows == _as_copy(spark, path, version), f"as of commit {version}"
    assert copy.rows == _as_copy(spark, path, newest)
    assert copy.gold_version == newest
    assert len(copy.rows) == 2

    by_commit: dict[int, list[str | None]] = {}
    for commit, value in seen:
        by_commit.setdefault(commit, []).append(value)
    # The MERGE's update is one upsert (its pre-image says nothing more); the delete
    # is a tombstone; the overwrite keeps GBP 03:00 as an upsert, not a tombstone too.
    assert len(by_commit[2]) == 2 and None not in by_commit[2]
    assert by_commit[3] == [None]
    assert len(by_commit[4]) == 3 and by_commit[4].count(None) == 1
    upserts = [json.loads(v) for v in by_commit[4] if v is not None]
    assert {(u["currency"], u["orders_placed"], u["_gold_version"]) for u in upserts} == {
        ("GBP", 4, 4),
        ("USD", 1, 4),
    }


@dataclasses.dataclass
class _Answer:
    """A partition in `committed`'s answer: its offset, or its error."""

    offset: int = -1001
    error: KafkaError | None = None


class _Marks:
    """A consumer's answers to `committed` for the mark: `errors` first (an error
    code raised for the whole request, or a partition carrying one), then the
    committed offset."""

    def __init__(self, offset: int, *errors: int | _Answer) -> None:
        self.offset, self.errors, self.asked = offset, list(errors), 0

    def committed(self, partitions: list[TopicPartition], timeout: float) -> list[_Answer]:
        self.asked += 1
        if self.errors:
            error = self.errors.pop(0)
            if isinstance(error, int):
                raise KafkaException(KafkaError(error))
            return [error]
        return [_Answer(self.offset)]


def _publisher(settings, consumer: _Marks) -> changes.Publisher:
    """A publisher whose Kafka clients are set already (`_connect` keeps them)."""
    publisher = changes.Publisher(None, settings, VIEW, "unused")  # type: ignore[arg-type]
    publisher._producer, publisher._consumer = object(), consumer  # type: ignore[assignment]
    return publisher


def test_the_mark_is_asked_again_while_the_coordinator_is_not_ready(settings, monkeypatch):
    monkeypatch.setattr(changes.time, "sleep", lambda s: None)
    loading = _Answer(error=KafkaError(KafkaError.COORDINATOR_LOAD_IN_PROGRESS))
    # A fresh broker: the whole request refused, then the partition's answer, then the mark.
    marks = _Marks(8, KafkaError.NOT_COORDINATOR, loading)
    assert _publisher(settings, marks).published_through() == 7
    assert marks.asked == 3
    # Never read as "nothing published": any other error, or one past the deadline, raises.
    with pytest.raises(KafkaException, match=r"(?i)authori"):
        _publisher(settings, _Marks(8, KafkaError.GROUP_AUTHORIZATION_FAILED)).published_through()
    monkeypatch.setattr(changes, "MARK_LOOKUP_S", 0)
    with pytest.raises(KafkaException, match=r"(?i)coordinator"):
        _publisher(settings, _Marks(8, KafkaError.NOT_COORDINATOR)).published_through()
    # No mark committed yet: nothing published.
    assert _publisher(settings, _Marks(-1001)).published_through() == -1
