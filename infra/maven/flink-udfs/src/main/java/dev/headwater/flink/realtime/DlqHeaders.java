package dev.headwater.flink.realtime;

import java.nio.charset.StandardCharsets;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.Map;

import org.apache.flink.metrics.Counter;
import org.apache.flink.metrics.MetricGroup;
import org.apache.flink.table.annotation.DataTypeHint;
import org.apache.flink.table.functions.FunctionContext;
import org.apache.flink.table.functions.ScalarFunction;

/**
 * {@code hw_dlq_headers(headers, reason, detail, partition, offset, source_topic)}: the headers of a
 * dead letter, as pipelines/events/codec.py {@code DeadLetter.kafka_headers} writes them: the
 * record's own headers, then {@code dlq-reason}, {@code -detail} (at most 500 characters),
 * {@code -source-topic}, {@code -source-partition}, {@code -source-offset}, {@code -failed-at}. Counts
 * dead letters per reason in the metric {@code hw_dlq_<reason>}.
 */
public final class DlqHeaders extends ScalarFunction {
    private static final long serialVersionUID = 1L;
    static final int MAX_DETAIL_CHARS = 500;

    private transient MetricGroup metrics;
    private transient Map<String, Counter> counters;

    @Override
    public void open(FunctionContext context) {
        metrics = context.getMetricGroup();
        counters = new HashMap<>();
    }

    public @DataTypeHint("MAP<STRING, BYTES>") Map<String, byte[]> eval(
            @DataTypeHint("MAP<STRING, BYTES>") Map<String, byte[]> headers, String reason, String detail,
            Integer partition, Long offset, String sourceTopic) {
        Map<String, byte[]> out = new LinkedHashMap<>();
        if (headers != null) {
            headers.forEach((k, v) -> out.put(k, v == null ? new byte[0] : v));
        }
        String d = detail == null ? "" : detail;
        if (d.length() > MAX_DETAIL_CHARS) {
            d = d.substring(0, MAX_DETAIL_CHARS);
        }
        put(out, "dlq-reason", reason);
        put(out, "dlq-detail", d);
        put(out, "dlq-source-topic", sourceTopic);
        put(out, "dlq-source-partition", String.valueOf(partition));
        put(out, "dlq-source-offset", String.valueOf(offset));
        put(out, "dlq-failed-at", Long.toString(System.currentTimeMillis()));
        if (counters != null) {
            counters.computeIfAbsent(reason, r -> metrics.counter("hw_dlq_" + r)).inc();
        }
        return out;
    }

    private static void put(Map<String, byte[]> out, String key, String value) {
        out.put(key, value.getBytes(StandardCharsets.UTF_8));
    }

    @Override
    public boolean isDeterministic() {
        return false;
    }
}
