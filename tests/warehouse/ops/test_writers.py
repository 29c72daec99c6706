"""One writer at a time: a second is refused at once, naming the first; a holder that
dies, however it dies, leaves no lock behind."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from warehouse.base.settings import load
from warehouse.ops import writers


def test_a_second_writer_is_refused_with_the_holder_named(tmp_path):
    settings = load({"REGAUGE_STATE_DIR": str(tmp_path)})
    with writers.view(settings, "revenue_hourly", 2, "the view host"):
        with pytest.raises(writers.WriterBusy) as busy:
            writers.view(
                settings, "revenue_hourly", 2, "`regauge views run --mode replay`"
            ).acquire()
        message = str(busy.value)
        assert message.startswith("view revenue_hourly_v2 is being written by the view host (pid ")
        assert "`regauge views run --mode replay` is refused: stop that one first" in message
        # Another version, and ingest, are other things to write.
        with writers.view(settings, "revenue_hourly", 1, "x"), writers.ingest(settings, "y"):
            pass
    # Released: the next writer gets it.
    with writers.view(settings, "revenue_hourly", 2, "`regauge views run --mode replay`"):
        pass


def test_a_writer_killed_with_sigkill_leaves_no_lock(tmp_path):
    settings = load({"REGAUGE_STATE_DIR": str(tmp_path)})
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import time; from warehouse.base.settings import load; "
            "from warehouse.ops import writers; "
            f"s = load({{'REGAUGE_STATE_DIR': {str(tmp_path)!r}}}); "
            "w = writers.ingest(s, 'ingest').acquire(); print('held', flush=True); time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        with pytest.raises(writers.WriterBusy, match=rf"by ingest \(pid {holder.pid}, since "):
            writers.ingest(settings, "`regauge ingest-once`").acquire()
    finally:
        holder.kill()
        holder.wait()
    deadline = time.monotonic() + 5
    while True:
        try:
            writers.ingest(settings, "`regauge ingest-once`").acquire().release()
            break
        except writers.WriterBusy:
            assert time.monotonic() < deadline, "the lock outlived its holder"
            time.sleep(0.1)


def test_a_view_name_is_checked_before_it_becomes_a_file(tmp_path):
    settings = load({"REGAUGE_STATE_DIR": str(tmp_path)})
    with pytest.raises(ValueError, match="plain identifier"):
        writers.view(settings, "../x", 1, "h")
