"""The loopback guard: only the project's own account may open Trino's local port.

On the local profile Trino takes the user name from the `X-Trino-User` header
(docs/contract.md §7: no authentication locally, every service on 127.0.0.1). So
anyone who can open its port can claim to be `regauge` or `engineer.*`, write to
the lake and reroute analysts. Issue 68, A.4: another local account must not.

The guard is an nftables table of its own. Its output chain resets every TCP
connection over loopback to the port from a socket another account owns, before
Trino sees a byte. The header stays the user name, as the contract says, for the
one account that can reach it. Loading the table needs root (CAP_NET_ADMIN) and
`nft` (`make setup` installs Debian's nftables when run as root). Without them
the port stays open to every local account, and `regauge up` says so.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess

log = logging.getLogger(__name__)

PREFIX = "regauge_guard_"
# Root's tools live in sbin, which is not on every account's PATH.
SBIN = "/usr/sbin:/sbin"


def table(port: int) -> str:
    """The guard's nftables table for one port: a table per port, so that a stack on
    other ports (a second checkout's) keeps its own."""
    return f"{PREFIX}{port}"


def ruleset(port: int, uid: int) -> str:
    """The table as `nft -f` reads it. The `add` and `delete` before it make one
    transaction replace a table left by an earlier start (a crash, a `kill -9`)."""
    name = table(port)
    return (
        f"add table inet {name}\n"
        f"delete table inet {name}\n"
        f"table inet {name} {{\n"
        "  chain output {\n"
        "    type filter hook output priority filter; policy accept;\n"
        f'    oifname "lo" tcp dport {port} meta skuid != {uid} counter reject with tcp reset\n'
        "  }\n"
        "}\n"
    )


def _nft() -> str | None:
    return shutil.which("nft", path=f"{os.environ.get('PATH', '')}:{SBIN}")


def _run(nft: str, *argv: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [nft, *argv], input=stdin, capture_output=True, text=True, timeout=30, check=False
    )


def close(port: int) -> str | None:
    """Let only this process's account open `port` over loopback. None once the guard
    holds; otherwise why it could not be set, in a few words."""
    if os.geteuid() != 0:
        return "the stack does not run as root, and only root can load nftables rules"
    nft = _nft()
    if nft is None:
        return "nft is not installed (Debian's nftables; `make setup` installs it as root)"
    done = _run(nft, "-f", "-", stdin=ruleset(port, os.geteuid()))
    if done.returncode != 0:
        said = (done.stderr.strip().splitlines() or ["no message"])[-1]
        return f"nft refused the rules: {said}"
    log.info("guard: only uid %d may open port %d over loopback", os.geteuid(), port)
    return None


def holds(port: int) -> bool:
    """Whether the guard's table for `port` is loaded."""
    nft = _nft()
    if nft is None or os.geteuid() != 0:
        return False
    return _run(nft, "list", "table", "inet", table(port)).returncode == 0


def lift(port: int) -> None:
    """Remove the guard of `port` (when the service stops), leaving the machine as it
    was; nothing to do when it was never set."""
    if holds(port):
        nft = _nft()
        assert nft is not None  # holds() found it
        done = _run(nft, "delete", "table", "inet", table(port))
        if done.returncode != 0:
            log.warning("guard: could not remove nftables table %s: %s", table(port), done.stderr)
        else:
            log.info("guard: port %d open again (nftables table %s removed)", port, table(port))
