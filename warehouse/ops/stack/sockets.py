"""Which processes listen on which addresses, read from /proc (Linux).

`regauge status` and the exposure test use it: every service regauge starts
must listen on the configured host (127.0.0.1 locally), never on a wildcard
address that the whole network can reach.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from warehouse.ops.stack import process

# /proc/net/tcp's state column: 0A is LISTEN.
_LISTEN = "0A"


@dataclass(frozen=True)
class Listener:
    pid: int
    command: str
    address: str
    port: int

    @property
    def wildcard(self) -> bool:
        """Bound to every interface (0.0.0.0 or ::), so reachable from outside."""
        return ipaddress.ip_address(self.address).is_unspecified

    def __str__(self) -> str:
        host = f"[{self.address}]" if ":" in self.address else self.address
        return f"{host}:{self.port} pid {self.pid} ({self.command})"


def _address(hex_addr: str) -> str:
    """/proc/net/tcp{,6} write addresses as host-order 32-bit words in hex."""
    raw = bytes.fromhex(hex_addr)
    # Each 4-byte word is little-endian on the machines regauge runs on (x86, arm64).
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    addr = ipaddress.ip_address(words)
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        return str(addr.ipv4_mapped)
    return str(addr)


def _listening_inodes() -> dict[int, tuple[str, int]]:
    found: dict[int, tuple[str, int]] = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError), open(table) as f:
            next(f, None)  # the header
            for line in f:
                cols = line.split()
                if len(cols) < 10 or cols[3] != _LISTEN:
                    continue
                host, port = cols[1].rsplit(":", 1)
                found[int(cols[9])] = (_address(host), int(port, 16))
    return found


def _command(pid: int) -> str:
    argv = process.argv(pid)
    return "?" if argv is None else " ".join(argv)


def listeners() -> Iterator[Listener]:
    """Every listening TCP socket with the process holding it."""
    inodes = _listening_inodes()
    seen: set[tuple[int, int]] = set()
    for fd_dir in Path("/proc").glob("[0-9]*/fd"):
        pid = int(fd_dir.parent.name)
        try:
            fds = list(os.scandir(fd_dir))
        except OSError:
            continue  # ended while we looked, or not ours to read
        for fd in fds:
            with contextlib.suppress(OSError):
                target = os.readlink(fd.path)
                if target.startswith("socket:["):
                    inode = int(target[8:-1])
                    if inode in inodes and (pid, inode) not in seen:
                        seen.add((pid, inode))
                        yield Listener(pid, _command(pid), *inodes[inode])


def started_from(listener: Listener, roots: tuple[Path, ...]) -> bool:
    """Whether the process was started from one of `roots` (its command line or
    working directory names one): how regauge's own processes are told apart
    from the machine's."""
    if any(str(root) in listener.command for root in roots):
        return True
    try:
        cwd = os.readlink(f"/proc/{listener.pid}/cwd")
    except OSError:
        return False
    return any(cwd == str(root) or cwd.startswith(f"{root}/") for root in roots)
