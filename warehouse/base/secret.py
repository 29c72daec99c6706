"""Secrets a checkout makes once and keeps readable by its owner only.

Every process started later (the services, the CLI, Airflow's tasks) reads the
same one, so no secret has to be written into a default that every local
account can read in the source.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from pathlib import Path


def kept(path: Path) -> str:
    """The secret in `path`, made there (mode 0600) if there is none yet.

    Made in a file of its own and linked into place: two processes that load
    their settings at once agree on one secret, and none reads a half-written one.
    """
    if not path.is_file():
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        draft = path.with_name(f".{path.name}.{os.getpid()}")
        fd = os.open(draft, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(secrets.token_urlsafe(32))
        try:
            with contextlib.suppress(FileExistsError):
                os.link(draft, path)
        finally:
            draft.unlink()
    return path.read_text().strip()
