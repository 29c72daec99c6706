import socket
import subprocess
import sys
import time

from warehouse.stack.process import (
    PidFile,
    Proc,
    group_rss_bytes,
    port_taken,
    spawn,
    stop_group,
)


def test_a_spawned_process_is_tracked_and_stopped_with_its_children(tmp_path):
    pidfile = PidFile(tmp_path / "sleeper.pid")
    log = tmp_path / "sleeper.log"
    # A parent with a child in the same group: stopping must take both.
    script = (
        "import subprocess, time; subprocess.Popen(['sleep', '60']); "
        "print('hi', flush=True); time.sleep(60)"
    )
    pid = spawn(Proc("sleeper", [sys.executable, "-c", script]), pidfile, log)
    assert pidfile.live_pid() == pid
    deadline = time.monotonic() + 10
    while "hi" not in log.read_text() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert "starting sleeper" in log.read_text()
    assert group_rss_bytes(pid) > 0
    children = subprocess.run(
        ["pgrep", "-g", str(pid)], capture_output=True, text=True
    ).stdout.split()
    assert len(children) == 2

    stop_group(pid, 15, timeout=10)
    assert pidfile.live_pid() is None
    left = subprocess.run(["pgrep", "-g", str(pid)], capture_output=True, text=True).stdout.split()
    assert left == []


def test_a_recycled_pid_is_not_mistaken_for_ours(tmp_path):
    pidfile = PidFile(tmp_path / "x.pid")
    # Our own pid, but with a start time that is not its own: someone else's process.
    import os

    pidfile.path.write_text(f"{os.getpid()} 1\n")
    assert pidfile.live_pid() is None


def test_port_taken_sees_a_listener():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        assert port_taken(port)
    assert not port_taken(port)
