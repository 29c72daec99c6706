"""regauge_forget(customer_id, reason): erase one customer everywhere (docs/contract.md §8).

Runs `regauge forget customer`: ingest and the view streams stop meanwhile,
every layer and every view version loses the customer's rows, Delta's history
is removed, and the streams start again. The erasure is logged, without the id,
in ops.control.erasures. Kafka's copy is skipped by ingest and replays until
its retention deletes it.

Airflow keeps this run's params (the id) in its own database; the task log
shows the command's environment names only, never the values, and the command
reads the id on its stdin, so no process list shows it. Within the hour
after the run has succeeded, regauge_audit's scrub_erasure_runs task deletes
it (the run, its task instances, logs and audit-log rows). A failed run
stays, for its retry."""

from __future__ import annotations

from airflow.sdk import DAG, Param

from _regauge import dag_args, regauge

# The same rules as warehouse/base/sqlnames.py, held by Airflow before a run exists.
# Any id silver keeps (docs/contract.md §1: 1-64 characters), but NUL, which no
# task's environment can carry (`regauge forget customer -` reads one on stdin).
CUSTOMER_ID_PATTERN = r"^[^\x00]{1,64}(?![\s\S])"
REASON_PATTERN = r"^[A-Za-z0-9 ,.;:()/#'_-]{1,200}(?![\s\S])"

with DAG(
    dag_id="regauge_forget",
    description="erase one customer from every layer, view version and Delta's history",
    schedule=None,
    params={
        "customer_id": Param(
            type="string",
            pattern=CUSTOMER_ID_PATTERN,
            description="the customer_id to erase, e.g. cust-00042",
        ),
        "reason": Param(
            "erasure request",
            type="string",
            pattern=REASON_PATTERN,
            description="why, for the erasure log: plain words, never the id",
        ),
    },
    **dag_args(__doc__),
) as dag:
    # Retried once like any task: the retry has the same run id, under which the
    # erasure resumes after the last step it completed (issue 68, B).
    # The id goes in on stdin, never as an argument that `ps` would show.
    regauge(
        "forget",
        'forget customer - --reason "$REASON" --request-id "$REQUEST_ID"',
        stdin="CUSTOMER_ID",
        CUSTOMER_ID="{{ params.customer_id }}",
        REASON="{{ params.reason }}",
        REQUEST_ID="{{ run_id }}",
    )
