"""Two landing processes at once on one source (issue 16 item 6b): the second refuses, nothing lands twice.

Before the lock both ran: they read the same checkpoint and records, Delta silently skipped the
slower one's commit of the same ``txnVersion``, and that lander went on from its own offsets.
Here a real landing process (its own Spark) follows the topic; a second lander refuses with a
message naming the first; the first is killed with SIGKILL mid-stream and a new lander takes the
table over at once (no stale lock) and lands the rest: every record exactly once.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from headwater.pipelines.events.codec import EventCodec
from headwater.pipelines.offline.lake import is_delta_table
from headwater.pipelines.offline.landing import Lander, LandingConfig, LandingError, read_checkpoint
from headwater.pipelines.offline.testing import T0, behaviour

_spec = importlib.util.spec_from_file_location(
    "landing_t", Path(__file__).with_name("test_offline_landing.py")
)
assert _spec is not None
assert _spec.loader is not None
lt = importlib.util.module_from_spec(_spec)
sys.modules["landing_t"] = lt
_spec.loader.exec_module(lt)
topics = lt.topics  # the fixture: a fresh topic and its dead-letter topic, 2 partitions

FOLLOWER = """
import sys
from pathlib import Path
from headwater.pipelines.offline.landing import Lander, LandingConfig
from headwater.pipelines.offline.session import offline_session
from headwater.pipelines.offline.testing import behaviour
bootstrap, topic, dlq, table = sys.argv[1:5]
spark = offline_session("headwater-landing-follower")
source = behaviour().model_copy(update={"topic": topic})
config = LandingConfig(bootstrap, source, dlq, Path(table), batch_records=300, max_batch_s=1.0,
                       poll_timeout_ms=200)
print("landing", flush=True)
Lander(spark, config).run(follow=True)
"""


def _wait(check: Any, timeout_s: float, what: str, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if proc.poll() is not None or time.monotonic() > deadline:
            pytest.fail(
                f"{what}: not after {timeout_s:g} s; follower log:\n{log.read_text(errors='replace')[-3000:]}"
            )
        time.sleep(0.3)


def _landed(spark: Any, config: LandingConfig) -> int:
    """Records the table's last landing commit covers (0 before its first commit is complete)."""
    if not is_delta_table(config.table):
        return 0
    try:
        return sum(read_checkpoint(spark, config).offsets.values())
    except Exception:  # the log folder exists before its first commit file does
        return 0


def test_a_second_landing_process_refuses_and_a_kill_9_leaves_no_stale_lock(
    spark: Any, kafka_bootstrap: str, topics: tuple[str, str], tmp_path: Path
) -> None:
    topic, dlq = topics
    codec = EventCodec()
    table = tmp_path / "bronze" / "events"
    first = [lt.good(codec, n, T0 + n * 100, n % 2) for n in range(1, 601)]
    lt.produce(kafka_bootstrap, topic, first)
    log = tmp_path / "follower.log"
    with log.open("wb") as out:
        follower = subprocess.Popen(
            [sys.executable, "-c", FOLLOWER, kafka_bootstrap, topic, dlq, str(table)],
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    source = behaviour().model_copy(update={"topic": topic})
    config = LandingConfig(kafka_bootstrap, source, dlq, table, batch_records=1000)
    try:
        _wait(lambda: _landed(spark, config) > 0, 180, "the follower's first commit", follower, log)
        # Step 1: a second lander while the first runs refuses, naming it, and lands nothing.
        with pytest.raises(LandingError, match=rf"another landing process holds .*pid {follower.pid} "):
            Lander(spark, config).run()
        # Step 2: more records while the follower lands; kill -9 it mid-stream.
        second = [lt.good(codec, n, T0 + n * 100, n % 2) for n in range(601, 1501)]
        lt.produce(kafka_bootstrap, topic, second)
        _wait(lambda: _landed(spark, config) > 600, 120, "landing of the second lot", follower, log)
    finally:
        if follower.poll() is None:
            os.killpg(follower.pid, signal.SIGKILL)
        follower.wait(30)
    landed_by_follower = sum(read_checkpoint(spark, config).offsets.values())
    # Step 3: the lock died with its holder; a new lander takes over at once and lands the rest.
    stats = Lander(spark, config).run()
    assert stats.records == 1500 - landed_by_follower
    rows = lt.bronze_rows(spark, table)
    assert len(rows) == 1500
    assert len({(p, o) for p, o, _ in rows}) == 1500  # each Kafka record once
    assert sorted(r[2] for r in rows) == [f"e{n:05d}" for n in range(1, 1501)]
    assert read_checkpoint(spark, config).offsets == {0: 750, 1: 750}
