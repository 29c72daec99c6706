"""What every service of the local stack shares: the Service base class, its status
types and config rendering.

Every service keeps its data, config, logs and pids under the settings' state
directory. Starting one that already runs is a no-op; stopping signals only the
processes recorded in our own pid files.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from string import Template

from warehouse.base.settings import REPO_ROOT, Settings
from warehouse.ops.stack.process import (
    PidFile,
    Proc,
    ServiceError,
    group_rss_bytes,
    port_taken,
    spawn,
    stop_group,
    tail,
    wait_until,
)

log = logging.getLogger(__name__)

INFRA = REPO_ROOT / "infra"


@dataclass(frozen=True)
class ProcStatus:
    name: str
    pid: int | None
    log: Path
    rss_bytes: int = 0


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
    def pidfile(self, proc: str) -> PidFile:
        return PidFile(self.settings.state_dir / "run" / f"{proc}.pid")

    def logfile(self, proc: str) -> Path:
        return self.settings.state_dir / "logs" / f"{proc}.log"

    def _proc_names(self) -> list[str]:
        return [p.name for p in self.procs()]

    def live_pids(self) -> dict[str, int | None]:
        return {n: self.pidfile(n).live_pid() for n in self._proc_names()}

    def running(self) -> bool:
        pids = self.live_pids()
        return _all_live(pids)

    def start(self) -> bool:
        """Start whatever of this service is not running; True if anything started."""
        pids = self.live_pids()
        if _all_live(pids) and self.healthy():
            log.info("%s already running (pid %s)", self.name, _pids(pids))
            return False
        if any(pid is not None for pid in pids.values()):
            # Half up (one Airflow process died, say): restart it whole, cleanly.
            log.warning("%s is partly running; restarting it", self.name)
            self.stop()
        self.launch()
        self.await_healthy()
        return True

    def launch(self) -> None:
        """Prepare and spawn the processes, without waiting for them (a member of a
        quorum cannot become healthy alone: its peers are launched first)."""
        for port in self.ports():
            if port_taken(port):
                raise ServiceError(
                    f"port {port} ({self.name}) is already taken by another process: stop it, "
                    f"or choose another port (see `regauge settings` for the REGAUGE_* variables)"
                )
        self.prepare()
        for proc in self.procs():
            spawn(proc, self.pidfile(proc.name), self.logfile(proc.name))

    def await_healthy(self) -> None:
        """Wait until the launched service answers; stop it and raise if it does not."""
        procs = self.procs()
        log.info("waiting for %s to become healthy (up to %.0f s)", self.name, self.health_timeout)
        ok = wait_until(self.healthy, self.health_timeout, alive=self.running, interval=1.0)
        if not ok:
            logs = "\n".join(
                f"--- last lines of {self.logfile(p.name)}\n{tail(self.logfile(p.name))}"
                for p in procs
            )
            state = "exited" if not self.running() else "did not become healthy in time"
            self.stop()
            raise ServiceError(f"{self.name} {state}\n{logs}")
        self.after_start()
        log.info("%s is up (pid %s)", self.name, _pids(self.live_pids()))

    def stop(self) -> bool:
        """Stop the processes we started, newest first; True if anything was running."""
        stopped = False
        for proc in reversed(self.procs()):
            pidfile = self.pidfile(proc.name)
            pid = pidfile.live_pid()
            if pid is not None:
                log.info("stopping %s (pid %d)", proc.name, pid)
                stop_group(pid, proc.stop_signal)
                stopped = True
            pidfile.clear()
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
                ProcStatus(n, pid, self.logfile(n), group_rss_bytes(pid) if pid else 0)
                for n, pid in pids.items()
            ],
            note=self.note(),
        )


def _all_live(pids: dict[str, int | None]) -> bool:
    return bool(pids) and all(pid is not None for pid in pids.values())


def _pids(pids: dict[str, int | None]) -> str:
    return ", ".join(str(p) for p in pids.values())
