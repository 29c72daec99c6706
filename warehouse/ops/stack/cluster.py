"""The one-box cluster: the distributed engines regauge runs on elsewhere, as real,
separate processes on this machine, to test the cluster profile with.

- an S3-compatible object store (S3Proxy from Maven Central, on a folder), reached
  by Spark through s3a:// and by Trino through its native S3 file system;
- a Spark standalone master and two workers (PySpark's own `bin/spark-class`);
- three Kafka brokers in one KRaft quorum, replication factor 3, min ISR 2;
- a Trino coordinator and one worker, over HTTPS with password logins;
- PostgreSQL and Airflow, the same services as the local stack.

Nothing here is used by the pipeline itself: it reads the cluster through the
settings `env()` describes (REGAUGE_PROFILE=cluster and the addresses below),
exactly as it would read a real one. State lives in `.state/cluster/`, apart
from the local stack's. Only one of the two fits on two cores: `regauge cluster
up` refuses while the local stack runs.
"""

from __future__ import annotations

import hashlib
import json
import logging
import secrets
import shutil
import subprocess
import urllib.request
from collections.abc import Collection, Sequence
from functools import partial
from pathlib import Path

from warehouse.base import jvm
from warehouse.base.settings import REPO_ROOT, Settings
from warehouse.base.settings import load as load_settings
from warehouse.ops.stack.base import (
    INFRA,
    Service,
    Starting,
    _render,
    keep_private,
    kept_secret,
    private,
    stop_together,
)
from warehouse.ops.stack.kafka import Kafka, _kafka_cluster_id
from warehouse.ops.stack.process import Proc, ServiceError, port_open
from warehouse.ops.stack.supervisor import Supervisor
from warehouse.ops.stack.trino import Trino, active_nodes

log = logging.getLogger(__name__)

STATE = REPO_ROOT / ".state" / "cluster"
BUCKET = "regauge"
S3_PORT = 9000
SPARK_MASTER_PORT = 7077
SPARK_MASTER_UI = 8090
SPARK_WORKERS = 2
KAFKA_BROKERS = 3
KAFKA_PORT_BASE = 19092  # broker n listens on base + n - 1
KAFKA_CONTROLLER_BASE = 19192
TRINO_HTTPS_PORT = 8443
TRINO_HTTP_PORT = 8080  # the coordinator's internal port, for its worker
TRINO_WORKER_PORT = 8082


def _secret(name: str) -> str:
    """A secret made once for this box's cluster and kept (owner-only)."""
    return kept_secret(STATE / "secrets" / name)


def env() -> dict[str, str]:
    """The REGAUGE_* settings that point regauge at the one-box cluster."""
    brokers = ",".join(f"127.0.0.1:{KAFKA_PORT_BASE + i}" for i in range(KAFKA_BROKERS))
    return {
        "REGAUGE_PROFILE": "cluster",
        "REGAUGE_STATE_DIR": str(STATE),
        "REGAUGE_SPARK_MASTER": f"spark://127.0.0.1:{SPARK_MASTER_PORT}",
        "REGAUGE_KAFKA_BOOTSTRAP": brokers,
        "REGAUGE_KAFKA_REPLICATION": str(KAFKA_BROKERS),
        # Every client logs in, as on the local profile (issue 68, A.5).
        "REGAUGE_KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
        "REGAUGE_KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
        "REGAUGE_KAFKA_SASL_USERNAME": "regauge",
        "REGAUGE_KAFKA_SASL_PASSWORD": _secret("kafka"),
        "REGAUGE_LAKE_ROOT": f"s3a://{BUCKET}/lake",
        "REGAUGE_S3_ENDPOINT": f"http://127.0.0.1:{S3_PORT}",
        "REGAUGE_S3_ACCESS_KEY": "regauge",
        "REGAUGE_S3_SECRET_KEY": _secret("s3"),
        # S3Proxy's filesystem backend answers a HEAD of a folder's marker (Delta
        # makes _delta_log/_staged_commits/) without an ETag, and S3A's default
        # check then refuses to copy it: retire's archive failed on it.
        "REGAUGE_S3_CHANGE_DETECTION": "none",
        "REGAUGE_TRINO_HOST": "127.0.0.1",
        "REGAUGE_TRINO_PORT": str(TRINO_HTTPS_PORT),
        "REGAUGE_TRINO_SCHEME": "https",
        "REGAUGE_TRINO_PASSWORD": _secret("trino"),
        "REGAUGE_TRINO_CA_FILE": str(STATE / "tls" / "ca.pem"),
        "REGAUGE_POSTGRES_HOST": "127.0.0.1",
        "REGAUGE_TRINO_HEAP": "1536M",
        # Two executor cores per application: a cluster's default of 200 shuffle
        # tasks (and Delta snapshot tasks, which follow it) would be mostly overhead.
        "REGAUGE_SPARK_SHUFFLE_PARTITIONS": "4",
        # One box: every server still listens on loopback only.
        "REGAUGE_BIND_HOST": "127.0.0.1",
        # Beside the local stack's view host, whose endpoint has the default port.
        "REGAUGE_METRICS_PORT": "19464",
    }


