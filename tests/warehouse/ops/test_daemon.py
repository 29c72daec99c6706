"""Daemons' command lines (the view host yields the cores to ingest when they are short),
and the wanted set through which `regauge streams start|stop` steer the view host."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from warehouse.base.settings import load
from warehouse.ops import ingest_ctl, streams
from warehouse.ops.daemon import Daemon


def test_view_streams_run_nicer_than_ingest(tmp_path):
    settings = load({"REGAUGE_STATE_DIR": str(tmp_path)})
    host = streams.host(settings).argv()
    assert host[:3] == ["nice", "-n", "10"]
    assert host[3:] == [sys.executable, "-m", "warehouse.cli", "streams", "host"]
    assert ingest_ctl.daemon(settings).argv()[0] == sys.executable
    off = load({"REGAUGE_STATE_DIR": str(tmp_path), "REGAUGE_VIEW_STREAM_NICE": "0"})
    assert streams.host(off).argv()[0] == sys.executable


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


def test_the_niceness_reaches_the_process(tmp_path):
    argv = Daemon("probe", tmp_path, ("settings",), nice=7).argv()
    # The same command line, asking the running process for its own niceness.
    shown = subprocess.run(
        [*argv[:3], sys.executable, "-c", "import os; print(os.nice(0))"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert shown.stdout.strip() == str(7 + os.nice(0))


class _Sleeper(Daemon):
    """A daemon that says it runs, then sleeps: no Spark needed to start one."""

    def argv(self) -> list[str]:
        say = f"open({str(self.status_file)!r}, 'w').write('{{\"state\": \"running\"}}')"
        return [sys.executable, "-c", f"import time; {say}; time.sleep(60)"]


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


def test_ingest_is_wanted_from_start_until_stop_unless_kept(tmp_path):
    settings = load({"REGAUGE_STATE_DIR": str(tmp_path)})
    assert ingest_ctl.wanted(settings) == (False, None)
    assert ingest_ctl.ensure(settings) is None  # not wanted: nothing to do
    # What `start` leaves before it launches (no Spark here).
    marker = tmp_path / "ingest" / "wanted"
    marker.parent.mkdir(parents=True)
    marker.write_text("5 seconds\n")
    assert ingest_ctl.wanted(settings) == (True, "5 seconds")
    # `regauge down` stops it and keeps it wanted; `regauge ingest stop` does not.
    assert ingest_ctl.stop(settings, keep_wanted=True) is False
    assert ingest_ctl.wanted(settings) == (True, "5 seconds")
    assert ingest_ctl.stop(settings) is False
    assert ingest_ctl.wanted(settings) == (False, None)
