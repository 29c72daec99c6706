"""When `pipeline.ingest_once` starts a source's query and when it need not: the
decision alone, from where ingest finished and Kafka's end offsets. Kafka and Spark
are stood in for by what they would answer (tests/integration/test_walking_skeleton.py
holds the skip on the real stack)."""

from __future__ import annotations

from typing import Any, cast

import pytest
from pyspark.sql import SparkSession

from spark_jobs.engine import ingest
from warehouse.ops import lag, pipeline

FINISHED = {0: 9, 1: 4}
# The decision reads no Spark: where ingest finished is stood in for below.
NO_SPARK = cast(SparkSession, None)


@pytest.fixture
def answers(monkeypatch) -> dict[str, Any]:
    """What ingest's checkpoint and Kafka say, set per case; the calls made."""
    said: dict[str, Any] = {"finished": FINISHED, "kafka": {0: (0, 9), 1: (2, 4)}, "calls": []}

    def kafka(settings, timeout, topic):
        said["calls"].append(("kafka", topic))
        if isinstance(said["kafka"], Exception):
            raise said["kafka"]
        return said["kafka"]

    monkeypatch.setattr(ingest, "finished_at", lambda spark, s, source: said["finished"])
    monkeypatch.setattr(lag, "kafka_watermarks", kafka)
    monkeypatch.setattr(
        ingest, "prepare", lambda spark, s, name: said["calls"].append(("prepare", name))
    )
    monkeypatch.setattr(
        ingest,
        "run_once",
        lambda spark, s, accept_data_loss, source: said["calls"].append(("run", source)),
    )
    monkeypatch.setattr(pipeline, "publish_ingest_tables", lambda s, source: None)
    return said


def test_a_source_whose_last_batch_ended_at_kafka_s_end_is_caught_up(settings, answers):
    assert pipeline.caught_up(NO_SPARK, settings, "web")
    assert answers["calls"] == [("kafka", "web.events")]
    pipeline.ingest_once(NO_SPARK, settings, source="web")
    # No query; the tables are made and evolved as a start would.
    assert ("run", "web") not in answers["calls"] and ("prepare", "web") in answers["calls"]


@pytest.mark.parametrize(
    "finished,kafka",
    [
        (None, {0: (0, 9), 1: (2, 4)}),  # no finished batch (or its commit file is missing)
        (FINISHED, {0: (0, 10), 1: (2, 4)}),  # a record not copied yet
        (FINISHED, {0: (0, 9), 1: (2, 4), 2: (0, 0)}),  # a partition added
        (FINISHED, {0: (0, 3), 1: (0, 1)}),  # offsets went back: Spark must say so
        (FINISHED, {0: (0, 9), 1: None}),  # a partition's watermarks timed out
        (FINISHED, RuntimeError("Kafka is down")),
    ],
)
def test_anything_else_starts_the_query(settings, answers, finished, kafka):
    answers["finished"], answers["kafka"] = finished, kafka
    assert not pipeline.caught_up(NO_SPARK, settings, "shop")
    pipeline.ingest_once(NO_SPARK, settings, source="shop")
    assert ("run", "shop") in answers["calls"]


def test_accepting_data_loss_always_starts_the_query(settings, answers):
    pipeline.ingest_once(NO_SPARK, settings, accept_data_loss=True, source="shop")
    assert answers["calls"] == [("run", "shop")]  # not even asked
