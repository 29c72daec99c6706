"""Every live view version's stream, as one query each in one Spark application.

A version's stream (its query in the view host) starts when its reprocess
hands over from the replay, runs while the version is building, ready or
serving, and stops when it fails validation or is retired.

One application, not one JVM per stream: on 2 cores, three stream JVMs and
ingest ran at load average 11-13, each JVM paid its own start, heap and
compiler threads, and their jobs could not be scheduled against each other.
In the host, each query has a Spark session of its own (its commits' tags
never mix with another's) and a fair-scheduler pool of its own (one
version's long batch does not hold back the others' short ones).

The control channel is a directory: `start` leaves a file in `wanted/` and
waits until the host reports the query running; `stop` removes it and waits
until the host reports it gone. Starting, stopping or a failure of one
query leaves the others running. `ensure` is the watchdog: Airflow's
`regauge_watchdog` calls it every minute to bring back a host or a query
that died.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from warehouse.base.settings import Settings
from warehouse.base.sqlnames import check_identifier
from warehouse.ops import writers
from warehouse.ops.daemon import Daemon
from warehouse.ops.stack import process
from warehouse.ops.stack.process import ServiceError
from warehouse.sql import versions

log = logging.getLogger(__name__)

_NAME = re.compile(r"(?P<view>[a-z][a-z0-9_]*)_v(?P<version>[1-9][0-9]*)")
# How often the host looks at `wanted/` (and so how soon a start or stop begins).
POLL_S = 1.0


@dataclass(frozen=True)
class Stream:
    view: str
    version: int
    # The host's pid while the query runs in it.
    pid: int | None
    state: str

    @property
    def name(self) -> str:
        return query_name(self.view, self.version)


def query_name(view: str, version: int) -> str:
    check_identifier(view, "view")
    return f"{view}_v{int(version)}"


def parse_name(name: str) -> tuple[str, int] | None:
    m = _NAME.fullmatch(name)
    return (m["view"], int(m["version"])) if m else None


def host(settings: Settings) -> Daemon:
    """The view host: the one process (and JVM) that runs every wanted stream."""
    return Daemon(
        "host",
        settings.state_dir / "streams",
        ("streams", "host"),
    )


def _wanted_dir(settings: Settings) -> Path:
    return settings.state_dir / "streams" / "wanted"


def want(settings: Settings, view: str, version: int, wanted: bool) -> None:
    """Say whether the version's stream should run; the host acts on it within POLL_S."""
    marker = _wanted_dir(settings) / query_name(view, version)
    if wanted:
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.touch()
    else:
        marker.unlink(missing_ok=True)


def wanted(settings: Settings) -> list[tuple[str, int]]:
    folder = _wanted_dir(settings)
    found = (parse_name(p.name) for p in folder.iterdir()) if folder.is_dir() else iter(())
    return sorted(f for f in found if f is not None)


def _queries(settings: Settings) -> tuple[int | None, dict[str, dict[str, Any]]]:
    """The host's pid (None if it is not running) and what it says of each query."""
    h = host(settings)
    pid = h.pid()
    if pid is None:
        return None, {}
    return pid, dict(h.read_status().get("queries") or {})


def pid(settings: Settings, view: str, version: int) -> int | None:
    """The host's pid if the version's query runs in it, else None."""
    host_pid, queries = _queries(settings)
    state = queries.get(query_name(view, version), {}).get("state")
    return host_pid if state == "running" else None


def read_through(settings: Settings, view: str, version: int) -> dict[str, int] | None:
    """The newest version of each table the version's stream has read all of, by path,
    as the host last reported it; None unless the stream runs in the host."""
    host_pid, queries = _queries(settings)
    state = queries.get(query_name(view, version), {})
    if host_pid is None or state.get("state") != "running":
        return None
    return {str(k): int(v) for k, v in (state.get("read_through") or {}).items()}


