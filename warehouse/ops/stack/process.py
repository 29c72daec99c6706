"""Watch and stop processes: ports, process groups, pid files, memory.

supervisord (`supervisor.py`) starts every long-running process. A pid file
holds a pid and its kernel start time, so a recycled pid never hits someone
else's process; regauge before supervisord kept one per service.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import socket
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path


class ServiceError(RuntimeError):
    """A service that could not be started or stopped; the message says what to do."""


@dataclass(frozen=True)
class Proc:
    """One long-running process of a service."""

    name: str
    argv: Sequence[str]
    env: dict[str, str] = field(default_factory=dict)
    cwd: Path | None = None
    user: str | None = None  # run as this user (PostgreSQL refuses to run as root)
    stop_signal: int = signal.SIGTERM
    # The title it gives itself in place of its command line (setproctitle), by
    # which it is found running outside supervisord.
    title: str | None = None


def _start_time(pid: int) -> str | None:
    """The kernel's start time of pid (clock ticks since boot), or None if gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may contain spaces; fields after ')' are fixed.
    fields = stat.rsplit(")", 1)[1].split()
    if fields[0] == "Z":  # a zombie is as good as gone
        return None
    return fields[19]


@dataclass(frozen=True)
class PidFile:
    path: Path

    def write(self, pid: int) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(f"{pid} {_start_time(pid)}\n")

    def live_pid(self) -> int | None:
        """The recorded pid if that very process is still running."""
        try:
            pid_s, started = self.path.read_text().split()
            pid = int(pid_s)
        except (OSError, ValueError):
            return None
        return pid if _start_time(pid) == started else None

    def clear(self) -> None:
        self.path.unlink(missing_ok=True)


def port_taken(port: int, host: str = "127.0.0.1") -> bool:
    """True if something already listens on host:port (binding would fail)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            return exc.errno == errno.EADDRINUSE
    return False


def port_open(port: int, host: str = "127.0.0.1", timeout: float = 0.5) -> bool:
    with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=timeout):
        return True
    return False


def argv(pid: int) -> list[str] | None:
    """The command line `pid` runs, its arguments decoded; None if it has ended (or is
    not ours to read). A pid outlives its process, so callers compare this with
    what they expect before they act on the pid."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    return [a.decode(errors="replace") for a in raw.split(b"\0") if a]


def tail(path: Path, lines: int = 25) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return f"(no log at {path})"
    return "\n".join(text.splitlines()[-lines:])


def stop_group(pid: int, sig: int, timeout: float = 30.0) -> None:
    """Signal pid's process group, wait for the leader to go, then force it."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, sig)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        _reap(pid)
        if _start_time(pid) is None and not group_alive(pid):
            return
        time.sleep(0.2)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)
    _reap(pid)


def _reap(pid: int) -> None:
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def wait_until(
    check: Callable[[], bool],
    timeout: float,
    *,
    alive: Callable[[], bool] = lambda: True,
    interval: float = 0.5,
) -> bool:
    """Poll check() until it is true, the timeout passes, or alive() turns false."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        if not alive():
            return False
        time.sleep(interval)
    return check()


@dataclass(frozen=True)
class ProcStat:
    pid: int
    ppid: int
    pgrp: int
    rss_bytes: int
    # User and system CPU time since the process started, in seconds (its own
    # threads; children it has waited for are not included).
    cpu_seconds: float = 0.0


def proc_stats() -> Iterator[ProcStat]:
    """Every live process's parent, group and resident memory, from /proc.

    A child that has not exec'd yet counts no memory of its own. The JVM starts
    programs (readlink, chmod for Hadoop's local file system) through posix_spawn: for
    that moment the child shares the JVM's address space, and /proc gives it the
    JVM's whole resident size. Summed over a process group, one such sample
    counted the view host's 4.5 GiB JVM twice in `make bench`'s memory peak. A
    fork child that still runs its parent's program on its parent's mapping
    (same executable, same virtual size) is the same case: its pages are the
    parent's until it writes to them.
    """
    page = os.sysconf("SC_PAGE_SIZE")
    tick = os.sysconf("SC_CLK_TCK")
    raw: dict[int, tuple[int, int, int, int, float]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # ended while we looked
        # After the command name: state, ppid, pgrp, ... vsize is the 21st field
        # and rss the 22nd.
        raw[int(stat.parent.name)] = (
            int(fields[1]),
            int(fields[2]),
            int(fields[20]),
            int(fields[21]) * page,
            _cpu_seconds(fields, tick),
        )
    for pid, (ppid, pgrp, vsize, rss, cpu) in raw.items():
        parent = raw.get(ppid)
        if parent is not None and parent[2] == vsize and _same_program(pid, ppid):
            rss = 0
        yield ProcStat(pid, ppid, pgrp, rss, cpu)


def _cpu_seconds(fields: list[str], tick: int) -> float:
    """User and system CPU time from a /proc stat line's fields after the command
    name (utime and stime are its 12th and 13th)."""
    return (int(fields[11]) + int(fields[12])) / tick


def thread_cpu_seconds(pid: int) -> dict[int, tuple[str, float]]:
    """Each thread of a process: its name (the first 15 characters) and CPU seconds."""
    tick = os.sysconf("SC_CLK_TCK")
    out: dict[int, tuple[str, float]] = {}
    for stat in Path(f"/proc/{pid}/task").glob("*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue  # ended while we looked
        name = text[text.index("(") + 1 : text.rindex(")")]
        out[int(stat.parent.name)] = (name, _cpu_seconds(text.rsplit(")", 1)[1].split(), tick))
    return out


def _same_program(pid: int, ppid: int) -> bool:
    try:
        return os.readlink(f"/proc/{pid}/exe") == os.readlink(f"/proc/{ppid}/exe")
    except OSError:  # ended, or not ours to read
        return False


def group_rss_bytes(pgid: int) -> int:
    """Resident memory of every process in a process group (a service and its children)."""
    return sum(p.rss_bytes for p in proc_stats() if p.pgrp == pgid)


def tree_pids(roots: Iterable[int], stats: list[ProcStat]) -> set[int]:
    """The roots and every process under them, whatever group or session it moved to
    (Airflow runs each task in a session of its own, under its scheduler)."""
    children: dict[int, list[int]] = {}
    for p in stats:
        children.setdefault(p.ppid, []).append(p.pid)
    found: set[int] = set()
    todo = [r for r in roots if any(p.pid == r for p in stats)]
    while todo:
        pid = todo.pop()
        if pid not in found:
            found.add(pid)
            todo.extend(children.get(pid, []))
    return found


def descendants_rss_bytes(pid: int, stats: list[ProcStat] | None = None) -> int:
    """Resident memory of the processes started under pid that stayed in its group.

    Daemons it launched in sessions of their own are left out: they are
    counted by their own group. `stats` is a snapshot to use (default: a fresh
    one), so several figures can come from the same moment.
    """
    stats = list(proc_stats()) if stats is None else stats
    group = next((p.pgrp for p in stats if p.pid == pid), None)
    children: dict[int, list[ProcStat]] = {}
    for p in stats:
        if p.pgrp == group:
            children.setdefault(p.ppid, []).append(p)
    total, todo = 0, list(children.get(pid, []))
    while todo:
        p = todo.pop()
        total += p.rss_bytes
        todo.extend(children.get(p.pid, []))
    return total
