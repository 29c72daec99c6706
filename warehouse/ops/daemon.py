"""Long-running pipeline processes (the view host) as daemons under supervisord.

Each daemon is a `regauge ... run`-style command that supervisord
(`warehouse.ops.stack.supervisor`) runs. It has a log that supervisord
rotates and a JSON status file under the state directory. supervisord starts
it again within seconds when it dies. `start` waits until the process says it
is running. `stop` asks the Python driver to finish its micro-batch and exit.
supervisord forces the process group only after a timeout.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import json
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from warehouse.base.jsonfile import replace_json
from warehouse.base.settings import REPO_ROOT
from warehouse.ops.stack import process
from warehouse.ops.stack.process import ServiceError
from warehouse.ops.stack.supervisor import Program, Supervisor

# How long a daemon gets to finish its micro-batch after SIGTERM before its group is killed.
STOP_WAIT_S = 90.0


@dataclass(frozen=True)
class Daemon:
    name: str
    base: Path
    # Arguments of `python -m warehouse.cli`.
    cli_args: tuple[str, ...]

    @property
    def supervisor(self) -> Supervisor:
        return Supervisor(self.base / "supervisor")

    @property
    def log(self) -> Path:
        return self.base / f"{self.name}.log"

    @property
    def status_file(self) -> Path:
        return self.base / f"{self.name}.status.json"

    def argv(self) -> list[str]:
        return [sys.executable, "-m", "warehouse.cli", *self.cli_args]

    def pid(self) -> int | None:
        return self.supervisor.pid(self.name)

    def read_status(self) -> dict[str, Any]:
        """What the running daemon last said of itself; {} if it runs not (yet).

        A daemon killed and restarted by supervisord leaves the dead one's file until
        the new one writes its own: a status naming another pid is old news."""
        try:
            loaded: dict[str, Any] = json.loads(self.status_file.read_text())
        except (OSError, ValueError):
            return {}
        if "pid" in loaded and loaded["pid"] != self.pid():
            return {}
        return loaded

    def write_status(self, **status: Any) -> None:
        """Replace the status file atomically (readers never see half of it)."""
        replace_json(self.status_file, status)

    def start(
        self, ready: Callable[[dict[str, Any]], bool], timeout: float = 240.0
    ) -> tuple[int, bool]:
        """Launch the daemon unless it runs; wait until `ready(status)`.

        Returns (pid, started): started is False when it was already running.
        Two callers at once (the watchdog and a person, say) start one daemon:
        the look at supervisord's record and the launch happen under a lock.
        """
        with self._launch_lock():
            pid = self.pid()
            if pid is not None:
                return pid, False
            self._stop_unsupervised()
            self.status_file.unlink(missing_ok=True)
            self.base.mkdir(parents=True, exist_ok=True)
            # In the project's folder, not the caller's: an Airflow task runs in a
            # temporary folder that is deleted when it ends, and a daemon it starts
            # outlives it (Spark fails to start in a folder that is gone).
            self.supervisor.start(
                self.name, self.argv(), self.log, Program(cwd=REPO_ROOT, stop_wait_s=STOP_WAIT_S)
            )
        if not process.wait_until(lambda: ready(self.read_status()), timeout, alive=self._alive):
            raise ServiceError(
                f"{self.name} did not start within {timeout:.0f} s; its log ends with:\n"
                + process.tail(self.log)
            )
        pid = self.pid()
        if pid is None:
            raise ServiceError(f"{self.name} ended right after it started; see {self.log}")
        return pid, True

    def _stop_unsupervised(self) -> None:
        """Stop a daemon supervisord does not know, which holds the same locks: one an
        older regauge started by itself (a pid file beside the log), or one left
        running when its supervisord died (its status file names it)."""
        legacy = process.PidFile(self.base / f"{self.name}.pid")
        orphans = {legacy.live_pid()}
        with contextlib.suppress(OSError, ValueError, TypeError):
            orphans.add(int(json.loads(self.status_file.read_text()).get("pid")))
        supervised = self.pid()
        for pid in sorted(p for p in orphans if p is not None and p != supervised):
            if self._runs_me(pid):
                print(f"stopping {self.name} pid {pid}, which supervisord does not know")
                # The driver first, so it ends its micro-batch; then what is left.
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGTERM)
                process.wait_until(functools.partial(self._gone, pid), STOP_WAIT_S)
                process.stop_group(pid, signal.SIGKILL, 10)
        legacy.clear()

    def _gone(self, pid: int) -> bool:
        return not self._runs_me(pid)

    def _runs_me(self, pid: int) -> bool:
        """Whether pid is alive and runs this daemon's command line."""
        cmdline = process.argv(pid)
        return cmdline is not None and cmdline[1:] == self.argv()[1:]

    def _alive(self) -> bool:
        """Running, or about to run again: supervisord retries a quick death a few times."""
        info = self.supervisor.info(self.name) or {}
        return info.get("statename") in ("STARTING", "RUNNING", "BACKOFF")

    @contextlib.contextmanager
    def _launch_lock(self) -> Iterator[None]:
        self.base.mkdir(parents=True, exist_ok=True)
        with open(self.base / f"{self.name}.lock", "w") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            yield

    def stop(self, timeout: float = 90.0) -> bool:
        """Stop it between micro-batches; force it after `timeout`. False if not running.

        Under the launch lock: a start while it stops (the watchdog's, say) waits
        and then launches a new daemon. Without the lock, a start could slip in
        between this stop's look and its wait (seen, with pid files: two view
        hosts after the bench put the stack back).
        """
        with self._launch_lock():
            self._stop_unsupervised()
            pid = self.pid()
            if pid is None:
                # Not retried either: a program in BACKOFF is stopped here too.
                self.supervisor.stop(self.name)
                return False
            # Only the Python driver gets SIGTERM (supervisord's stopasgroup=false): it
            # stops its queries between batches and shuts Spark down; signalling the
            # whole group would kill the JVM mid-commit.
            self.supervisor.stop(self.name)
            deadline = time.monotonic() + timeout
            while self.pid() == pid and time.monotonic() < deadline:
                time.sleep(0.5)
            if self.pid() == pid:
                print(f"{self.name} did not stop within {timeout:.0f} s; killing it")
            # Whatever is left of its group (a JVM the driver did not take down).
            process.stop_group(pid, signal.SIGKILL, 10)
            # It died on its own just before the stop, and supervisord started it again.
            if self.pid() is not None:
                self.supervisor.stop(self.name)
                process.wait_until(lambda: self.pid() is None, timeout)
            return True
