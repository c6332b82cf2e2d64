"""The JVM artifacts resolved by infra/ work with the pinned Python engines.

These prove the Maven project, not the tiers: Spark reads back a Delta table it wrote with the
Delta jars, and a PyFlink job reads a Kafka topic through the resolved connector.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from kafka import KafkaAdminClient, KafkaProducer
from kafka.admin import NewTopic

from headwater.pipelines import jvm


@pytest.fixture(scope="module")
def spark() -> Iterator[object]:
    session = jvm.spark_session("headwater-test-jvm")
    yield session
    session.stop()


def test_spark_writes_and_reads_delta_with_the_resolved_jars(spark: object, tmp_path: Path) -> None:
    from pyspark.sql import SparkSession

    assert isinstance(spark, SparkSession)
    table = str(tmp_path / "delta_table")
    spark.createDataFrame([(1, "a"), (2, "b")], "id INT, v STRING").write.format("delta").save(table)
    spark.createDataFrame([(3, "c")], "id INT, v STRING").write.format("delta").mode("append").save(table)

    rows = spark.read.format("delta").load(table).orderBy("id").collect()
    assert [(r.id, r.v) for r in rows] == [(1, "a"), (2, "b"), (3, "c")]
    history = spark.sql(f"DESCRIBE HISTORY delta.`{table}`").collect()
    assert len(history) == 2  # two commits in the Delta log: the write and the append
    assert spark.conf.get("spark.sql.adaptive.enabled") == "false"


def test_pyflink_reads_kafka_through_the_resolved_connector(kafka_bootstrap: str) -> None:
    from pyflink.table import StreamTableEnvironment

    topic = f"test.jvm.{uuid.uuid4().hex[:8]}"
    admin = KafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    admin.create_topics([NewTopic(topic, num_partitions=1, replication_factor=1)])
    try:
        producer = KafkaProducer(bootstrap_servers=kafka_bootstrap)
        for i in range(5):
            producer.send(topic, f'{{"n": {i}}}'.encode())
        producer.flush()
        producer.close()

        env = jvm.flink_environment(parallelism=1)
        tenv = StreamTableEnvironment.create(env)
        tenv.execute_sql(
            f"""
            CREATE TABLE src (n INT) WITH (
              'connector' = 'kafka', 'topic' = '{topic}',
              'properties.bootstrap.servers' = '{kafka_bootstrap}',
              'scan.startup.mode' = 'earliest-offset',
              'scan.bounded.mode' = 'latest-offset',
              'format' = 'json')
            """
        )
        with tenv.execute_sql("SELECT SUM(n) AS total, COUNT(*) AS c FROM src").collect() as results:
            rows = list(results)
        final = rows[-1]
        assert (final[0], final[1]) == (10, 5)
    finally:
        admin.delete_topics([topic])
        admin.close()
