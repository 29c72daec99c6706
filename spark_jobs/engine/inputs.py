"""What a view reads: the silver tables of the sources it declares (`View.sources`),
and where in each of them a gold commit stands (`Position`).

A view over one source reads that source's silver, and its position is one silver
version, written in tags and markers as it always was. A view over several reads
the union by name of their silvers (a column one source lacks is null in the
other's rows), and its position is a version per source: every gold commit still
equals the view's function of one snapshot of its input, now a snapshot of each
source (docs/architecture.md, "A view over two sources").
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import StructField, StructType

from spark_jobs.engine import contract, lake
from spark_jobs.engine import silver as silver_mod
from spark_jobs.views.base import View
from warehouse import sources
from warehouse.base import registry
from warehouse.base.settings import Settings


@dataclass(frozen=True)
class Position:
    """Each source's silver version, in the order the view declares its sources."""

    versions: tuple[tuple[str, int], ...]

    @classmethod
    def of(cls, view: View, versions: Mapping[str, int]) -> Position:
        missing = [s for s in view.sources if s not in versions]
        if missing:
            raise ValueError(f"{view.table_name}: no silver version for {', '.join(missing)}")
        return cls(tuple((s, int(versions[s])) for s in view.sources))

    def __getitem__(self, source: str) -> int:
        return dict(self.versions)[source]

    def as_dict(self) -> dict[str, int]:
        return dict(self.versions)

    @property
    def single(self) -> int | None:
        """The one silver version of a view over one source (None over several)."""
        return self.versions[0][1] if len(self.versions) == 1 else None

    def json(self) -> int | dict[str, int]:
        """For reports: one source's version as a number, as it always was."""
        return self.single if self.single is not None else self.as_dict()

    def __str__(self) -> str:
        """`123`, or `shop@123,web@45` over several sources: what logs, the
        registry's replay position and the markers beside a stream say."""
        if self.single is not None:
            return str(self.single)
        return ",".join(f"{s}@{v}" for s, v in self.versions)

    def describe(self) -> str:
        """For a sentence: `silver version 123`, `silver versions shop@123, web@45`."""
        if self.single is not None:
            return f"silver version {self.single}"
        return "silver versions " + ", ".join(f"{s}@{v}" for s, v in self.versions)

    def tag_fields(self) -> dict[str, Any]:
        """A gold commit's tag: `silver_version` over one source (the shop's views'
        tags have always said that), `silver_versions` over several."""
        if self.single is not None:
            return {"silver_version": self.single, "silver_versions": self.as_dict()}
        return {"silver_versions": self.as_dict()}

    @classmethod
    def from_tag(cls, meta: Mapping[str, Any]) -> Position | None:
        """The position a tag names; None for a commit not tagged by the runner. A tag
        with only `silver_version` was written before views had sources: the shop's."""
        versions = meta.get("silver_versions")
        if isinstance(versions, dict) and all(isinstance(v, int) for v in versions.values()):
            return cls(tuple((str(s), int(v)) for s, v in versions.items()))
        if isinstance(meta.get("silver_version"), int):
            return cls(((registry.SHOP_SOURCE, int(meta["silver_version"])),))
        return None

    @classmethod
    def parse(cls, view: View, text: str) -> Position:
        """A marker's text (`str(position)`), for `view`."""
        text = text.strip()
        if text.lstrip("-").isdigit():
            if len(view.sources) != 1:
                raise ValueError(f"{view.table_name}: {text!r} names one silver version")
            return cls(((view.sources[0], int(text)),))
        pairs = dict(part.split("@", 1) for part in text.split(","))
        return cls.of(view, {s: int(v) for s, v in pairs.items()})

    def after(self, other: Mapping[str, int]) -> Position:
        """This position with some sources moved on."""
        return Position(tuple((s, int(other.get(s, v))) for s, v in self.versions))


def nowhere(view: View) -> Position:
    """Before any replay: -1 for each source."""
    return Position(tuple((s, -1) for s in view.sources))


