"""What regauge's DAG files share: the params' schemas and the one way a task runs.

Tasks call the pipeline's CLI (`$REGAUGE_BIN`, in the pipeline's own
virtualenv). Every value from a run's params reaches the shell as an
environment variable, quoted where it is used, never pasted into the command
text, and each param is already held to a strict schema by Airflow before
the run exists: unknown views, versions below 1, percents outside 0-100 and
names that are not plain identifiers are refused with HTTP 400.

Every DAG shows its file's docstring in the UI (`dag_args(__doc__)`), every
task retries once unless its failure is a verdict, and every task that fails
for good says so in one ERROR line (`log_failure`) and, where
REGAUGE_ALERT_WEBHOOK_URL is set, to a webhook (`WebhookNotifier`).
"""

from __future__ import annotations

import json
import logging
import os
import re
import urllib.request
from collections.abc import Mapping
from datetime import timedelta
from pathlib import Path
from typing import Any

from airflow.providers.standard.operators.bash import BashOperator
from airflow.sdk import BaseNotifier, Param

REPO_ROOT = Path(__file__).resolve().parent.parent
VIEWS_DIR = REPO_ROOT / "spark_jobs" / "views"
# A view version is a module `<view>_v<N>.py` (spark_jobs/views/__init__.py).
_VIEW_FILE = re.compile(r"(?P<name>[a-z][a-z0-9_]*)_v(?P<version>[1-9][0-9]*)\.py")
# Trino user names: analyst.alice, engineer.bob (warehouse/base/sqlnames.py holds the same).
# Not "$": a JSON-schema pattern is searched, and "$" also matches before a final newline.
USER_PATTERN = r"^[a-z][a-z0-9_.@-]{0,63}(?![\s\S])"

log = logging.getLogger("regauge.dags")


def _failure(context: Mapping[str, Any]) -> dict[str, Any]:
    """What a failed task's context says about it: never its params (the erasure's
    are a customer's id)."""
    ti = context.get("ti") or context.get("task_instance")
    max_tries = getattr(ti, "max_tries", None)
    exc = context.get("exception")
    return {
        "dag_id": getattr(ti, "dag_id", None),
        "task_id": getattr(ti, "task_id", None),
        "run_id": getattr(ti, "run_id", None),
        "try": getattr(ti, "try_number", None),
        # max_tries counts the retries: a task with retries=1 has 2 tries.
        "tries": max_tries + 1 if isinstance(max_tries, int) else None,
        "error": f"{type(exc).__name__}: {exc}"
        if isinstance(exc, BaseException)
        else exc or "no exception reported (the task died or was killed)",
    }


def log_failure(context: Mapping[str, Any]) -> None:
    """Every task's on_failure_callback: one ERROR line naming the run, the task,
    the try and the exception, so a failure stands out in the task's log.

    Airflow calls it in the task's own process once the task has failed for good
    (not on a try that will be retried), and in the DAG processor for a task that
    died without reporting (heartbeat timeout). Standard library only: the DAG
    processor must not import PySpark or the pipeline's packages.
    """
    f = _failure(context)
    log.error(
        "REGAUGE TASK FAILED: dag_id=%s task_id=%s run_id=%s try=%s of %s: %s",
        f["dag_id"],
        f["task_id"],
        f["run_id"],
        f["try"],
        f["tries"],
        f["error"],
    )


