"""Damage to a queue's log files while the broker is down: find records, flip bits, truncate.

Record boundaries are read with the broker's own framing (``broker.storage.record``), so a test
knows exactly which offsets a damaged byte belongs to.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from broker.storage.record import HEADER, parse_header

__all__ = ["Damage", "Record", "flip_bit", "records", "segments", "truncate"]


@dataclass(frozen=True)
class Record:
    """One record of a segment file: where it starts, how long it is, which offsets it holds."""

    path: Path
    position: int
    size: int
    base_offset: int
    count: int


@dataclass(frozen=True)
class Damage:
    """What a test did to a segment: the file, the first byte the broker must cut from, the
    first offset lost, and the file size before the broker cut it."""

    path: Path
    position: int
    first_lost_offset: int
    size_after_damage: int
    what: str


def segments(queue_dir: Path) -> list[Path]:
    """A queue's segment files, oldest first."""
    return sorted(queue_dir.glob("*.log"))


def records(path: Path) -> list[Record]:
    """Every record of an intact segment file, in order."""
    raw = path.read_bytes()
    out, position = [], 0
    while position < len(raw):
        header = parse_header(raw[position : position + HEADER.size])
        if header is None:
            raise ValueError(f"{path} has no record header at byte {position}")
        out.append(Record(path, position, header.size, header.base_offset, header.count))
        position += header.size
    return out


def flip_bit(record: Record, offset_in_record: int, bit: int = 0) -> Damage:
    """Flip one bit of ``record`` (``offset_in_record`` bytes from its start)."""
    with open(record.path, "r+b") as f:
        f.seek(record.position + offset_in_record)
        byte = f.read(1)[0]
        f.seek(record.position + offset_in_record)
        f.write(bytes([byte ^ (1 << bit)]))
        f.flush()
        os.fsync(f.fileno())
    return Damage(record.path, record.position, record.base_offset, record.path.stat().st_size,
                  f"bit {bit} of byte {offset_in_record} flipped in the record of offset {record.base_offset}")


def truncate(record: Record, keep: int) -> Damage:
    """Cut the file inside ``record``, keeping its first ``keep`` bytes (0 < keep < size)."""
    os.truncate(record.path, record.position + keep)
    return Damage(record.path, record.position, record.base_offset, record.position + keep,
                  f"file truncated {keep} bytes into the record of offset {record.base_offset}")
