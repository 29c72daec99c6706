"""PostgreSQL, from Debian's packages, in a private cluster under the state dir."""

from __future__ import annotations

import hashlib
import logging
import os
import pwd
import shutil
import signal
import subprocess
from collections.abc import Sequence
from pathlib import Path

from warehouse.base import registry
from warehouse.ops.stack import process
from warehouse.ops.stack.base import Service
from warehouse.ops.stack.process import Proc, ServiceError

log = logging.getLogger(__name__)


def _running_as_root() -> bool:
    return os.geteuid() == 0


def _account() -> str:
    return pwd.getpwuid(os.geteuid()).pw_name


def auth_files(owner: str, server: str | None) -> dict[str, str]:
    """pg_hba.conf and pg_ident.conf: on the socket, only the project's account (and
    the server's own, when root runs it as postgres) may log in, as the superuser
    and by who they are; over TCP, every login needs its password (scram).

    No `trust` line: with one, any local account that reaches the socket is anyone.
    """
    header = "# Written by regauge before every start (warehouse/ops/stack/postgres.py).\n"
    accounts = [owner] + ([server] if server and server != owner else [])
    return {
        "pg_hba.conf": header
        + "local all postgres peer map=regauge\n"
        + "host all all 127.0.0.1/32 scram-sha-256\n"
        + "host all all ::1/128 scram-sha-256\n",
        "pg_ident.conf": header + "".join(f"regauge {a} postgres\n" for a in accounts),
    }


class Postgres(Service):
    """PostgreSQL from Debian's packages, in a private cluster under the state dir."""

    name = "postgres"
    health_timeout = 60.0
    priority = 100

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
        if self.home.is_symlink():
            return
        self.settings.state_dir.mkdir(parents=True, exist_ok=True)
        probe = subprocess.run(["test", "-x", str(self.settings.state_dir)], user=user, check=False)
        if probe.returncode == 0:
            return
        # .state/ is now owner-only; a cluster an older regauge made inside it moves
        # out to where its account can reach it (it is stopped: this runs before start).
        earlier = self.home if self.home.is_dir() else None
        digest = hashlib.sha1(str(self.settings.state_dir).encode()).hexdigest()[:10]
        real = Path("/var/lib/regauge") / digest / "postgres"
        if real.exists():
            # Only .state/postgres leads here, and it is gone: this cluster is an earlier
            # checkout's at the same path (a fresh clone where one was, or .state removed
            # by hand). Its databases (Airflow's runs, the view registry, the erasure
            # log) describe a lake that no longer exists, and a fresh lake must not
            # start with them.
            self._refuse_if_running(real / "data")
            shutil.rmtree(real)
            log.info("removed %s, the PostgreSQL cluster of an earlier checkout at this path", real)
        real.parent.mkdir(parents=True, exist_ok=True)
        for parent in (real.parent.parent, real.parent):
            parent.chmod(0o755)
        if earlier is not None:
            shutil.move(earlier, real)
            log.info("moved the PostgreSQL cluster in %s to %s", earlier, real)
        real.mkdir(exist_ok=True)
        self.home.symlink_to(real, target_is_directory=True)
        log.info("postgres cannot reach %s; its cluster lives in %s", self.settings.state_dir, real)

    @staticmethod
    def _refuse_if_running(data: Path) -> None:
        """Stop with a clear error if a postmaster still runs on `data`."""
        try:
            pid = int((data / "postmaster.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return
        argv = process.argv(pid)
        # Gone: the file is what a killed postmaster leaves. And a pid outlives its
        # process: after a restart another program may have it.
        if argv is None or str(data) not in argv:
            return
        raise ServiceError(
            f"PostgreSQL (pid {pid}) still runs on {data}, an earlier checkout's cluster at "
            f"this path: stop it (kill {pid}), then start again"
        )

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
                    "unix_socket_permissions=0700",
                    "-c",
                    "max_connections=200",
                    "-c",
                    "shared_buffers=128MB",
                ],
                user=self._user(),
                # A folder its account can enter (supervisord changes to it after
                # switching user); the checkout may be private to root.
                cwd=self.real_home,
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
            # Its account only: the socket's folder was the way in for every local
            # account, and the cluster's home held the superuser's password.
            d.chmod(0o700)
            if user:
                shutil.chown(d, user)
        # Left by an older regauge, readable by every local account.
        (self.real_home / ".superuser-pw").unlink(missing_ok=True)
        if not (self.data / "PG_VERSION").is_file():
            self._initdb(user)
        self._write_auth(user)

    def _initdb(self, user: str | None) -> None:
        if self.data.exists():
            # Left by an initdb that was interrupted; initdb needs an empty directory.
            shutil.rmtree(self.data)
        log.info("initialising PostgreSQL cluster in %s", self.data)
        # The superuser logs in through the socket by its account (peer), never by
        # password: it gets none, and no file holds one.
        init = subprocess.run(
            [
                str(self.bin_dir() / "initdb"),
                "-D",
                str(self.data),
                "-U",
                "postgres",
                "--auth-local=peer",
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

    def _write_auth(self, user: str | None) -> None:
        """Who may log in, written before every start (a cluster an older regauge made
        trusted every local account on its socket)."""
        for name, text in auth_files(owner=_account(), server=user).items():
            target = self.data / name
            target.write_text(text)
            if user:
                shutil.chown(target, user)
            target.chmod(0o600)

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
        """Through the private Unix socket, where this account may be the superuser
        (peer authentication, `auth_files`)."""
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
        # Never the password itself: a status line is read over shoulders and pasted.
        return (
            f"psql {s.postgres_dsn(password=False)} (password in "
            f"{s.state_dir / 'secrets' / 'postgres'}, or REGAUGE_POSTGRES_PASSWORD if set)"
        )
