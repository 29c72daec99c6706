"""Where a string is still written in a local lake's files, decoded: parquet (data and
checkpoints, whose compression would hide it from a byte search) value by value,
every other file (commits, checksums, checkpoints of streams) as text."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq


def residue(root: Path, needle: str) -> list[str]:
    """The files under `root` that hold `needle` (relative paths, sorted)."""
    found = []
    raw = needle.encode()
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        if path.suffix == ".parquet":
            table = pq.read_table(path)
            hit = needle in str(table.to_pylist())
        else:
            hit = raw in path.read_bytes()
        if hit:
            found.append(str(path.relative_to(root)))
    return found
