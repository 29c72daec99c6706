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

BRONZE = registry.BRONZE_EVENTS.trino_name
SILVER = registry.SILVER_EVENTS.trino_name
QUARANTINE = registry.SILVER_QUARANTINE.trino_name
LEDGER = registry.SILVER_LEDGER.trino_name
FORGOTTEN = registry.SILVER_FORGOTTEN.trino_name

PER_PARTITION_SQL = f"""
WITH bronze AS (
    SELECT partition, count(*) AS n FROM {BRONZE} GROUP BY partition
), forgotten AS (
    SELECT partition, count(*) AS n FROM {FORGOTTEN} GROUP BY partition
), silver AS (
    SELECT partition, count(*) AS n FROM {SILVER} GROUP BY partition
), quarantine AS (
    SELECT partition, count(*) AS n FROM {QUARANTINE} GROUP BY partition
), duplicates AS (
    SELECT l.partition, count(*) AS n
    FROM {LEDGER} AS l
    WHERE NOT EXISTS (
        SELECT 1 FROM {SILVER} AS s WHERE s.partition = l.partition AND s."offset" = l."offset"
    )
    AND NOT EXISTS (
        SELECT 1 FROM {QUARANTINE} AS q
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

BY_REASON_SQL = f"""
SELECT reason, count(*) AS records
FROM {QUARANTINE}
GROUP BY reason
ORDER BY records DESC, reason
"""


def per_partition(settings: Settings, user: str = "regauge") -> trino_client.Result:
    return trino_client.query(settings, PER_PARTITION_SQL, user=user)


def by_reason(settings: Settings, user: str = "regauge") -> trino_client.Result:
    return trino_client.query(settings, BY_REASON_SQL, user=user)
