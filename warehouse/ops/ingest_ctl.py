"""`regauge ingest start|stop|status`: ingest as a part of the view host.

Ingest runs in the view host (`regauge streams host`), the one Spark
application that also runs every live view's stream: no JVM of its own. `start`
records that ingest is wanted (the file `wanted` under the state directory's
`ingest/`, holding its trigger), starts the host if it is not running, and
waits until its query reports running; `stop` removes the file and waits
until the host has stopped them between micro-batches. The host restarts
ingest after a backoff if it fails, and `ensure`, which the `regauge_watchdog`
DAG runs every minute, starts a host that died while ingest was wanted.
`regauge down` stops the host but keeps ingest wanted, so the watchdog brings
it back after the next `regauge up`.

`regauge ingest run` is the same ingest as a foreground process of its own.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from warehouse.base import registry
from warehouse.base.settings import Settings
from warehouse.ops import lag, streams, writers
from warehouse.ops.stack.process import ServiceError

log = logging.getLogger(__name__)


def _base(settings: Settings) -> Path:
    return settings.state_dir / "ingest"


def status_file(settings: Settings) -> Path:
    """Each ingest query's latest progress, written by spark_jobs.engine.ingest.ProgressLog."""
    return _base(settings) / "ingest.status.json"


def _wanted(settings: Settings) -> Path:
    return _base(settings) / "wanted"


def wanted(settings: Settings) -> tuple[bool, str | None]:
    """Whether ingest should be running, and with which trigger (None: the default)."""
    try:
        text = _wanted(settings).read_text().strip()
    except FileNotFoundError:
        return False, None
    return True, text or None


def pid(settings: Settings) -> int | None:
    """The view host's pid while ingest runs in it, else None."""
    host_pid = streams.host(settings).pid()
    if host_pid is None:
        return None
    return host_pid if _host_state(settings).get("state") == "running" else None


def _host_state(settings: Settings) -> dict[str, Any]:
    return dict(streams.host(settings).read_status().get("ingest") or {})


def failure(settings: Settings) -> str | None:
    """Why ingest is not running in the host, if it failed (None if it runs or is not asked)."""
    if streams.host(settings).pid() is None:
        return None
    state = _host_state(settings)
    return str(state.get("error")) if state.get("state") == "failed" else None


def _running(status: dict[str, Any]) -> bool:
    return bool(status.get(registry.INGEST_QUERY, {}).get("state") == "running")


def asked_at(settings: Settings) -> int | None:
    """When ingest was last asked for (the marker's mtime, ns): each `start` is news."""
    try:
        return _wanted(settings).stat().st_mtime_ns
    except FileNotFoundError:
        return None


def start(settings: Settings, trigger: str | None, timeout: float = 240.0) -> int:
    """Ask the view host to run ingest (starting the host if need be); wait until its
    query reports running. Returns the host's pid."""
    marker = _wanted(settings)
    marker.parent.mkdir(parents=True, exist_ok=True)
    running = pid(settings)
    marker.write_text(f"{trigger or ''}\n")
    if running is not None and _running(read_status(settings)):
        print(f"ingest already running in the view host (pid {running})")
        return running
    asked = asked_at(settings)
    # A status file left by an earlier run would say "running" before this one does.
    status_file(settings).unlink(missing_ok=True)
    host_pid, _ = streams.start_host(settings)

    def state() -> dict[str, Any]:
        # Running once the query says so (the host's thread runs sooner); failed
        # as the host says.
        if _running(read_status(settings)):
            return {"state": "running"}
        host_state = _host_state(settings)
        failed = host_state.get("state") == "failed" and host_state.get("asked") == asked
        return host_state if failed else {}

    host_pid = streams.wait_in_host(settings, host_pid, "ingest", state, timeout)
    print(f"ingest running in the view host (pid {host_pid}); log: {streams.host(settings).log}")
    return host_pid


def stop(settings: Settings, timeout: float = 90.0) -> bool:
    """Ask the host to stop ingest between micro-batches and no longer want it, so the
    watchdog leaves it stopped. False if it was not running."""
    was_running = pid(settings) is not None
    _wanted(settings).unlink(missing_ok=True)
    host = streams.host(settings)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if host.pid() is None or not _host_state(settings):
            return was_running
        time.sleep(0.5)
    # Forcing it would take every view stream in the host down with it.
    raise ServiceError(
        f"ingest did not stop within {timeout:.0f} s; the view host is still stopping it, "
        f"see {host.log}"
    )


@contextlib.contextmanager
def paused(settings: Settings, holder: str) -> Iterator[None]:
    """Ingest stopped between micro-batches, and its writer lock held, while the body
    runs; afterwards ingest is as it was, whether the body succeeded or not."""
    was_wanted, trigger = wanted(settings)
    if stop(settings):
        log.info("ingest stopped for %s", holder)
    lock = writers.ingest(settings, holder).acquire()
    try:
        yield
    finally:
        lock.release()
        if was_wanted:
            start(settings, trigger)


def ensure(settings: Settings) -> str | None:
    """Start the view host if ingest is wanted and the host is not running; say so."""
    want, trigger = wanted(settings)
    if not want or streams.host(settings).pid() is not None:
        return None
    if writers.busy(settings, writers.ERASURE) is not None:
        return None  # the erasure starts ingest again itself
    log.warning("ingest is wanted but the view host is not running: starting it")
    host_pid = start(settings, trigger)
    return f"ingest restarted (view host pid {host_pid})"


def read_status(settings: Settings) -> dict[str, Any]:
    try:
        loaded: dict[str, Any] = json.loads(status_file(settings).read_text())
    except (OSError, ValueError):
        return {}
    return loaded


def describe(settings: Settings, *, kafka_up: bool = True) -> tuple[bool, str]:
    """Whether ingest runs, a line on its latest batch, and (if Kafka
    is up) how far bronze is behind Kafka now, in records and in seconds."""
    host = streams.host(settings)
    running = pid(settings)
    state = _host_state(settings)
    where = f"in the view host, pid {running}" if running else "not running"
    lines = [f"ingest: {where} (log {host.log})"]
    if state.get("state") == "failed":
        retry = state.get("retry_in_s")
        when = f"retrying in {retry} s" if retry is not None else "`regauge ingest start` retries"
        lines.append(f"  failed: {state.get('error')}; {when}")
    status = read_status(settings)
    copied = lag.copied_by_source(status)
    if not kafka_up:
        lines.append("  behind Kafka: unknown (Kafka is down)")
    elif not copied:
        lines.append("  behind Kafka: unknown until ingest's first batch")
    # The shop's first, then the others by name; each source its own topic.
    for name in sorted(copied, key=lambda s: (s != registry.SHOP_SOURCE, s)) if kafka_up else ():
        topic = registry.source_tables(name).topic
        behind = lag.ingest_lag(settings, copied[name], topic)
        lines.append(f"  {topic} behind Kafka: " + "; ".join(str(x) for x in behind))
    for name, st in sorted(status.items()):
        lines.append(
            f"  {name:<7} {st.get('state', '?'):<8} batch {st.get('batch', '-')}, "
            f"{st.get('rows_in', 0):,} rows in the last batch, "
            f"{st.get('rows_per_s', 0):,.0f} rows/s, at {st.get('at', '-')}"
            + (f"\n          error: {st['error']}" if st.get("error") else "")
        )
    return running is not None, "\n".join(lines)
