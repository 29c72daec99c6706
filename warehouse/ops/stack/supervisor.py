"""supervisord runs every long-running process regauge starts: the stack's
services (PostgreSQL, Kafka, Trino, Airflow's three components; the one-box
cluster's members) and the pipeline's view host.

supervisord, from PyPI, restarts a program that dies (a kill -9, an
out-of-memory kill, Airflow's scheduler losing its database) within seconds,
and rotates its log. One supervisord serves one state folder, from
`<state>/streams/supervisor/` (where the view host's first lived). It listens
on a unix socket in that folder, with no TCP port to keep on loopback. It
starts the first time a program is asked for and stops with `regauge down`,
once none of its programs runs.

A program's section is written when it is started, with the starter's
command line, folder, the program's own environment and the starter's
`REGAUGE_*` settings. `supervisorctl update`'s two calls (`reloadConfig`,
then `addProcessGroup`) load it. A service is stopped as a process group, as
its launcher's children are its own. The view host gets SIGTERM alone, since
it ends its micro-batches and then stops its JVM; only after `stop_wait_s`
does supervisord kill the whole group.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shlex
import stat
import subprocess
import sys
import time
import xmlrpc.client
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from warehouse.ops.stack.process import ServiceError, tail, wait_until

# A unix socket's path must fit in 108 bytes, its terminating zero included, and
# supervisord binds `<path>.<its pid>` first, then renames it.
_SOCKET_PATH_MAX = 96
# What supervisord calls a live program, which has a pid.
ALIVE = ("STARTING", "RUNNING", "STOPPING")
LOG_MAX_BYTES = "50MB"
LOG_BACKUPS = 5
# A stuck supervisord must not hang `regauge status` or a test's teardown.
RPC_TIMEOUT_S = 30.0
# What supervisord itself keeps of its starter's environment. Everything else
# (an Airflow task's secrets, a bench's REGAUGE_SPARK_EVENT_LOG_DIR) would reach
# every program it ever starts; a program's REGAUGE_* come from its own section.
_KEPT_ENV = ("PATH", "HOME", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "JAVA_HOME", "USER", "TMPDIR")
# Not settings: the DAGs' pointer to the CLI, which differs between starters.
_NOT_PASSED = ("REGAUGE_BIN",)


def _quoted(value: str) -> str:
    """A value for supervisord's config: `%` is interpolation there."""
    return value.replace("%", "%%")


def _env_value(program: str, key: str, value: str) -> str:
    """A value for `environment=`, double-quoted; refused where supervisord's parser
    would cut or misread it (it has no escape for these)."""
    if (
        any(c in value for c in '"\n\r')
        # configparser ends the line at a comment after any whitespace.
        or re.search(r"\s[#;]", value)
        # supervisord strips quotes of either kind from both ends.
        or value[:1] == "'"
        or value[-1:] == "'"
    ):
        raise ServiceError(
            f"{key} holds a double quote, a line break, whitespace before '#' or ';', or "
            f'begins or ends with "\'", which supervisord cannot pass to {program}; '
            "set it without them"
        )
    return f'{key}="{_quoted(value)}"'


