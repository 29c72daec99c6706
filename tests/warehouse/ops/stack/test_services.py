"""The service mechanics, on throw-away processes (no real services needed)."""

import dataclasses
import os
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from tests.ports import free_port
from warehouse.ops.stack import kafka as kafka_module
from warehouse.ops.stack import postgres as postgres_module
from warehouse.ops.stack import services
from warehouse.ops.stack.base import Starting
from warehouse.ops.stack.process import PidFile, Proc, ServiceError, port_open, wait_until
from warehouse.ops.stack.supervisor import Supervisor


@pytest.fixture
def local(settings, tmp_path):
    """Settings of a state folder of its own, whose supervisord is stopped after."""
    state = tmp_path / "state"
    yield dataclasses.replace(settings, state_dir=state)
    Supervisor.of_state(state).shutdown(30)


class Dummy(services.Service):
    """An HTTP server standing in for a service, healthy once its port answers."""

    name = "dummy"
    health_timeout = 10.0

    def __init__(self, settings, port, script=None):
        super().__init__(settings)
        self.port = port
        self.script = script

    def ports(self) -> Sequence[int]:
        return [self.port]

    def procs(self) -> Sequence[Proc]:
        argv = [sys.executable, "-m", "http.server", str(self.port), "--bind", "127.0.0.1"]
        if self.script:
            argv = [sys.executable, "-c", self.script]
        return [Proc("dummy", argv)]

    def healthy(self) -> bool:
        return port_open(self.port)


def test_start_twice_is_a_no_op_and_stop_stops_it(local):
    svc = Dummy(local, free_port())
    try:
        assert svc.start() is True
        pid = svc.live_pids()["dummy"]
        assert svc.start() is False
        assert svc.live_pids()["dummy"] == pid
        status = svc.status()
        assert status.healthy and status.procs[0].pid == pid
        # supervisord's umask (077): a service's log and files are its owner's only.
        assert status.procs[0].log.stat().st_mode & 0o077 == 0
        umask = Path(f"/proc/{pid}/status").read_text().split("Umask:")[1].split()[0]
        assert umask == "0077"
    finally:
        assert svc.stop() is True
    assert svc.live_pids()["dummy"] is None
    assert not port_open(svc.port)
    assert svc.stop() is False  # stopping again: nothing to do, no error


class Named(Dummy):
    """A dummy of its own name, which records its setup once it answers."""

    def __init__(self, settings, port, name):
        self.name = name
        super().__init__(settings, port)
        self.set_up = False

    def procs(self) -> Sequence[Proc]:
        return [Proc(self.name, [sys.executable, "-m", "http.server", str(self.port)])]

    def after_start(self) -> None:
        self.set_up = True


def test_services_started_together_are_all_awaited_when_one_fails(local):
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    first = Named(local, free_port(), "first")
    second = Named(local, taken.getsockname()[1], "second")
    third = Named(local, free_port(), "third")
    starting = Starting()
    try:
        for svc in (first, second, third):
            starting.begin(svc)
        with pytest.raises(ServiceError, match=r"\(second\) is already taken"):
            starting.done()
        # Begun before the failure: still awaited, and set up.
        assert first.set_up and first.healthy()
        # Nothing is begun after a failure.
        assert third.live_pids() == {"third": None} and not third.set_up
    finally:
        taken.close()
        for svc in (first, third):
            svc.stop()


def test_supervisord_restarts_a_killed_service_and_rotates_its_log(local):
    svc = Dummy(local, free_port())
    try:
        svc.start()
        pid = svc.live_pids()["dummy"]
        # Up for supervisord once it has lived 5 s (startsecs).
        assert wait_until(lambda: svc.status().procs[0].state == "RUNNING", 15)
        assert pid is not None and svc.live_pids()["dummy"] == pid
        os.kill(pid, 9)
        assert wait_until(
            lambda: svc.live_pids()["dummy"] not in (None, pid) and svc.healthy(), 30
        ), svc.supervisor.info("dummy")
        section = (svc.supervisor.base / "programs" / "dummy.conf").read_text()
        # A service comes back after any exit, its whole group is stopped, and its
        # log is rotated; the file holds its environment, so it is owner-only.
        assert "autorestart=true" in section and "stopasgroup=true" in section
        assert "stdout_logfile_maxbytes=50MB" in section
        assert (svc.supervisor.base / "programs" / "dummy.conf").stat().st_mode & 0o777 == 0o600
    finally:
        svc.stop()
    # Stopped by us, it stays stopped; with nothing left, `down` stops supervisord.
    time.sleep(6)
    assert svc.live_pids()["dummy"] is None and not port_open(svc.port)
    assert svc.supervisor.running()
    services.down(local, ["postgres"])
    assert not svc.supervisor.running()


