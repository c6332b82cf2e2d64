package dev.headwater.flink.realtime;

import org.apache.flink.api.connector.sink2.Sink;
import org.apache.flink.api.connector.sink2.SinkWriter;
import org.apache.flink.api.connector.sink2.WriterInitContext;

/**
 * The realtime tier's online-store sink (Flink Sink V2): one {@link StoreWriter} per subtask, chained
 * to its {@link ViewOperator}. At-least-once (it flushes before every checkpoint barrier) with
 * idempotent writes (write.lua keeps the newer event time; an equal value is a no-op), which is
 * exactly-once in effect.
 */
public final class RedisSink implements Sink<Update> {
    private static final long serialVersionUID = 1L;

    private final String programJson;
    private final int groupIndex;

    public RedisSink(String programJson, int groupIndex) {
        this.programJson = programJson;
        this.groupIndex = groupIndex;
    }

    @Override
    public SinkWriter<Update> createWriter(WriterInitContext context) {
        return new StoreWriter(Program.parse(programJson), groupIndex, context);
    }
}
