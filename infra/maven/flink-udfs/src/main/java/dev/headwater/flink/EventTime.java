package dev.headwater.flink;

import org.apache.flink.table.functions.ScalarFunction;

/**
 * {@code hw_event_time(value, schema_fp, produce_ts, expected_fp, max_future_ms, schema_json)}: the
 * event time (UTC ms) of a record that {@link DecodeEvent} accepts, 0 for one it rejects; the
 * source's rowtime (a computed column cannot read another computed column).
 */
public class EventTime extends ScalarFunction {
    private transient EventDecoder decoder;

    public long eval(byte[] value, byte[] fp, byte[] produceTs, String expectedFp, Long maxFutureMs,
                     String schemaJson) {
        if (decoder == null) {
            decoder = new EventDecoder(schemaJson);
        }
        return decoder.decode(value, fp, produceTs,
            expectedFp.getBytes(java.nio.charset.StandardCharsets.US_ASCII), maxFutureMs,
            System.currentTimeMillis()).eventTime();
    }
}
