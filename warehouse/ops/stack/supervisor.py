"""supervisord runs regauge's long-running pipeline process (the view host).

supervisord, from PyPI, restarts a program that dies (a kill -9, an
out-of-memory kill) within seconds, and rotates its log. One supervisord
serves one state folder. It listens on a unix socket in that folder, with no
TCP port to keep on loopback. It starts the first time a program is asked for
and stops with `regauge down`.

A program's section is written when it is started, with the starter's
command line, folder and `REGAUGE_*` settings. `supervisorctl update`'s two
calls (`reloadConfig`, then `addProcessGroup`) load it. supervisord sends
SIGTERM to the program alone, since the view host ends its micro-batches and
then stops its JVM. Only after `stop_wait_s` does it kill the whole process
group.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import subprocess
import sys
import time
import xmlrpc.client
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from warehouse.ops.stack.process import ServiceError, tail, wait_until

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


def _env_value(key: str, value: str) -> str:
    """A value for `environment=`, double-quoted; refused where supervisord's parser
    would cut or misread it (it has no escape for these)."""
    if any(c in value for c in '"\n\r') or " #" in value or " ;" in value:
        raise ServiceError(
            f"{key} holds a double quote, a line break, ' #' or ' ;', which supervisord "
            "cannot pass to the view host; set it without them"
        )
    return f'{key}="{_quoted(value)}"'


def _private_write(path: Path, text: str) -> None:
    """Owner-only: a program's section holds its settings, passwords among them."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    path.chmod(0o600)


@dataclass(frozen=True)
class Supervisor:
    base: Path

    @property
    def conf(self) -> Path:
        return self.base / "supervisord.conf"

    @property
    def socket(self) -> Path:
        return self.base / "supervisor.sock"

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
        for folder in (self.base, self._programs()):
            folder.mkdir(parents=True, exist_ok=True)
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

    def start(self, name: str, argv: list[str], log: Path, cwd: Path, stop_wait_s: float) -> None:
        """(Re)define the program with this command line and start it."""
        self.ensure()
        env = {
            k: v for k, v in os.environ.items() if k.startswith("REGAUGE_") and k not in _NOT_PASSED
        }
        section = [
            f"[program:{name}]",
            f"command={_quoted(shlex.join(argv))}",
            f"directory={_quoted(str(cwd))}",
            "autostart=false",
            # A clean exit (asked by `stop`) stays stopped; a crash is restarted.
            "autorestart=unexpected",
            "exitcodes=0",
            # Up once it has lived this long; a quicker death counts as a failed
            # start, retried with a growing backoff.
            "startsecs=5",
            "startretries=10",
            "stopsignal=TERM",
            f"stopwaitsecs={int(stop_wait_s)}",
            "stopasgroup=false",
            "killasgroup=true",
            "redirect_stderr=true",
            f"stdout_logfile={_quoted(str(log))}",
            f"stdout_logfile_maxbytes={LOG_MAX_BYTES}",
            f"stdout_logfile_backups={LOG_BACKUPS}",
        ]
        if env:
            section.append(
                "environment=" + ",".join(_env_value(k, v) for k, v in sorted(env.items()))
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
        found: list[dict[str, Any]] = self.rpc().supervisor.getAllProcessInfo()
        return found

    def shutdown(self, timeout: float = 120.0) -> bool:
        """Stop supervisord (it stops its programs first). False if it was not running."""
        if not self.running():
            return False
        self.rpc().supervisor.shutdown()
        deadline = time.monotonic() + timeout
        while self.socket.exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        return True
