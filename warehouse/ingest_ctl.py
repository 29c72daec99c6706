"""`regauge ingest start|stop|status`: ingest as a background process with a pid file.

`regauge ingest run` is the process itself (foreground, logs to stdout);
`start` launches it detached with its log in the state directory, the same
way the stack's services run, so `stop` and `status` find it again.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from warehouse.settings import Settings
from warehouse.stack import process
from warehouse.stack.process import PidFile, Proc, ServiceError


@dataclass(frozen=True)
class Paths:
    pidfile: PidFile
    log: Path
    status: Path


def paths(settings: Settings) -> Paths:
    base = settings.state_dir / "ingest"
    return Paths(PidFile(base / "ingest.pid"), base / "ingest.log", base / "status.json")


def start(settings: Settings, trigger: str | None, timeout: float = 180.0) -> int:
    """Launch `regauge ingest run` detached; wait until both queries report running."""
    p = paths(settings)
    pid = p.pidfile.live_pid()
    if pid is not None:
        print(f"ingest already running (pid {pid}); log: {p.log}")
        return pid
    p.status.unlink(missing_ok=True)
    argv = [sys.executable, "-m", "warehouse.cli", "ingest", "run"]
    if trigger:
        argv += ["--trigger", trigger]
    pid = process.spawn(Proc("ingest", argv), p.pidfile, p.log)

    def running() -> bool:
        states = read_status(settings)
        return all(states.get(q, {}).get("state") == "running" for q in ("bronze", "silver"))

    if not process.wait_until(running, timeout, alive=lambda: p.pidfile.live_pid() is not None):
        raise ServiceError(
            f"ingest did not start within {timeout:.0f} s; its log ends with:\n"
            + process.tail(p.log)
        )
    print(f"ingest running (pid {pid}); log: {p.log}")
    return pid


def stop(settings: Settings, timeout: float = 90.0) -> bool:
    """Ask ingest to finish its micro-batches and stop; force it after `timeout`."""
    p = paths(settings)
    pid = p.pidfile.live_pid()
    if pid is None:
        p.pidfile.clear()
        return False
    # Only the Python driver gets SIGTERM: it stops the queries between batches
    # and shuts Spark down; signalling the whole group would kill the JVM mid-commit.
    os.kill(pid, signal.SIGTERM)
    if not wait_for_exit(settings, timeout):
        print(f"ingest did not stop within {timeout:.0f} s; killing it")
    process.stop_group(pid, signal.SIGKILL, 10)
    p.pidfile.clear()
    return True


def read_status(settings: Settings) -> dict[str, Any]:
    try:
        loaded: dict[str, Any] = json.loads(paths(settings).status.read_text())
    except (OSError, ValueError):
        return {}
    return loaded


def describe(settings: Settings) -> tuple[bool, str]:
    """Whether ingest runs, and a few lines on each query's latest batch."""
    p = paths(settings)
    pid = p.pidfile.live_pid()
    lines = [f"ingest: {'running, pid ' + str(pid) if pid else 'not running'} (log {p.log})"]
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


def wait_for_exit(settings: Settings, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if paths(settings).pidfile.live_pid() is None:
            return True
        time.sleep(0.5)
    return False
