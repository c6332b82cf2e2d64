"""The push API: any source's events over HTTP (``headwater ingest serve``), checked like the producer.

:mod:`~headwater.serving.ingest.core` is the protocol-neutral core (:class:`IngestService`: one answer
per event, the same row check and codec as ``headwater events produce --from``);
:mod:`~headwater.serving.ingest.sink` sends to Kafka (acks=all, idempotent, murmur2 keys);
:mod:`~headwater.serving.ingest.rest` is the REST adapter (JSON array, JSON Lines, Avro binary, and a
Feast-compatible ``/push``).
"""
