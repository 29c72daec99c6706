"""The one registry of names: every topic, Delta path, Trino name and checkpoint.

No other module spells a table path or a topic; they ask here. Names follow
docs/contract.md §1-§2.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from warehouse.base.settings import Settings

TRINO_LAKE_CATALOG = "lakehouse"
TRINO_OPS_CATALOG = "ops"

# PostgreSQL schemas inside the `regauge` database (seen in Trino as catalog `ops`).
PG_SCHEMAS = ("reference", "control")


@dataclass(frozen=True)
class Table:
    """A Delta table in the lake and the Trino name it is published under."""

    schema: str
    name: str

    @property
    def key(self) -> str:
        return f"{self.schema}.{self.name}"

    @property
    def trino_name(self) -> str:
        return f"{TRINO_LAKE_CATALOG}.{self.schema}.{self.name}"

    def path(self, settings: Settings) -> str:
        return f"{settings.lake_root.rstrip('/')}/{self.schema}/{self.name}"

    def checkpoint(self, settings: Settings, query: str = "main") -> str:
        """Where the streaming query that writes this table keeps its progress."""
        return f"{settings.lake_root.rstrip('/')}/_checkpoints/{self.schema}/{self.name}/{query}"


@dataclass(frozen=True)
class SourceTables:
    """A source's topic and tables (docs/contract.md §10): source `S` reads `S.events`
    and writes `bronze.S_events`, `silver.S_events` and the silver tables beside it.
    The names follow from the source's name alone, so a declaration lists none."""

    source: str

    def __post_init__(self) -> None:
        # The name becomes a topic, table names and a Trino identifier.
        if not re.fullmatch(r"[a-z][a-z0-9_]{0,30}", self.source):
            raise ValueError(
                f"source name {self.source!r}: use 1-31 of a-z 0-9 _, starting with a letter"
            )

    @property
    def topic(self) -> str:
        return f"{self.source}.events"

    @property
    def bronze(self) -> Table:
        return Table("bronze", f"{self.source}_events")

    @property
    def silver(self) -> Table:
        return Table("silver", f"{self.source}_events")

    @property
    def quarantine(self) -> Table:
        return Table("silver", f"{self.source}_events_quarantine")

    @property
    def ledger(self) -> Table:
        """Every accepted record (event_id, position, content hash): silver's memory
        for exact dedup over all history, and how an audit counts exact duplicates."""
        return Table("silver", f"{self.source}_events_ledger")

    @property
    def forgotten(self) -> Table:
        """The Kafka positions erased subjects' records held (docs/contract.md §8): no
        personal data, what ingest and replays skip, and the accounting's `forgotten`."""
        return Table("silver", f"{self.source}_events_forgotten")

    @property
    def tables(self) -> tuple[Table, ...]:
        return (self.bronze, self.silver, self.quarantine, self.ledger, self.forgotten)

    @property
    def ingest_query(self) -> str:
        """The name of the streaming query that ingests this source: its progress,
        status entry, log lines and metrics say it (the shop's keeps its old name)."""
        return INGEST_QUERY if self.source == SHOP_SOURCE else f"{INGEST_QUERY}.{self.source}"

    def ingest_checkpoint(self, settings: Settings) -> str:
        """Where the source's ingest query (Kafka -> bronze and silver in each
        micro-batch) keeps its Kafka offsets."""
        return self.silver.checkpoint(settings, "kafka")


def source_tables(source: str) -> SourceTables:
    return SourceTables(source)


def ingested_source(query: str) -> str | None:
    """The source an ingest query (`SourceTables.ingest_query`) ingests; None for a
    query that is not ingest's (a view's)."""
    if query == INGEST_QUERY:
        return SHOP_SOURCE
    prefix = f"{INGEST_QUERY}."
    return query.removeprefix(prefix) if query.startswith(prefix) else None


# Ingest's streaming query (the shop's; another source's is `ingest.<source>`).
INGEST_QUERY = "ingest"
SHOP_SOURCE = "shop"
SHOP = SourceTables(SHOP_SOURCE)
TOPIC = SHOP.topic
BRONZE_EVENTS = SHOP.bronze
SILVER_EVENTS = SHOP.silver
SILVER_QUARANTINE = SHOP.quarantine
SILVER_LEDGER = SHOP.ledger
SILVER_FORGOTTEN = SHOP.forgotten
GOLD_RESTATEMENTS = Table("gold", "restatements")
# One row per check per `regauge audit` run.
GOLD_AUDIT_RUNS = Table("gold", "audit_runs")

# dbt's relations are Delta tables too: `staging` (stg_, int_) and `marts`, each
# at <lake>/<schema>/<model>; marts are published to Trino as lakehouse.marts.<model>.
DBT_STAGING_SCHEMA = "staging"
MARTS_SCHEMA = "marts"
DBT_SCHEMAS = (DBT_STAGING_SCHEMA, MARTS_SCHEMA)


def ingest_checkpoint(settings: Settings) -> str:
    """The shop's ingest checkpoint (`SourceTables.ingest_checkpoint`). Bronze's and
    silver's own `main` checkpoints are those of the two queries it replaced; ingest
    deletes them once it has taken over."""
    return SHOP.ingest_checkpoint(settings)


def mart(name: str) -> Table:
    """A dbt mart (a versioned one as `<model>_v<N>`)."""
    return Table(MARTS_SCHEMA, name)


TABLES: dict[str, Table] = {
    t.key: t
    for t in (
        BRONZE_EVENTS,
        SILVER_EVENTS,
        SILVER_QUARANTINE,
        SILVER_LEDGER,
        SILVER_FORGOTTEN,
        GOLD_RESTATEMENTS,
        GOLD_AUDIT_RUNS,
    )
}


def gold_view_table(view: str, version: int) -> Table:
    """The physical table of one view version, e.g. gold.revenue_hourly_v2."""
    return Table("gold", f"{view}_v{version}")


def view_topic(view: str, version: int) -> str:
    """The compacted topic a live view version publishes its changes to (docs/contract.md §9)."""
    return f"regauge.view.{view}_v{version}"


def view_publisher_group(view: str, version: int) -> str:
    """The Kafka consumer group whose committed offset marks the last gold commit a
    view version published (it consumes nothing; see spark_jobs.engine.changes)."""
    return f"regauge.publisher.{view}_v{version}"


def table(key: str) -> Table:
    """Look a table up by its `schema.name`; unknown names are an error, not a guess."""
    if key in TABLES:
        return TABLES[key]
    # Another source's tables: `bronze.S_events`, `silver.S_events[_quarantine|...]`.
    found = re.fullmatch(r"(bronze|silver)\.([a-z][a-z0-9_]{0,30})_events(_[a-z]+)?", key)
    if found:
        schema, source, _ = found.groups()
        for t in SourceTables(source).tables:
            if t.key == key and t.schema == schema:
                return t
    raise KeyError(f"unknown table {key!r}; known: {', '.join(sorted(TABLES))}")
