"""Spark for the serving tests that build a training set through the real offline path."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    from headwater.pipelines.offline.session import offline_session

    session = offline_session("headwater-serving-tests")
    session.conf.set("spark.sql.shuffle.partitions", "2")  # tiny tables: fewer tasks, same results
    yield session
    session.stop()