@pytest.mark.parametrize("recorded", [True, False], ids=["pid file", "orphan"])
def test_a_service_running_outside_supervisord_is_taken_over(local, recorded):
    """Before supervisord, regauge kept a pid file per process; and a supervisord
    killed leaves its programs running. `regauge up` takes such a service over
    instead of failing on its taken port, and `down` would stop it."""
    port = free_port()
    svc = Dummy(local, port)
    legacy = subprocess.Popen(svc.procs()[0].argv, start_new_session=True)
    try:
        if recorded:
            svc.legacy_pidfile("dummy").write(legacy.pid)
        assert wait_until(lambda: svc.unsupervised() == {"dummy": legacy.pid}, 10)
        assert wait_until(svc.healthy, 10)
        assert svc.running() and svc.status().procs[0].state == "unsupervised"
        assert svc.start() is True
        assert legacy.wait(10) is not None
        assert svc.supervisor.pid("dummy") == svc.live_pids()["dummy"] != legacy.pid
        assert not PidFile(svc.legacy_pidfile("dummy").path).path.exists()
    finally:
        svc.stop()
        if legacy.poll() is None:
            legacy.kill()


def test_a_service_up_for_long_that_stopped_answering_is_restarted(local, tmp_path):
    """Alive for supervisord but wedged (not answering for longer than its health
    timeout): `regauge up` restarts it rather than waiting for it."""
    wedged = tmp_path / "wedged"
    wedged.touch()
    port = free_port()
    # One line, with no space before a ';': supervisord's config has comments.
    script = ";".join(
        [
            "import os,sys,time,runpy",
            f"os.path.exists({str(wedged)!r}) and time.sleep(600)",
            f"sys.argv=['http.server','{port}','--bind','127.0.0.1']",
            "runpy.run_module('http.server',run_name='__main__')",
        ]
    )
    svc = Dummy(local, port, script)
    svc.health_timeout = 8
    try:
        svc.launch()
        first = svc.live_pids()["dummy"]
        time.sleep(svc.health_timeout + 1)
        assert first is not None and not svc.healthy()
        wedged.unlink()
        assert svc.start() is True
        assert svc.healthy() and svc.live_pids()["dummy"] not in (None, first)
    finally:
        svc.stop()


def test_a_taken_port_is_refused_in_one_line_naming_port_and_service(local):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        svc = Dummy(local, port)
        with pytest.raises(ServiceError) as err:
            svc.start()
    assert str(err.value).startswith(f"port {port} (dummy) is already taken by another process")
    assert "\n" not in str(err.value)
    assert svc.live_pids()["dummy"] is None


def test_a_service_that_never_gets_healthy_shows_its_log_and_is_stopped(local):
    script = "import time; print('still warming up', flush=True); time.sleep(60)"
    svc = Dummy(local, free_port(), script)
    # Long enough for the child to start and print on 2 busy cores.
    svc.health_timeout = 8
    with pytest.raises(ServiceError) as err:
        svc.start()
    message = str(err.value)
    assert "dummy did not become healthy in time" in message
    assert "still warming up" in message
    assert svc.live_pids()["dummy"] is None


def test_a_service_that_dies_says_so_with_its_log(local):
    script = "import sys; print('config is broken: no such catalog', flush=True); sys.exit(3)"
    svc = Dummy(local, free_port(), script)
    with pytest.raises(ServiceError) as err:
        svc.start()
    assert "dummy exited" in str(err.value)
    assert "config is broken: no such catalog" in str(err.value)


class Lingering(Dummy):
    """Goes only 5 s after SIGTERM (room for both stops to be asked on 2 busy cores), and
    writes down when it was asked and when it went."""

    def __init__(self, settings, port, name, record):
        super().__init__(settings, port)
        self.name = name
        # A file, not `-c`: supervisord cannot run a command line with line breaks.
        self.path = record.parent / f"{name}.py"
        self.path.write_text(
            "import http.server, signal, sys, time\n"
            "def term(*_):\n"
            f"    open({str(record)!r}, 'a').write('asked {name} %f\\n' % time.time())\n"
            "    time.sleep(5)\n"
            f"    open({str(record)!r}, 'a').write('gone {name} %f\\n' % time.time())\n"
            "    sys.exit(0)\n"
            "signal.signal(signal.SIGTERM, term)\n"
            f"http.server.HTTPServer(('127.0.0.1', {port}), http.server.BaseHTTPRequestHandler)"
            ".serve_forever()\n"
        )

    def procs(self) -> Sequence[Proc]:
        return [Proc(self.name, [sys.executable, str(self.path)])]


