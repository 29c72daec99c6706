"""regauge_audit: every hour, check each layer against the one it derives from.

Fails loudly (the task fails, and `lakehouse.gold.audit_runs` says which keys
differ) on any mismatch: Kafka -> bronze -> silver -> gold, and routing.

Beside it, scrub_erasure_runs deletes the regauge_forget runs that have
succeeded: their params hold the customer id they erased (docs/contract.md §8).
"""

from __future__ import annotations

from airflow.sdk import DAG
from airflow.timetables.trigger import CronTriggerTimetable

from _regauge import FIRST_RUN_WAITS, dag_args, no_retry, regauge

with DAG(
    dag_id="regauge_audit",
    description="the integrity audit: trust, but verify",
    # On the hour, as a trigger timetable without a start_date: a stack that comes up
    # waits for the next hour. With timedelta(hours=1) and a start_date, it ran at
    # once, beside whatever the stack was started for (`make demo`, the tests).
    schedule=CronTriggerTimetable("0 * * * *", timezone="UTC", run_immediately=FIRST_RUN_WAITS),
    **dag_args(__doc__),
) as dag:
    # No retry: a mismatch is the audit's verdict (exit 1) and would only be found
    # again; the next hourly run is its retry.
    no_retry(regauge("audit", "audit"))
    # Hourly, not in the every-minute watchdog: an Airflow task a minute more costs
    # 2 cores several seconds of CPU each time, and an hour is soon enough.
    regauge("scrub_erasure_runs", "forget airflow-runs")