class WebhookNotifier(BaseNotifier):
    """Every task's other on_failure_callback: the failure, POSTed as JSON to
    REGAUGE_ALERT_WEBHOOK_URL (a chat's incoming webhook, or a relay to a pager),
    read when a task fails from Airflow's environment (`regauge up` passes the
    starter's REGAUGE_* variables on). Without it, nothing is sent.

    The body has `text`, one line for a chat, and each field of `_failure`. A
    receiver that cannot be reached is logged (REGAUGE ALERT NOT SENT), never
    raised: the task's own failure stays the one Airflow reports.
    """

    def notify(self, context: Mapping[str, Any]) -> None:
        url = os.environ.get("REGAUGE_ALERT_WEBHOOK_URL", "").strip()
        if not url:
            return
        f = _failure(context)
        text = (
            f"regauge: {f['dag_id']}.{f['task_id']} failed (run {f['run_id']}, "
            f"try {f['try']} of {f['tries']}): {f['error']}"
        )
        request = urllib.request.Request(
            url,
            data=json.dumps({"text": text, **f}, default=str).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        try:
            with urllib.request.urlopen(request, timeout=10) as answer:
                answer.read()
        except (OSError, ValueError) as exc:
            log.warning("REGAUGE ALERT NOT SENT to %s: %s", url, exc)


# Every task is idempotent (it looks at the registry first), so one retry costs
# nothing but time and rides out a transient fault: a JVM that died on this
# 2-core box, PostgreSQL or Trino restarting. 30 s is long enough for a
# restarting service to answer again and short beside the tasks themselves
# (a replay or a dbt build takes minutes). One retry, not more: the CLI exits 2
# for a refusal and for an unreachable service alike, so Airflow cannot tell a
# fault from a deterministic failure, and a deterministic one would repeat a
# whole replay for every extra retry.
# Tasks whose failure is a verdict, not a fault, are wrapped in `no_retry` where
# they are declared, with the reason: a retry would only delay the same answer.
# The end-to-end tests wait on exactly those (a second reprocess refused at
# `register`, a retire refused while users are routed), so they see the failed
# run as soon as before, and no test slows down.
RETRIES = 1
RETRY_DELAY = timedelta(seconds=30)
# A cron trigger timetable's `run_immediately` for a DAG that must wait for its next
# time when a stack comes up with no runs of it. Its default, False, still runs the
# most recent time at once if it passed less than a tenth of the interval ago (at
# least 5 min) in Airflow 3.3 (`_calc_first_run`; apache/airflow#64162): a fresh
# stack started at 05:13 ran the 03:17 maintenance beside the tests' first module
# (stop 87's rehearsal). A zero window runs it only at its time.
FIRST_RUN_WAITS = timedelta(0)
DEFAULT_ARGS: dict[str, Any] = {
    "owner": "regauge",
    "retries": RETRIES,
    "retry_delay": RETRY_DELAY,
    "execution_timeout": timedelta(hours=2),
    "on_failure_callback": [log_failure, WebhookNotifier()],
}
# What every regauge DAG shares: one run at a time, no backfill of missed intervals.
DAG_ARGS: dict[str, Any] = {
    "catchup": False,
    "max_active_runs": 1,
    "default_args": DEFAULT_ARGS,
    "tags": ["regauge"],
}


def dag_args(doc: str | None) -> dict[str, Any]:
    """DAG_ARGS plus `doc_md`: pass the DAG file's `__doc__`, which the UI then shows."""
    if not doc or not doc.strip():
        raise ValueError("a regauge DAG file starts with a docstring: it is the DAG's doc_md")
    return {**DAG_ARGS, "doc_md": doc}


def known_views() -> list[str]:
    """View names, from the file names alone: the DAG processor must not import PySpark."""
    names = {m["name"] for p in VIEWS_DIR.glob("*_v*.py") if (m := _VIEW_FILE.fullmatch(p.name))}
    return sorted(names)


def view_param() -> Param:
    return Param(
        type="string",
        enum=known_views(),
        description="the view, e.g. revenue_hourly",
    )


def version_param() -> Param:
    return Param(type="integer", minimum=1, description="the view version, e.g. 2")


def regauge(task_id: str, args: str, stdin: str | None = None, **env: str) -> BashOperator:
    """A task running `regauge <args>`; `args` refers to params only as "$NAME".

    `stdin` names one of `env` to hand to the command on its standard input
    instead, taken out of its environment first: an argument would show in the
    process list, which every local account can read.
    """
    feed = ""
    if stdin:
        feed = f'input="${stdin}"; unset {stdin}; '
        args = f'{args} <<<"$input"'
    return BashOperator(
        task_id=task_id,
        bash_command=f'set -euo pipefail; {feed}exec "$REGAUGE_BIN" {args}',
        env=env,
        append_env=True,
    )


def no_retry(task: BashOperator) -> BashOperator:
    """`task` without DEFAULT_ARGS' retry: for a task whose failure is a verdict."""
    task.retries = 0
    return task
