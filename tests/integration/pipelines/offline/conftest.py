"""One Spark session (with Delta) for all offline-tier integration tests of a pytest run."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    from headwater.pipelines.offline.session import offline_session

    session = offline_session("headwater-offline-tests")
    session.conf.set("spark.sql.shuffle.partitions", "2")  # tiny test tables: fewer tasks, same results
    yield session
    session.stop()
