"""infra/redis.sh and infra/kafka.sh: healthy on start, and stop only what they started."""

from __future__ import annotations

import os
import socket
import subprocess
from pathlib import Path

import pytest
import redis

ROOT = Path(__file__).resolve().parents[3]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _script(name: str, action: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(ROOT / "infra" / f"{name}.sh"), action],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_redis_script_starts_on_the_overridden_port_and_stops_it(tmp_path: Path) -> None:
    port = _free_port()
    env = {"HEADWATER_REDIS_PORT": str(port), "HEADWATER_SERVICES_DIR": str(tmp_path)}

    started = _script("redis", "start", env)
    assert started.returncode == 0, started.stderr
    client = redis.Redis(port=port)
    assert client.ping() is True
    pid = (tmp_path / "redis" / "redis.pid").read_text().strip()
    assert Path(f"/proc/{pid}/cmdline").read_text().startswith("redis-server")
    assert client.config_get("dir")["dir"] == str(tmp_path / "redis")

    stopped = _script("redis", "stop", env)
    assert stopped.returncode == 0, stopped.stderr
    with pytest.raises(redis.ConnectionError):
        redis.Redis(port=port, socket_connect_timeout=1).ping()


def test_stop_leaves_a_redis_it_did_not_start_running(tmp_path: Path) -> None:
    port = _free_port()
    foreign_dir = tmp_path / "foreign"
    foreign_dir.mkdir()
    foreign = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--dir", str(foreign_dir)],
        stdout=subprocess.DEVNULL,
    )
    try:
        client = redis.Redis(port=port)
        for _ in range(50):
            try:
                client.ping()
                break
            except redis.ConnectionError:
                subprocess.run(["sleep", "0.1"], check=True)
        env = {"HEADWATER_REDIS_PORT": str(port), "HEADWATER_SERVICES_DIR": str(tmp_path / "state")}

        started = _script("redis", "start", env)
        assert started.returncode == 0
        assert "not started by headwater" in started.stderr

        stopped = _script("redis", "stop", env)
        assert stopped.returncode == 0
        assert client.ping() is True
        assert foreign.poll() is None
    finally:
        foreign.terminate()
        foreign.wait(timeout=10)


def test_kafka_status_reports_the_running_broker(kafka_bootstrap: str) -> None:
    port = kafka_bootstrap.rsplit(":", 1)[1]
    status = _script("kafka", "status", {"HEADWATER_KAFKA_PORT": port})
    assert status.returncode == 0
    assert f"kafka: up on 127.0.0.1:{port}" in status.stdout


def test_kafka_status_fails_where_no_broker_listens() -> None:
    status = _script("kafka", "status", {"HEADWATER_KAFKA_PORT": str(_free_port())})
    assert status.returncode == 1
    assert "kafka: down" in status.stdout
