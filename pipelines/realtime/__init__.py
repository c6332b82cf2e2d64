"""The realtime tier: every realtime view of the applied plan as one PyFlink job, Kafka to Redis.

- :mod:`.sql`: the SQL half: Kafka source, Avro decode, dead-letter routing, the event columns.
- :mod:`.program`: the plan compiled for the JVM half (``dev.headwater.flink.realtime`` in
  infra/maven/flink-udfs): a keyed window operator per (join key, slide) and a batched Redis sink.
- :mod:`.decode`: the vectorised Python Avro decode (``--decode python``; the JVM one is the default).
- :mod:`.udfs`: the functions the SQL calls; :mod:`.job`: configuration, checkpoints, submit.
- :mod:`.cli`: ``headwater run realtime``.
"""
