"""One landing process per bronze table: an exclusive ``flock`` on ``<table>/_landing.lock``.

Why a lock: two landers of one source read the same checkpoint and the same records, and both
commit batch ``seq + 1``. Delta skips the second commit of a ``txnVersion`` without an error, so
the slower lander goes on with ``seq + 2`` from offsets the first one's batch may already hold
(batches end at different offsets): rows landed twice. The second lander must refuse instead.

Why ``flock`` and not a lease with an expiry: the kernel releases the lock when its holder's file
descriptor closes, and a process killed with ``kill -9`` closes all of them. So a crashed lander
never leaves a stale lock, there is no clock and no expiry to tune, and a lander that is alive but
stalled (paused, swapping, a long GC) keeps its lock: a second lander cannot take over while the
first might still commit, the split brain a time-based lease allows. The holder writes its pid,
host and start time into the file, for the message the refused one prints (the contents are
information only; the lock is the ``flock``).

Limits: ``flock`` is local to a host (and an NFS mount that implements it); landers of one table on
two hosts over an object store need a distributed lock (a Kafka consumer group's single member,
for instance). Here the lake is a local folder.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType

from headwater.pipelines.offline.landing_state import LandingError

LOCK_NAME = "_landing.lock"
"""In the table's folder; Delta ignores (and VACUUM keeps) names starting with ``_``."""


class LandingLock:
    """The exclusive right to land into one bronze table, for as long as this process holds it."""

    def __init__(self, table: Path, source: str) -> None:
        """Lock ``table`` (its folder is created if missing) on behalf of source ``source``."""
        self.path = table / LOCK_NAME
        self.source = source
        self._fd: int | None = None

    def acquire(self) -> None:
        """Take the lock without waiting.

        Raises:
            LandingError: another process (or another lander of this process) holds it.
        """
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read(fd)
            os.close(fd)
            msg = (
                f"source {self.source!r}: another landing process holds {self.path} ({holder}); it is "
                "landing this table already and two at once would land rows twice. Stop it first, or "
                "let it run; the lock is released when it exits, even after kill -9"
            )
            raise LandingError(msg) from None
        info = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "since": datetime.now(UTC).isoformat(timespec="seconds"),
            "source": self.source,
        }
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(info).encode(), 0)
        self._fd = fd

    def release(self) -> None:
        """Release the lock (closing the descriptor releases it; the file stays)."""
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, 0)
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> LandingLock:
        """Acquire (see :meth:`acquire`)."""
        self.acquire()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        """Release."""
        self.release()


def _read(fd: int) -> str:
    """Describe the holder from the lock file's contents (best effort: it may be mid-write)."""
    try:
        data = json.loads(os.pread(fd, 4096, 0) or b"{}")
    except (OSError, ValueError):
        data = {}
    if not isinstance(data, dict) or "pid" not in data:
        return "holder unknown"
    return f"pid {data['pid']} on {data.get('host', '?')} since {data.get('since', '?')}"
