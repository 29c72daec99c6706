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
import signal
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from string import Template

from warehouse.base import secret
from warehouse.base.settings import REPO_ROOT, Settings
from warehouse.ops.stack.process import (
    PidFile,
    Proc,
    ServiceError,
    argv,
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
# With n seconds before the nth retry, 85 retries keep a service trying for an
# hour (1 + 2 + ... + 85 s; Airflow's components while PostgreSQL is down); then
# supervisord gives up (FATAL, shown by `regauge status`) and `regauge up`
# starts it again.
START_RETRIES = 85


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


def keep_private(settings: Settings) -> None:
    """The state folder (data, configs, secrets, logs of every service) and a local
    lake (tables and checkpoints): their owner's only.

    Files inside are made under umask 077 too (supervisord's and the CLI's), but a
    folder's mode is what keeps out another local account, and Trino's read-only
    rules mean nothing to someone who reads the Parquet files themselves.
    """
    places = [settings.state_dir]
    if settings.lake_is_local:
        places.append(Path(settings.lake_root))
    for place in places:
        place.mkdir(parents=True, exist_ok=True)
        place.chmod(0o700)


def kept_secret(path: Path) -> str:
    """A secret made once and kept in `path` (owner-only), so every component
    started later agrees on it."""
    return secret.kept(path)


def _render(template: Path, target: Path, **values: object) -> None:
    """A config from its template, owner-only: some hold passwords (Trino's
    catalog of PostgreSQL), and no other account needs to read any."""
    text = Template(template.read_text()).substitute({k: str(v) for k, v in values.items()})
    with private(target.parent):
        if target.exists():
            target.chmod(0o600)  # made readable by all by an older regauge
        target.write_text(text)


class Service(ABC):
    """One service of the stack; subclasses say how to prepare, run and probe it."""

    name: str
    health_timeout: float = 120.0
    # supervisord starts lower first and, when it stops itself, stops it last.
    priority: int = 500
    # Up, for supervisord, once it has lived this long; a quicker death is a failed
    # start, retried with a backoff. A longer life resets the backoff: a service
    # that takes long to fail (Airflow without its database) needs a longer one.
    start_s: int = 5

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

    def unsupervised(self) -> dict[str, int]:
        """Its processes that run outside supervisord: recorded in a pid file by a
        regauge before supervisord, or left running by a supervisord that died (found
        by their command line and folder)."""
        found = {}
        for proc in self.procs():
            supervised = self.supervisor.pid(proc.name)
            pid = self.legacy_pidfile(proc.name).live_pid()
            if pid is None and supervised is None:
                pid = _running(proc)
            if pid is not None and pid != supervised:
                found[proc.name] = pid
        return found

    def live_pids(self) -> dict[str, int | None]:
        """Each process's pid, if it runs (supervised, or not: see `unsupervised`)."""
        pids = {n: self.supervisor.pid(n) for n in self._proc_names()}
        if not _all_live(pids):
            pids.update(self.unsupervised())
        return pids

    def running(self) -> bool:
        pids = self.live_pids()
        return _all_live(pids)

    def start(self) -> bool:
        """Start whatever of this service is not running and wait until it answers;
        True if anything started."""
        started = self.begin()
        if started:
            self.await_healthy()
        return started

    def begin(self) -> bool:
        """`start` without the wait: launch whatever is not running, and say whether
        the service is on its way (then `await_healthy` it) or already answered."""
        if self.unsupervised():
            log.warning("%s runs outside supervisord; restarting it under it", self.name)
            self.stop()
        states = [self.supervisor.state(n) for n in self._proc_names()]
        if all(state in ALIVE for state in states):
            if self.healthy():
                log.info("%s already running (pid %s)", self.name, _pids(self.live_pids()))
                return False
            if self._recently_started():
                # (Re)started by supervisord a moment ago, and on its way.
                return True
            log.warning("%s runs but does not answer; restarting it", self.name)
        if any(state in (*ALIVE, "BACKOFF") for state in states):
            # Half up (one Airflow process given up on), or retried by supervisord
            # (BACKOFF, which a start would not touch): restart it whole, cleanly.
            log.warning("%s is partly running (%s); restarting it", self.name, states)
            self.stop()
        self.launch()
        return True

    def _recently_started(self) -> bool:
        """Whether a process of it started within its health timeout (or is starting)."""
        for name in self._proc_names():
            info = self.supervisor.info(name) or {}
            if info.get("statename") == "STARTING":
                return True
            if info.get("now", 0) - info.get("start", 0) < self.health_timeout:
                return True
        return False

    def program(self, proc: Proc) -> Program:
        """How supervisord runs one of its processes."""
        return Program(
            cwd=proc.cwd,
            env=proc.env,
            user=proc.user,
            stop_signal=signal.Signals(proc.stop_signal).name.removeprefix("SIG"),
            stop_wait_s=STOP_WAIT_S,
            service=True,
            start_s=self.start_s,
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
        """Stop its processes, newest first; True if anything was running. All are
        asked first and then awaited together: one slow to go (a Kafka broker's
        controlled shutdown) does not hold up the signal to the others."""
        stopped = False
        outside = self.unsupervised()
        asked = []
        for proc in reversed(self.procs()):
            if proc.name in outside:
                log.info("stopping %s (pid %d, outside supervisord)", proc.name, outside[proc.name])
                stop_group(outside[proc.name], proc.stop_signal)
                stopped = True
            self.legacy_pidfile(proc.name).clear()
            pid = self.supervisor.pid(proc.name)
            if pid is not None:
                log.info("stopping %s (pid %d)", proc.name, pid)
                stopped = True
                asked.append(pid)
            # Also a program in BACKOFF, which has no pid but would be started again.
            self.supervisor.stop(proc.name)
        for pid in asked:
            # supervisord signals the group and kills it after STOP_WAIT_S; the
            # group is checked too, as a launcher's children may outlive it.
            wait_until(partial(_group_gone, pid), STOP_WAIT_S + 10, interval=0.2)
            stop_group(pid, signal.SIGKILL, 10)
        return stopped

    def status(self) -> Status:
        pids = self.live_pids()
        outside = self.unsupervised()
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
                    "unsupervised" if n in outside else (self.supervisor.state(n) or "-"),
                )
                for n, pid in pids.items()
            ],
            note=self.note(),
        )


