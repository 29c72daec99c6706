"""The contract's accounting, asked of Trino: every bronze record is in exactly one place.

Per partition and in total, `bronze = silver + quarantine + exact duplicates
+ forgotten` (docs/contract.md §8). Bronze counts records as produced: the rows it
holds plus those an erasure removed. An exact duplicate is an accepted record
(in the ledger) that is neither silver's kept record nor quarantined. The same
SQL serves the demo, the tests and the audit.
"""

from __future__ import annotations

from warehouse.base import registry
from warehouse.base.settings import Settings
from warehouse.sql import trino_client


def per_partition_sql(source: str = registry.SHOP_SOURCE) -> str:
    """The accounting of `source`'s tables (docs/contract.md §10: each source's own)."""
    src = registry.source_tables(source)
    bronze_t = src.bronze.trino_name
    silver_t = src.silver.trino_name
    quarantine_t = src.quarantine.trino_name
    ledger_t = src.ledger.trino_name
    forgotten_t = src.forgotten.trino_name
    return f"""
WITH bronze AS (
    SELECT partition, count(*) AS n FROM {bronze_t} GROUP BY partition
), forgotten AS (
    SELECT partition, count(*) AS n FROM {forgotten_t} GROUP BY partition
), silver AS (
    SELECT partition, count(*) AS n FROM {silver_t} GROUP BY partition
), quarantine AS (
    SELECT partition, count(*) AS n FROM {quarantine_t} GROUP BY partition
), duplicates AS (
    SELECT l.partition, count(*) AS n
    FROM {ledger_t} AS l
    WHERE NOT EXISTS (
        SELECT 1 FROM {silver_t} AS s WHERE s.partition = l.partition AND s."offset" = l."offset"
    )
    AND NOT EXISTS (
        SELECT 1 FROM {quarantine_t} AS q
        WHERE q.partition = l.partition AND q."offset" = l."offset"
    )
    GROUP BY l.partition
), partitions AS (
    SELECT partition FROM bronze UNION SELECT partition FROM forgotten
)
SELECT
    p.partition,
    coalesce(b.n, 0) + coalesce(f.n, 0) AS bronze,
    coalesce(s.n, 0) AS silver,
    coalesce(q.n, 0) AS quarantine,
    coalesce(d.n, 0) AS exact_duplicates,
    coalesce(f.n, 0) AS forgotten,
    coalesce(b.n, 0) - coalesce(s.n, 0) - coalesce(q.n, 0) - coalesce(d.n, 0) AS unaccounted
FROM partitions AS p
LEFT JOIN bronze AS b ON b.partition = p.partition
LEFT JOIN forgotten AS f ON f.partition = p.partition
LEFT JOIN silver AS s ON s.partition = p.partition
LEFT JOIN quarantine AS q ON q.partition = p.partition
LEFT JOIN duplicates AS d ON d.partition = p.partition
ORDER BY p.partition
"""


def by_reason_sql(source: str = registry.SHOP_SOURCE) -> str:
    quarantine_t = registry.source_tables(source).quarantine.trino_name
    return f"""
SELECT reason, count(*) AS records
FROM {quarantine_t}
GROUP BY reason
ORDER BY records DESC, reason
"""


PER_PARTITION_SQL = per_partition_sql()  # the shop's
BY_REASON_SQL = by_reason_sql()


def per_partition(
    settings: Settings, user: str = "regauge", source: str = registry.SHOP_SOURCE
) -> trino_client.Result:
    return trino_client.query(settings, per_partition_sql(source), user=user)


def by_reason(
    settings: Settings, user: str = "regauge", source: str = registry.SHOP_SOURCE
) -> trino_client.Result:
    return trino_client.query(settings, by_reason_sql(source), user=user)
