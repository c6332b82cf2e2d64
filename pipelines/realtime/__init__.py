"""The realtime tier: every realtime view of the applied plan as one PyFlink SQL job, Kafka to Redis.

- :mod:`.sql`: the plan compiled into Flink SQL (source, dead letters, windows, merge per view).
- :mod:`.decode`: the vectorised Avro decode, the only per-event Python.
- :mod:`.sink`: merged rows to online vectors, batched idempotent writes.
- :mod:`.udfs`: those as PyFlink functions; :mod:`.job`: configuration, checkpoints, submit.
- :mod:`.cli`: ``headwater run realtime``.
"""
