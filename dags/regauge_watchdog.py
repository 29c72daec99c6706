"""regauge_watchdog: every minute, make the view host run what the registry says.

supervisord restarts a view host that dies, within seconds. This DAG covers
what supervisord cannot know. It starts the host when ingest is wanted and no
host runs, for example after `regauge down` and `up`, or a reboot. It starts the
live stream of any ready or serving view version that is not running. It stops
the streams of failed or retired ones."""

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
