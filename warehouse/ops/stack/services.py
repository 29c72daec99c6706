"""The local stack: PostgreSQL, Kafka, Trino and Airflow, each with start, stop and status.

Every service keeps its data, config, logs and pids under the settings' state
directory. Starting one that already runs is a no-op; stopping signals only the
processes recorded in our own pid files.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import os
import secrets
import shutil
import signal
import subprocess
import urllib.error
import urllib.request
import uuid
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from string import Template

from confluent_kafka.admin import AdminClient

from warehouse.base import jvm, registry
from warehouse.base.settings import REPO_ROOT, Settings
from warehouse.ops.stack.process import (
    PidFile,
    Proc,
    ServiceError,
    group_rss_bytes,
    port_open,
    port_taken,
    spawn,
    stop_group,
    tail,
    wait_until,
)

log = logging.getLogger(__name__)

INFRA = REPO_ROOT / "infra"
AIRFLOW_VENV = REPO_ROOT / ".venv-airflow"


@dataclass(frozen=True)
class ProcStatus:
    name: str
    pid: int | None
    log: Path
    rss_bytes: int = 0


@dataclass(frozen=True)
class Status:
    service: str
    running: bool
    healthy: bool
    ports: Sequence[int]
    procs: Sequence[ProcStatus]
    note: str = ""


def _render(template: Path, target: Path, **values: object) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    text = Template(template.read_text()).substitute({k: str(v) for k, v in values.items()})
    target.write_text(text)


class Service(ABC):
    """One service of the stack; subclasses say how to prepare, run and probe it."""

    name: str
    health_timeout: float = 120.0

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.home = settings.state_dir / self.name

    # -- what a service declares ------------------------------------------------
    @abstractmethod
    def ports(self) -> Sequence[int]: ...

    @abstractmethod
    def procs(self) -> Sequence[Proc]: ...

    @abstractmethod
    def healthy(self) -> bool: ...

    def prepare(self) -> None:  # noqa: B027 - most services need no preparation
        """Write config and initialise data (idempotent); runs before every start."""

    def after_start(self) -> None:  # noqa: B027 - optional hook
        """Create what must exist once the service answers (idempotent)."""

    def note(self) -> str:
        return ""

    # -- shared mechanics ---------------------------------------------------------
    def pidfile(self, proc: str) -> PidFile:
        return PidFile(self.settings.state_dir / "run" / f"{proc}.pid")

    def logfile(self, proc: str) -> Path:
        return self.settings.state_dir / "logs" / f"{proc}.log"

    def _proc_names(self) -> list[str]:
        return [p.name for p in self.procs()]

    def live_pids(self) -> dict[str, int | None]:
        return {n: self.pidfile(n).live_pid() for n in self._proc_names()}

    def running(self) -> bool:
        pids = self.live_pids()
        return _all_live(pids)

    def start(self) -> bool:
        """Start whatever of this service is not running; True if anything started."""
        pids = self.live_pids()
        if _all_live(pids) and self.healthy():
            log.info("%s already running (pid %s)", self.name, _pids(pids))
            return False
        if any(pid is not None for pid in pids.values()):
            # Half up (one Airflow process died, say): restart it whole, cleanly.
            log.warning("%s is partly running; restarting it", self.name)
            self.stop()
        for port in self.ports():
            if port_taken(port):
                raise ServiceError(
                    f"port {port} ({self.name}) is already taken by another process: stop it, "
                    f"or choose another port (see `regauge settings` for the REGAUGE_* variables)"
                )
        self.prepare()
        procs = self.procs()
        for proc in procs:
            spawn(proc, self.pidfile(proc.name), self.logfile(proc.name))
        log.info("waiting for %s to become healthy (up to %.0f s)", self.name, self.health_timeout)
        ok = wait_until(self.healthy, self.health_timeout, alive=self.running, interval=1.0)
        if not ok:
            logs = "\n".join(
                f"--- last lines of {self.logfile(p.name)}\n{tail(self.logfile(p.name))}"
                for p in procs
            )
            state = "exited" if not self.running() else "did not become healthy in time"
            self.stop()
            raise ServiceError(f"{self.name} {state}\n{logs}")
        self.after_start()
        log.info("%s is up (pid %s)", self.name, _pids(self.live_pids()))
        return True

    def stop(self) -> bool:
        """Stop the processes we started, newest first; True if anything was running."""
        stopped = False
        for proc in reversed(self.procs()):
            pidfile = self.pidfile(proc.name)
            pid = pidfile.live_pid()
            if pid is not None:
                log.info("stopping %s (pid %d)", proc.name, pid)
                stop_group(pid, proc.stop_signal)
                stopped = True
            pidfile.clear()
        return stopped

    def status(self) -> Status:
        pids = self.live_pids()
        running = _all_live(pids)
        return Status(
            service=self.name,
            running=running,
            healthy=running and self.healthy(),
            ports=self.ports(),
            procs=[
                ProcStatus(n, pid, self.logfile(n), group_rss_bytes(pid) if pid else 0)
                for n, pid in pids.items()
            ],
            note=self.note(),
        )


def _all_live(pids: dict[str, int | None]) -> bool:
    return bool(pids) and all(pid is not None for pid in pids.values())


def _pids(pids: dict[str, int | None]) -> str:
    return ", ".join(str(p) for p in pids.values())


def _running_as_root() -> bool:
    return os.geteuid() == 0


# ---------------------------------------------------------------------------------
class Postgres(Service):
    """PostgreSQL from Debian's packages, in a private cluster under the state dir."""

    name = "postgres"
    health_timeout = 60.0

    @property
    def real_home(self) -> Path:
        """The cluster's directory with links resolved: the postgres account may
        not be able to pass through .state/ to follow the link itself."""
        return self.home.resolve()

    @property
    def data(self) -> Path:
        return self.real_home / "data"

    @property
    def run_dir(self) -> Path:
        return self.real_home / "run"

    def _place_home(self, user: str) -> None:
        """Give the postgres account a home it can reach.

        Run as root from a checkout under a private directory (say /root), the
        postgres account cannot traverse to .state/; the cluster then lives in
        /var/lib/regauge/<id>, with .state/postgres linking to it.
        """
        if self.home.exists() or self.home.is_symlink():
            return
        self.settings.state_dir.mkdir(parents=True, exist_ok=True)
        probe = subprocess.run(["test", "-x", str(self.settings.state_dir)], user=user, check=False)
        if probe.returncode == 0:
            return
        digest = hashlib.sha1(str(self.settings.state_dir).encode()).hexdigest()[:10]
        real = Path("/var/lib/regauge") / digest / "postgres"
        real.mkdir(parents=True, exist_ok=True)
        for parent in (real.parent.parent, real.parent):
            parent.chmod(0o755)
        self.home.symlink_to(real, target_is_directory=True)
        log.info("postgres cannot reach %s; its cluster lives in %s", self.settings.state_dir, real)

    @staticmethod
    def bin_dir() -> Path:
        found = sorted(Path("/usr/lib/postgresql").glob("*/bin/postgres"))
        if not found:
            raise ServiceError(
                "PostgreSQL server not found under /usr/lib/postgresql: run `make setup` "
                "(installs Debian's postgresql) or `apt-get install -y postgresql`"
            )
        return found[-1].parent

    def _user(self) -> str | None:
        # initdb and postgres refuse to run as root: use Debian's postgres account.
        return "postgres" if _running_as_root() else None

    def ports(self) -> Sequence[int]:
        return [self.settings.postgres_port]

    def procs(self) -> Sequence[Proc]:
        return [
            Proc(
                name="postgres",
                argv=[
                    str(self.bin_dir() / "postgres"),
                    "-D",
                    str(self.data),
                    "-p",
                    str(self.settings.postgres_port),
                    "-k",
                    str(self.run_dir),
                    "-c",
                    "listen_addresses=127.0.0.1",
                    "-c",
                    "max_connections=200",
                    "-c",
                    "shared_buffers=128MB",
                ],
                user=self._user(),
                # SIGINT is PostgreSQL's "fast" shutdown; SIGTERM waits for clients.
                stop_signal=signal.SIGINT,
            )
        ]

    def prepare(self) -> None:
        user = self._user()
        if user:
            self._place_home(user)
        for d in (self.real_home, self.run_dir):
            d.mkdir(parents=True, exist_ok=True)
            if user:
                shutil.chown(d, user)
        if (self.data / "PG_VERSION").is_file():
            return
        if self.data.exists():
            # Left by an initdb that was interrupted; initdb needs an empty directory.
            shutil.rmtree(self.data)
        log.info("initialising PostgreSQL cluster in %s", self.data)
        pwfile = self.real_home / ".superuser-pw"
        pwfile.write_text(secrets.token_hex(16) + "\n")
        if user:
            shutil.chown(pwfile, user)
        init = subprocess.run(
            [
                str(self.bin_dir() / "initdb"),
                "-D",
                str(self.data),
                "-U",
                "postgres",
                "--pwfile",
                str(pwfile),
                "--auth-local=trust",
                "--auth-host=scram-sha-256",
                "-E",
                "UTF8",
                "--locale=C.UTF-8",
            ],
            capture_output=True,
            text=True,
            user=user,
        )
        if init.returncode != 0:
            raise ServiceError(f"initdb failed in {self.data}:\n{init.stdout}{init.stderr}")

    def healthy(self) -> bool:
        proc = subprocess.run(
            [
                str(self.bin_dir() / "pg_isready"),
                "-q",
                "-h",
                str(self.run_dir),
                "-p",
                str(self.settings.postgres_port),
            ],
            check=False,
        )
        return proc.returncode == 0

    def superuser_conninfo(self, dbname: str = "postgres") -> str:
        """Through the private Unix socket, where the superuser is trusted."""
        return (
            f"host={self.run_dir} port={self.settings.postgres_port} user=postgres dbname={dbname}"
        )

    def after_start(self) -> None:
        import psycopg
        from psycopg import sql

        s = self.settings
        with psycopg.connect(self.superuser_conninfo(), autocommit=True) as conn:
            if conn.execute(
                "SELECT 1 FROM pg_roles WHERE rolname = %s", [s.postgres_user]
            ).fetchone():
                conn.execute(
                    sql.SQL("ALTER ROLE {} WITH LOGIN PASSWORD {}").format(
                        sql.Identifier(s.postgres_user), sql.Literal(s.postgres_password)
                    )
                )
            else:
                conn.execute(
                    sql.SQL("CREATE ROLE {} WITH LOGIN PASSWORD {}").format(
                        sql.Identifier(s.postgres_user), sql.Literal(s.postgres_password)
                    )
                )
            for db in (s.postgres_db, s.airflow_db):
                if not conn.execute(
                    "SELECT 1 FROM pg_database WHERE datname = %s", [db]
                ).fetchone():
                    conn.execute(
                        sql.SQL("CREATE DATABASE {} OWNER {}").format(
                            sql.Identifier(db), sql.Identifier(s.postgres_user)
                        )
                    )
        with psycopg.connect(self.superuser_conninfo(s.postgres_db), autocommit=True) as conn:
            for schema in registry.PG_SCHEMAS:
                conn.execute(
                    sql.SQL("CREATE SCHEMA IF NOT EXISTS {} AUTHORIZATION {}").format(
                        sql.Identifier(schema), sql.Identifier(s.postgres_user)
                    )
                )
        from warehouse.sql import migrations

        migrations.apply(s)

    def note(self) -> str:
        s = self.settings
        return f"psql {s.postgres_dsn()}"


