import os
import signal
import socket
import subprocess
import sys
import time

from warehouse.ops.stack.process import (
    PidFile,
    descendants_rss_bytes,
    group_rss_bytes,
    port_taken,
    proc_stats,
    stop_group,
    thread_cpu_seconds,
    tree_pids,
    wait_until,
)


def test_a_process_group_is_tracked_and_stopped_with_its_children(tmp_path):
    """How a service an older regauge started itself (a pid file) is found and stopped."""
    pidfile = PidFile(tmp_path / "sleeper.pid")
    log = tmp_path / "sleeper.log"
    # A parent with a child in the same group: stopping must take both.
    script = (
        "import subprocess, time; subprocess.Popen(['sleep', '60']); "
        "print('hi', flush=True); time.sleep(60)"
    )
    with log.open("w") as out:
        pid = subprocess.Popen(
            [sys.executable, "-c", script], stdout=out, start_new_session=True
        ).pid
    pidfile.write(pid)
    assert pidfile.live_pid() == pid
    deadline = time.monotonic() + 10
    while "hi" not in log.read_text() and time.monotonic() < deadline:
        time.sleep(0.1)
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


def test_descendants_count_only_children_that_stayed_in_the_group():
    """The bench counts its own Spark JVM this way, and daemons it starts by their group."""
    import os

    # Each child says when its interpreter is up: a fixed sleep was too short for
    # that on 2 busy cores.
    script = "import time; print('ready', flush=True); time.sleep(30)"
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE)
    daemon = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, start_new_session=True
    )
    try:
        assert child.stdout is not None and daemon.stdout is not None
        assert child.stdout.readline() == daemon.stdout.readline() == b"ready\n"
        # Every figure from one snapshot: this worker's Spark JVM, also a child,
        # changes its memory between two reads of /proc.
        stats = list(proc_stats())
        rss = {p.pid: p.rss_bytes for p in stats}
        assert rss[child.pid] > 1_000_000 and rss[daemon.pid] > 1_000_000
        mine = descendants_rss_bytes(os.getpid(), stats)
        others = sum(
            p.rss_bytes
            for p in stats
            if p.ppid == os.getpid() and p.pid not in (child.pid, daemon.pid)
        )
        # The child is in; the daemon (its own session) is out.
        assert rss[child.pid] <= mine < rss[child.pid] + others + rss[daemon.pid] // 2
        assert descendants_rss_bytes(daemon.pid) == 0
    finally:
        child.kill()
        daemon.kill()
        child.wait()
        daemon.wait()


def test_a_tree_follows_children_into_sessions_of_their_own():
    """How the bench counts Airflow's tasks: each runs in a session of its own, under
    the scheduler, and starts a JVM there."""
    import os

    # A parent that starts a grandchild in a new session, as Airflow's task runner does.
    script = (
        "import subprocess, sys, time; "
        "subprocess.Popen(['sleep', '30'], start_new_session=True); time.sleep(30)"
    )
    parent = subprocess.Popen([sys.executable, "-c", script], start_new_session=True)
    stranger = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        # Until the parent's interpreter is up and has started it (a fixed sleep was
        # too short on 2 busy cores).
        wait_until(lambda: any(p.ppid == parent.pid for p in proc_stats()), 30, interval=0.1)
        stats = list(proc_stats())
        (grandchild,) = [p for p in stats if p.ppid == parent.pid]
        assert grandchild.pgrp != parent.pid  # a group of its own: group_rss_bytes misses it
        tree = tree_pids([parent.pid], stats)
        assert tree == {parent.pid, grandchild.pid}
        assert stranger.pid not in tree and os.getpid() not in tree
        assert tree_pids([2**22 + 7], stats) == set()  # a root that is gone
    finally:
        for proc in (parent, stranger):
            proc.kill()
            proc.wait()


def test_a_child_that_has_not_execd_counts_none_of_its_parents_memory():
    # The JVM starts programs through posix_spawn: until the exec, the child shares
    # the JVM's address space and /proc gives it the JVM's whole resident size. A
    # fork that runs on without exec is the same case and can be held still. The
    # exec'd child runs the same program with 30 MiB of its own, and says when it
    # holds them: the kernel counts resident pages lazily, per CPU, so a child that
    # has only just exec'd (a `sleep`, as this test once used) can read 0 pages.
    own = "import time\nheld = b'y' * (30 * 2**20)\nprint(flush=True)\ntime.sleep(60)\n"
    script = (
        "import os, subprocess, sys, time\n"
        "ballast = b'x' * (200 * 2**20)\n"
        f"execd = subprocess.Popen([sys.executable, '-c', {own!r}], stdout=subprocess.PIPE)\n"
        "execd.stdout.readline()\n"
        "forked = os.fork()\n"
        "if forked == 0:\n"
        "    time.sleep(60)\n"
        "    os._exit(0)\n"
        "os.write(1, f'{execd.pid} {forked}\\n'.encode())\n"
        "time.sleep(60)\n"
    )
    parent = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, start_new_session=True
    )
    try:
        assert parent.stdout is not None
        execd, forked = map(int, parent.stdout.readline().split())
        stats = {p.pid: p for p in proc_stats()}
        assert {p.pid for p in stats.values() if p.ppid == parent.pid} == {execd, forked}
        assert stats[parent.pid].rss_bytes > 200 * 2**20
        assert stats[forked].rss_bytes == 0
        # Its own 30 MiB and an interpreter, not its parent's 200.
        assert 30 * 2**20 < stats[execd].rss_bytes < 100 * 2**20
        assert group_rss_bytes(parent.pid) < (
            stats[parent.pid].rss_bytes + stats[execd].rss_bytes + 10 * 2**20
        )
    finally:
        stop_group(parent.pid, signal.SIGTERM)
        parent.wait(30)


def test_cpu_seconds_grow_with_a_process_busy_on_the_cpu_and_not_with_one_asleep():
    busy = subprocess.Popen(
        [sys.executable, "-c", "import time\nend = time.time() + 30\nwhile time.time() < end: pass"]
    )
    asleep = subprocess.Popen(["sleep", "30"])
    try:
        first = {p.pid: p.cpu_seconds for p in proc_stats()}
        time.sleep(1.0)
        then = {p.pid: p.cpu_seconds for p in proc_stats()}
        # One core for a second, less what the machine's other work took from it.
        assert then[busy.pid] - first[busy.pid] >= 0.3
        assert then[asleep.pid] - first[asleep.pid] < 0.05
    finally:
        busy.kill()
        asleep.kill()
        busy.wait(10)
        asleep.wait(10)


def test_thread_cpu_seconds_names_each_thread_and_counts_a_busy_one():
    import threading

    done = threading.Event()

    def spin() -> None:
        while not done.is_set():
            pass

    busy = threading.Thread(target=spin)
    busy.start()
    try:
        time.sleep(1.0)
        threads = thread_cpu_seconds(os.getpid())
    finally:
        done.set()
        busy.join()
    assert os.getpid() in threads  # the main thread's id is the process's
    assert all(isinstance(name, str) and name for name, _ in threads.values())
    others = [s for tid, (_, s) in threads.items() if tid != os.getpid()]
    # One thread spun for a second, less what the machine's other work took.
    assert max(others) >= 0.3
