"""What every service of the local stack shares: the Service base class, its status
types and config rendering.

Every service keeps its data, config and logs under the settings' state
directory, and runs under that folder's supervisord
(`warehouse.ops.stack.supervisor`), which restarts a process that dies and
rotates its log. Starting one that already runs is a no-op; stopping asks
supervisord, so a stopped service stays stopped.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import signal
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from string import Template

from warehouse.base.settings import REPO_ROOT, Settings
from warehouse.ops.stack.process import (
    PidFile,
    Proc,
    ServiceError,
    group_alive,
    group_rss_bytes,
    port_taken,
    stop_group,
    tail,
    wait_until,
)
from warehouse.ops.stack.supervisor import ALIVE, Program, Supervisor

log = logging.getLogger(__name__)

INFRA = REPO_ROOT / "infra"
# As long as regauge waited before it used supervisord: then the group is killed.
STOP_WAIT_S = 30.0
# With n seconds before the nth retry, 60 retries keep a service trying for an
# hour (Airflow's components while PostgreSQL is down); then supervisord gives
# up (FATAL, shown by `regauge status`) and `regauge up` starts it again.
START_RETRIES = 60


@dataclass(frozen=True)
class ProcStatus:
    name: str
    pid: int | None
    log: Path
    rss_bytes: int = 0
    # supervisord's state of it (RUNNING, BACKOFF...), or how else it runs.
    state: str = "-"


@dataclass(frozen=True)
class Status:
    service: str
    running: bool
    healthy: bool
    ports: Sequence[int]
    procs: Sequence[ProcStatus]
    note: str = ""


@contextlib.contextmanager
def private(under: Path) -> Iterator[None]:
    """Files made inside are readable by their owner only from the start (secrets,
    keys, configs that hold them), not after a chmod that a crash could skip.

    `under` and its parents are made first with the usual mode: made under this
    umask, a new .state/ would be owner-only too, and the local stack's
    PostgreSQL (run as the postgres account) could no longer reach its home there.
    """
    under.mkdir(parents=True, exist_ok=True)
    before = os.umask(0o077)
    try:
        yield
    finally:
        os.umask(before)


def kept_secret(path: Path) -> str:
    """A secret made once and kept in `path` (owner-only), so every component
    started later agrees on it."""
    if not path.is_file():
        with private(path.parent):
            path.write_text(secrets.token_urlsafe(32))
    return path.read_text().strip()


def _render(template: Path, target: Path, **values: object) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    text = Template(template.read_text()).substitute({k: str(v) for k, v in values.items()})
    target.write_text(text)


class Service(ABC):
    """One service of the stack; subclasses say how to prepare, run and probe it."""

    name: str
    health_timeout: float = 120.0
    # supervisord starts lower first and, when it stops itself, stops it last.
    priority: int = 500

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.home = settings.state_dir / self.name

    # -- what a service declares ------------------------------------------------
    @abstractmethod
    def ports(self) -> Sequence[int]: ...

    @abstractmethod
    def procs(self) -> Sequence[Proc]: ...

    @abstractmethod
    def healthy(self) -> bool: ...

    def prepare(self) -> None:  # noqa: B027 - most services need no preparation
        """Write config and initialise data (idempotent); runs before every start."""

    def after_start(self) -> None:  # noqa: B027 - optional hook
        """Create what must exist once the service answers (idempotent)."""

    def note(self) -> str:
        return ""

    # -- shared mechanics ---------------------------------------------------------
    @property
    def supervisor(self) -> Supervisor:
        return Supervisor.of_state(self.settings.state_dir)

    def legacy_pidfile(self, proc: str) -> PidFile:
        """Where regauge before supervisord recorded a process it started itself."""
        return PidFile(self.settings.state_dir / "run" / f"{proc}.pid")

    def logfile(self, proc: str) -> Path:
        return self.settings.state_dir / "logs" / f"{proc}.log"

    def _proc_names(self) -> list[str]:
        return [p.name for p in self.procs()]

    def _legacy_pids(self) -> dict[str, int]:
        found = {n: self.legacy_pidfile(n).live_pid() for n in self._proc_names()}
        return {n: pid for n, pid in found.items() if pid is not None}

    def live_pids(self) -> dict[str, int | None]:
        """Each process's pid, if it runs (supervised, or left by an older regauge)."""
        legacy = self._legacy_pids()
        return {n: self.supervisor.pid(n) or legacy.get(n) for n in self._proc_names()}

    def running(self) -> bool:
        pids = self.live_pids()
        return _all_live(pids)

    def start(self) -> bool:
        """Start whatever of this service is not running; True if anything started."""
        pids = self.live_pids()
        legacy = self._legacy_pids()
        if _all_live(pids) and not legacy and self.healthy():
            log.info("%s already running (pid %s)", self.name, _pids(pids))
            return False
        if legacy:
            log.warning("%s was started without supervisord; restarting it under it", self.name)
            self.stop()
        elif any(pid is not None for pid in pids.values()):
            # Half up (one Airflow process given up on, say): restart it whole, cleanly.
            log.warning("%s is partly running; restarting it", self.name)
            self.stop()
        self.launch()
        self.await_healthy()
        return True

    def program(self, proc: Proc) -> Program:
        """How supervisord runs one of its processes."""
        return Program(
            cwd=proc.cwd,
            env=proc.env,
            user=proc.user,
            stop_signal=signal.Signals(proc.stop_signal).name.removeprefix("SIG"),
            stop_wait_s=STOP_WAIT_S,
            service=True,
            start_retries=START_RETRIES,
            priority=self.priority,
        )

    def launch(self) -> None:
        """Prepare and start the processes, without waiting for them (a member of a
        quorum cannot become healthy alone: its peers are launched first)."""
        for port in self.ports():
            if port_taken(port):
                raise ServiceError(
                    f"port {port} ({self.name}) is already taken by another process: stop it, "
                    f"or choose another port (see `regauge settings` for the REGAUGE_* variables)"
                )
        self.prepare()
        for proc in self.procs():
            self.supervisor.start(proc.name, proc.argv, self.logfile(proc.name), self.program(proc))

    def _starting(self) -> bool:
        """Every process is up or on its way; a start that already died (supervisord
        retries it, in BACKOFF) is reported at once, with its log."""
        return all(self.supervisor.state(n) in ALIVE for n in self._proc_names())

    def await_healthy(self) -> None:
        """Wait until the launched service answers; stop it and raise if it does not."""
        procs = self.procs()
        log.info("waiting for %s to become healthy (up to %.0f s)", self.name, self.health_timeout)
        ok = wait_until(self.healthy, self.health_timeout, alive=self._starting, interval=1.0)
        if not ok:
            logs = "\n".join(
                f"--- last lines of {self.logfile(p.name)}\n{tail(self.logfile(p.name))}"
                for p in procs
            )
            state = "exited" if not self._starting() else "did not become healthy in time"
            self.stop()
            raise ServiceError(f"{self.name} {state}\n{logs}")
        self.after_start()
        log.info("%s is up (pid %s)", self.name, _pids(self.live_pids()))

    def stop(self) -> bool:
        """Stop its processes, newest first; True if anything was running."""
        stopped = False
        for proc in reversed(self.procs()):
            legacy = self.legacy_pidfile(proc.name)
            pid = legacy.live_pid()
            if pid is not None:
                log.info("stopping %s (pid %d, started without supervisord)", proc.name, pid)
                stop_group(pid, proc.stop_signal)
                stopped = True
            legacy.clear()
            pid = self.supervisor.pid(proc.name)
            if pid is not None:
                log.info("stopping %s (pid %d)", proc.name, pid)
                stopped = True
            # Also a program in BACKOFF, which has no pid but would be started again.
            self.supervisor.stop(proc.name)
            if pid is not None:
                # supervisord signals the group and kills it after STOP_WAIT_S; the
                # group is checked too, as a launcher's children may outlive it.
                wait_until(partial(_group_gone, pid), STOP_WAIT_S + 10, interval=0.2)
                stop_group(pid, signal.SIGKILL, 10)
        return stopped

    def status(self) -> Status:
        pids = self.live_pids()
        running = _all_live(pids)
        return Status(
            service=self.name,
            running=running,
            healthy=running and self.healthy(),
            ports=self.ports(),
            procs=[
                ProcStatus(
                    n,
                    pid,
                    self.logfile(n),
                    group_rss_bytes(pid) if pid else 0,
                    self.supervisor.state(n) or ("unsupervised" if pid else "-"),
                )
                for n, pid in pids.items()
            ],
            note=self.note(),
        )


def _group_gone(pgid: int) -> bool:
    return not group_alive(pgid)


def _all_live(pids: dict[str, int | None]) -> bool:
    return bool(pids) and all(pid is not None for pid in pids.values())


def _pids(pids: dict[str, int | None]) -> str:
    return ", ".join(str(p) for p in pids.values())