# ---------------------------------------------------------------------------------
class Kafka(Service):
    """A single-node Kafka 4 broker in KRaft mode, from Maven Central jars."""

    name = "kafka"
    health_timeout = 90.0

    def ports(self) -> Sequence[int]:
        return [self.settings.kafka_port, self.settings.kafka_controller_port]

    def _java_base(self) -> list[str]:
        jars = jvm.layout(self.settings).kafka_jars
        if not (jars / ".complete").is_file():
            raise ServiceError(f"Kafka jars are not fetched yet ({jars}): run `make setup`")
        return [
            jvm.java17(),
            "-Xms256m",
            "-Xmx1g",
            "-XX:+UseG1GC",
            f"-Dlog4j2.configurationFile={self.home / 'log4j2.properties'}",
            "-cp",
            f"{jars}/*",
        ]

    def procs(self) -> Sequence[Proc]:
        return [
            Proc(
                name="kafka",
                argv=[*self._java_base(), "kafka.Kafka", str(self.home / "server.properties")],
            )
        ]

    def prepare(self) -> None:
        s = self.settings
        data = self.home / "data"
        _render(
            INFRA / "kafka" / "server.properties",
            self.home / "server.properties",
            port=s.kafka_port,
            controller_port=s.kafka_controller_port,
            data_dir=data,
            partitions=s.kafka_partitions,
        )
        shutil.copyfile(INFRA / "kafka" / "log4j2.properties", self.home / "log4j2.properties")
        if (data / "meta.properties").is_file():
            return
        cluster_id = _kafka_cluster_id()
        log.info("formatting Kafka storage in %s (cluster %s)", data, cluster_id)
        proc = subprocess.run(
            [
                *self._java_base(),
                "kafka.tools.StorageTool",
                "format",
                f"--cluster-id={cluster_id}",
                f"--config={self.home / 'server.properties'}",
            ],
            capture_output=True,
            text=True,
        )
        if proc.returncode != 0:
            raise ServiceError(f"kafka storage format failed:\n{proc.stdout}{proc.stderr}")

    def healthy(self) -> bool:
        if not port_open(self.settings.kafka_port):
            return False
        try:
            md = kafka_admin(self.settings).list_topics(timeout=3)
        except Exception:
            return False
        return bool(md.brokers)

    def after_start(self) -> None:
        ensure_topic(self.settings)


