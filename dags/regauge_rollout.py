"""regauge_rollout(view, version, percent, pin_user, unpin_user): move users to or
back from a version. Takes effect on the next query; can be undone until retirement."""

from __future__ import annotations

from airflow.sdk import DAG, Param

from _regauge import USER_PATTERN, dag_args, regauge, version_param, view_param

with DAG(
    dag_id="regauge_rollout",
    description="route a percent of users (and pinned users) to a view version",
    schedule=None,
    params={
        "view": view_param(),
        "version": version_param(),
        "percent": Param(type="integer", minimum=0, maximum=100, description="0-100"),
        "pin_user": Param(
            None,
            type=["null", "string"],
            pattern=USER_PATTERN,
            description="also pin this user to the version",
        ),
        "unpin_user": Param(
            None,
            type=["null", "string"],
            pattern=USER_PATTERN,
            description="remove this user's pin",
        ),
    },
    **dag_args(__doc__),
) as dag:
    regauge(
        "rollout",
        'rollout "$VIEW" "$VERSION" "$PERCENT" '
        '${PIN_USER:+--pin "$PIN_USER"} ${UNPIN_USER:+--unpin "$UNPIN_USER"}',
        VIEW="{{ params.view }}",
        VERSION="{{ params.version }}",
        PERCENT="{{ params.percent }}",
        PIN_USER="{{ params.pin_user or '' }}",
        UNPIN_USER="{{ params.unpin_user or '' }}",
    )
