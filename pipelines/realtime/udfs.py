"""The Python functions the SQL job calls: decode (vectorised), dead-letter headers, and the sinks.

Imports of pyflink stay inside :func:`register`, so this module loads without Flink. The
function objects are pickled into the Python workers; each opens what it needs (codec, Redis)
in ``open`` and counts what it does in Flink metrics (``hw_decoded``, ``hw_dlq_<reason>``,
``hw_rows_written``, ``hw_freshness_ms`` of the last batch).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from headwater.pipelines.events.codec import HEADER_PRODUCE_TS, HEADER_SCHEMA_FP, DeadLetter
from headwater.pipelines.realtime.decode import DECODED_COLUMNS, DEFAULT_MAX_FUTURE_MS, decode_batch

if TYPE_CHECKING:
    import pandas as pd
    from pyflink.table import StreamTableEnvironment

    from headwater.pipelines.realtime.sink import ViewSink
    from headwater.pipelines.realtime.sql import ViewJob


class DecodeFn:
    """Vectorised decode: (value, headers) series -> a DataFrame of :data:`DECODED_COLUMNS`."""

    def __init__(self, max_future_ms: int = DEFAULT_MAX_FUTURE_MS, time_only: bool = False) -> None:
        self.max_future_ms = max_future_ms
        self.time_only = time_only
        self._codec: Any = None
        self._counter: Any = None

    def open(self, function_context: Any) -> None:
        """Load the schema once per worker; register the decoded-records counter."""
        from headwater.pipelines.events.codec import EventCodec

        self._codec = EventCodec()
        if not self.time_only:
            self._counter = function_context.get_metric_group().counter("hw_decoded")

    def eval(self, values: pd.Series, fingerprints: pd.Series, produce_ts: pd.Series) -> Any:
        """Decode one Arrow batch (the two headers the codec reads come as columns: Arrow has no maps)."""
        import pandas as pd

        headers = [
            {k: v for k, v in ((HEADER_SCHEMA_FP, fp), (HEADER_PRODUCE_TS, ts)) if v is not None}
            for fp, ts in zip(fingerprints, produce_ts, strict=True)
        ]
        batch = _decode_once(self._codec, list(values), headers, self.max_future_ms)
        if self.time_only:
            return pd.Series(batch.columns["event_time"], dtype="int64")
        if self._counter is not None:
            self._counter.inc(len(batch))
        return pd.DataFrame({name: batch.columns[name] for name, _ in DECODED_COLUMNS})

    def close(self) -> None:
        """Nothing to release."""


_LAST: list[Any] = [None, None, None]


def _decode_once(codec: Any, values: list[Any], headers: list[Any], max_future_ms: int) -> Any:
    """Decode a batch, reusing the previous result when the same batch comes again.

    ``hw_decode`` and ``hw_event_time`` run in one Python operator on the same Arrow batch;
    the second call finds the first one's result here (checked by equality, not identity).
    """
    if _LAST[0] == values and _LAST[1] == headers:
        return _LAST[2]
    batch = decode_batch(codec, values, headers, max_future_ms)
    _LAST[:] = [values, headers, batch]
    return batch


def late_detail(detail: str, lateness_s: float) -> str:
    """Complete a ``late`` dead letter's detail with the allowed lateness and the realtime tier's policy."""
    return (
        f"{detail} ({lateness_s:g} s); the realtime tier drops every event behind its watermark, "
        "also within the allowed lateness: its pane has closed, Flink's window aggregation would drop it "
        "and published boundaries are never revised (nearline and offline count events within the allowed "
        "lateness)"
    )


class DlqHeadersFn:
    """Headers of a dead letter (the record's own, then ``dlq-*``); counts dead letters per reason."""

    def __init__(self, source_topic: str) -> None:
        self.source_topic = source_topic
        self._group: Any = None
        self._counters: dict[str, Any] = {}

    def open(self, function_context: Any) -> None:
        """Keep the metric group; counters are made per reason on first use."""
        self._group = function_context.get_metric_group()

    def eval(
        self,
        headers: dict[str, bytes] | None,
        reason: str,
        detail: str,
        partition: int,
        offset: int,
        lateness_s: float,
    ) -> dict[str, bytes]:
        """Build the headers for one rejected record."""
        if reason == "late":
            detail = late_detail(detail, lateness_s)
        letter = DeadLetter(
            value=None,
            key=None,
            reason=reason,
            detail=detail,
            source_topic=self.source_topic,
            source_partition=partition,
            source_offset=offset,
            failed_at_ms=time.time_ns() // 1_000_000,
            original_headers=list((headers or {}).items()),
        )
        counter = self._counters.get(reason)
        if counter is None and self._group is not None:
            counter = self._counters[reason] = self._group.counter(f"hw_dlq_{reason}")
        if counter is not None:
            counter.inc()
        return dict(letter.kafka_headers())

    def close(self) -> None:
        """Nothing to release."""


class SinkFn:
    """Vectorised sink of one view: writes the batch to the online store, returns per-row status."""

    deterministic = False
    """It writes: the planner must neither fold nor repeat it."""

    def __init__(self, job_view: ViewJob, registry_hash: str, redis_url: str, namespace: str) -> None:
        self.job_view = job_view
        self.registry_hash = registry_hash
        self.redis_url = redis_url
        self.namespace = namespace
        self._sink: ViewSink | None = None
        self._rows: Any = None
        self._freshness: list[int] = [0]

    def open(self, function_context: Any) -> None:
        """Connect to Redis; build the view's layout and sink."""
        from headwater.pipelines.realtime.sink import ViewSink
        from headwater.pipelines.store import OnlineStore
        from headwater.pipelines.windows import RedisDictionary, compile_view, view_layout

        spec = compile_view(self.job_view.view)
        store = OnlineStore.from_url(self.redis_url, namespace=self.namespace)
        dictionary = RedisDictionary(store.client, namespace=self.namespace)
        layout = view_layout(spec, self.registry_hash)
        self._sink = ViewSink(spec, self.job_view.slots, layout, store, dictionary)
        group = function_context.get_metric_group().add_group("view", self.job_view.view.name)
        self._rows = group.counter("hw_rows_written")
        group.gauge("hw_freshness_ms", lambda: self._freshness[0])

    def eval(self, entity: pd.Series, boundary: pd.Series, *slots: pd.Series) -> Any:
        """Write one Arrow batch of merged rows; returns the store status of each row."""
        import numpy as np
        import pandas as pd

        if self._sink is None:
            msg = "SinkFn.eval called before open()"
            raise RuntimeError(msg)
        b_ms = boundary.to_numpy(dtype="datetime64[ms]").astype(np.int64)
        columns = {
            s.name: col.astype(object).where(col.notna(), None).tolist()
            for s, col in zip(self.job_view.slots, slots, strict=True)
        }
        result = self._sink.write(entity.tolist(), b_ms, columns)
        now = time.time_ns() // 1_000_000
        if len(b_ms):
            self._freshness[0] = int(now - b_ms.max())
        self._rows.inc(result.written)
        return pd.Series(result.status, dtype="int64")

    def close(self) -> None:
        """Close the Redis connection."""
        if self._sink is not None:
            self._sink.store.close()


def register(
    t_env: StreamTableEnvironment,
    views: list[ViewJob],
    registry_hash: str,
    redis_url: str,
    namespace: str,
    source_topic: str,
    max_future_ms: int = DEFAULT_MAX_FUTURE_MS,
    *,
    python_decode: bool = True,
) -> None:
    """Register the decode, dead-letter and per-view sink functions in ``t_env``.

    With ``python_decode=False`` the decode functions are the JVM ones of infra/maven/flink-udfs
    (``dev.headwater.flink.DecodeEvent`` and ``EventTime``, on the job's class path).
    """
    from pyflink.table import DataTypes
    from pyflink.table.udf import ScalarFunction, udf

    class Wrapped(ScalarFunction):  # type: ignore[misc]
        """A plain function object (open/eval/close) as a PyFlink scalar function."""

        def __init__(self, inner: Any) -> None:
            self.inner = inner

        def open(self, function_context: Any) -> None:
            self.inner.open(function_context)

        def eval(self, *args: Any) -> Any:
            return self.inner.eval(*args)

        def close(self) -> None:
            self.inner.close()

        def is_deterministic(self) -> bool:
            return bool(getattr(self.inner, "deterministic", True))

    def scalar(obj: Any) -> ScalarFunction:
        return Wrapped(obj)

    if python_decode:
        row = DataTypes.ROW([DataTypes.FIELD(n, _data_type(DataTypes, t)) for n, t in DECODED_COLUMNS])
        t_env.create_temporary_system_function(
            "hw_decode", udf(scalar(DecodeFn(max_future_ms)), result_type=row, func_type="pandas")
        )
        t_env.create_temporary_system_function(
            "hw_event_time",
            udf(
                scalar(DecodeFn(max_future_ms, time_only=True)),
                result_type=DataTypes.BIGINT(),
                func_type="pandas",
            ),
        )
    else:
        t_env.create_java_temporary_system_function("hw_decode", "dev.headwater.flink.DecodeEvent")
        t_env.create_java_temporary_system_function("hw_event_time", "dev.headwater.flink.EventTime")
    headers_type = DataTypes.MAP(DataTypes.STRING(), DataTypes.BYTES())
    t_env.create_temporary_system_function(
        "hw_dlq_headers", udf(scalar(DlqHeadersFn(source_topic)), result_type=headers_type)
    )
    for job_view in views:
        fn = scalar(SinkFn(job_view, registry_hash, redis_url, namespace))
        t_env.create_temporary_system_function(
            job_view.sink_function,
            udf(fn, result_type=DataTypes.BIGINT(), func_type="pandas"),
        )


def _data_type(types: Any, sql_type: str) -> Any:
    return {
        "STRING": types.STRING(),
        "BIGINT": types.BIGINT(),
        "INT": types.INT(),
        "DOUBLE": types.DOUBLE(),
    }[sql_type]
