"""`regauge ingest start|stop|status`: ingest as a background process with a pid file.

`regauge ingest run` is the process itself (foreground, logs to stdout);
`start` launches it detached with its log in the state directory, the same
way the stack's services run, so `stop` and `status` find it again.

Ingest is supervised like the view streams: `start` also records that it is
wanted (the file `wanted` beside its pid file, holding its trigger), `stop`
removes that, and `ensure`, which the `regauge_watchdog` DAG runs every
minute, starts a wanted ingest that died. `regauge down` stops it but keeps it
wanted, so the watchdog brings it back after the next `regauge up`.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from warehouse.base.settings import Settings
from warehouse.ops import lag
from warehouse.ops.daemon import Daemon

log = logging.getLogger(__name__)


def daemon(settings: Settings, trigger: str | None = None) -> Daemon:
    args: tuple[str, ...] = ("ingest", "run")
    if trigger:
        args += ("--trigger", trigger)
    # The status file is written by spark_jobs.ingest.ProgressLog, per query.
    return Daemon("ingest", settings.state_dir / "ingest", args)


def _wanted(settings: Settings) -> Path:
    return settings.state_dir / "ingest" / "wanted"


def wanted(settings: Settings) -> tuple[bool, str | None]:
    """Whether ingest should be running, and with which trigger (None: the default)."""
    try:
        text = _wanted(settings).read_text().strip()
    except FileNotFoundError:
        return False, None
    return True, text or None


def start(settings: Settings, trigger: str | None, timeout: float = 180.0) -> int:
    """Launch `regauge ingest run` detached; wait until both queries report running."""
    marker = _wanted(settings)
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.write_text(f"{trigger or ''}\n")
    d = daemon(settings, trigger)

    def running(states: dict[str, Any]) -> bool:
        return all(states.get(q, {}).get("state") == "running" for q in ("bronze", "silver"))

    pid, started = d.start(running, timeout)
    print(f"ingest {'running' if started else 'already running'} (pid {pid}); log: {d.log}")
    return pid


def stop(settings: Settings, timeout: float = 90.0, *, keep_wanted: bool = False) -> bool:
    """Ask ingest to finish its micro-batches and stop; force it after `timeout`.

    Unless `keep_wanted`, it is no longer wanted either, so the watchdog leaves it
    stopped."""
    if not keep_wanted:
        _wanted(settings).unlink(missing_ok=True)
    return daemon(settings).stop(timeout)


def ensure(settings: Settings) -> str | None:
    """Start ingest if it is wanted and not running; say what was done, if anything."""
    want, trigger = wanted(settings)
    if not want or daemon(settings).pid() is not None:
        return None
    log.warning("ingest is wanted but not running: starting it")
    pid = start(settings, trigger)
    return f"ingest restarted (pid {pid})"


def read_status(settings: Settings) -> dict[str, Any]:
    return daemon(settings).read_status()


def describe(settings: Settings, *, kafka_up: bool = True) -> tuple[bool, str]:
    """Whether ingest runs, a few lines on each query's latest batch, and (if Kafka
    is up) how far bronze is behind Kafka now, in records and in seconds."""
    d = daemon(settings)
    pid = d.pid()
    lines = [f"ingest: {'running, pid ' + str(pid) if pid else 'not running'} (log {d.log})"]
    status = read_status(settings)
    copied = status.get("bronze", {}).get("copied")
    if not kafka_up:
        lines.append("  behind Kafka: unknown (Kafka is down)")
    elif copied:
        behind = lag.ingest_lag(settings, {int(p): int(o) for p, o in copied.items()})
        lines.append("  behind Kafka: " + "; ".join(str(x) for x in behind))
    else:
        lines.append("  behind Kafka: unknown until ingest's first batch")
    for name, st in sorted(status.items()):
        lines.append(
            f"  {name:<7} {st.get('state', '?'):<8} batch {st.get('batch', '-')}, "
            f"{st.get('rows_in', 0):,} rows in the last batch, "
            f"{st.get('rows_per_s', 0):,.0f} rows/s, at {st.get('at', '-')}"
            + (f"\n          error: {st['error']}" if st.get("error") else "")
        )
    return pid is not None, "\n".join(lines)
