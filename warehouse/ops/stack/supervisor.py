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


def _quoted(value: str) -> str:
    """A value for supervisord's config: `%` is interpolation there."""
    return value.replace("%", "%%")


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
        from supervisor.xmlrpc import SupervisorTransport

        transport = SupervisorTransport(None, None, f"unix://{self.socket}")
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
        self._programs().mkdir(parents=True, exist_ok=True)
        self.conf.write_text(
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
                    "[rpcinterface:supervisor]",
                    "supervisor.rpcinterface_factory = "
                    "supervisor.rpcinterface:make_main_rpcinterface",
                    "[include]",
                    f"files={_quoted(str(self._programs()))}/*.conf",
                    "",
                ]
            )
        )
        # It forks into the background (its own session), so it outlives the command
        # or Airflow task that started it.
        subprocess.run(
            [sys.executable, "-m", "supervisor.supervisord", "-c", str(self.conf)],
            check=True,
            cwd=self.base,
            stdin=subprocess.DEVNULL,
            timeout=timeout,
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
        env = {k: v for k, v in os.environ.items() if k.startswith("REGAUGE_")}
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
            pairs = ",".join(f'{k}="{_quoted(v)}"' for k, v in sorted(env.items()))
            section.append(f"environment={pairs}")
        path = self._programs() / f"{name}.conf"
        text = "\n".join(section) + "\n"
        if not path.exists() or path.read_text() != text:
            path.write_text(text)
        self._update(name)
        try:
            self.rpc().supervisor.startProcess(name, False)
        except xmlrpc.client.Fault as exc:
            if "ALREADY_STARTED" not in exc.faultString:
                raise ServiceError(
                    f"supervisord could not start {name}: {exc.faultString}"
                ) from exc

    def _update(self, name: str) -> None:
        """`supervisorctl update` for one program: load its section as it is now."""
        server = self.rpc().supervisor
        [[added, changed, _removed]] = server.reloadConfig()
        if name in changed and (self.info(name) or {}).get("statename") not in ALIVE:
            server.removeProcessGroup(name)
            added = [*added, name]
        if name in added:
            server.addProcessGroup(name)

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
