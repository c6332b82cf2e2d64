"""Session fixtures: the real services, started once through the infra/ scripts.

Integration tests ask for ``kafka_bootstrap`` or ``redis_url``. When the service already answers
(``make test`` starts them through infra/with-services.sh, or a developer ran ``make
services-up``), it is used as is; otherwise the fixture starts it and stops it at the end of the
session. Every test under tests/integration/ is marked ``integration``.
"""

from __future__ import annotations

import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from headwater.pipelines.settings import Settings
from headwater.pipelines.store.testing import OwnRedis

ROOT = Path(__file__).resolve().parents[1]
INFRA = ROOT / "infra"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    integration_dir = ROOT / "tests" / "integration"
    for item in items:
        if integration_dir in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.integration)


def _port_open(address: str) -> bool:
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=1):
            return True
    except OSError:
        return False


def _ensure(service: str, address: str) -> Iterator[None]:
    """Start ``service`` with its infra script unless something already answers at ``address``."""
    started = False
    if not _port_open(address):
        subprocess.run(["bash", str(INFRA / f"{service}.sh"), "start"], check=True, cwd=ROOT)
        started = True
    yield
    if started:
        subprocess.run(["bash", str(INFRA / f"{service}.sh"), "stop"], check=False, cwd=ROOT)


@pytest.fixture(scope="session")
def settings() -> Settings:
    return Settings.from_env()


@pytest.fixture(scope="session")
def redis_url(settings: Settings) -> Iterator[str]:
    address = settings.redis_url.split("://", 1)[1].split("/", 1)[0]
    yield from _with(_ensure("redis", address), settings.redis_url)


@pytest.fixture(scope="session")
def kafka_bootstrap(settings: Settings) -> Iterator[str]:
    yield from _with(_ensure("kafka", settings.kafka_bootstrap), settings.kafka_bootstrap)


def _with(guard: Iterator[None], value: str) -> Iterator[str]:
    next(guard)
    yield value
    next(guard, None)


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[OwnRedis]:
    """A private redis-server (started) that the test may stop and restart; stopped at the end."""
    server = OwnRedis(tmp_path)
    server.start()  # raises OwnRedisError (the test errors) when redis-server is missing or mute
    yield server
    server.stop()
