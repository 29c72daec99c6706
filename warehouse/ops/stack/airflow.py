"""Airflow 3, its three components run from their own virtualenv."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import subprocess
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from warehouse.base.settings import REPO_ROOT
from warehouse.ops.stack.base import Service, kept_secret, private
from warehouse.ops.stack.process import Proc, ServiceError

log = logging.getLogger(__name__)

# Airflow's tables that grow with every run; `dag`, `dag_version` and the like hold
# what the DAG files define, and stay.
CLEANED_TABLES = (
    "dag_run",
    "task_instance",
    "task_instance_history",
    "task_reschedule",
    "xcom",
    "job",
    "log",
    "callback",
)


@dataclass(frozen=True)
class Cleaned:
    output: str  # airflow db clean's own account, table by table
    log_files: int
    log_bytes: int


def old_task_logs(root: Path, before_s: float, remove: bool) -> tuple[int, int]:
    """Task log files under `root` last written before `before_s` (Unix time), and
    their bytes; removed (with the folders they leave empty) unless `remove` is off."""
    files = size = 0
    if not root.is_dir():
        return 0, 0
    paths = sorted(root.rglob("*"), reverse=True)  # a folder after its content
    # A folder's time as it was before this pass: removing its files renews it.
    made = {p: p.stat().st_mtime for p in paths if p.is_dir() and not p.is_symlink()}
    for path in paths:
        if path.is_file() and not path.is_symlink() and path.stat().st_mtime < before_s:
            files += 1
            size += path.stat().st_size
            if remove:
                path.unlink()
        elif (
            remove
            and made.get(path, before_s) < before_s  # not one a task has just made
            and not any(path.iterdir())
        ):
            path.rmdir()
    return files, size


AIRFLOW_VENV = REPO_ROOT / ".venv-airflow"
# The scheduler's log server (port 8793) has no host setting in Airflow 3.3: it
# listens on every interface. With the LocalExecutor on one machine it is not
# needed: the API server reads task logs from the files in AIRFLOW_HOME (a task
# still running shows "Could not read served logs" beside what it has written so
# far).
# What the API server calls itself once started (its command line is gone then).
API_SERVER_TITLE = "airflow api_server -- "
SKIP_LOG_SERVER = {"scheduler": ("--skip-serve-logs",)}
# The scheduler's own settings. A scheduler started after a crash resets the dead
# one's running tasks (so their next tries run) only once the dead one's last
# heartbeat is older than this: 20 s instead of Airflow's 30 brings a killed
# rollout's driver back sooner. It beats every 5 s, so a loop stalled for four
# beats on a loaded machine still counts as alive. Set for the scheduler alone:
# the API server's health report keeps Airflow's 30 s.
ORPHAN_RESET_AFTER_S = 20
SCHEDULER_ENV = {"AIRFLOW__SCHEDULER__SCHEDULER_HEALTH_CHECK_THRESHOLD": str(ORPHAN_RESET_AFTER_S)}


class Airflow(Service):
    """Airflow 3 (api-server, scheduler, dag-processor) in its own virtualenv.

    No triggerer: it runs only deferred tasks, and no regauge task defers (each
    runs the CLI to its end; tests/dags/test_dags.py keeps it so). Idle, it cost
    about 1 CPU-s a minute and 300 MiB of memory on 2 cores.
    """

    name = "airflow"
    priority = 400
    # Without its database the scheduler dies after some seconds: long enough to
    # count as up (and reset supervisord's backoff) were this the usual 5 s.
    start_s = 30
    health_timeout = 240.0
    components = ("api-server", "scheduler", "dag-processor")
    task_env: dict[str, str] = {}  # noqa: RUF012 - replaced per instance, never mutated

    def ports(self) -> Sequence[int]:
        return [self.settings.airflow_port]

    @property
    def passwords_file(self) -> Path:
        return self.home / "simple_auth_manager_passwords.json.generated"

    def env(self) -> dict[str, str]:
        s = self.settings
        url = s.airflow_url
        return {
            # An operator's own Airflow settings (supervisord passes on no other
            # variable of the shell that started it); regauge's own below win.
            **{k: v for k, v in os.environ.items() if k.startswith("AIRFLOW_")},
            "AIRFLOW_HOME": str(self.home),
            "AIRFLOW__CORE__DAGS_FOLDER": str(REPO_ROOT / "dags"),
            # The rollout page (issue 69): Browse > regauge rollouts, served at /regauge/.
            "AIRFLOW__CORE__PLUGINS_FOLDER": str(REPO_ROOT / "dags" / "plugins"),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
            "AIRFLOW__CORE__PARALLELISM": "4",
            "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{url}/execution/",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": "admin:admin",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(self.passwords_file),
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": (
                f"postgresql+psycopg2://{s.postgres_user}:{s.postgres_password}"
                f"@{s.postgres_host}:{s.postgres_port}/{s.airflow_db}"
            ),
            "AIRFLOW__API__HOST": s.bind_host or "127.0.0.1",
            "AIRFLOW__API__PORT": str(s.airflow_port),
            "AIRFLOW__API__BASE_URL": url,
            "AIRFLOW__API__WORKERS": "1",
            "AIRFLOW__API_AUTH__JWT_SECRET": kept_secret(self.home / ".jwt_secret"),
            "AIRFLOW__API__SECRET_KEY": kept_secret(self.home / ".api_secret"),
            # New DAG files are picked up within seconds, not the default five minutes.
            "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "15",
            # An edited DAG file is parsed again at once (newer mtime than its last
            # parse), so the default of re-parsing unchanged files every 30 s buys
            # only a new view's name in the params' list of views sooner. It cost
            # about 100 CPU-s an hour on 2 cores; every 2 minutes costs a quarter.
            "AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL": "120",
            "AIRFLOW__SCHEDULER__ENABLE_HEALTH_CHECK": "True",
            "AIRFLOW__SCHEDULER__SCHEDULER_HEALTH_CHECK_SERVER_HOST": s.bind_host or "127.0.0.1",
            # The pipeline's CLI, which every task calls (DAGs stay thin).
            "REGAUGE_BIN": str(REPO_ROOT / ".venv" / "bin" / "regauge"),
            "PYTHONUNBUFFERED": "1",
            # The settings its tasks' commands read (the one-box cluster's), whatever
            # the environment of the process that started Airflow.
            **self.task_env,
        }

    def _bin(self) -> str:
        airflow = AIRFLOW_VENV / "bin" / "airflow"
        if not airflow.is_file():
            raise ServiceError(f"Airflow is not installed ({airflow}): run `make setup`")
        return str(airflow)

    def procs(self) -> Sequence[Proc]:
        env = self.env()
        return [
            Proc(
                name=f"airflow-{c}",
                argv=[self._bin(), c, *SKIP_LOG_SERVER.get(c, ())],
                env={**env, **SCHEDULER_ENV} if c == "scheduler" else env,
                cwd=self.home,
                title=API_SERVER_TITLE if c == "api-server" else None,
            )
            for c in self.components
        ]

    def prepare(self) -> None:
        # A stack that an older regauge started ran a triggerer too.
        if self.supervisor.forget("airflow-triggerer"):
            log.info("Airflow's triggerer is no longer run: no regauge task defers")
        self.home.mkdir(parents=True, exist_ok=True)
        self._keep_admin_password()
        log.info("migrating Airflow's metadata database")
        proc = subprocess.run(
            [self._bin(), "db", "migrate"],
            env={**os.environ, **self.env()},
            capture_output=True,
            text=True,
        )
        if proc.returncode != 0:
            raise ServiceError(
                f"airflow db migrate failed:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}"
            )

    def _keep_admin_password(self) -> None:
        """The admin's password, made by regauge (owner-only) before Airflow starts.

        Left to itself, Airflow's simple auth manager makes it, prints it in the
        api-server's log and keeps it in a file every local account could read. It
        prints only a password it makes, so it prints none. A file an older regauge
        let it make is replaced: its password is in old logs.
        """
        kept = self.passwords_file
        if kept.is_file() and kept.stat().st_mode & 0o077 == 0:
            with contextlib.suppress(ValueError):
                if "admin" in json.loads(kept.read_text() or "{}"):
                    return
        with private(kept.parent):
            draft = kept.with_name(f"{kept.name}.new")
            draft.unlink(missing_ok=True)
            draft.write_text(json.dumps({"admin": secrets.token_urlsafe(18)}) + "\n")
        draft.replace(kept)
        log.info("made Airflow's admin password, in %s (owner-only)", kept)

    def clean(self, before: datetime, dry_run: bool = False) -> Cleaned:
        """Airflow's records and task logs from before `before`: the watchdog alone
        makes 1,440 runs a day, and neither Airflow's database nor its log folder
        would ever shrink. `airflow db clean` deletes the rows (its tables of runs,
        task instances, jobs, XComs and the audit log; each DAG's latest run stays),
        without archive tables; the task logs go by their files' age."""
        argv = [
            self._bin(),
            "db",
            "clean",
            "--clean-before-timestamp",
            before.isoformat(timespec="seconds"),
            "--tables",
            ",".join(CLEANED_TABLES),
            "--skip-archive",
            "--error-on-cleanup-failure",
            "--yes",
            *(["--dry-run"] if dry_run else []),
        ]
        proc = subprocess.run(
            argv, env={**os.environ, **self.env()}, capture_output=True, text=True, timeout=1800
        )
        if proc.returncode != 0:
            raise ServiceError(
                f"airflow db clean failed:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}"
            )
        files, size = old_task_logs(self.home / "logs", before.timestamp(), remove=not dry_run)
        return Cleaned(proc.stdout + proc.stderr, files, size)

    def healthy(self) -> bool:
        try:
            url = f"{self.settings.airflow_url}/api/v2/monitor/health"
            with urllib.request.urlopen(url, timeout=3) as resp:
                health = json.load(resp)
        except (OSError, urllib.error.URLError, ValueError):
            return False
        parts = ("metadatabase", "scheduler", "dag_processor")
        return all(health.get(p, {}).get("status") == "healthy" for p in parts)

    def admin_password(self) -> str | None:
        try:
            return json.loads(self.passwords_file.read_text()).get("admin")
        except (OSError, ValueError):
            return None

    def note(self) -> str:
        return (
            f"UI {self.settings.airflow_url} — user admin, password in {self.passwords_file}; "
            f"the rollout page {self.settings.airflow_url}/regauge/ (Browse > regauge rollouts)"
        )
