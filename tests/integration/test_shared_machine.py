"""A second local account, made by the test, gets into none of the stack's data or
secrets (issue 68, A.1 to A.3), and the project's own account keeps working.

Each probe runs as that account (`runuser`), so it meets the same file modes, the
same socket and the same logins an attacker with a shell on the machine would.
"""

from __future__ import annotations

import os
import pwd
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

from warehouse.ops.stack import services
from warehouse.ops.stack.airflow import Airflow
from warehouse.ops.stack.postgres import Postgres

PROBE = "regauge-probe"

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="making a second local account needs root"
)


@pytest.fixture(scope="module")
def probe() -> str:
    try:
        pwd.getpwnam(PROBE)
    except KeyError:
        subprocess.run(
            ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", PROBE],
            check=True,
        )
    return PROBE


def _as(account: str, *argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    extra = [f"{k}={v}" for k, v in (env or {}).items()]
    return subprocess.run(
        ["runuser", "-u", account, "--", "env", *extra, *argv],
        capture_output=True,
        text=True,
        timeout=30,
        cwd="/",
    )


def _by_name(stack: list[services.Service]) -> dict[str, services.Service]:
    return {svc.name: svc for svc in stack}


def _psql(*conninfo: str) -> list[str]:
    return [str(Postgres.bin_dir() / "psql"), "-X", "-w", "-c", "SELECT 1", *conninfo]


def test_postgres_refuses_another_account_on_its_socket_and_over_tcp(stack, settings, probe):
    pg = _by_name(stack)["postgres"]
    assert isinstance(pg, Postgres)
    port = str(settings.postgres_port)
    for user in ("postgres", settings.postgres_user):
        on_socket = _as(probe, *_psql(f"host={pg.run_dir} port={port} user={user} dbname=postgres"))
        assert on_socket.returncode != 0, f"the socket let {probe} in as {user}"
    # The password regauge used to ship, and no password at all.
    for password in ("regauge", ""):
        over_tcp = _as(
            probe,
            *_psql(f"host=127.0.0.1 port={port} user={settings.postgres_user} dbname=regauge"),
            env={"PGPASSWORD": password} if password else None,
        )
        assert over_tcp.returncode != 0
        assert "password authentication failed" in over_tcp.stderr or (
            "no password supplied" in over_tcp.stderr
        ), over_tcp.stderr
    assert settings.postgres_password != "regauge"
    assert "trust" not in (pg.data / "pg_hba.conf").read_text()
    assert not (pg.real_home / ".superuser-pw").exists()

    # The project's own account: the superuser on the socket, its role over TCP.
    with psycopg.connect(pg.superuser_conninfo()) as conn:
        assert conn.execute("SELECT current_user").fetchone() == ("postgres",)
    with psycopg.connect(settings.postgres_dsn()) as conn:
        assert conn.execute("SELECT current_user").fetchone() == (settings.postgres_user,)


def test_another_account_reads_no_lake_state_log_or_secret(stack, settings, probe):
    airflow = _by_name(stack)["airflow"]
    assert isinstance(airflow, Airflow)
    trino = _by_name(stack)["trino"]
    lake = Path(settings.lake_root)
    secrets = [
        settings.state_dir / "secrets" / "postgres",
        airflow.passwords_file,
        *sorted((trino.home / "etc" / "catalog").glob("*.properties")),
    ]
    logs = sorted((settings.state_dir / "logs").glob("*.log"))
    assert secrets[-1].name.endswith(".properties") and logs, "nothing to probe"
    for path in (*secrets, *logs):
        read = _as(probe, "cat", str(path))
        assert read.returncode != 0 and "Permission denied" in read.stderr, path
    for folder in (settings.state_dir, lake):
        listed = _as(probe, "ls", str(folder))
        assert listed.returncode != 0 and "Permission denied" in listed.stderr, folder
        # The mode itself, so that this fails as it should even where the
        # checkout's own parent folders happen to keep the account out.
        assert folder.stat().st_mode & 0o077 == 0, oct(folder.stat().st_mode)
    for path in (*secrets, *logs):
        assert path.stat().st_mode & 0o077 == 0, f"{path}: {oct(path.stat().st_mode)}"


def test_airflow_keeps_its_admin_password_out_of_its_log(stack, settings):
    airflow = _by_name(stack)["airflow"]
    assert isinstance(airflow, Airflow)
    password = airflow.admin_password()
    assert password
    log = airflow.logfile("airflow-api-server")
    assert log.is_file()
    assert password not in log.read_text(errors="replace")
    assert "Password for user" not in log.read_text(errors="replace")


class _Outcome:
    """A producer's delivery report: the error of each message (None if taken)."""

    def __init__(self) -> None:
        self.errors: list[object] = []

    def __call__(self, error: object, _message: object) -> None:
        self.errors.append(error)


def test_kafka_refuses_a_client_that_has_not_logged_in(stack, settings):
    """Issue 68, A.5: with no login, or a guessed one, a client can neither read the
    topics, nor produce a forged event, nor delete the topic. Kafka knows nothing of
    local accounts, so this runs in the test's own process: what keeps another
    account out is that it cannot read the secrets in .state/ (the test above)."""
    from confluent_kafka import KafkaException, Producer
    from confluent_kafka.admin import AdminClient

    from warehouse.base import kafka_conf, registry
    from warehouse.ops.stack.kafka import kafka_admin

    assert settings.kafka_security_protocol == "SASL_PLAINTEXT"
    ours = kafka_admin(settings)
    topic = registry.TOPIC
    before = ours.list_topics(topic, timeout=10).topics[topic]
    assert before.error is None
    strangers = {
        "no login": {"bootstrap.servers": settings.kafka_bootstrap},
        "a guessed password": {
            **kafka_conf.client_conf(settings),
            "sasl.password": "regauge",
        },
    }
    for who, conf in strangers.items():
        quiet = {**conf, "log_level": 0}
        with pytest.raises(KafkaException):
            AdminClient(quiet).list_topics(timeout=5)
        outcome = _Outcome()
        forged = Producer({**quiet, "message.timeout.ms": 5000})
        forged.produce(topic, key=b"forged", value=b"{}", on_delivery=outcome)
        forged.flush(15)
        assert outcome.errors and outcome.errors[0] is not None, f"{who}: a forged event was taken"
        deleted = AdminClient(quiet).delete_topics([topic], operation_timeout=5)[topic]
        with pytest.raises(KafkaException):
            deleted.result(timeout=15)
    after = ours.list_topics(topic, timeout=10).topics[topic]
    assert after.error is None and len(after.partitions) == len(before.partitions)


# What another account would send to take regauge's name: a statement posted as the
# pipeline's user, over Trino's HTTP protocol, with the standard library only.
_AS_REGAUGE = """
import sys, urllib.request
req = urllib.request.Request(
    sys.argv[1], data=b"SELECT current_user", headers={"X-Trino-User": "regauge"}
)
try:
    with urllib.request.urlopen(req, timeout=10) as resp:
        print("answered", resp.status)
except OSError as exc:
    print("refused", type(exc).__name__, exc)
    sys.exit(3)
"""


def test_trino_takes_no_connection_from_another_account(stack, settings, probe):
    """Issue 68, A.4: on the local profile Trino's user name is a header (docs/contract.md
    §7), so another account must not reach its port at all, or it could claim to be
    `regauge` and write to the lake or reroute analysts. The guard's nftables table
    resets its connections; the project's own account sends the same request and is
    answered, as `regauge`."""
    from warehouse.ops.stack import guard
    from warehouse.sql import trino_client

    url = f"{settings.trino_url}/v1/statement"
    # The system's Python: another account cannot read this checkout's virtualenv.
    theirs = _as(probe, "/usr/bin/python3", "-c", _AS_REGAUGE, url)
    assert theirs.returncode == 3 and theirs.stdout.startswith("refused"), (
        theirs.stdout + theirs.stderr
    )
    said = theirs.stdout
    assert "Connection reset" in said or "Connection refused" in said, said
    assert guard.holds(settings.trino_port)
    trino = _by_name(stack)["trino"]
    assert "only this account may connect" in trino.status().note

    ours = subprocess.run(
        [sys.executable, "-c", _AS_REGAUGE, url], capture_output=True, text=True, timeout=30
    )
    assert ours.returncode == 0 and ours.stdout.strip() == "answered 200", ours.stdout + ours.stderr
    assert trino_client.scalar(settings, "SELECT current_user") == "regauge"
