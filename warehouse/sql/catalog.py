"""Publishing lake tables to Trino's `lakehouse` catalog.

Spark writes the Delta tables; Trino only needs each table's name and
location, which `register_table` records in its file metastore. Registering is
idempotent, so every job can publish what it writes on every start.
"""

from __future__ import annotations

import logging

from trino.exceptions import TrinoUserError

from warehouse.base import registry
from warehouse.base.registry import Table
from warehouse.base.settings import Settings
from warehouse.base.sqlnames import check_identifier, quote_identifier, quote_location
from warehouse.sql import trino_client

log = logging.getLogger(__name__)


def trino_location(table: Table, settings: Settings) -> str:
    """The table's location as Trino names it (local:/// is the lake root locally)."""
    if settings.is_local:
        return f"local:///{table.schema}/{table.name}"
    # Trino's native S3 file system reads s3:// where Hadoop writes s3a://.
    return table.path(settings).replace("s3a://", "s3://", 1)


def is_published(table: Table, settings: Settings) -> bool:
    found = trino_client.query(
        settings,
        f"SELECT 1 FROM {registry.TRINO_LAKE_CATALOG}.information_schema.tables "
        "WHERE table_schema = ? AND table_name = ?",
        [table.schema, table.name],
    )
    return bool(found.rows)


def publish(table: Table, settings: Settings) -> bool:
    """Register a Delta table (which must have at least one commit) in Trino.

    Returns True if it was newly registered, False if Trino already knew it.
    """
    catalog = quote_identifier(registry.TRINO_LAKE_CATALOG, "catalog")
    schema = quote_identifier(table.schema, "schema")
    trino_client.query(settings, f"CREATE SCHEMA IF NOT EXISTS {catalog}.{schema}")
    if is_published(table, settings):
        return False
    # CALL takes no bound parameters in Trino, so the names go through the gate.
    try:
        trino_client.query(
            settings,
            f"CALL {catalog}.system.register_table("
            f"schema_name => '{check_identifier(table.schema, 'schema')}', "
            f"table_name => '{check_identifier(table.name, 'table')}', "
            f"table_location => {quote_location(trino_location(table, settings))})",
        )
    except TrinoUserError as exc:
        # Another process registered it between the look and the call (two audits
        # recording their first runs at once, say; Trino's file metastore then says
        # ALREADY_EXISTS): it is published, as wanted.
        if is_published(table, settings):
            log.info("%s was published by another process (%s)", table.trino_name, exc.error_name)
            return False
        raise
    log.info("published %s at %s", table.trino_name, trino_location(table, settings))
    return True


def unpublish(table: Table, settings: Settings) -> bool:
    """Remove a table from Trino's metastore, leaving its files; False if it was not there."""
    if not is_published(table, settings):
        return False
    catalog = quote_identifier(registry.TRINO_LAKE_CATALOG, "catalog")
    trino_client.query(
        settings,
        f"CALL {catalog}.system.unregister_table("
        f"schema_name => '{check_identifier(table.schema, 'schema')}', "
        f"table_name => '{check_identifier(table.name, 'table')}')",
    )
    log.info("unpublished %s", table.trino_name)
    return True
