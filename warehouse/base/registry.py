"""The one registry of names: every topic, Delta path, Trino name and checkpoint.

No other module spells a table path or a topic; they ask here. Names follow
docs/contract.md §1-§2.
"""

from __future__ import annotations

from dataclasses import dataclass

from warehouse.base.settings import Settings

TOPIC = "shop.events"
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


BRONZE_EVENTS = Table("bronze", "shop_events")
SILVER_EVENTS = Table("silver", "shop_events")
SILVER_QUARANTINE = Table("silver", "shop_events_quarantine")
# Every accepted record (event_id, position, content hash): silver's memory for
# exact dedup over all history, and how an audit counts exact duplicates.
SILVER_LEDGER = Table("silver", "shop_events_ledger")
# The Kafka positions erased customers' records held (docs/contract.md §8): no
# personal data, what ingest and replays skip, and the accounting's `forgotten`.
SILVER_FORGOTTEN = Table("silver", "shop_events_forgotten")
GOLD_RESTATEMENTS = Table("gold", "restatements")
# One row per check per `regauge audit` run.
GOLD_AUDIT_RUNS = Table("gold", "audit_runs")

# dbt's relations are Delta tables too: `staging` (stg_, int_) and `marts`, each
# at <lake>/<schema>/<model>; marts are published to Trino as lakehouse.marts.<model>.
DBT_STAGING_SCHEMA = "staging"
MARTS_SCHEMA = "marts"
DBT_SCHEMAS = (DBT_STAGING_SCHEMA, MARTS_SCHEMA)


# Ingest's one streaming query: its progress, status entry, log lines and metrics say it.
INGEST_QUERY = "ingest"


def ingest_checkpoint(settings: Settings) -> str:
    """Where ingest's one query (Kafka -> bronze and silver in each micro-batch)
    keeps its Kafka offsets. Bronze's and silver's own `main` checkpoints are
    those of the two queries it replaced; ingest deletes them once it has taken over."""
    return SILVER_EVENTS.checkpoint(settings, "kafka")


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
    view version published (it consumes nothing; see spark_jobs.views.changes)."""
    return f"regauge.publisher.{view}_v{version}"


def table(key: str) -> Table:
    """Look a table up by its `schema.name`; unknown names are an error, not a guess."""
    try:
        return TABLES[key]
    except KeyError:
        raise KeyError(f"unknown table {key!r}; known: {', '.join(sorted(TABLES))}") from None