def settings() -> Settings:
    return load_settings(env())


class ObjectStore(Service):
    """S3Proxy on a folder: a real S3 server (signed requests, multipart uploads)."""

    name = "s3"
    priority = 50
    health_timeout = 60.0

    def ports(self) -> Sequence[int]:
        return [S3_PORT]

    def procs(self) -> Sequence[Proc]:
        jar = jvm.layout(self.settings).s3proxy_jar
        return [
            Proc(
                name="s3",
                argv=[jvm.java17(), "-Xmx512m", "-jar", str(jar), "--properties", str(self._conf)],
            )
        ]

    @property
    def _conf(self) -> Path:
        return self.home / "s3proxy.conf"

    def prepare(self) -> None:
        s = self.settings
        jar = jvm.layout(s).s3proxy_jar
        if not jar.is_file():
            raise ServiceError(f"S3Proxy is not fetched yet ({jar}): run `regauge cluster fetch`")
        data = self.home / "data"
        # The filesystem backend keeps a bucket as a folder: making it is the
        # bucket's creation, as an operator would do once for a deployment.
        (data / BUCKET).mkdir(parents=True, exist_ok=True)
        with private(self._conf.parent):
            self._conf.unlink(missing_ok=True)
            _render(
                INFRA / "cluster" / "s3proxy.conf",
                self._conf,
                port=S3_PORT,
                access_key=s.s3_access_key,
                secret_key=s.s3_secret_key,
                data_dir=data,
            )

    def healthy(self) -> bool:
        return port_open(S3_PORT)

    def note(self) -> str:
        return f"s3a://{BUCKET} at http://127.0.0.1:{S3_PORT}"


def _spark_class(settings: Settings, main: str, *args: str) -> list[str]:
    import pyspark

    return [str(Path(pyspark.__file__).parent / "bin" / "spark-class"), main, *args]


def _spark_env() -> dict[str, str]:
    import pyspark

    return {
        "JAVA_HOME": jvm.java17_home(),
        "SPARK_HOME": str(Path(pyspark.__file__).parent),
        # The UI binds to SPARK_LOCAL_IP, else every interface.
        "SPARK_LOCAL_IP": "127.0.0.1",
        "SPARK_DAEMON_MEMORY": "512m",
    }


class SparkMaster(Service):
    name = "spark-master"
    priority = 150
    health_timeout = 60.0

    def ports(self) -> Sequence[int]:
        return [SPARK_MASTER_PORT, SPARK_MASTER_UI]

    def procs(self) -> Sequence[Proc]:
        argv = _spark_class(
            self.settings,
            "org.apache.spark.deploy.master.Master",
            *("--host", "127.0.0.1", "--port", str(SPARK_MASTER_PORT)),
            *("--webui-port", str(SPARK_MASTER_UI)),
        )
        return [Proc(name=self.name, argv=argv, env=_spark_env(), cwd=self.home)]

    def prepare(self) -> None:
        self.home.mkdir(parents=True, exist_ok=True)

    def healthy(self) -> bool:
        return port_open(SPARK_MASTER_PORT)

    def note(self) -> str:
        return f"spark://127.0.0.1:{SPARK_MASTER_PORT}, UI http://127.0.0.1:{SPARK_MASTER_UI}"


