"""What regauge's DAG files share: the params' schemas and the one way a task runs.

Tasks call the pipeline's CLI (`$REGAUGE_BIN`, in the pipeline's own
virtualenv). Every value from a run's params reaches the shell as an
environment variable, quoted where it is used, never pasted into the command
text, and each param is already held to a strict schema by Airflow before
the run exists: unknown views, versions below 1, percents outside 0-100 and
names that are not plain identifiers are refused with HTTP 400.
"""

from __future__ import annotations

import re
from datetime import timedelta
from pathlib import Path

from airflow.providers.standard.operators.bash import BashOperator
from airflow.sdk import Param

REPO_ROOT = Path(__file__).resolve().parent.parent
VIEWS_DIR = REPO_ROOT / "spark_jobs" / "views"
# A view version is a module `<view>_v<N>.py` (spark_jobs/views/__init__.py).
_VIEW_FILE = re.compile(r"(?P<name>[a-z][a-z0-9_]*)_v(?P<version>[1-9][0-9]*)\.py")
# Trino user names: analyst.alice, engineer.bob (warehouse/versions.py holds the same).
# Not "$": a JSON-schema pattern is searched, and "$" also matches before a final newline.
USER_PATTERN = r"^[a-z][a-z0-9_.@-]{0,63}(?![\s\S])"

DEFAULT_ARGS = {"owner": "regauge", "retries": 0, "execution_timeout": timedelta(hours=2)}
# What every regauge DAG shares: one run at a time, no backfill of missed intervals.
DAG_ARGS = {
    "catchup": False,
    "max_active_runs": 1,
    "default_args": DEFAULT_ARGS,
    "tags": ["regauge"],
}


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


def regauge(task_id: str, args: str, **env: str) -> BashOperator:
    """A task running `regauge <args>`; `args` refers to params only as "$NAME"."""
    return BashOperator(
        task_id=task_id,
        bash_command=f'set -euo pipefail; exec "$REGAUGE_BIN" {args}',
        env=env,
        append_env=True,
    )
