"""Long-running pipeline processes (ingest, a view version's live stream) as daemons.

Each daemon is a `regauge ... run`-style command started detached in its own
session, with a pid file, a log and a JSON status file under the state
directory, the same way the stack's services run. `start` waits until the
process says it is running; `stop` asks the Python driver to finish its
micro-batch and exit, and only forces the process group after a timeout.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from warehouse.base.settings import REPO_ROOT
from warehouse.ops.stack import process
from warehouse.ops.stack.process import PidFile, Proc, ServiceError


@dataclass(frozen=True)
class Daemon:
    name: str
    base: Path
    # Arguments of `python -m warehouse.cli`.
    cli_args: tuple[str, ...]

    @property
    def pidfile(self) -> PidFile:
        return PidFile(self.base / f"{self.name}.pid")

    @property
    def log(self) -> Path:
        return self.base / f"{self.name}.log"

    @property
    def status_file(self) -> Path:
        return self.base / f"{self.name}.status.json"

    def argv(self) -> list[str]:
        return [sys.executable, "-m", "warehouse.cli", *self.cli_args]

    def pid(self) -> int | None:
        return self.pidfile.live_pid()

    def read_status(self) -> dict[str, Any]:
        try:
            loaded: dict[str, Any] = json.loads(self.status_file.read_text())
        except (OSError, ValueError):
            return {}
        return loaded

    def write_status(self, **status: Any) -> None:
        """Replace the status file atomically (readers never see half of it)."""
        self.base.mkdir(parents=True, exist_ok=True)
        tmp = self.status_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(status, indent=2, default=str))
        tmp.replace(self.status_file)

    def start(
        self, ready: Callable[[dict[str, Any]], bool], timeout: float = 240.0
    ) -> tuple[int, bool]:
        """Launch the daemon unless it runs; wait until `ready(status)`.

        Returns (pid, started): started is False when it was already running.
        Two callers at once (the watchdog and a person, say) start one daemon:
        the look at the pid file and the launch happen under a lock.
        """
        with self._launch_lock():
            pid = self.pid()
            if pid is not None:
                return pid, False
            self.status_file.unlink(missing_ok=True)
            # In the project's folder, not the caller's: an Airflow task runs in a
            # temporary folder that is deleted when it ends, and a daemon it starts
            # outlives it (Spark fails to start in a folder that is gone).
            proc = Proc(self.name, self.argv(), cwd=REPO_ROOT)
            pid = process.spawn(proc, self.pidfile, self.log)
        if not process.wait_until(
            lambda: ready(self.read_status()), timeout, alive=lambda: self.pid() is not None
        ):
            raise ServiceError(
                f"{self.name} did not start within {timeout:.0f} s; its log ends with:\n"
                + process.tail(self.log)
            )
        return pid, True

    @contextlib.contextmanager
    def _launch_lock(self) -> Iterator[None]:
        self.base.mkdir(parents=True, exist_ok=True)
        with open(self.base / f"{self.name}.lock", "w") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            yield

    def stop(self, timeout: float = 90.0) -> bool:
        """Stop it between micro-batches; force it after `timeout`. False if not running.

        Under the launch lock: a start while it stops (the watchdog's, say) waits
        and then launches a new daemon. Without the lock, such a start could
        launch after this one ended and have its pid file cleared here, leaving a
        daemon nobody knew of, and a second one started next to it (seen: two
        view hosts after the bench put the stack back).
        """
        with self._launch_lock():
            pid = self.pid()
            if pid is None:
                self.pidfile.clear()
                return False
            # Only the Python driver gets SIGTERM: it stops its queries between batches
            # and shuts Spark down; signalling the whole group would kill the JVM
            # mid-commit.
            os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + timeout
            while self.pid() is not None and time.monotonic() < deadline:
                time.sleep(0.5)
            if self.pid() is not None:
                print(f"{self.name} did not stop within {timeout:.0f} s; killing it")
            process.stop_group(pid, signal.SIGKILL, 10)
            self.pidfile.clear()
            return True
