"""Each live view version's stream as a daemon, and the watchdog that keeps them up.

A version's stream (`regauge views run VIEW VERSION --mode stream`)
starts when its reprocess hands over from the replay, runs while the version
is building, ready or serving, and stops when it fails validation or is
retired. `ensure` is the watchdog: Airflow's `regauge_watchdog` calls it every
minute to restart any live version's stream that died.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass

from warehouse.base.settings import Settings
from warehouse.base.sqlnames import check_identifier
from warehouse.ops.daemon import Daemon
from warehouse.sql import versions

log = logging.getLogger(__name__)

_NAME = re.compile(r"(?P<view>[a-z][a-z0-9_]*)_v(?P<version>[1-9][0-9]*)")


@dataclass(frozen=True)
class Stream:
    view: str
    version: int
    pid: int | None
    state: str


def daemon(settings: Settings, view: str, version: int) -> Daemon:
    check_identifier(view, "view")
    return Daemon(
        f"{view}_v{int(version)}",
        settings.state_dir / "streams",
        ("views", "run", view, str(int(version)), "--mode", "stream"),
        nice=settings.view_stream_nice,
    )


def start(settings: Settings, view: str, version: int, timeout: float = 300.0) -> str:
    d = daemon(settings, view, version)
    pid, started = d.start(lambda st: st.get("state") == "running", timeout)
    return f"{view} v{version} stream {'started' if started else 'already running'} (pid {pid})"


def stop(settings: Settings, view: str, version: int) -> str:
    stopped = daemon(settings, view, version).stop()
    return f"{view} v{version} stream {'stopped' if stopped else 'was not running'}"


def known(settings: Settings) -> list[Stream]:
    """Every stream with a pid file, running or not."""
    found = []
    for pidfile in sorted((settings.state_dir / "streams").glob("*.pid")):
        m = _NAME.fullmatch(pidfile.stem)
        if not m:
            continue
        d = daemon(settings, m["view"], int(m["version"]))
        pid = d.pid()
        state = d.read_status().get("state", "?") if pid else "stopped"
        found.append(Stream(m["view"], int(m["version"]), pid, state))
    return found


def ensure(settings: Settings) -> list[str]:
    """Run the streams of live versions; stop those of failed or retired ones."""
    done = []
    for v in versions.versions(settings):
        running = daemon(settings, v.view_name, v.version).pid() is not None
        if v.live and not running:
            log.warning("%s is %s but its stream is not running: starting it", v.label, v.status)
            done.append(start(settings, v.view_name, v.version))
        elif v.status in ("failed", "retired") and running:
            done.append(stop(settings, v.view_name, v.version))
    return done
