"""The infra scripts' one start-up wait (common.sh launch + wait_for) judges only its own child.

Issue 37: ``kafka.sh`` checked ``owned_pid`` right after ``nohup java ... &``, before the forked child had
exec'd java, so ``/proc/PID/cmdline`` did not name the state folder yet and a healthy start was reported as
"kafka exited during start". ``launch`` now enters the state folder before the fork, so its child is
recognisable (by its working directory) from its first instant, whatever its command line says.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
from pathlib import Path

import redis

ROOT = Path(__file__).resolve().parents[3]
COMMON = ROOT / "infra" / "common.sh"
CYCLES = 20  # the figure: a race that fails one start in five shows within 20


def _bash(
    script: str, services_dir: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", "-c", f"set -euo pipefail; source {COMMON}; {script}"],
        env={**os.environ, "HEADWATER_SERVICES_DIR": str(services_dir), **(env or {})},
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )


def _free_ports(n: int) -> list[int]:
    sockets = [socket.socket() for _ in range(n)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [int(s.getsockname()[1]) for s in sockets]
    finally:
        for s in sockets:
            s.close()


def test_a_launched_child_is_ours_from_its_first_instant(tmp_path: Path) -> None:
    # `sleep` never names the state folder on its command line: only the working directory can prove
    # it is ours, and owned_pid is asked at once, before the child could have done anything itself.
    script = (
        "for i in $(seq 1 25); do"
        " launch probe sleep 30; owned_pid probe >/dev/null || echo MISSED; stop_owned probe;"
        " done"
    )
    result = _bash(script, tmp_path)
    assert result.returncode == 0, result.stderr
    assert "MISSED" not in result.stdout
    assert result.stderr.count("probe: stopping pid") == 25


def test_wait_for_reports_a_child_that_really_exited(tmp_path: Path) -> None:
    result = _bash("launch probe bash -c 'echo bad config >&2; exit 3'; wait_for probe 10 false", tmp_path)
    assert result.returncode == 1
    assert f"probe exited during start; see {tmp_path}/probe/probe.log" in result.stderr
    assert (tmp_path / "probe" / "probe.log").read_text() == "bad config\n"


def test_wait_for_reports_a_check_that_never_passes(tmp_path: Path) -> None:
    started = time.monotonic()
    result = _bash("launch probe sleep 30; wait_for probe 2 false", tmp_path)
    _bash("stop_owned probe", tmp_path)
    assert result.returncode == 1
    assert "probe not healthy within 2 s" in result.stderr
    assert 1.5 < time.monotonic() - started < 20


def test_redis_and_kafka_start_and_stop_twenty_times_on_fresh_state(tmp_path: Path) -> None:
    """20 cycles of redis.sh + kafka.sh start/stop, each on a new state folder and its own ports."""
    failures: list[str] = []
    for cycle in range(CYCLES):
        kafka_port, controller_port, redis_port = _free_ports(3)
        env = {
            **os.environ,
            "HEADWATER_SERVICES_DIR": str(tmp_path / f"cycle-{cycle}"),
            "HEADWATER_KAFKA_PORT": str(kafka_port),
            "HEADWATER_KAFKA_CONTROLLER_PORT": str(controller_port),
            "HEADWATER_REDIS_PORT": str(redis_port),
            "HEADWATER_KAFKA_BOOTSTRAP": f"127.0.0.1:{kafka_port}",
        }
        try:
            for name in ("redis", "kafka"):
                started = subprocess.run(
                    ["bash", str(ROOT / "infra" / f"{name}.sh"), "start"],
                    env=env,
                    capture_output=True,
                    text=True,
                    timeout=180,
                    check=False,
                )
                if started.returncode != 0:
                    failures.append(f"cycle {cycle}: {name} start: {started.stderr.strip()}")
            if not failures:
                assert redis.Redis(port=redis_port).ping() is True
                # The recorded pids are the servers themselves (not a shell that launched them).
                state = tmp_path / f"cycle-{cycle}"
                kafka_pid = (state / "kafka" / "kafka.pid").read_text().strip()
                assert "kafka.Kafka" in Path(f"/proc/{kafka_pid}/cmdline").read_text()
                redis_pid = (state / "redis" / "redis.pid").read_text().strip()
                assert Path(f"/proc/{redis_pid}/cmdline").read_text().startswith("redis-server")
        finally:
            for name in ("kafka", "redis"):
                subprocess.run(
                    ["bash", str(ROOT / "infra" / f"{name}.sh"), "stop"],
                    env=env,
                    capture_output=True,
                    timeout=120,
                    check=False,
                )
        if failures:
            break
        # Nothing of this cycle is left listening (stop waited for both).
        assert all(_closed(port) for port in (kafka_port, redis_port)), f"cycle {cycle} left a port open"
    assert failures == []


def _closed(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex(("127.0.0.1", port)) != 0