def _private_write(path: Path, text: str) -> None:
    """Owner-only: a program's section holds its settings, passwords among them."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    path.chmod(0o600)


@dataclass(frozen=True)
class Program:
    """How supervisord runs one program."""

    cwd: Path | None = None
    # Its own environment, over the starter's REGAUGE_* settings.
    env: Mapping[str, str] = field(default_factory=dict)
    # Run as this account (PostgreSQL refuses root); needs a supervisord run as root.
    user: str | None = None
    stop_signal: str = "TERM"
    stop_wait_s: float = 30.0
    # A service is restarted whatever its exit, stopped as a process group, and
    # retried for long (Airflow's scheduler dies while its database is down).
    # Otherwise (the view host): a clean exit stays stopped, and only the
    # driver gets the stop signal.
    service: bool = False
    start_s: int = 5
    start_retries: int = 10
    # Lower starts first and stops last when supervisord itself stops.
    priority: int = 999


@dataclass(frozen=True)
class Supervisor:
    base: Path

    @classmethod
    def of_state(cls, state_dir: Path) -> Supervisor:
        """The one supervisord of a state folder."""
        return cls(state_dir / "streams" / "supervisor")

    @property
    def conf(self) -> Path:
        return self.base / "supervisord.conf"

    @property
    def socket(self) -> Path:
        beside = self.base / "supervisor.sock"
        if len(str(beside)) <= _SOCKET_PATH_MAX:
            return beside
        # A deep checkout: a unix socket's path has a hard limit (108 bytes on
        # Linux), so it goes to an owner-only folder in /tmp, named after this one.
        # /tmp, not $TMPDIR: every caller, whatever its environment, must find it.
        digest = hashlib.sha1(str(self.base.resolve()).encode()).hexdigest()[:16]
        return Path("/tmp") / f"regauge-{os.getuid()}" / f"{digest}.sock"

    @property
    def log(self) -> Path:
        return self.base / "supervisord.log"

    def _programs(self) -> Path:
        return self.base / "programs"

    def rpc(self) -> Any:
        from supervisor.xmlrpc import SupervisorTransport, UnixStreamHTTPConnection

        class Connection(UnixStreamHTTPConnection):
            def connect(self) -> None:
                super().connect()
                self.sock.settimeout(RPC_TIMEOUT_S)

        socket_file = str(self.socket)

        def connection() -> Connection:
            conn = Connection("localhost")
            conn.socketfile = socket_file
            return conn

        transport = SupervisorTransport(None, None, f"unix://{self.socket}")
        transport._get_connection = connection
        # The host part is ignored: the transport talks to the socket.
        return xmlrpc.client.ServerProxy("http://supervisord", transport=transport)

    def running(self) -> bool:
        if not self.socket.exists():
            return False
        try:
            return bool(self.rpc().supervisor.getState()["statename"] == "RUNNING")
        except (OSError, xmlrpc.client.Fault):
            return False

    def ensure(self, timeout: float = 30.0) -> None:
        """Start supervisord for this folder unless it runs."""
        if self.running():
            return
        if "%" in str(self.base):
            # supervisord expands a log file's path twice; no quoting survives both.
            raise ServiceError(f"the state folder {self.base} has a '%': supervisord cannot use it")
        for folder in (self.base, self._programs(), self.socket.parent):
            folder.mkdir(parents=True, exist_ok=True)
            # In /tmp another account could have made it first, to serve a socket
            # of its own: regauge would then signal pids it makes up.
            held = folder.lstat()
            if stat.S_ISLNK(held.st_mode) or held.st_uid != os.getuid():
                raise ServiceError(
                    f"{folder} is a link or belongs to another account; supervisord's "
                    "socket cannot go there: remove it"
                )
            folder.chmod(0o700)
        _private_write(
            self.conf,
            "\n".join(
                [
                    "[unix_http_server]",
                    f"file={_quoted(str(self.socket))}",
                    "chmod=0700",
                    "[supervisord]",
                    f"logfile={_quoted(str(self.log))}",
                    f"logfile_maxbytes={LOG_MAX_BYTES}",
                    f"logfile_backups={LOG_BACKUPS}",
                    f"pidfile={_quoted(str(self.base / 'supervisord.pid'))}",
                    f"directory={_quoted(str(self.base))}",
                    f"childlogdir={_quoted(str(self.base))}",
                    "identifier=regauge",
                    # Every service's files (lake, logs, Kafka's segments) are made
                    # owner-only; supervisord's default is 022.
                    "umask=077",
                    # Its default clean-up deletes other supervisords' logs in /tmp.
                    "nocleanup=true",
                    "[rpcinterface:supervisor]",
                    "supervisor.rpcinterface_factory = "
                    "supervisor.rpcinterface:make_main_rpcinterface",
                    "[include]",
                    # Relative to this file: a path with a space would be split here.
                    "files=programs/*.conf",
                    "",
                ]
            ),
        )
        # It forks into the background (its own session), so it outlives the command
        # or Airflow task that started it.
        subprocess.run(
            [sys.executable, "-m", "supervisor.supervisord", "-c", str(self.conf)],
            check=True,
            cwd=self.base,
            stdin=subprocess.DEVNULL,
            timeout=timeout,
            env={k: os.environ[k] for k in _KEPT_ENV if k in os.environ},
        )
        if not wait_until(self.running, timeout):
            raise ServiceError(
                f"supervisord did not start within {timeout:.0f} s; its log ends with:\n"
                + tail(self.log)
            )

    def info(self, name: str) -> dict[str, Any] | None:
        """supervisord's record of a program (state, pid, uptime), or None if it has none."""
        if not self.socket.exists():
            return None
        try:
            found: dict[str, Any] = self.rpc().supervisor.getProcessInfo(name)
        except (OSError, xmlrpc.client.Fault):
            return None
        return found

    def pid(self, name: str) -> int | None:
        info = self.info(name)
        if info is None or info["statename"] not in ALIVE or not info["pid"]:
            return None
        return int(info["pid"])

    def state(self, name: str) -> str | None:
        """supervisord's state of a program (RUNNING, BACKOFF, FATAL...), None if unknown."""
        info = self.info(name)
        return None if info is None else str(info["statename"])

    def start(self, name: str, argv: Sequence[str], log: Path, program: Program) -> None:
        """(Re)define the program with this command line and start it."""
        self.ensure()
        log.parent.mkdir(parents=True, exist_ok=True)
        env = {
            k: v for k, v in os.environ.items() if k.startswith("REGAUGE_") and k not in _NOT_PASSED
        }
        env.update(program.env)
        command = shlex.join(argv)
        if re.search(r"[\n\r]|\s[#;]", command):
            # supervisord's parser would end the line there, whatever the quotes.
            raise ServiceError(
                f"{name}'s command line holds a line break, or whitespace before '#' or "
                f"';', which supervisord cannot run: {command[:200]}"
            )
        section = [
            f"[program:{name}]",
            f"command={_quoted(command)}",
            "autostart=false",
            f"autorestart={'true' if program.service else 'unexpected'}",
            "exitcodes=0",
            # Up once it has lived this long; a quicker death counts as a failed
            # start, retried with a growing backoff (n seconds before the nth retry).
            f"startsecs={program.start_s}",
            f"startretries={program.start_retries}",
            f"priority={program.priority}",
            f"stopsignal={program.stop_signal}",
            f"stopwaitsecs={int(program.stop_wait_s)}",
            f"stopasgroup={str(program.service).lower()}",
            "killasgroup=true",
            "redirect_stderr=true",
            f"stdout_logfile={_quoted(str(log))}",
            f"stdout_logfile_maxbytes={LOG_MAX_BYTES}",
            f"stdout_logfile_backups={LOG_BACKUPS}",
        ]
        if program.cwd is not None:
            section.append(f"directory={_quoted(str(program.cwd))}")
        if program.user is not None:
            section.append(f"user={program.user}")
        if env:
            section.append(
                "environment=" + ",".join(_env_value(name, k, v) for k, v in sorted(env.items()))
            )
        path = self._programs() / f"{name}.conf"
        text = "\n".join(section) + "\n"
        if not path.exists() or path.read_text() != text:
            _private_write(path, text)
        self._update(name)
        try:
            self.rpc().supervisor.startProcess(name, False)
        except xmlrpc.client.Fault as exc:
            if "ALREADY_STARTED" not in exc.faultString:
                raise ServiceError(
                    f"supervisord could not start {name}: {exc.faultString}"
                ) from exc

    def _update(self, name: str) -> None:
        """`supervisorctl update` for one program: load its section as it is now.
        A changed section replaces the old one only while the program is not alive."""
        server = self.rpc().supervisor
        try:
            [[added, changed, _removed]] = server.reloadConfig()
            if name in changed and (self.info(name) or {}).get("statename") not in ALIVE:
                # BACKOFF (retrying a quick death) is not stopped: stop it first.
                with contextlib.suppress(xmlrpc.client.Fault):
                    server.stopProcess(name, True)
                server.removeProcessGroup(name)
                added = [*added, name]
            if name in added:
                server.addProcessGroup(name)
        except xmlrpc.client.Fault as exc:
            raise ServiceError(
                f"supervisord could not load {name}'s section ({exc.faultString}); see {self.log}"
            ) from exc

    def forget(self, name: str) -> bool:
        """Stop a program regauge no longer runs and drop its section, so a state
        folder made by an older regauge neither runs nor lists it; whether it had one."""
        path = self._programs() / f"{name}.conf"
        if not path.exists():
            return False
        if self.running():
            server = self.rpc().supervisor
            with contextlib.suppress(xmlrpc.client.Fault):
                server.stopProcess(name, True)
            with contextlib.suppress(xmlrpc.client.Fault):
                server.removeProcessGroup(name)
        path.unlink()
        return True

    def stop(self, name: str) -> None:
        """Ask it to stop (SIGTERM); supervisord kills its group after stop_wait_s."""
        try:
            self.rpc().supervisor.stopProcess(name, False)
        except xmlrpc.client.Fault as exc:
            if "NOT_RUNNING" not in exc.faultString and "BAD_NAME" not in exc.faultString:
                raise ServiceError(f"supervisord could not stop {name}: {exc.faultString}") from exc
        except OSError:
            pass  # supervisord is gone, and its programs with it

    def programs(self) -> list[dict[str, Any]]:
        """Every program's state, for `regauge status`."""
        if not self.running():
            return []
        try:
            found: list[dict[str, Any]] = self.rpc().supervisor.getAllProcessInfo()
        except OSError:
            return []  # it went away, or hangs, since it said it runs
        return found

    def idle(self) -> bool:
        """Whether none of its programs runs or is about to run again."""
        return not any(p["statename"] in (*ALIVE, "BACKOFF") for p in self.programs())

    def shutdown_if_idle(self) -> bool:
        """Stop supervisord once it has nothing left to run (`regauge down`'s last step);
        whether it stopped."""
        return self.running() and self.idle() and self.shutdown()

    def shutdown(self, timeout: float = 400.0) -> bool:
        """Stop supervisord (it stops its programs first). False if it was not running."""
        if not self.running():
            return False
        self.rpc().supervisor.shutdown()
        deadline = time.monotonic() + timeout
        while self.socket.exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        return True
