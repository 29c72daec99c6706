"""Daemons' command lines: view streams yield the cores to ingest when they are short."""

from __future__ import annotations

import os
import subprocess
import sys

from warehouse.base.settings import load
from warehouse.ops import ingest_ctl, streams
from warehouse.ops.daemon import Daemon


def test_view_streams_run_nicer_than_ingest(tmp_path):
    settings = load({"REGAUGE_STATE_DIR": str(tmp_path)})
    stream = streams.daemon(settings, "revenue_hourly", 2).argv()
    assert stream[:3] == ["nice", "-n", "10"]
    assert stream[3:] == [
        sys.executable, "-m", "warehouse.cli",
        "views", "run", "revenue_hourly", "2", "--mode", "stream",
    ]  # fmt: skip
    assert ingest_ctl.daemon(settings).argv()[0] == sys.executable
    off = load({"REGAUGE_STATE_DIR": str(tmp_path), "REGAUGE_VIEW_STREAM_NICE": "0"})
    assert streams.daemon(off, "revenue_hourly", 2).argv()[0] == sys.executable


def test_the_niceness_reaches_the_process(tmp_path):
    argv = Daemon("probe", tmp_path, ("settings",), nice=7).argv()
    # The same command line, asking the running process for its own niceness.
    shown = subprocess.run(
        [*argv[:3], sys.executable, "-c", "import os; print(os.nice(0))"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert shown.stdout.strip() == str(7 + os.nice(0))
