"""The progress journal and the locks of a resumable loop (`harness nightly`).

A run (results/nightly/<run>/) is a list of items ("evaluate:fuse_norm", "agent:fuse_norm"). Its
journal.jsonl holds ItemRecords: "started" when a process takes an item, "done" with the item's
outcome and findings when it finishes. An item is done when a "done" record exists for it, and at
most one exists: `finish` checks and appends under the journal's lock.

Concurrency: a process works on an item only while it holds the item's exclusive lock (flock on
locks/<item>.lock), and checks the journal after taking it, so two processes never do one item
twice, and a process that finds an item taken goes on with others and comes back to it. The
kernel releases a lock when its holder dies, so an item whose holder was killed is simply taken
again: that is resumption (its "started" record without a "done" says it was interrupted).
Appends go through harness.records.append (one write, fsync, torn-line tolerant readers).
"""

from __future__ import annotations

import dataclasses
import fcntl
import os
import platform
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness import records
from harness.records import now_utc

JOURNAL_FILE = "journal.jsonl"
LOCKS_DIR = "locks"
STATES = ("started", "done")
OUTCOMES = ("ok", "failed", "error")  # done: no gating finding; a gating finding; the harness failed on it
ITEM_NAME = re.compile(r"^[a-z]+:[A-Za-z0-9_.-]+$")


@dataclass(frozen=True)
class ItemRecord:
    run: str
    item: str  # "<kind>:<task>"
    state: str  # one of STATES
    outcome: str = ""  # done: one of OUTCOMES
    findings: list[dict[str, Any]] = field(default_factory=list)  # harness.nightly.Finding dicts
    details: dict[str, Any] = field(default_factory=dict)  # what the summary shows of the item
    wall_s: float = 0.0
    host: str = field(default_factory=platform.node)
    pid: int = field(default_factory=os.getpid)
    created_utc: str = field(default_factory=now_utc)

    def __post_init__(self) -> None:
        if self.state not in STATES:
            raise ValueError(f"item state must be one of {STATES}; got {self.state!r}")
        if self.state == "done" and self.outcome not in OUTCOMES:
            raise ValueError(f"a done item needs an outcome in {OUTCOMES}; got {self.outcome!r}")
        if not ITEM_NAME.match(self.item):
            raise ValueError(f"item must look like 'evaluate:fuse_norm'; got {self.item!r}")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@contextmanager
def exclusive(path: Path, blocking: bool = True) -> Iterator[bool]:
    """An exclusive flock on `path` (created if needed) for the block; yields whether it was taken."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(fd)  # releases the lock


class Journal:
    def __init__(self, folder: Path):
        self.folder = Path(folder)
        self.path = self.folder / JOURNAL_FILE

    def entries(self) -> tuple[list[ItemRecord], list[str]]:
        return records.read(self.path, ItemRecord)

    def done(self, run: str) -> dict[str, ItemRecord]:
        """item -> its done record (the first, should a second ever exist)."""
        out: dict[str, ItemRecord] = {}
        for r in self.entries()[0]:
            if r.run == run and r.state == "done":
                out.setdefault(r.item, r)
        return out

    def interrupted(self, run: str) -> list[ItemRecord]:
        """Started records whose item has no done record after them from the same process."""
        entries = [r for r in self.entries()[0] if r.run == run]
        finished = {(r.item, r.host, r.pid) for r in entries if r.state == "done"}
        return [r for r in entries if r.state == "started" and (r.item, r.host, r.pid) not in finished]

    def item_lock(self, item: str, blocking: bool):
        return exclusive(self.folder / LOCKS_DIR / f"{item.replace(':', '__')}.lock", blocking)

    def start(self, run: str, item: str) -> None:
        records.append(self.path, ItemRecord(run, item, "started"))

    def finish(self, record: ItemRecord) -> bool:
        """Append `record` (state done) unless its item is done already; whether it was appended."""
        with exclusive(self.folder / "journal.lock"):
            if record.item in self.done(record.run):
                return False
            records.append(self.path, record)
            return True
