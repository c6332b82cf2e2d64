"""The realtime tier: every realtime view of every source of the plan as one PyFlink job, Kafka to Redis.

- :mod:`.sql`: the SQL half, per source: Kafka table, Avro decode, rules, dead-letter routing, event columns.
- :mod:`.program`: the plan compiled for the JVM half (``dev.headwater.flink.realtime`` in
  infra/maven/flink-udfs): a keyed window operator per (join key, slide) and a batched Redis sink.
- :mod:`.decode`: the decoded row of a source and the config the JVM decode is built from (the plan source).
- :mod:`.udfs`: the functions the SQL calls; :mod:`.job`: configuration, checkpoints, submit.
- :mod:`headwater.cli.realtime`: ``headwater run realtime``.
"""
