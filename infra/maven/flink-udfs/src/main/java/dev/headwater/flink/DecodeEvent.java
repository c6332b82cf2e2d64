package dev.headwater.flink;

import org.apache.flink.table.annotation.DataTypeHint;
import org.apache.flink.table.functions.ScalarFunction;
import org.apache.flink.types.Row;

/**
 * {@code hw_decode(value, schema_fp, produce_ts, expected_fp, max_future_ms, schema_json)}: the
 * realtime job's Avro decode in the JVM. Returns the row of pipelines/realtime/decode.py
 * DECODED_COLUMNS: a reason (NULL for a good record), a detail, then the event's fields (NULL,
 * event_time 0, for a rejected record).
 */
public class DecodeEvent extends ScalarFunction {
    private transient EventDecoder decoder;

    @DataTypeHint("ROW<reason STRING, detail STRING, event_id STRING, user_id STRING, item_id STRING, "
        + "event_type STRING, event_time BIGINT, session_id STRING, category STRING, price DOUBLE, "
        + "dwell_ms BIGINT, `query` STRING, `position` INT, device STRING>")
    public Row eval(byte[] value, byte[] fp, byte[] produceTs, String expectedFp, Long maxFutureMs,
                    String schemaJson) {
        EventDecoder.Result r = decoder(schemaJson).decode(value, fp, produceTs,
            expectedFp.getBytes(java.nio.charset.StandardCharsets.US_ASCII), maxFutureMs,
            System.currentTimeMillis());
        Object[] out = new Object[2 + EventDecoder.FIELDS.length];
        out[0] = r.reason;
        out[1] = r.detail;
        if (r.reason == null) {
            System.arraycopy(r.fields, 0, out, 2, r.fields.length);
        } else {
            out[6] = 0L;
        }
        return Row.of(out);
    }

    private EventDecoder decoder(String schemaJson) {
        if (decoder == null) {
            decoder = new EventDecoder(schemaJson);
        }
        return decoder;
    }

    @Override
    public boolean isDeterministic() {
        return true;
    }
}