def known(settings: Settings) -> list[Stream]:
    """Every stream that is wanted or that the host runs."""
    host_pid, queries = _queries(settings)
    names = {query_name(v, n) for v, n in wanted(settings)} | set(queries)
    found = []
    for name in sorted(names):
        parsed = parse_name(name)
        if parsed is None:
            continue
        state = queries.get(name, {}).get("state", "stopped" if host_pid is None else "starting")
        found.append(Stream(*parsed, host_pid if state == "running" else None, state))
    return found


def start_host(settings: Settings, timeout: float = 240.0) -> tuple[int, bool]:
    return host(settings).start(lambda st: st.get("state") == "running", timeout)


def start(settings: Settings, view: str, version: int, timeout: float = 300.0) -> str:
    name = query_name(view, version)
    running = pid(settings, view, version)
    if running is not None:
        return f"{view} v{version} stream already running (view host pid {running})"
    want(settings, view, version, True)
    host_pid, _ = start_host(settings)
    now_pid = wait_in_host(
        settings, host_pid, name, lambda: _queries(settings)[1].get(name, {}), timeout
    )
    return f"{view} v{version} stream started (view host pid {now_pid})"


def wait_in_host(
    settings: Settings,
    host_pid: int,
    what: str,
    state: Callable[[], dict[str, Any]],
    timeout: float,
) -> int:
    """Wait until `state()` (what the host says of `what`) is running; the host's pid.

    Raises at once if the host dies or reports `what` failed (it retries it
    after a backoff), and after `timeout`."""
    h = host(settings)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        now_pid = h.pid()
        if now_pid is None:
            raise ServiceError(
                f"the view host (pid {host_pid}) died while starting {what}; its log ends "
                f"with:\n{process.tail(h.log)}"
            )
        st = state()
        if st.get("state") == "running":
            return now_pid
        if st.get("state") == "failed":
            raise ServiceError(
                f"{what} failed to start in the view host: {st.get('error')}; "
                f"the host retries it; see {h.log}"
            )
        time.sleep(0.5)
    raise ServiceError(f"{what} did not start within {timeout:.0f} s; see {h.log}")


def stop(settings: Settings, view: str, version: int, timeout: float = 90.0) -> str:
    """Stop one version's query between micro-batches; the others keep running."""
    name = query_name(view, version)
    want(settings, view, version, False)
    host_pid, queries = _queries(settings)
    if name not in queries:
        return f"{view} v{version} stream was not running"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        host_pid, queries = _queries(settings)
        if name not in queries:
            return f"{view} v{version} stream stopped"
        time.sleep(0.5)
    # Forcing it would take every other version's stream down with it.
    raise ServiceError(
        f"{name} did not stop within {timeout:.0f} s; the view host (pid {host_pid}) "
        f"is still stopping it, see {host(settings).log}"
    )


def stop_host(settings: Settings) -> bool:
    """Stop the host and every query in it; the wanted set stays."""
    return host(settings).stop()


def shutdown(settings: Settings) -> bool:
    """`regauge down`: stop the host, then the supervisord that ran it unless it runs
    services still. Whether the host was running."""
    stopped = stop_host(settings)
    host(settings).supervisor.shutdown_if_idle()
    return stopped


def ensure(settings: Settings) -> list[str]:
    """Run the streams of live versions; stop those of failed or retired ones."""
    erasing = writers.busy(settings, writers.ERASURE)
    if erasing is not None:
        # It stopped them on purpose, and starts them again when it is done.
        return [f"streams left as they are: an erasure is running ({erasing})"]
    done = []
    for v in versions.versions(settings):
        running = pid(settings, v.view_name, v.version) is not None
        if v.live and not running:
            log.warning("%s is %s but its stream is not running: starting it", v.label, v.status)
            done.append(start(settings, v.view_name, v.version))
        elif v.status in ("failed", "retired") and (
            running or (v.view_name, v.version) in wanted(settings)
        ):
            done.append(stop(settings, v.view_name, v.version))
    return done
