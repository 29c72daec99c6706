"""Where a view version stands: the markers beside its stream checkpoint (what its
last replay was built from, and where its stream has read each source to) and the
tags on its gold commits (the input position each was computed from)."""

from __future__ import annotations

import json
import logging

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from spark_jobs.engine import (
    gold_writes,
    lake,
)
from spark_jobs.engine.inputs import Position
from spark_jobs.views.base import View
from warehouse.base import registry
from warehouse.base.settings import Settings

log = logging.getLogger(__name__)


# Beside a view's stream checkpoint: the position its last replay was built from,
# and what it read (a `SOURCES` name). Over several sources, also where the stream
# has read each source to (`POSITION_MARKER`), since a micro-batch with no change
# of one source says nothing of where that source stands.
REPLAY_MARKER = "regauge_replayed_through"
REPLAY_SOURCE_MARKER = "regauge_replayed_from"
POSITION_MARKER = "regauge_read_through"


def marker(settings: Settings, view: View, name: str = REPLAY_MARKER) -> str:
    return f"{gold_writes.gold_table(view).checkpoint(settings)}/{name}"


def folds(spark: SparkSession, settings: Settings, view: View) -> bool:
    """Whether the view's live batches fold their changes into gold (`fold_changes`):
    its rows add up, and its last replay read bronze, so gold is the view of silver
    as of the version the stream follows on from.

    Not after a replay from Kafka: gold may then hold records silver does not have
    yet (the stream recomputes their rows once ingest brings them) or lack those
    past Kafka's retention, and a fold would count the first twice. Nor without a
    recorded source (a replay made before it was recorded, whose batches may also
    have committed without their transaction id): until the next replay, such a
    stream recomputes, which is right whatever gold holds."""
    if view.sums is None:
        return False
    source = lake.read_text(spark, marker(settings, view, REPLAY_SOURCE_MARKER)) or ""
    return source.strip() == "bronze"


def read_position(
    spark: SparkSession, settings: Settings, view: View, name: str
) -> Position | None:
    text = lake.read_text(spark, marker(settings, view, name))
    return Position.parse(view, text) if text and text.strip() else None


def replayed_through(spark: SparkSession, settings: Settings, view: View) -> Position | None:
    """The position the view's last replay was built from (None: none)."""
    return read_position(spark, settings, view, REPLAY_MARKER)


# -- tags ------------------------------------------------------------------------------
# Delta keeps this session setting as the next commits' userMetadata.
TAG_CONF = "spark.databricks.delta.commitInfo.userMetadata"


def tag(position: Position | int, source: str) -> str:
    """What a gold commit was computed from: its input as of one position (a number:
    the shop's silver version)."""
    if isinstance(position, int):
        position = Position(((registry.SHOP_SOURCE, position),))
    return json.dumps({**position.tag_fields(), "source": source})


def latest_tag(spark: SparkSession, path: str) -> tuple[int, Position, str] | None:
    """The newest gold commit tagged with a position: (gold version, position,
    source), or None if no commit has a tag yet."""
    for row in (
        lake.history(spark, path)
        .where(F.col("userMetadata").isNotNull())
        .orderBy(F.col("version").desc())
        .select("version", "userMetadata")
        .toLocalIterator()
    ):
        try:
            meta = json.loads(row["userMetadata"])
        except ValueError:
            continue
        position = Position.from_tag(meta) if isinstance(meta, dict) else None
        if position is not None:
            return int(row["version"]), position, str(meta.get("source"))
    return None
