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


def _holding(state: object, writer: str, seconds: float) -> subprocess.Popen[str]:
    """Another process that holds `writer` (Python, on settings `s`) for `seconds`,
    returned once it holds it."""
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import time; from warehouse.base.settings import load; "
            "from warehouse.ops import writers; "
            f"s = load({{'REGAUGE_STATE_DIR': {str(state)!r}}}); "
            f"w = {writer}.acquire(); print('held', flush=True); time.sleep({seconds})",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
    return holder


def test_a_writer_killed_with_sigkill_leaves_no_lock(tmp_path):
    settings = load({"REGAUGE_STATE_DIR": str(tmp_path)})
    holder = _holding(tmp_path, "writers.ingest(s, 'ingest')", 60)
    try:
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


def test_dbt_maintenance_and_reprocesses_never_run_beside_an_erasure(tmp_path):
    """Issue 68, B: beside an erasure, an incremental dbt model could merge back rows
    it read before the deletion, and a replay could read silver as it was. They
    hold the erasure's lock shared: together, but never with an erasure."""
    settings = load({"REGAUGE_STATE_DIR": str(tmp_path)})
    with (
        writers.beside_erasure_refused(settings, "`regauge dbt`"),
        writers.beside_erasure_refused(settings, "`regauge maintain`"),
    ):
        # ...and they are not an erasure to those who wait for one.
        assert writers.busy(settings, writers.ERASURE) is None
        with pytest.raises(writers.WriterBusy, match="a dbt run, table maintenance or a reprocess"):
            writers.erasure(settings, "`regauge forget`").acquire(wait_s=0.3)
    with writers.erasure(settings, "`regauge forget` (erasure e-1)"):
        assert (writers.busy(settings, writers.ERASURE) or "").startswith(
            "`regauge forget` (erasure e-1)"
        )
        with pytest.raises(writers.WriterBusy) as refused:
            writers.beside_erasure_refused(settings, "`regauge versions build`").acquire()
        message = str(refused.value)
        assert message.startswith("an erasure is running (`regauge forget` (erasure e-1) (pid ")
        assert (
            "`regauge versions build` beside it could bring the forgotten customer back" in message
        )


def test_an_erasure_waits_for_a_dbt_run_to_finish(tmp_path):
    settings = load({"REGAUGE_STATE_DIR": str(tmp_path)})
    holder = _holding(tmp_path, "writers.beside_erasure_refused(s, 'dbt')", 1.5)
    try:
        started = time.monotonic()
        with writers.erasure(settings, "`regauge forget`").acquire(wait_s=30):
            waited = time.monotonic() - started
        assert 0.3 < waited < 10, waited
    finally:
        holder.kill()
        holder.wait()


def test_regauge_maintain_is_refused_while_an_erasure_runs(tmp_path, monkeypatch, capsys):
    from warehouse.base import settings as settings_mod
    from warehouse.cli import main

    monkeypatch.setenv("REGAUGE_STATE_DIR", str(tmp_path))
    settings_mod.get.cache_clear()
    try:
        with writers.erasure(settings_mod.get(), "`regauge forget` (erasure e-2)"):
            assert main(["maintain"]) == 2
    finally:
        settings_mod.get.cache_clear()
    err = capsys.readouterr().err
    assert "an erasure is running (`regauge forget` (erasure e-2)" in err
    assert "`regauge maintain` beside it could bring the forgotten customer back" in err