def test_services_stopped_together_are_all_asked_before_any_has_gone(local, tmp_path):
    record = tmp_path / "stops.log"
    both = [Lingering(local, free_port(), name, record) for name in ("first", "second")]
    for svc in both:
        svc.start()
    assert services.stop_together(both) == ["first", "second"]
    events = [line.split() for line in record.read_text().splitlines()]
    asked = [float(t) for what, _, t in events if what == "asked"]
    gone = [float(t) for what, _, t in events if what == "gone"]
    assert len(asked) == len(gone) == 2
    assert max(asked) < min(gone)  # one after the other would ask the second after
    assert all(svc.live_pids()[svc.name] is None for svc in both)
    assert services.stop_together(both) == []  # nothing left running


def test_down_with_nothing_running_is_fine(local):
    services.down(local)
    assert all(not svc.running() for svc in services.services(local))


def test_the_stack_keeps_its_services_and_their_order(local):
    assert [svc.name for svc in services.services(local)] == [
        "postgres",
        "kafka",
        "trino",
        "airflow",
    ]
    assert [svc.name for svc in services.services(local, ["airflow", "kafka"])] == [
        "kafka",
        "airflow",
    ]


def test_callers_still_find_every_public_name_in_services():
    # cli/stack.py, tools (chaos, demo, bench), ops/airflow_client.py and the
    # integration tests import these from services.py; they live in other modules now.
    for name in services.__all__:
        assert hasattr(services, name), name
    assert services.Kafka.__module__ == "warehouse.ops.stack.kafka"
    assert issubclass(services.Airflow, services.Service)


def test_unknown_service_names_are_refused(local):
    with pytest.raises(ServiceError, match="unknown service zookeeper"):
        services.services(local, ["zookeeper"])


def test_kafka_cluster_ids_never_look_like_an_option():
    # A leading '-' made the storage tool read the id as a flag (a 1-in-64 CI failure).
    ids = [kafka_module._kafka_cluster_id() for _ in range(3000)]
    assert all(len(i) == 22 and not i.startswith("-") for i in ids)
    assert len(set(ids)) == len(ids)


def test_kafka_storage_formats_with_an_id_that_starts_with_a_dash(local, monkeypatch):
    # Patched where Kafka.prepare looks it up: kafka.py, not services.py.
    monkeypatch.setattr(kafka_module, "_kafka_cluster_id", lambda: "-" + "A" * 21)
    kafka = services.Kafka(local)
    kafka.prepare()
    assert (
        "cluster.id=-AAAAAAAAAAAAAAAAAAAAA" in (kafka.home / "data" / "meta.properties").read_text()
    )


def test_kept_secrets_are_owner_only_and_so_is_their_folder(tmp_path):
    """The cluster's, Airflow's and PostgreSQL's secrets are owner-only from their
    first byte and the same on every read; so is the folder that holds them. The
    folders above keep the usual mode: `keep_private` closes the state folder itself
    when the stack starts (the postgres account's home then lives outside it)."""
    from warehouse.ops.stack import base

    usual = os.umask(0o022)
    os.umask(usual)
    secret = tmp_path / "state" / "cluster" / "secrets" / "s3"
    first = base.kept_secret(secret)
    assert len(first) >= 32 and base.kept_secret(secret) == first
    assert secret.stat().st_mode & 0o777 == 0o600
    assert secret.parent.stat().st_mode & 0o777 == 0o700
    for folder in (tmp_path / "state", tmp_path / "state" / "cluster"):
        assert folder.stat().st_mode & 0o777 == 0o777 & ~usual, folder
    assert [p.name for p in secret.parent.iterdir()] == ["s3"], "a draft was left"


def test_the_state_folder_and_a_local_lake_are_made_owner_only(local, tmp_path):
    """Issue 68, A.2: another local account lists and reads neither (an integration
    test, test_shared_machine, shows it as that account)."""
    from warehouse.ops.stack import base

    lake = tmp_path / "lake"
    lake.mkdir(mode=0o755)
    local.state_dir.mkdir(mode=0o755)
    base.keep_private(dataclasses.replace(local, lake_root=str(lake)))
    assert local.state_dir.stat().st_mode & 0o777 == 0o700
    assert lake.stat().st_mode & 0o777 == 0o700
    # A lake on an object store is not a folder here: nothing to close.
    base.keep_private(dataclasses.replace(local, lake_root="s3a://bucket/lake"))
    assert not (tmp_path / "s3a:").exists()


