"""The functions the SQL half of the job calls: the Avro decode and the dead-letter headers.

The decode runs in the JVM (``dev.headwater.flink.DecodeEvent``) or as a vectorised Python UDF; the
dead-letter headers in the JVM (``dev.headwater.flink.realtime.DlqHeaders``, counting
``hw_dlq_<reason>``).

Imports of pyflink stay inside :func:`register`, so this module loads without Flink. With the JVM
decode (the default) the job runs no Python worker at all; ``--decode python`` pickles
:class:`DecodeFn` into one, which counts ``hw_decoded``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from headwater.pipelines.events.codec import HEADER_PRODUCE_TS, HEADER_SCHEMA_FP
from headwater.pipelines.realtime.decode import DECODED_COLUMNS, DEFAULT_MAX_FUTURE_MS, decode_batch

if TYPE_CHECKING:
    import pandas as pd
    from pyflink.table import StreamTableEnvironment


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


def register(
    t_env: StreamTableEnvironment,
    max_future_ms: int = DEFAULT_MAX_FUTURE_MS,
    *,
    python_decode: bool = False,
) -> None:
    """Register the decode and dead-letter functions in ``t_env``.

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
    t_env.create_java_temporary_system_function("hw_dlq_headers", "dev.headwater.flink.realtime.DlqHeaders")


def _data_type(types: Any, sql_type: str) -> Any:
    return {
        "STRING": types.STRING(),
        "BIGINT": types.BIGINT(),
        "INT": types.INT(),
        "DOUBLE": types.DOUBLE(),
    }[sql_type]
