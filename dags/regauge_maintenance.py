"""regauge_maintenance: every day at 03:17 UTC, compact, checkpoint and VACUUM every
Delta table regauge writes (`regauge maintain`), and delete Airflow's records of
runs and task logs older than REGAUGE_AIRFLOW_KEEP_DAYS, 14 (`regauge clean-airflow`).

Files a newer version replaced are kept for REGAUGE_MAINTENANCE_RETENTION_HOURS
(168, Delta's default), or longer while a stream's checkpoint, a replay waiting
for its stream or the audit still needs an older version. It runs beside
ingest and the streams: compaction changes no data, and a writer it conflicts
with retries. REGAUGE_MAINTENANCE_CRON, read when the DAG file is parsed, sets
another schedule, e.g. "*/10 * * * *" (`make soak` triggers runs itself instead).
A new stack waits for the next time: no run is due at start. A stack that was
down at the time runs the one it missed when it comes up (no more than one).
"""

from __future__ import annotations

import os

from airflow.sdk import DAG, Param
from airflow.timetables.trigger import CronTriggerTimetable

from _regauge import FIRST_RUN_WAITS, dag_args, regauge

with DAG(
    dag_id="regauge_maintenance",
    description="Delta table maintenance: OPTIMIZE, checkpoint, VACUUM behind every reader",
    # A trigger timetable, not a timedelta: a stack started after a day away would
    # otherwise run it at once, in the middle of whatever it was started for.
    schedule=CronTriggerTimetable(
        os.environ.get("REGAUGE_MAINTENANCE_CRON", "17 3 * * *"),
        timezone="UTC",
        run_immediately=FIRST_RUN_WAITS,
    ),
    # No start_date: with one, a trigger timetable without catchup runs the most
    # recent past time at once (airflow.timetables.trigger); without, it waits.
    params={
        "retention_hours": Param(
            None,
            type=["null", "number"],
            minimum=0,
            description="keep replaced files at least this many hours instead of the "
            "configured retention (empty: the configured one); readers still make it longer",
        ),
    },
    **dag_args(__doc__),
) as dag:
    # Beside it: Airflow's own records of runs and their task logs, which nothing
    # else deletes (the watchdog alone makes 1,440 runs a day).
    regauge("clean_airflow", "clean-airflow")
    # Retried once like any task: what the first try compacted is not compacted again.
    regauge(
        "maintain",
        'maintain ${RETENTION_HOURS:+--retention-hours "$RETENTION_HOURS"}',
        RETENTION_HOURS=(
            "{{ params.retention_hours if params.retention_hours is not none else '' }}"
        ),
    )
