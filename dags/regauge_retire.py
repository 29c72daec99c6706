"""regauge_retire(view, version): stop and remove a version no user is routed to.

Refused while anyone is routed to it (the current version, a candidate above
0 %, or a pinned user). Re-running finishes whatever an earlier run left."""

from __future__ import annotations

from airflow.sdk import DAG

from _regauge import dag_args, no_retry, regauge, version_param, view_param

with DAG(
    dag_id="regauge_retire",
    description="retire a view version: stream stopped, dropped from Trino, table archived",
    schedule=None,
    params={"view": view_param(), "version": version_param()},
    **dag_args(__doc__),
) as dag:
    # No retry: the refusal while users are routed to the version is a verdict
    # (docs/contract.md §5); re-running by hand finishes whatever a failed run left.
    no_retry(
        regauge(
            "retire",
            'retire "$VIEW" "$VERSION"',
            VIEW="{{ params.view }}",
            VERSION="{{ params.version }}",
        )
    )