def test_rendered_configs_are_owner_only_even_where_an_older_one_was_not(tmp_path):
    """Trino's catalog of PostgreSQL holds its password (issue 68, A.1)."""
    from warehouse.ops.stack import base

    template = tmp_path / "ops.properties"
    template.write_text("connection-password=${pw}\n")
    target = tmp_path / "etc" / "catalog" / "ops.properties"
    target.parent.mkdir(parents=True)
    target.write_text("old\n")
    target.chmod(0o644)
    base._render(template, target, pw="s3cr3t")
    assert target.read_text() == "connection-password=s3cr3t\n"
    assert target.stat().st_mode & 0o777 == 0o600


def test_postgres_lets_only_this_account_on_its_socket_and_no_one_without_a_password():
    """Issue 68, A.1: no `trust` anywhere; on the socket only the project's account
    (and, when root runs the server as postgres, the server's own) may log in, and
    only as the superuser; TCP always asks for the password."""
    files = postgres_module.auth_files(owner="root", server="postgres")
    hba = [line for line in files["pg_hba.conf"].splitlines() if not line.startswith("#")]
    assert hba == [
        "local all postgres peer map=regauge",
        "host all all 127.0.0.1/32 scram-sha-256",
        "host all all ::1/128 scram-sha-256",
    ]
    ident = [line for line in files["pg_ident.conf"].splitlines() if not line.startswith("#")]
    assert ident == ["regauge root postgres", "regauge postgres postgres"]
    alone = postgres_module.auth_files(owner="ann", server=None)["pg_ident.conf"]
    assert alone.splitlines()[1:] == ["regauge ann postgres"]


def test_airflow_admin_password_is_made_owner_only_and_a_readable_one_replaced(local):
    """Airflow prints a password it makes in its api-server's log; regauge makes it
    first, so Airflow makes none (issue 68, A.3)."""
    import json

    airflow = services.Airflow(local)
    airflow.home.mkdir(parents=True)
    airflow._keep_admin_password()
    first = airflow.admin_password()
    assert first and len(first) >= 20
    assert airflow.passwords_file.stat().st_mode & 0o777 == 0o600
    airflow._keep_admin_password()
    assert airflow.admin_password() == first
    # One an older regauge let Airflow make (and print) is replaced.
    airflow.passwords_file.write_text(json.dumps({"admin": "printed"}))
    airflow.passwords_file.chmod(0o644)
    airflow._keep_admin_password()
    assert airflow.admin_password() not in (None, "printed", first)
    assert airflow.passwords_file.stat().st_mode & 0o777 == 0o600


def test_only_airflows_scheduler_resets_a_dead_schedulers_tasks_after_20_s(local):
    """A scheduler started after a crash resets the dead one's tasks once its last
    heartbeat is older than the threshold (test_versions.py waits just past it); the
    API server's health report keeps Airflow's own 30 s."""
    from warehouse.ops.stack.airflow import ORPHAN_RESET_AFTER_S

    airflow = services.Airflow(local)
    airflow.home.mkdir(parents=True)
    threshold = "AIRFLOW__SCHEDULER__SCHEDULER_HEALTH_CHECK_THRESHOLD"
    envs = {p.name: p.env for p in airflow.procs()}
    assert envs["airflow-scheduler"][threshold] == str(ORPHAN_RESET_AFTER_S) == "20"
    assert threshold not in envs["airflow-api-server"]
    assert threshold not in envs["airflow-dag-processor"]


@pytest.fixture
def private_checkout(settings, tmp_path):
    """Settings of a checkout the postgres account cannot reach (its state lives in
    /var/lib/regauge, as for a clone under /root), and that folder, removed after."""
    import hashlib
    import shutil
    from pathlib import Path

    if os.geteuid() != 0:
        pytest.fail("setup runs as root (it installs Debian's packages); so do the tests")
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    state = private / "main" / ".state"
    digest = hashlib.sha1(str(state).encode()).hexdigest()[:10]
    outside = Path("/var/lib/regauge") / digest
    try:
        yield dataclasses.replace(settings, state_dir=state), outside / "postgres"
    finally:
        shutil.rmtree(outside, ignore_errors=True)