def _running(proc: Proc) -> int | None:
    """A live process group leader running `proc`, if there is one: its command line
    ends with `proc`'s arguments (a script's interpreter, or the JVM a launcher
    exec'd, comes first) or starts with its title, in its folder or one below
    (PostgreSQL moves to its data folder). Leaders only: supervisord and regauge
    before it started each service in a group of its own, and the children a
    service forks (Airflow's) are in the parent's group, with its command line."""
    args = [str(a) for a in proc.argv[1:]]
    folder = Path(proc.cwd).resolve() if proc.cwd is not None else None
    for entry in Path("/proc").glob("[0-9]*"):
        pid = int(entry.name)
        try:
            cmdline = argv(pid)
            if cmdline is None:
                continue
            titled = proc.title is not None and " ".join(cmdline).startswith(proc.title)
            if not titled and (not args or cmdline[-len(args) :] != args):
                continue
            # Airflow's components have the same command line in every state folder.
            if folder is not None:
                cwd = (entry / "cwd").resolve()
                if cwd != folder and folder not in cwd.parents:
                    continue
            if os.getpgid(pid) != pid:
                continue
        except OSError:
            continue  # ended while we looked, or not ours to read
        return pid
    return None


def _group_gone(pgid: int) -> bool:
    return not group_alive(pgid)


def _all_live(pids: dict[str, int | None]) -> bool:
    return bool(pids) and all(pid is not None for pid in pids.values())


def _pids(pids: dict[str, int | None]) -> str:
    return ", ".join(str(p) for p in pids.values())


class Starting:
    """Services begun together and awaited afterwards: each mostly a JVM or a Python
    warming up, so waiting for one after another cost a start the sum of their
    waits. Whatever fails (a launch, a health wait, the setup after it), every
    service already begun is still awaited, so none is left starting unwatched
    and each that answers gets its setup (`after_start`: Kafka's topic,
    PostgreSQL's roles); `done` then raises what failed."""

    def __init__(self) -> None:
        self.pending: list[Service] = []
        self.errors: list[Exception] = []

    def begin(self, svc: Service, launch: Callable[[], bool] | None = None) -> None:
        """`svc.begin()` (or `launch`, which says whether it was launched); nothing
        more is begun after a failure."""
        if self.errors:
            return
        try:
            if (launch or svc.begin)():
                self.pending.append(svc)
        except Exception as exc:
            self.errors.append(exc)

    def await_all(self, kind: type[Service] | None = None) -> None:
        """Await the pending services (those of `kind` only, if given)."""
        for svc in [p for p in self.pending if kind is None or isinstance(p, kind)]:
            self.pending.remove(svc)
            try:
                svc.await_healthy()
            except Exception as exc:
                self.errors.append(exc)

    def done(self) -> None:
        self.await_all()
        if len(self.errors) == 1:
            raise self.errors[0]
        if self.errors:
            raise ServiceError("\n\n".join(str(e) for e in self.errors))


def stop_together(services: Sequence[Service]) -> list[str]:
    """Stop these services at the same time (for services that need nothing of each
    other to stop); the names of those that were running, in the order given.
    Stopping one after another cost a whole stack's shutdown the sum of their waits:
    about 40 s for the one-box cluster, most of it its last Kafka broker."""
    if not services:
        return []
    with ThreadPoolExecutor(max_workers=len(services), thread_name_prefix="stop") as pool:
        ran = list(pool.map(lambda svc: svc.stop(), services))
    return [svc.name for svc, was in zip(services, ran, strict=True) if was]
