"""regauge_readmit(source, reason): bring quarantined records back once the contract
learns them (docs/contract.md §10).

Runs `regauge readmit SOURCE --reason REASON`: every record of the source quarantined
with that reason is validated again under the contract version the lake runs
(`regauge sources deploy`), and settled as if it had passed when it arrived. Ingest
stops between micro-batches meanwhile and starts again afterwards; the live views
restate the windows that change. Each run is logged in ops.control.readmissions.

A retry, or a later run for the same source and reason, resumes a run that did not
finish under its own id, so nothing is admitted twice."""

from __future__ import annotations

from airflow.sdk import DAG, Param

from _regauge import dag_args, regauge

# A source's name as `warehouse/sources/` declares it; the command refuses one it
# does not know, naming those it does.
SOURCE_PATTERN = r"^[a-z][a-z0-9_]{0,63}(?![\s\S])"
# The quarantine reasons of docs/contract.md §1 but conflicting_duplicate (those
# records passed the contract; dedup settles them). tests/dags holds this list to
# spark_jobs.engine.readmit's.
REASONS = [
    "unsupported_schema_version",
    "oversize",
    "malformed_json",
    "missing_field",
    "invalid_field",
    "unknown_event_type",
    "event_time_out_of_range",
    "total_mismatch",
]

with DAG(
    dag_id="regauge_readmit",
    description="validate quarantined records again under the contract the lake runs",
    schedule=None,
    params={
        "source": Param(
            "shop", type="string", pattern=SOURCE_PATTERN, description="the source, e.g. shop"
        ),
        "reason": Param(
            "unsupported_schema_version",
            type="string",
            enum=REASONS,
            description="the quarantine reason whose records to examine",
        ),
    },
    **dag_args(__doc__),
) as dag:
    regauge(
        "readmit",
        'readmit "$SOURCE" --reason "$REASON"',
        SOURCE="{{ params.source }}",
        REASON="{{ params.reason }}",
    )
