"""Trino, on Java 25, with its config rendered from infra/trino/local."""

from __future__ import annotations

import json
import logging
import shutil
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from string import Template

import trino.exceptions

from warehouse.base import jvm
from warehouse.base.settings import Settings
from warehouse.ops.stack import guard
from warehouse.ops.stack.base import INFRA, Service, _render
from warehouse.ops.stack.process import Proc, ServiceError

log = logging.getLogger(__name__)


class Trino(Service):
    """Trino 476 on Java 25 with catalogs `lakehouse` (Delta) and `ops` (PostgreSQL)."""

    name = "trino"
    priority = 300
    health_timeout = 180.0

    def ports(self) -> Sequence[int]:
        return [self.settings.trino_port]

    def guarded_ports(self) -> Sequence[int]:
        """The ports only the project's own account may open (`guard`): the local
        profile's one, where the user name is a header anyone could send. The
        cluster's nodes log users in with passwords and need none."""
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
                name=self.name,
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
        if not s.lake_is_local:
            raise ServiceError(
                f"the local Trino reads a lake in a local folder, not {s.lake_root}: on a "
                "cluster, regauge uses the cluster's Trino (REGAUGE_TRINO_HOST)"
            )
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
            "bind_ip": s.bind_host or "0.0.0.0",
            "internal_address": s.bind_host or "127.0.0.1",
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
        self.close_to_others()

    def close_to_others(self) -> None:
        """Close the port to other local accounts before Trino starts, so that no
        moment is left open; say so in one line where that cannot be done."""
        for port in self.guarded_ports():
            why = guard.close(port)
            if why is not None:
                log.warning(
                    "trino: port %d is open to every local account, which can claim any "
                    "user name, regauge's too: %s (docs/operators.md, 'Another local account')",
                    port,
                    why,
                )

    def stop(self) -> bool:
        stopped = super().stop()
        for port in self.guarded_ports():
            guard.lift(port)
        return stopped

    @property
    def info_url(self) -> str:
        """Where the node says whether it is still starting."""
        return f"{self.settings.trino_url}/v1/info"

    def healthy(self) -> bool:
        return self.started() and self.has_active_node()

    def started(self) -> bool:
        """Whether the node says it is past its start."""
        try:
            with urllib.request.urlopen(self.info_url, timeout=3) as resp:
                info = json.load(resp)
        except (OSError, urllib.error.URLError, ValueError):
            return False
        return info.get("starting") is False

    def has_active_node(self) -> bool:
        """Whether the coordinator counts a node active to run a query's tasks. It
        says it is past its start a moment before it counts itself: a query in that
        moment fails with NO_NODES_AVAILABLE (seen once right after `regauge up`
        said Trino was healthy)."""
        return active_nodes(self.settings) > 0

    def note(self) -> str:
        port = self.settings.trino_port
        who = (
            "only this account may connect"
            if guard.holds(port)
            else "no guard: any local account may connect"
        )
        return f"{self.settings.trino_url} (user name is the X-Trino-User header; {who})"


def active_nodes(settings: Settings, *, workers_only: bool = False) -> int:
    """How many nodes Trino's coordinator counts active to run a query's tasks (with
    `workers_only`, not itself); 0 while it cannot answer yet."""
    from warehouse.sql import trino_client

    which = "state = 'active'" + (" AND NOT coordinator" if workers_only else "")
    try:
        return int(
            trino_client.scalar(
                settings, f"SELECT count(*) FROM system.runtime.nodes WHERE {which}"
            )
        )
    except (OSError, trino.exceptions.Error, trino.exceptions.HttpError) as exc:
        log.debug("trino: no active node yet (%s)", exc)
        return 0
