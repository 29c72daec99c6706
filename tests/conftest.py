"""Fixtures shared by every test: the settings and one Spark session per run."""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Generator, Iterator
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from spark_jobs.engine.session import INTERPRETED_CONF, build_session
from warehouse.base import settings as settings_mod
from warehouse.base.settings import Settings


@pytest.fixture(scope="session")
def settings() -> Settings:
    return settings_mod.get()


@pytest.fixture(scope="session")
def spark(settings: Settings) -> Iterator[SparkSession]:
    """One session for the whole run: starting a JVM costs seconds.

    Without generated code: the tests' data are a few rows to some thousands, for
    which compiling each query (Janino, then the JIT) costs more than it saves.
    tests/spark_jobs/views/test_scope.py took 173 s instead of 245 s on 2 cores.
    Live batches run this way too (`runner.LIVE_SESSION_CONF`); test_runner.py
    compares them with a replay and a batch that compile theirs, and the
    integration tests' view host runs as deployed.
    """
    session = build_session("regauge-tests", settings, ui=False, extra_conf=INTERPRETED_CONF)
    yield session
    session.stop()


# -- the suite's time, where nobody can miss it ---------------------------------------
# `make test` must stay well inside CI's 90 minutes, and every test added must be paid
# for (issue 65). pytest's --durations lists the slowest tests; this adds each test
# file's time (setup, call and teardown summed), which docs/development.md keeps from
# each fresh-clone run. With pytest-xdist the controller receives every worker's
# reports, so the sums cover both workers.
#
# When tests run one at a time (the integration tests), a file also gets the CPU
# seconds the whole machine was busy while it ran: services, drivers and the tests
# alike. On two cores that, not the wall time, is what a test costs the suite (it
# moves between runs as the wall time does). Under xdist the workers' tests overlap,
# so no such figure is kept there. `make test` runs the Spark fast tests beside the
# integration tests, in a session of their own (infra/run-tests.sh), whose CPU is
# left out of the integration tests' figures.
FILES_SHOWN = 25
_busy_per_file: dict[str, float] = defaultdict(float)
BESIDE_SESSION = "REGAUGE_TESTS_BESIDE_SESSION"


def _busy_seconds() -> float | None:
    """CPU seconds this machine has been busy since boot, every core and process,
    but for the tests run beside these ones."""
    try:
        fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    except OSError:
        return None
    user, nice, system, _idle, _iowait, irq, softirq = map(int, fields[:7])
    busy = (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")
    beside = os.environ.get(BESIDE_SESSION)
    if beside:
        # A session's sum falls when its last process exits (its time goes to the
        # parent outside it), so the most seen stands for it from then on.
        _beside_seen[0] = max(_beside_seen[0], _session_cpu_seconds(int(beside)))
        busy -= _beside_seen[0]
    return busy


_beside_seen = [0.0]


def _session_cpu_seconds(session: int) -> float:
    """CPU seconds used so far by a session's processes, alive or reaped by one of
    them: a process's own time plus its reaped children's (proc(5): utime, stime,
    cutime, cstime)."""
    ticks = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            # The command name, in parentheses, may hold spaces: split after it.
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # gone since the listing
        # fields[0] is the state (field 3): the session is field 6, the times 14-17.
        if int(fields[3]) == session:
            ticks += sum(int(f) for f in fields[11:15])
    return ticks / os.sysconf("SC_CLK_TCK")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Generator[None, object, object]:
    before = _busy_seconds()
    try:
        return (yield)
    finally:
        after = _busy_seconds()
        if before is not None and after is not None:
            _busy_per_file[item.nodeid.split("::", 1)[0]] += after - before


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    per_file: dict[str, float] = defaultdict(float)
    for reports in terminalreporter.stats.values():
        for report in reports:
            if isinstance(report, pytest.TestReport):
                per_file[report.nodeid.split("::", 1)[0]] += report.duration
    if not per_file:
        return
    busy = bool(_busy_per_file)
    total = sum(per_file.values())
    # Under xdist the workers' times add up: the sum is more than the run's wall time.
    summed = "" if busy else ", every worker's time summed"
    terminalreporter.write_sep("=", f"time per test file, slowest {FILES_SHOWN}")
    terminalreporter.write_line(
        "  wall s   share" + ("   CPU s" if busy else "") + "  file (wall: setup, call, teardown)"
    )
    for path, seconds in sorted(per_file.items(), key=lambda kv: -kv[1])[:FILES_SHOWN]:
        cpu = f"{_busy_per_file.get(path, 0.0):8.0f}" if busy else ""
        terminalreporter.write_line(f"{seconds:8.1f}  {100 * seconds / total:5.1f}%{cpu}  {path}")
    cpu_total = f"{sum(_busy_per_file.values()):8.0f}" if busy else ""
    terminalreporter.write_line(
        f"{total:8.1f}  100.0%{cpu_total}  in all, {len(per_file)} files{summed}"
    )