class SparkWorker(Service):
    """A standalone worker: 4 cores and 4 GB, for two executors of 2 cores and 2 GB
    (one per application, settings.spark_executor_cores).

    Eight cores in all on a two-core machine is overcommitted on purpose: with
    2 cores per application, the view host, an Airflow task, the CLI and a
    test each get an executor at once, as on a real cluster, instead of waiting
    for another's cores (and one worker lost still leaves room for two).
    """

    health_timeout = 60.0
    priority = 160

    def __init__(self, settings: Settings, n: int) -> None:
        self.name = f"spark-worker-{n}"
        self.n = n
        super().__init__(settings)

    @property
    def ui_port(self) -> int:
        return SPARK_MASTER_UI + self.n

    def ports(self) -> Sequence[int]:
        return [self.ui_port]

    def procs(self) -> Sequence[Proc]:
        argv = _spark_class(
            self.settings,
            "org.apache.spark.deploy.worker.Worker",
            *("--host", "127.0.0.1", "--cores", "4", "--memory", "4g"),
            *("--webui-port", str(self.ui_port), "--work-dir", str(self.home / "work")),
            f"spark://127.0.0.1:{SPARK_MASTER_PORT}",
        )
        return [Proc(name=self.name, argv=argv, env=_spark_env(), cwd=self.home)]

    def prepare(self) -> None:
        (self.home / "work").mkdir(parents=True, exist_ok=True)

    def healthy(self) -> bool:
        return port_open(self.ui_port) and self._registered()

    def _master_view(self) -> dict[str, object] | None:
        """This worker as the master sees it, or None if it is not registered."""
        try:
            with urllib.request.urlopen(
                f"http://127.0.0.1:{SPARK_MASTER_UI}/json/", timeout=3
            ) as resp:
                state = json.load(resp)
        except (OSError, ValueError):
            return None
        for w in state.get("workers", []):
            if w.get("webuiaddress", "").endswith(f":{self.ui_port}") and w.get("state") == "ALIVE":
                return dict(w)
        return None

    def _registered(self) -> bool:
        return self._master_view() is not None

    def executor_logs(self, app_name: str) -> list[Path]:
        """The stderr files of the executors this worker runs for the application
        named so (Spark's executors log each task they start there)."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.ui_port}/json/", timeout=3) as r:
                state = json.load(r)
        except (OSError, ValueError):
            return []
        return [
            self.home / "work" / e["appid"] / str(e["id"]) / "stderr"
            for e in state.get("executors", [])
            if e.get("appdesc", {}).get("name") == app_name
        ]


class KafkaBroker(Kafka):
    """One of three KRaft nodes, each both broker and controller."""

    health_timeout = 120.0

    def __init__(self, settings: Settings, n: int) -> None:
        self.name = f"kafka-{n}"
        self.n = n
        super().__init__(settings)

    @property
    def port(self) -> int:
        return KAFKA_PORT_BASE + self.n - 1

    def ports(self) -> Sequence[int]:
        return [self.port, KAFKA_CONTROLLER_BASE + self.n - 1]

    def procs(self) -> Sequence[Proc]:
        return [
            Proc(
                name=self.name,
                argv=[
                    *self._java_base(heap="512m"),
                    "kafka.Kafka",
                    str(self.home / "server.properties"),
                ],
            )
        ]

    def _config(self) -> dict[str, object]:
        voters = ",".join(
            f"{i}@127.0.0.1:{KAFKA_CONTROLLER_BASE + i - 1}" for i in range(1, KAFKA_BROKERS + 1)
        )
        return {
            "template": INFRA / "cluster" / "kafka.properties",
            "node_id": self.n,
            "port": self.port,
            "controller_port": KAFKA_CONTROLLER_BASE + self.n - 1,
            "voters": voters,
            "data_dir": self.home / "data",
            "partitions": self.settings.kafka_partitions,
            "broker_password": self._broker_password(),
        }

    def _cluster_id(self) -> str:
        # Every node of one quorum is formatted with the same cluster id.
        path = STATE / "kafka-cluster-id"
        if not path.is_file():
            STATE.mkdir(parents=True, exist_ok=True)
            path.write_text(_kafka_cluster_id() + "\n")
        return path.read_text().strip()

    def healthy(self) -> bool:
        """Up, and a member of the quorum: it names itself among the brokers."""
        if not port_open(self.port):
            return False
        try:
            md = self._own_admin(f"127.0.0.1:{self.port}").list_topics(timeout=3)
        except Exception:
            return False
        return self.n in md.brokers

    def after_start(self) -> None:
        """The clients' login and the topics are made once the whole quorum is up
        (see `up`)."""


def members(s: Settings) -> list[Service]:
    """Every process of the one-box cluster, in start order."""
    from warehouse.ops.stack.airflow import Airflow
    from warehouse.ops.stack.postgres import Postgres

    airflow = Airflow(s)
    airflow.task_env = env()
    return [
        ObjectStore(s),
        SparkMaster(s),
        *(SparkWorker(s, n) for n in range(1, SPARK_WORKERS + 1)),
        *(KafkaBroker(s, n) for n in range(1, KAFKA_BROKERS + 1)),
        Postgres(s),
        TrinoNode(s, "coordinator"),
        TrinoNode(s, "worker"),
        airflow,
    ]


class TrinoNode(Trino):
    """The coordinator (HTTPS, password logins, no tasks of its own) or its worker."""

    health_timeout = 240.0

    def __init__(self, settings: Settings, role: str) -> None:
        self.name = f"trino-{role}"
        self.role = role
        super().__init__(settings)

    @property
    def http_port(self) -> int:
        return TRINO_HTTP_PORT if self.role == "coordinator" else TRINO_WORKER_PORT

    def has_active_node(self) -> bool:
        # The coordinator runs no tasks, and a worker's health is its own start:
        # `wait_for_trino_worker` waits for the worker to join before queries run.
        return True

    def ports(self) -> Sequence[int]:
        if self.role == "coordinator":
            return [TRINO_HTTPS_PORT, TRINO_HTTP_PORT]
        return [TRINO_WORKER_PORT]

    def guarded_ports(self) -> Sequence[int]:
        return []  # users log in with passwords over HTTPS

    def prepare(self) -> None:
        s = self.settings
        src = INFRA / "cluster" / "trino"
        etc = self.home / "etc"
        tls = STATE / "tls"
        if self.role == "coordinator":
            make_tls(tls)
        values = {
            "http_port": self.http_port,
            "https_port": TRINO_HTTPS_PORT,
            "coordinator_port": TRINO_HTTP_PORT,
            "tls_dir": tls,
            "etc_dir": etc,
            "shared_secret": _secret("trino-internal"),
            "plugin_dir": self._server_home() / "plugin",
            "catalog_dir": etc / "catalog",
            "rules_file": INFRA / "trino" / "rules.json",
            "bucket": BUCKET,
            "s3_endpoint": s.s3_endpoint,
            "s3_region": s.s3_region,
            "s3_access_key": s.s3_access_key,
            "s3_secret_key": s.s3_secret_key,
            "pg_host": s.postgres_host,
            "pg_port": s.postgres_port,
            "pg_db": s.postgres_db,
            "pg_user": s.postgres_user,
            "pg_password": s.postgres_password,
        }
        # Rebuilt each start, owner-only from the first byte: the files hold the S3
        # key, PostgreSQL's password, the shared secret and the password hashes.
        shutil.rmtree(etc, ignore_errors=True)
        with private(etc.parent):
            _render(src / f"{self.role}.properties", etc / "config.properties", **values)
            for template in (src / "catalog").glob("*.properties"):
                _render(template, etc / "catalog" / template.name, **values)
            if self.role == "coordinator":
                for name in ("access-control.properties", "password-authenticator.properties"):
                    _render(src / name, etc / name, **values)
                logins = {s.trino_login: s.trino_password or "", ANALYST: analyst_password()}
                (etc / "password.db").write_text(
                    "".join(f"{u}:{pbkdf2(p)}\n" for u, p in logins.items())
                )
            # The local stack's levels (they keep query values out of the log).
            shutil.copy(INFRA / "trino" / "local" / "log.properties", etc / "log.properties")

    @property
    def info_url(self) -> str:
        """Asked on the internal HTTP port: clients need HTTPS and a password."""
        return f"http://127.0.0.1:{self.http_port}/v1/info"

    def note(self) -> str:
        if self.role == "coordinator":
            return f"https://127.0.0.1:{TRINO_HTTPS_PORT} (password logins)"
        return f"worker, internal http://127.0.0.1:{TRINO_WORKER_PORT}"


# An analyst with a login of their own, for the cluster's authenticated queries.
ANALYST = "analyst.cluster"


def analyst_password() -> str:
    return _secret("trino-analyst")


def pbkdf2(password: str, iterations: int = 100_000) -> str:
    """Trino's PBKDF2 password-file entry: iterations, salt and hash in lowercase hex
    (PBKDF2WithHmacSHA1 in Trino's file authenticator; 64-byte hash)."""
    salt = secrets.token_bytes(16)
    digest = hashlib.pbkdf2_hmac("sha1", password.encode(), salt, iterations, dklen=64)
    return f"{iterations}:{salt.hex()}:{digest.hex()}"


def make_tls(where: Path) -> None:
    """A CA of this box and Trino's certificate for 127.0.0.1 and localhost, once.

    Clients trust the CA (REGAUGE_TRINO_CA_FILE); Trino reads its key and
    certificate from one PEM file.
    """
    if (where / "trino.pem").is_file():
        return
    with private(where):
        _make_tls(where)
    (where / "ca.pem").chmod(0o644)  # the CA's certificate is public; its key is not


def _make_tls(where: Path) -> None:
    def openssl(*args: str) -> None:
        proc = subprocess.run(["openssl", *args], cwd=where, capture_output=True, text=True)
        if proc.returncode != 0:
            raise ServiceError(f"openssl {args[0]} failed: {proc.stderr.strip()}")

    openssl(
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-days",
        "3650",
        "-subj",
        "/CN=regauge one-box CA",
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
    )
    openssl(
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-subj",
        "/CN=127.0.0.1",
        "-keyout",
        "trino.key",
        "-out",
        "trino.csr",
    )
    (where / "san.ext").write_text(
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n"
    )
    openssl(
        "x509",
        "-req",
        "-in",
        "trino.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-days",
        "3650",
        "-extfile",
        "san.ext",
        "-out",
        "trino.crt",
    )
    pem = (where / "trino.key").read_text() + (where / "trino.crt").read_text()
    (where / "trino.pem").write_text(pem)


def up(s: Settings, skip: Collection[str] = ()) -> None:
    """Start every member not running yet and wait until each answers. Members
    named in `skip` are left as they are (a test that needs no Airflow)."""
    from warehouse.base.settings import load
    from warehouse.ops.stack import artifacts, services
    from warehouse.ops.stack.airflow import Airflow
    from warehouse.ops.stack.kafka import ensure_source_topics
    from warehouse.ops.stack.postgres import Postgres

    local = [svc.name for svc in services.services(load({})) if svc.running()]
    if local:
        raise ServiceError(
            f"the local stack is running ({', '.join(local)}): only one of the two fits "
            "on this machine; stop it with `regauge down` first"
        )
    artifacts.fetch_all(s)
    artifacts.fetch_cluster(s)
    keep_private(s)
    # Everything starts together (`Starting`), but for two that need another first:
    # a Spark worker registers with its master, and Airflow migrates its database
    # in PostgreSQL (where its roles are made once it answers).
    needs: dict[type[Service], type[Service]] = {SparkWorker: SparkMaster, Airflow: Postgres}
    starting = Starting()
    chosen = [m for m in members(s) if m.name not in skip]
    for svc in sorted(chosen, key=lambda m: type(m) in needs):  # stable: in order
        if type(svc) in needs:
            starting.await_all(needs[type(svc)])
        if isinstance(svc, KafkaBroker | TrinoNode):
            # A broker cannot be healthy before a majority of the quorum runs, nor
            # a worker before its coordinator: the group is launched, then awaited.
            starting.begin(svc, partial(_launch_member, svc))
        else:
            starting.begin(svc)
    starting.done()
    brokers = [m for m in chosen if isinstance(m, KafkaBroker)]
    if brokers:
        # At every start: one that failed before made neither.
        brokers[0].set_client_login()
        ensure_source_topics(s)
    wait_for_trino_worker(s)


def _launch_member(svc: Service) -> bool:
    """Launch a quorum's member unless it runs and answers; whether it was launched."""
    if svc.unsupervised() or not (svc.running() and svc.healthy()):
        svc.stop()
        svc.launch()
        return True
    return False


def wait_for_trino_worker(s: Settings, timeout: float = 120.0) -> None:
    """Queries need a worker (the coordinator runs no tasks): wait until it is active,
    asked through the HTTPS front door with a password, as every client will."""
    from warehouse.ops.stack.process import wait_until

    if not wait_until(lambda: active_nodes(s, workers_only=True) > 0, timeout, interval=2.0):
        raise ServiceError(
            f"Trino's worker did not join the coordinator within {timeout:.0f} s: see "
            f"{s.state_dir / 'logs'}/trino-worker.log"
        )


def down(s: Settings) -> list[str]:
    """Stop every member this box started, the view host first; data stays."""
    from warehouse.ops import streams

    stopped = []
    everything = members(s)
    airflow = [m for m in everything if m.name == "airflow"]
    for svc in airflow:
        if svc.stop():
            stopped.append(svc.name)
    if streams.shutdown(s):
        stopped.append("view host")
    # The rest need nothing of each other to stop: the lake's data is on disk.
    stopped += stop_together(list(reversed([m for m in everything if m.name != "airflow"])))
    if Supervisor.of_state(s.state_dir).shutdown_if_idle():
        stopped.append("supervisord")
    return stopped