def test_a_fresh_checkout_never_inherits_an_earlier_ones_postgres(private_checkout):
    """CI clones to the same path every time: the PostgreSQL cluster an earlier clone
    left in /var/lib/regauge (Airflow's runs, the view registry) must not greet the
    next one, whose .state and lake are new."""
    settings, outside = private_checkout
    stale = outside / "data" / "PG_VERSION"
    stale.parent.mkdir(parents=True)
    stale.write_text("16\n")
    pg = services.Postgres(settings)
    pg._place_home("postgres")
    assert pg.home.is_symlink() and pg.home.resolve() == outside
    assert outside.is_dir() and not stale.exists()
    # The link in place, the cluster is this checkout's own: a second start keeps it.
    kept = outside / "data" / "PG_VERSION"
    kept.parent.mkdir(parents=True)
    kept.write_text("16\n")
    pg._place_home("postgres")
    assert kept.exists()


def test_a_cluster_inside_the_state_folder_moves_out_when_the_folder_closes(private_checkout):
    """An older regauge kept the cluster in .state/postgres where the postgres account
    could reach it; .state/ is owner-only now (issue 68, A.2), so it moves out,
    whole, to where the account can reach it."""
    settings, outside = private_checkout
    mine = settings.state_dir / "postgres" / "data" / "PG_VERSION"
    mine.parent.mkdir(parents=True)
    mine.write_text("16\n")
    pg = services.Postgres(settings)
    pg._place_home("postgres")
    assert pg.home.is_symlink() and pg.home.resolve() == outside
    assert (outside / "data" / "PG_VERSION").read_text() == "16\n"


def test_an_earlier_checkouts_postgres_still_running_is_named_not_removed(private_checkout):
    import subprocess

    settings, outside = private_checkout
    data = outside / "data"
    pidfile = data / "postmaster.pid"
    pidfile.parent.mkdir(parents=True)
    # A process whose command line names the data folder, as `postgres -D` does.
    running = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", str(data)])
    try:
        pidfile.write_text(f"{running.pid}\n{data}\n")
        with pytest.raises(ServiceError, match=f"PostgreSQL \\(pid {running.pid}\\) still runs"):
            services.Postgres(settings)._place_home("postgres")
        assert pidfile.exists()
    finally:
        running.kill()
        running.wait()


def test_a_stale_postmaster_pid_reused_by_another_program_is_no_reason_to_stop(private_checkout):
    settings, outside = private_checkout
    pidfile = outside / "data" / "postmaster.pid"
    pidfile.parent.mkdir(parents=True)
    pidfile.write_text(f"{os.getpid()}\n")  # alive, but pytest, not a postmaster
    pg = services.Postgres(settings)
    pg._place_home("postgres")
    assert pg.home.resolve() == outside and not pidfile.exists()


def test_postgres_status_names_the_dsn_without_its_password(local):
    """`regauge status` shows how to connect, not the secret (issue 68, A.1)."""
    secret = dataclasses.replace(local, postgres_password="s3cr3t-pw")
    note = services.Postgres(secret).note()
    assert note.startswith(f"psql postgresql://{secret.postgres_user}@127.0.0.1:")
    assert "s3cr3t-pw" not in note
    assert secret.postgres_dsn().startswith(f"postgresql://{secret.postgres_user}:s3cr3t-pw@")


def test_old_task_logs_go_with_the_folders_they_leave_empty(tmp_path):
    """Airflow's task logs grow without end (issue 68, C): `regauge clean-airflow`
    removes those last written before the cut, and the folders left empty."""
    from warehouse.ops.stack.airflow import old_task_logs

    root = tmp_path / "logs"
    old = root / "dag_id=regauge_watchdog" / "run_id=scheduled__1" / "task_id=t" / "attempt=1.log"
    new = root / "dag_id=regauge_watchdog" / "run_id=scheduled__2" / "task_id=t" / "attempt=1.log"
    for path in (old, new):
        path.parent.mkdir(parents=True)
        path.write_text("x" * 100)
    cut = time.time() - 3600
    for folder in (old, *old.parents):
        if folder == root:
            break
        os.utime(folder, (cut - 60, cut - 60))
    assert old_task_logs(root, cut, remove=False) == (1, 100)
    assert old.exists()
    assert old_task_logs(root, cut, remove=True) == (1, 100)
    assert (
        not old.exists() and not (root / "dag_id=regauge_watchdog" / "run_id=scheduled__1").exists()
    )
    assert new.read_text() == "x" * 100
    assert old_task_logs(tmp_path / "none", cut, remove=True) == (0, 0)
