"""regauge_watchdog: every minute, restart the view host if it died while ingest was
wanted (started and not stopped on purpose; the host brings ingest back), then
the live stream of any ready or serving view version that died (and stop streams
of failed or retired ones)."""

from __future__ import annotations

from datetime import datetime, timedelta

from airflow.sdk import DAG

from _regauge import dag_args, regauge

with DAG(
    dag_id="regauge_watchdog",
    description="keep ingest and every live view version's stream running",
    schedule=timedelta(minutes=1),
    start_date=datetime(2026, 1, 1),
    dagrun_timeout=timedelta(minutes=10),
    **dag_args(__doc__),
) as dag:
    regauge("ensure_streams", "streams ensure")
