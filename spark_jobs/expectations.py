"""What the contract says must become of generated records, once Kafka has placed them:
which event ids silver keeps (and at which position), which positions the
quarantine holds and why, which are exact duplicates. Tests, the demo, chaos
and `regauge produce`'s report judge the lake against this.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

from spark_jobs.generator import CONFLICT, VALID, Record


@dataclass
class Expected:
    """The contract's answer for a set of delivered records."""

    silver: dict[str, tuple[int, int]] = field(default_factory=dict)  # event_id -> position
    quarantine: dict[tuple[int, int], str] = field(default_factory=dict)  # position -> reason
    duplicates: set[tuple[int, int]] = field(default_factory=set)

    def by_reason(self) -> Counter[str]:
        return Counter(self.quarantine.values())

    def per_partition(self) -> dict[int, dict[str, int]]:
        out: dict[int, dict[str, int]] = {}
        for what, positions in (
            ("silver", self.silver.values()),
            ("quarantine", self.quarantine.keys()),
            ("duplicates", self.duplicates),
        ):
            for p, _ in positions:
                out.setdefault(p, {"silver": 0, "quarantine": 0, "duplicates": 0})[what] += 1
        return out


def expected_outcome(delivered: Iterable[tuple[Record, int, int]]) -> Expected:
    """Given each record with its (partition, offset), what silver and quarantine must hold."""
    exp = Expected()
    by_id: dict[str, list[tuple[tuple[int, int], Record]]] = {}
    for rec, partition, offset in delivered:
        pos = (partition, offset)
        if rec.expect == VALID:
            assert rec.event_id is not None
            by_id.setdefault(rec.event_id, []).append((pos, rec))
        else:
            exp.quarantine[pos] = rec.expect
    for event_id, seen in by_id.items():
        seen.sort(key=lambda pr: pr[0])
        (first, winner), rest = seen[0], seen[1:]
        exp.silver[event_id] = first
        for pos, rec in rest:
            if rec.content == winner.content:
                exp.duplicates.add(pos)
            else:
                exp.quarantine[pos] = CONFLICT
    return exp


def id_checksum(event_ids: Iterable[str]) -> int:
    """Order-free checksum of a set of event ids, equal to this Trino SQL:
    `sum(from_base(substr(to_hex(sha256(to_utf8(event_id))), 1, 8), 16))`."""
    return sum(int(hashlib.sha256(i.encode()).hexdigest()[:8], 16) for i in event_ids)
