"""Triggering and following DAG runs through Airflow's REST API (v2).

`regauge trigger` and the demo use it, and so do the end-to-end tests: a run
goes through the real API server, scheduler and executor, with its params
validated by Airflow before the run exists.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterable, Mapping
from typing import Any

import requests

from warehouse.base.settings import Settings

log = logging.getLogger(__name__)

FINISHED = ("success", "failed")
# Params whose values never go into a log line: an erasure's customer id is what the
# erasure removes (docs/contract.md §8).
PRIVATE_PARAMS = frozenset({"customer_id"})


class AirflowError(RuntimeError):
    """Airflow refused a request, or a run did not succeed."""


class Refused(AirflowError):
    """An HTTP error from Airflow's API; a refused param is status 400."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(f"Airflow refused it (HTTP {status}): {detail}")
        self.status = status
        self.detail = detail


class Client:
    def __init__(self, settings: Settings) -> None:
        from warehouse.ops.stack.services import Airflow

        self.base = settings.airflow_url
        # An Airflow of one's own takes the password from the settings; the one
        # `regauge up` started keeps the admin password it generated.
        password = settings.airflow_password or Airflow(settings).admin_password()
        if password is None:
            raise AirflowError(
                "Airflow has no admin password yet: start it with `regauge up`, or set "
                "REGAUGE_AIRFLOW_PASSWORD for an Airflow regauge did not start"
            )
        try:
            resp = requests.post(
                f"{self.base}/auth/token",
                json={"username": settings.airflow_user, "password": password},
                timeout=30,
            )
        except requests.ConnectionError:
            raise AirflowError(
                f"Airflow is not reachable at {self.base}; start it with `regauge up`"
            ) from None
        self._check(resp)
        # The UI's login sets the same token as its `_token` cookie.
        self.token = str(resp.json()["access_token"])
        self.session = requests.Session()
        self.session.headers["Authorization"] = f"Bearer {self.token}"

    @staticmethod
    def _check(resp: requests.Response) -> None:
        if resp.status_code >= 400:
            try:
                detail = resp.json().get("detail", resp.text)
            except ValueError:
                detail = resp.text
            raise Refused(
                resp.status_code, detail if isinstance(detail, str) else json.dumps(detail)
            )

    def _get(self, path: str, **params: Any) -> Any:
        resp = self.session.get(f"{self.base}/api/v2{path}", params=params, timeout=30)
        self._check(resp)
        return resp.json()

    def wait_for_dag(self, dag_id: str, timeout: float = 120.0) -> None:
        """Wait until the DAG processor has parsed `dag_id` (new files take a few seconds)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                self._get(f"/dags/{dag_id}")
                return
            except Refused as exc:
                if exc.status != 404 or time.monotonic() > deadline:
                    raise
            time.sleep(2)

    def is_paused(self, dag_id: str) -> bool:
        return bool(self._get(f"/dags/{dag_id}").get("is_paused"))

    def pause(self, dag_id: str, paused: bool) -> None:
        resp = self.session.patch(
            f"{self.base}/api/v2/dags/{dag_id}", json={"is_paused": paused}, timeout=30
        )
        self._check(resp)

    def quiet(self, dag_ids: Iterable[str]) -> dict[str, bool]:
        """Pause these DAGs (each once parsed); returns whether each was paused
        before, for `restore` to put back."""
        was_paused: dict[str, bool] = {}
        for dag_id in dag_ids:
            self.wait_for_dag(dag_id)
            was_paused[dag_id] = self.is_paused(dag_id)
            self.pause(dag_id, True)
        return was_paused

    def restore(self, was_paused: Mapping[str, bool]) -> None:
        """Pause or unpause each DAG as `quiet` found it."""
        for dag_id, paused in was_paused.items():
            self.pause(dag_id, paused)

    def trigger(self, dag_id: str, conf: dict[str, Any], run_id: str | None = None) -> str:
        """Create a run (with `run_id`, or one Airflow makes); returns its run id. Bad
        params raise Refused (HTTP 400)."""
        body: dict[str, Any] = {"logical_date": None, "conf": conf}
        if run_id is not None:
            body["dag_run_id"] = run_id
        resp = self.session.post(f"{self.base}/api/v2/dags/{dag_id}/dagRuns", json=body, timeout=30)
        self._check(resp)
        made: str = resp.json()["dag_run_id"]
        shown = {k: "<hidden>" if k in PRIVATE_PARAMS else v for k, v in conf.items()}
        log.info("triggered %s with %s: run %s", dag_id, json.dumps(shown), made)
        return made

    def delete_run(self, dag_id: str, run_id: str) -> None:
        """Delete a run with its task instances (and their rendered fields)."""
        resp = self.session.delete(f"{self.base}/api/v2/dags/{dag_id}/dagRuns/{run_id}", timeout=30)
        self._check(resp)

    def mark_failed(self, dag_id: str, run_id: str) -> None:
        """Mark a run failed, as a person does in the UI: Airflow fails its running
        tasks and sends their processes SIGTERM."""
        resp = self.session.patch(
            f"{self.base}/api/v2/dags/{dag_id}/dagRuns/{run_id}",
            json={"state": "failed"},
            timeout=30,
        )
        self._check(resp)
        log.info("marked %s run %s failed", dag_id, run_id)

    def runs(self, dag_id: str) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = self._get(f"/dags/{dag_id}/dagRuns", limit=100)["dag_runs"]
        return found

    def active_runs(self, dag_id: str) -> list[str]:
        """The ids of the DAG's runs that are queued or running (pausing a DAG stops
        new runs, not these)."""
        found = self._get(f"/dags/{dag_id}/dagRuns", state=["queued", "running"], limit=100)
        return [str(r["dag_run_id"]) for r in found["dag_runs"]]

    def state(self, dag_id: str, run_id: str) -> str:
        return str(self._get(f"/dags/{dag_id}/dagRuns/{run_id}")["state"])

    def tasks(self, dag_id: str, run_id: str) -> dict[str, str | None]:
        found = self._get(f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances")["task_instances"]
        return {t["task_id"]: t["state"] for t in found}

    def task_seconds(self, dag_id: str, run_id: str) -> dict[str, float]:
        """How long each finished task of a run took, as Airflow measured it."""
        found = self._get(f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances")["task_instances"]
        return {t["task_id"]: float(t["duration"]) for t in found if t.get("duration") is not None}

    def task_log(
        self, dag_id: str, run_id: str, task_id: str, try_number: int | None = None
    ) -> str:
        """A task try's log as text (Airflow 3 serves structured entries); by default
        its latest try's: a task that failed once and then succeeded on its retry
        says what it did in the second."""
        if try_number is None:
            ti = self._get(f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}")
            try_number = max(1, int(ti.get("try_number") or 1))
        found = self._get(
            f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}/logs/{try_number}",
            full_content=True,
        )
        lines = []
        for entry in found.get("content", []):
            if isinstance(entry, dict):
                lines.append(str(entry.get("event", "")))
            else:
                lines.append(str(entry))
        return "\n".join(lines)

    def wait(self, dag_id: str, run_id: str, timeout: float = 1800.0) -> str:
        """Wait for the run to finish, logging each task as it changes state."""
        started = time.monotonic()
        deadline = started + timeout
        seen: dict[str, str | None] = {}
        while True:
            state = self.state(dag_id, run_id)
            for task, ts in self.tasks(dag_id, run_id).items():
                if ts != seen.get(task) and ts is not None:
                    log.info("%s %s: %s", dag_id, task, ts)
                seen[task] = ts
            if state in FINISHED:
                return state
            if time.monotonic() > deadline:
                raise AirflowError(f"{dag_id} run {run_id} still {state} after {timeout:.0f} s")
            # Two light API calls a second, four in the first 30 s of the wait:
            # most runs the CLI and the tests wait on are short, and their end is
            # seen within half a second of it.
            time.sleep(0.5 if time.monotonic() - started < 30 else 1.0)

    def failure_logs(self, dag_id: str, run_id: str, lines: int = 30) -> str:
        """The log tails of a run's failed tasks: what to show when a run fails."""
        out = []
        for task, ts in self.tasks(dag_id, run_id).items():
            if ts == "failed":
                text = self.task_log(dag_id, run_id, task)
                out.append(f"--- {task} ---\n" + "\n".join(text.splitlines()[-lines:]))
        return "\n".join(out)

    def run(
        self,
        dag_id: str,
        conf: dict[str, Any],
        timeout: float = 1800.0,
        run_id: str | None = None,
    ) -> str:
        """Trigger, wait, and raise with the failed tasks' logs unless it succeeded."""
        self.wait_for_dag(dag_id)
        run_id = self.trigger(dag_id, conf, run_id)  # the one Airflow made, if None
        state = self.wait(dag_id, run_id, timeout)
        if state != "success":
            raise AirflowError(
                f"{dag_id} run {run_id} {state}:\n{self.failure_logs(dag_id, run_id)}"
            )
        return run_id