def _kafka_cluster_id() -> str:
    """A random cluster id as Kafka makes them: 22 base64url characters, never a
    leading '-', which the storage tool's argument parser would take for an option."""
    while True:
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cluster_id.startswith("-"):
            return cluster_id


def kafka_admin(settings: Settings) -> AdminClient:
    # A quiet logger: while the broker starts, librdkafka would print every refusal.
    quiet = logging.getLogger("regauge.kafka-admin")
    quiet.setLevel(logging.CRITICAL)
    return AdminClient({"bootstrap.servers": settings.kafka_bootstrap}, logger=quiet)


def ensure_topic(settings: Settings, topic: str = registry.TOPIC) -> None:
    """Create the event topic with its partition count if it does not exist."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import NewTopic

    admin = kafka_admin(settings)
    if topic in admin.list_topics(timeout=10).topics:
        return
    futures = admin.create_topics(
        [NewTopic(topic, num_partitions=settings.kafka_partitions, replication_factor=1)]
    )
    try:
        futures[topic].result(timeout=30)
        log.info("created topic %s with %d partitions", topic, settings.kafka_partitions)
    except KafkaException as exc:
        if "TOPIC_ALREADY_EXISTS" not in str(exc):
            raise


# ---------------------------------------------------------------------------------
class Trino(Service):
    """Trino 476 on Java 25 with catalogs `lakehouse` (Delta) and `ops` (PostgreSQL)."""

    name = "trino"
    health_timeout = 180.0

    def ports(self) -> Sequence[int]:
        return [self.settings.trino_port]

    def _server_home(self) -> Path:
        home = jvm.layout(self.settings).trino_home(self.settings.versions.trino)
        if not (home / ".complete").is_file():
            raise ServiceError(f"Trino is not fetched yet ({home}): run `make setup`")
        return home

    def procs(self) -> Sequence[Proc]:
        etc = self.home / "etc"
        jvm_config = (INFRA / "trino" / "local" / "jvm.config").read_text()
        jvm_opts = Template(jvm_config).substitute(heap=self.settings.trino_heap).split()
        return [
            Proc(
                name="trino",
                argv=[
                    jvm.java25(),
                    *jvm_opts,
                    "-cp",
                    f"{self._server_home() / 'lib'}/*",
                    f"-Dconfig={etc / 'config.properties'}",
                    f"-Dlog.levels-file={etc / 'log.properties'}",
                    "io.trino.server.TrinoServer",
                ],
                cwd=self.home,
            )
        ]

    def prepare(self) -> None:
        s = self.settings
        src = INFRA / "trino" / "local"
        etc = self.home / "etc"
        lake = Path(s.lake_root)
        metastore = lake / "_trino_metastore"
        metastore.mkdir(parents=True, exist_ok=True)
        values = {
            "port": s.trino_port,
            "data_dir": self.home / "data",
            "plugin_dir": self._server_home() / "plugin",
            "catalog_dir": etc / "catalog",
            "lake_root": lake,
            "pg_host": s.postgres_host,
            "pg_port": s.postgres_port,
            "pg_db": s.postgres_db,
            "pg_user": s.postgres_user,
            "pg_password": s.postgres_password,
            "heap": s.trino_heap,
            "etc_dir": etc,
            "rules_file": INFRA / "trino" / "rules.json",
        }
        # Rebuild etc/ each start so a removed catalog file does not linger.
        if etc.exists():
            shutil.rmtree(etc)
        for template in src.rglob("*.properties"):
            _render(template, etc / template.relative_to(src), **values)
        # Without the launcher, Trino reads node.* settings from config.properties.
        config = etc / "config.properties"
        node = (etc / "node.properties").read_text()
        config.write_text(config.read_text() + "\n" + node)

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.settings.trino_url}/v1/info", timeout=3) as resp:
                info = json.load(resp)
        except (OSError, urllib.error.URLError, ValueError):
            return False
        return info.get("starting") is False

    def note(self) -> str:
        return f"{self.settings.trino_url} (user name is the X-Trino-User header)"


# ---------------------------------------------------------------------------------
class Airflow(Service):
    """Airflow 3 (api-server, scheduler, dag-processor, triggerer) in its own virtualenv."""

    name = "airflow"
    health_timeout = 240.0
    components = ("api-server", "scheduler", "dag-processor", "triggerer")

    def ports(self) -> Sequence[int]:
        return [self.settings.airflow_port]

    @property
    def passwords_file(self) -> Path:
        return self.home / "simple_auth_manager_passwords.json.generated"

    def _secret(self, name: str) -> str:
        """A secret generated once and kept, so every component agrees on it."""
        path = self.home / f".{name}"
        if not path.is_file():
            self.home.mkdir(parents=True, exist_ok=True)
            path.write_text(secrets.token_urlsafe(32))
            path.chmod(0o600)
        return path.read_text().strip()

    def env(self) -> dict[str, str]:
        s = self.settings
        url = s.airflow_url
        return {
            "AIRFLOW_HOME": str(self.home),
            "AIRFLOW__CORE__DAGS_FOLDER": str(REPO_ROOT / "dags"),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
            "AIRFLOW__CORE__PARALLELISM": "4",
            "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{url}/execution/",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": "admin:admin",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(self.passwords_file),
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": (
                f"postgresql+psycopg2://{s.postgres_user}:{s.postgres_password}"
                f"@{s.postgres_host}:{s.postgres_port}/{s.airflow_db}"
            ),
            "AIRFLOW__API__HOST": "127.0.0.1",
            "AIRFLOW__API__PORT": str(s.airflow_port),
            "AIRFLOW__API__BASE_URL": url,
            "AIRFLOW__API__WORKERS": "1",
            "AIRFLOW__API_AUTH__JWT_SECRET": self._secret("jwt_secret"),
            "AIRFLOW__API__SECRET_KEY": self._secret("api_secret"),
            # New DAG files are picked up within seconds, not the default five minutes.
            "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "15",
            "AIRFLOW__SCHEDULER__ENABLE_HEALTH_CHECK": "True",
            # The pipeline's CLI, which every task calls (DAGs stay thin).
            "REGAUGE_BIN": str(REPO_ROOT / ".venv" / "bin" / "regauge"),
            "PYTHONUNBUFFERED": "1",
        }

    def _bin(self) -> str:
        airflow = AIRFLOW_VENV / "bin" / "airflow"
        if not airflow.is_file():
            raise ServiceError(f"Airflow is not installed ({airflow}): run `make setup`")
        return str(airflow)

    def procs(self) -> Sequence[Proc]:
        env = self.env()
        return [
            Proc(name=f"airflow-{c}", argv=[self._bin(), c], env=env, cwd=self.home)
            for c in self.components
        ]

    def prepare(self) -> None:
        self.home.mkdir(parents=True, exist_ok=True)
        log.info("migrating Airflow's metadata database")
        proc = subprocess.run(
            [self._bin(), "db", "migrate"],
            env={**os.environ, **self.env()},
            capture_output=True,
            text=True,
        )
        if proc.returncode != 0:
            raise ServiceError(
                f"airflow db migrate failed:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}"
            )

    def healthy(self) -> bool:
        try:
            url = f"{self.settings.airflow_url}/api/v2/monitor/health"
            with urllib.request.urlopen(url, timeout=3) as resp:
                health = json.load(resp)
        except (OSError, urllib.error.URLError, ValueError):
            return False
        parts = ("metadatabase", "scheduler", "triggerer", "dag_processor")
        return all(health.get(p, {}).get("status") == "healthy" for p in parts)

    def admin_password(self) -> str | None:
        try:
            return json.loads(self.passwords_file.read_text()).get("admin")
        except (OSError, ValueError):
            return None

    def note(self) -> str:
        return f"UI {self.settings.airflow_url} — user admin, password in {self.passwords_file}"


SERVICE_ORDER: tuple[type[Service], ...] = (Postgres, Kafka, Trino, Airflow)


def services(settings: Settings, names: Sequence[str] = ()) -> list[Service]:
    """The services in start order, optionally only the named ones."""
    known = {cls.name: cls for cls in SERVICE_ORDER}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ServiceError(f"unknown service {', '.join(unknown)}; known: {', '.join(known)}")
    return [cls(settings) for cls in SERVICE_ORDER if not names or cls.name in names]


def up(settings: Settings, names: Sequence[str] = ()) -> None:
    for svc in services(settings, names):
        svc.start()


def down(settings: Settings, names: Sequence[str] = ()) -> None:
    for svc in reversed(services(settings, names)):
        if not svc.stop():
            log.info("%s was not running", svc.name)