@functools.cache
def _types_by_source(names: tuple[str, ...]) -> dict[str, tuple[str, ...]]:
    declared = sources.discover()
    unknown = [n for n in names if n not in declared]
    if unknown:
        raise ValueError(
            f"no such source: {', '.join(unknown)} (declared: {', '.join(sorted(declared))})"
        )
    return {n: declared[n].type_names for n in names}


def event_types_by_source(view: View) -> dict[str, tuple[str, ...]]:
    """Each source the view reads -> the view's event types that source declares.

    Over several sources an event type says which source a row came from, so each
    of the view's event types must be declared by exactly one of them."""
    declared = _types_by_source(view.sources)
    out = {s: tuple(t for t in view.event_types if t in declared[s]) for s in view.sources}
    if len(view.sources) > 1:
        counted = [t for types in out.values() for t in types]
        twice = sorted({t for t in counted if counted.count(t) > 1})
        if twice:
            raise ValueError(
                f"{view.table_name}: event types declared by more than one of its sources: "
                + ", ".join(twice)
            )
    idle = [s for s, types in out.items() if not types]
    if len(view.sources) > 1 and idle:
        raise ValueError(
            f"{view.table_name}: it reads none of the event types of {', '.join(idle)}; "
            "take the source out of its `sources`"
        )
    missing = [t for t in view.event_types if not any(t in types for types in out.values())]
    if missing:
        raise ValueError(
            f"{view.table_name}: no source of {', '.join(view.sources)} declares "
            + ", ".join(missing)
        )
    return out


def silver_table(source: str) -> registry.Table:
    return registry.source_tables(source).silver


def schema(view: View) -> StructType:
    """The columns of the view's input: its sources' silver columns, each once, in
    the order the sources are declared."""
    fields: dict[str, StructField] = {}
    for source in view.sources:
        for f in silver_mod.silver_schema(contract.source_plan(source).event_schema).fields:
            fields.setdefault(f.name, f)
    return StructType(list(fields.values()))


def union(frames: list[DataFrame]) -> DataFrame:
    """Frames of different sources' silver as one, by column name; a column one lacks
    is null in its rows."""
    out = frames[0]
    for frame in frames[1:]:
        out = out.unionByName(frame, allowMissingColumns=True)
    return out


def ensure(spark: SparkSession, settings: Settings, view: View) -> None:
    """Make the silver tables of a view over several sources, so that each has a
    version to read even before its first record (one source's silver is made by
    its ingest, as it always was).

    Only those missing: making a table takes Delta's Python API, which a Spark Connect
    session (a reprocess's replay in the view host) does not have, and ingest has made
    every declared source's tables by then."""
    if len(view.sources) > 1:
        for source in view.sources:
            if not lake.exists(spark, f"{silver_table(source).path(settings)}/_delta_log"):
                silver_mod.ensure_tables(spark, settings, source)


def newest(spark: SparkSession, settings: Settings, view: View) -> Position:
    """The newest commit of each of the view's silvers: what a replay is built from."""
    return Position.of(
        view,
        {s: lake.newest_version(spark, silver_table(s).path(settings)) for s in view.sources},
    )


def read_where(
    spark: SparkSession, settings: Settings, view: View, at: Position, condition: str
) -> DataFrame:
    """The view's input as of `at`, the rows that meet `condition` (SQL) only, read by
    delta-rs into a local DataFrame (`lake.read_where`): a live batch's few rows."""
    return union(
        [
            lake.read_where(
                spark, *settings.delta_rs(silver_table(s).path(settings)), at[s], condition
            )
            for s in view.sources
        ]
    )


def read(spark: SparkSession, settings: Settings, view: View, at: Position | None) -> DataFrame:
    """The view's input, as of `at` (None: each silver's newest)."""
    frames = [
        lake.read_version(spark, silver_table(s).path(settings), None if at is None else at[s])
        for s in view.sources
    ]
    return union(frames)
