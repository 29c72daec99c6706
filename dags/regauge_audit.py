"""regauge_audit: every hour, check each layer against the one it derives from.

Fails loudly (the task fails, and `lakehouse.gold.audit_runs` says which keys
differ) on any mismatch: Kafka -> bronze -> silver -> gold, and routing.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from _regauge import DEFAULT_ARGS, regauge
from airflow.sdk import DAG

with DAG(
    dag_id="regauge_audit",
    description="the integrity audit: trust, but verify",
    schedule=timedelta(hours=1),
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,
    default_args=DEFAULT_ARGS,
    tags=["regauge"],
) as dag:
    regauge("audit", "audit")
