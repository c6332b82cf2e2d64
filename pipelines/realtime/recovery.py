"""A realtime job that recovers: each checkpoint checked before it is restored, a failed restore falls back.

Before session 8 a checkpoint whose files were gone (a kill -9 while Flink discarded it, a disk
problem) was restored again every 5 s, forever (fixed-delay restarts, unlimited): the job never ran and
only the views' freshness said so. Now, in ``headwater run realtime`` (local mini-cluster):

1. **Check before restoring** (:func:`verify_checkpoint`). The candidates are the complete checkpoints
   (``chk-N`` with ``_metadata``), newest first (:func:`.job.checkpoint_candidates`; Flink retains 3).
   Each is read with Flink's own loader (``Checkpoints.loadCheckpointMetadata``, in the gateway JVM),
   and every state file its handles name must exist with the size the handle records (keyed state,
   operator state, and the in-flight channel state of an unaligned checkpoint; small states live inside
   ``_metadata``). The first that passes is restored; each one skipped is logged (which chk, which file,
   why) and marked (:data:`UNRESTORABLE`, a file in its folder saying why), so no later start tries it.
2. **A restore that fails anyway** (a file of the right size with wrong bytes): Flink restarts the job a
   few times (:data:`.job.RESTART_STRATEGY`, exponential delay, bounded), then the job fails. If it
   failed restoring (the error names the checkpoint or a state restore, :func:`restore_failed`) and
   completed no checkpoint of its own, that checkpoint is marked and the job is submitted again from the
   previous one (:func:`supervise`). Any other failure (Redis or Kafka away longer than Flink's restarts)
   is submitted again from the newest checkpoint, after a backoff doubling to a minute.
3. **None left.** Only when every retained checkpoint failed does the job start without state, with an
   ERROR line naming them and the state report saying each view's windows start empty (partial values
   for its longest window). It is never silently empty while a checkpoint exists.

Exactly once: an older checkpoint restores older Kafka offsets, so the records between it and the newer
one are read again. Their values are rewritten through the store's fences (``write.lua``: a value with a
newer event time wins, an equal one is a no-op, and a restored job's re-emitted values are dated inside
their interval), as for any restore after a kill that followed a sink flush
(tests/integration/pipelines/realtime/test_realtime_kill_after_flush.py). The dead letters of those
records were committed with the newer checkpoint's Kafka transaction and are written again: a fallback
can repeat dead letters (same source topic, partition and offset; a consumer that counts them must
de-duplicate by those).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

log = logging.getLogger(__name__)

UNRESTORABLE = "_unrestorable"
"""A file in a ``chk-N`` folder that failed to restore (or failed the check): why. Delete it to try again."""

MAX_BACKOFF_S = 60.0
"""Longest wait before a job that failed for another reason than its restore is submitted again."""
STEADY_S = 120.0
"""A job that ran this long before failing starts the backoff again at 1 s (Flink's own reset)."""

_DELEGATING = {
    "org.apache.flink.runtime.state.KeyGroupsStateHandle": "getDelegateStateHandle",
    "org.apache.flink.runtime.state.OperatorStreamStateHandle": "getDelegateStateHandle",
    "org.apache.flink.runtime.state.AbstractChannelStateHandle": "getDelegate",
    "org.apache.flink.runtime.state.AbstractMergedChannelStateHandle": "getDelegate",
}
"""State handles whose bytes are in another handle, and the getter of that one."""
_FILE = "org.apache.flink.runtime.state.filesystem.FileStateHandle"
_SUBTASK_STATES = (
    "getManagedKeyedState",
    "getRawKeyedState",
    "getManagedOperatorState",
    "getRawOperatorState",
    "getInputChannelState",
    "getResultSubpartitionState",
)


def _iterate(collection: Any) -> Iterator[Any]:
    """Iterate a java.util.Collection through the gateway."""
    it = collection.iterator()
    while it.hasNext():
        yield it.next()


def verify_checkpoint(chk: Path) -> str | None:
    """Return why ``chk`` cannot be restored; None when it passes.

    It passes when its ``_metadata`` loads and names only files that exist with their recorded size.
    Needs the gateway JVM (:func:`.job.start_gateway`).
    """
    from py4j.protocol import Py4JJavaError
    from pyflink.java_gateway import get_gateway

    meta = chk / "_metadata"
    try:
        data = meta.read_bytes()
    except OSError as exc:
        return f"{meta} cannot be read: {exc}"
    jvm = get_gateway().jvm
    stream = jvm.java.io.DataInputStream(jvm.java.io.ByteArrayInputStream(data))
    loader = jvm.Thread.currentThread().getContextClassLoader()
    try:
        checkpoints = jvm.org.apache.flink.runtime.checkpoint.Checkpoints
        md = checkpoints.loadCheckpointMetadata(stream, loader, str(chk))
    except Py4JJavaError as exc:
        return f"{meta} does not load: {exc.java_exception.toString()}"
    classes = {name: jvm.java.lang.Class.forName(name) for name in [_FILE, *_DELEGATING]}

    def files(handle: Any) -> Iterator[Any]:
        if handle is None:
            return
        if classes[_FILE].isInstance(handle):
            yield handle
            return
        for name, getter in _DELEGATING.items():
            if classes[name].isInstance(handle):
                yield from files(getattr(handle, getter)())
                return
        # inline bytes (ByteStreamStateHandle) live in _metadata; other kinds (RocksDB's incremental
        # handles) are not written by this job's hashmap backend

    for op in _iterate(md.getOperatorStates()):
        for sub in _iterate(op.getStates()):
            for getter in _SUBTASK_STATES:
                for handle in _iterate(getattr(sub, getter)()):
                    for f in files(handle):
                        path = Path(str(f.getFilePath().toUri().getPath()))
                        want = int(f.getStateSize())
                        try:
                            size = path.stat().st_size
                        except OSError:
                            return f"state file {path} is missing (operator {op.getOperatorID().toString()})"
                        if size != want:
                            return f"state file {path} has {size} bytes, its checkpoint recorded {want}"
    return None


def mark_unrestorable(chk: Path, reason: str) -> None:
    """Write :data:`UNRESTORABLE` into ``chk``: no later start restores it (delete the file to try again)."""
    try:
        (chk / UNRESTORABLE).write_text(reason.strip() + "\n", encoding="utf-8")
    except OSError as exc:  # a read-only or vanished folder: this start still skips it
        log.warning("could not mark %s unrestorable: %s", chk, exc)


def is_marked(chk: Path) -> bool:
    """Return whether ``chk`` was marked unrestorable."""
    return (chk / UNRESTORABLE).is_file()


@dataclass(frozen=True)
class Choice:
    """The checkpoint a start restores (None: none) and the newer ones it skipped, with why."""

    checkpoint: Path | None
    skipped: tuple[tuple[Path, str], ...] = ()
    candidates: int = 0
    """How many complete checkpoints there were (a fresh start has 0)."""


def choose_checkpoint(
    candidates: list[Path], verify: Callable[[Path], str | None] = verify_checkpoint
) -> Choice:
    """Return the first of ``candidates`` (newest first) that passes ``verify``; mark and log the others.

    A candidate already marked :data:`UNRESTORABLE` is skipped without a new check.
    """
    skipped: list[tuple[Path, str]] = []
    for chk in candidates:
        if is_marked(chk):
            reason = (chk / UNRESTORABLE).read_text(encoding="utf-8", errors="replace").strip()
            why = f"marked unrestorable earlier ({reason})"
        else:
            found = verify(chk)
            if found is None:
                if skipped:
                    log.warning("falling back to checkpoint %s (%d newer skipped)", chk, len(skipped))
                return Choice(chk, tuple(skipped), len(candidates))
            mark_unrestorable(chk, found)
            why = found
        log.warning("checkpoint %s cannot be restored: %s; trying the previous retained one", chk, why)
        skipped.append((chk, why))
    if skipped:
        log.error(
            "NO RESTORABLE CHECKPOINT: all %d retained checkpoints failed (%s): the job starts WITHOUT "
            "STATE, every view's windows empty (partial values until its longest window has passed). Delete "
            "a folder's %s file to try it again, or restore a savepoint.",
            len(skipped),
            ", ".join(str(c) for c, _ in skipped),
            UNRESTORABLE,
        )
    return Choice(None, tuple(skipped), len(candidates))


RESTORE_SIGNS = (
    "Could not restore",  # "Could not restore keyed state backend for ...", "... operator state backend ..."
    "StreamOperatorStateContext",  # "Exception while creating StreamOperatorStateContext."
    "Failed when trying to restore",  # heap backend restore
    "loadCheckpointMetadata",  # the job master reading _metadata
)
"""What Flink's error says when a job fails restoring its state (any of these, or the checkpoint's path)."""


def restore_failed(error: str, chk: Path) -> bool:
    """Return whether a job's failure ``error`` (Flink's exception text) is a failure to restore ``chk``."""
    return str(chk) in error or any(sign in error for sign in RESTORE_SIGNS)


def summary(error: str, limit: int = 400) -> str:
    """Return the last ``Caused by`` of a Java stack trace (or its first line): what went wrong."""
    causes = [line.strip() for line in error.splitlines() if line.strip().startswith("Caused by:")]
    line = causes[-1] if causes else next((ln.strip() for ln in error.splitlines() if ln.strip()), "")
    return line[:limit]


class Running(Protocol):
    """A submitted job: its id, and a wait for its end."""

    job_id: str

    def wait(self) -> str | None:
        """Block until the job ends; return its failure (Flink's text), None when it finished."""


@dataclass
class Supervision:
    """What :func:`supervise` did (for the tests and the log)."""

    restored: list[Path | None] = field(default_factory=list)
    """The checkpoint each submission restored."""
    failures: list[str] = field(default_factory=list)


def supervise(
    choose: Callable[[], Choice],
    start: Callable[[Choice], Running],
    has_checkpointed: Callable[[str], bool],
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
    max_submissions: int | None = None,
) -> Supervision:
    """Run the job until it finishes: choose a checkpoint, submit, wait; on a failure decide what next.

    A failure restoring the chosen checkpoint by a job that completed no checkpoint of its own marks that
    checkpoint and submits again at once (the next choice falls back to the previous one). Any other
    failure is submitted again from the newest checkpoint after 1, 2, 4... up to :data:`MAX_BACKOFF_S`
    seconds (1 again after a job that ran :data:`STEADY_S`). ``max_submissions``: stop after that many
    (the tests); None: until the job finishes.
    """
    done = Supervision()
    backoff = 1.0
    while max_submissions is None or len(done.restored) < max_submissions:
        choice = choose()
        done.restored.append(choice.checkpoint)
        began = clock()
        job = start(choice)
        error = job.wait()
        if error is None:
            return done
        done.failures.append(error)
        chk = choice.checkpoint
        if chk is not None and not has_checkpointed(job.job_id) and restore_failed(error, chk):
            why = summary(error)
            log.error(
                "realtime job %s failed restoring checkpoint %s (%s): marking it unrestorable; submitting "
                "again from the previous retained checkpoint",
                job.job_id,
                chk,
                why,
            )
            mark_unrestorable(chk, f"the restore failed: {why}")
            continue
        if clock() - began >= STEADY_S:
            backoff = 1.0
        log.error(
            "realtime job %s failed after Flink's restarts (%s): submitting it again from the newest "
            "checkpoint in %g s",
            job.job_id,
            summary(error),
            backoff,
        )
        sleep(backoff)
        backoff = min(backoff * 2, MAX_BACKOFF_S)
    return done


def job_checkpointed(checkpoint_dir: Path, job_id: str) -> bool:
    """Return whether job ``job_id`` completed a checkpoint (a ``chk-N/_metadata`` in its folder)."""
    return any((checkpoint_dir / job_id).glob("chk-*/_metadata"))
