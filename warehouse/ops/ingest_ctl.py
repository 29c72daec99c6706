"""`regauge ingest start|stop|status`: ingest as a background process with a pid file.

`regauge ingest run` is the process itself (foreground, logs to stdout);
`start` launches it detached with its log in the state directory, the same
way the stack's services run, so `stop` and `status` find it again.
"""

from __future__ import annotations

from typing import Any

from warehouse.base.settings import Settings
from warehouse.ops.daemon import Daemon


def daemon(settings: Settings, trigger: str | None = None) -> Daemon:
    args: tuple[str, ...] = ("ingest", "run")
    if trigger:
        args += ("--trigger", trigger)
    # The status file is written by spark_jobs.ingest.ProgressLog, per query.
    return Daemon("ingest", settings.state_dir / "ingest", args)


def start(settings: Settings, trigger: str | None, timeout: float = 180.0) -> int:
    """Launch `regauge ingest run` detached; wait until both queries report running."""
    d = daemon(settings, trigger)

    def running(states: dict[str, Any]) -> bool:
        return all(states.get(q, {}).get("state") == "running" for q in ("bronze", "silver"))

    pid, started = d.start(running, timeout)
    print(f"ingest {'running' if started else 'already running'} (pid {pid}); log: {d.log}")
    return pid


def stop(settings: Settings, timeout: float = 90.0) -> bool:
    """Ask ingest to finish its micro-batches and stop; force it after `timeout`."""
    return daemon(settings).stop(timeout)


def read_status(settings: Settings) -> dict[str, Any]:
    return daemon(settings).read_status()


def describe(settings: Settings) -> tuple[bool, str]:
    """Whether ingest runs, and a few lines on each query's latest batch."""
    d = daemon(settings)
    pid = d.pid()
    lines = [f"ingest: {'running, pid ' + str(pid) if pid else 'not running'} (log {d.log})"]
    for name, st in sorted(read_status(settings).items()):
        lag = st.get("lag") or {}
        behind = " ".join(f"p{k}={v:,}" for k, v in lag.items())
        lines.append(
            f"  {name:<7} {st.get('state', '?'):<8} batch {st.get('batch', '-')}, "
            f"{st.get('rows_in', 0):,} rows in the last batch, "
            f"{st.get('rows_per_s', 0):,.0f} rows/s, at {st.get('at', '-')}"
            + (f", lag {behind}" if behind else "")
            + (f"\n          error: {st['error']}" if st.get("error") else "")
        )
    return pid is not None, "\n".join(lines)
