"""Daemons' command lines, the view host's scheduler pools (ingest goes first when
the cores are short), and the wanted set through which `regauge ingest|streams
start|stop` steer the view host."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from xml.etree import ElementTree

import pytest

from warehouse.base.settings import load
from warehouse.ops import ingest_ctl, processes, streams
from warehouse.ops.daemon import Daemon
from warehouse.ops.stack.process import wait_until
from warehouse.ops.stack.supervisor import Supervisor


@pytest.fixture(autouse=True)
def _no_supervisord_left(tmp_path):
    """Each daemon here runs under a supervisord of its own folder: stop them all."""
    yield
    for conf in tmp_path.rglob("supervisord.conf"):
        Supervisor(conf.parent).shutdown(30)


def test_ingest_goes_first_in_the_host_s_scheduler(tmp_path):
    """Ingest shares the view host's JVM; its pool is served before any view's."""
    settings = load({"REGAUGE_STATE_DIR": str(tmp_path)})
    host = streams.host(settings).argv()
    assert host == [sys.executable, "-m", "warehouse.cli", "streams", "host"]
    pools = ElementTree.parse(processes.FAIR_SCHEDULER_FILE).getroot().findall("pool")
    (ingest_pool,) = [p for p in pools if p.get("name") == processes.INGEST_POOL]
    # A pool under its minShare is offered free slots first; 2 is every local core.
    assert int(ingest_pool.findtext("minShare") or 0) >= 2
    assert int(ingest_pool.findtext("weight") or 1) > 1


def test_the_wanted_streams_are_what_start_and_stop_leave(tmp_path):
    settings = load({"REGAUGE_STATE_DIR": str(tmp_path)})
    assert streams.wanted(settings) == []
    streams.want(settings, "revenue_hourly", 2, True)
    streams.want(settings, "cart_sessions", 1, True)
    streams.want(settings, "revenue_hourly", 2, True)
    assert streams.wanted(settings) == [("cart_sessions", 1), ("revenue_hourly", 2)]
    # No host runs: wanted, but stopped, and no pid.
    assert [(s.name, s.pid, s.state) for s in streams.known(settings)] == [
        ("cart_sessions_v1", None, "stopped"),
        ("revenue_hourly_v2", None, "stopped"),
    ]
    assert streams.pid(settings, "revenue_hourly", 2) is None
    assert streams.stop(settings, "revenue_hourly", 2) == "revenue_hourly v2 stream was not running"
    assert streams.wanted(settings) == [("cart_sessions", 1)]


def test_a_stream_name_is_checked_before_it_becomes_a_file(tmp_path):
    settings = load({"REGAUGE_STATE_DIR": str(tmp_path)})
    with pytest.raises(ValueError, match="plain identifier"):
        streams.want(settings, "../../etc", 1, True)
    assert not (tmp_path / "streams").exists()


class _Sleeper(Daemon):
    """A daemon that says it runs, then sleeps: no Spark needed to start one."""

    # Python run before it says it runs (a subclass sets how it takes SIGTERM).
    setup = "import time"

    def argv(self) -> list[str]:
        say = f"open({str(self.status_file)!r}, 'w').write('{{\"state\": \"running\"}}')"
        return [sys.executable, "-c", f"{self.setup}; {say}; time.sleep(60)"]


def test_two_starts_at_once_launch_one_daemon(tmp_path):
    import threading

    d = _Sleeper("probe", tmp_path, ())
    results: list[tuple[int, bool]] = []
    threads = [
        threading.Thread(target=lambda: results.append(d.start(lambda st: bool(st), 30)))
        for _ in range(4)
    ]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len({pid for pid, _ in results}) == 1, results
        assert sorted(started for _, started in results) == [False, False, False, True]
    finally:
        assert d.stop(5)
    assert d.pid() is None


class _SlowToStop(_Sleeper):
    """Takes two seconds to finish after SIGTERM, as a host ends its micro-batch."""

    setup = (
        "import signal, sys, time; "
        "signal.signal(signal.SIGTERM, lambda *a: (time.sleep(2), sys.exit(0)))"
    )


def test_a_start_while_stopping_waits_and_its_daemon_stays_known(tmp_path):
    import threading

    d = _SlowToStop("probe", tmp_path, ())
    first, _ = d.start(lambda st: bool(st), 30)
    stopping = threading.Thread(target=d.stop, args=(10,))
    stopping.start()
    # Until stop() has signalled the first and waits for it, holding the launch lock
    # (a fixed sleep could end before that on 2 busy cores).
    stopping_now = wait_until(lambda: d.supervisor.state("probe") == "STOPPING", 20, interval=0.05)
    assert stopping_now, d.supervisor.info("probe")
    try:
        second, started = d.start(lambda st: bool(st), 30)
        stopping.join()
        # The start waited for the stop, then launched: the new daemon is the one
        # the pid file names, so the next stop or start finds it.
        assert started and second != first
        assert d.pid() == second
    finally:
        d.stop(10)
    assert d.pid() is None


def test_a_daemon_runs_in_the_project_folder_not_its_launcher_s(tmp_path, monkeypatch):
    """The watchdog starts the view host from an Airflow task, whose temporary folder
    is deleted when the task ends; a daemon left in it could not start Spark."""
    from warehouse.base.settings import REPO_ROOT

    launcher = tmp_path / "task-folder"
    launcher.mkdir()
    monkeypatch.chdir(launcher)
    d = _Sleeper("probe", tmp_path / "state", ())
    try:
        pid, started = d.start(lambda st: bool(st), 30)
        assert started
        assert Path(f"/proc/{pid}/cwd").resolve() == REPO_ROOT.resolve()
    finally:
        assert d.stop(5)


def test_supervisord_starts_a_killed_daemon_again_and_rotates_its_log(tmp_path):
    """A kill -9 (the OOM killer's, say) is answered within seconds, with no watchdog."""
    import os
    import signal

    d = _Sleeper("probe", tmp_path, ())
    first, started = d.start(lambda st: bool(st), 30)
    assert started
    os.killpg(first, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while d.pid() in (None, first):
        assert time.monotonic() < deadline, d.supervisor.info("probe")
        time.sleep(0.2)
    (program,) = d.supervisor.programs()
    assert (program["name"], program["statename"]) in {("probe", "STARTING"), ("probe", "RUNNING")}
    section_file = d.supervisor.base / "programs" / "probe.conf"
    # It holds the starter's REGAUGE_* settings, passwords among them.
    assert section_file.stat().st_mode & 0o777 == 0o600
    section = section_file.read_text()
    assert f"stdout_logfile={d.log}" in section
    assert "stdout_logfile_maxbytes=50MB" in section and "autorestart=unexpected" in section
    # A stop asked for stays a stop.
    assert d.stop(10)
    time.sleep(6)
    assert d.pid() is None
    assert (d.supervisor.info("probe") or {}).get("statename") == "STOPPED"


def test_ingest_is_wanted_from_start_until_stop_unless_kept(tmp_path):
    settings = load({"REGAUGE_STATE_DIR": str(tmp_path)})
    assert ingest_ctl.wanted(settings) == (False, None)
    assert ingest_ctl.ensure(settings) is None  # not wanted: nothing to do
    # What `start` leaves before it launches (no Spark here).
    marker = tmp_path / "ingest" / "wanted"
    marker.parent.mkdir(parents=True)
    marker.write_text("5 seconds\n")
    assert ingest_ctl.wanted(settings) == (True, "5 seconds")
    # No view host runs here, so ingest is not running; `stop` no longer wants it.
    assert ingest_ctl.pid(settings) is None
    assert ingest_ctl.stop(settings) is False
    assert ingest_ctl.wanted(settings) == (False, None)


def test_a_setting_supervisord_cannot_pass_on_is_refused_by_name():
    from warehouse.ops.stack.process import ServiceError
    from warehouse.ops.stack.supervisor import _env_value

    assert _env_value("host", "REGAUGE_X", "a%b c") == 'REGAUGE_X="a%%b c"'
    assert _env_value("host", "X", "it's") == 'X="it\'s"'
    for bad in ('pa"ss', "line\nbreak", "x #comment", "y ;comment", "t\t#ab", "'q", "q'"):
        with pytest.raises(ServiceError, match=r"REGAUGE_PASSWORD holds .* to host;"):
            _env_value("host", "REGAUGE_PASSWORD", bad)
