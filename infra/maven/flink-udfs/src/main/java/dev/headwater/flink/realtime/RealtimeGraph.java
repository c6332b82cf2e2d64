package dev.headwater.flink.realtime;

import org.apache.flink.api.common.functions.FilterFunction;
import org.apache.flink.api.common.typeinfo.TypeInformation;
import org.apache.flink.api.common.typeinfo.Types;
import org.apache.flink.api.java.functions.KeySelector;
import org.apache.flink.streaming.api.datastream.DataStream;
import org.apache.flink.table.api.bridge.java.StreamTableEnvironment;
import org.apache.flink.types.Row;

/**
 * Adds the realtime tier's aggregation and store writes to a PyFlink job: the Python side builds the
 * Kafka source, the decode, the dead-letter routing and the filter columns in Flink SQL, then calls
 * {@link #attach} with the name of that table and the compiled program (pipelines/realtime/program.py),
 * once per source of the job: each source is its own pipeline (uids carry the source's name).
 *
 * <p>The table becomes one stream (so the source and the decode run once). Rows with a reason go back
 * to the table world as a view for the dead-letter insert; the good ones go, per group (join key,
 * slide), to keyBy(key) -> {@link ViewOperator} -> {@link RedisSink}, with stable uids so checkpoints
 * restore into them.
 */
public final class RealtimeGraph {
    private RealtimeGraph() {}

    /**
     * Wire every group of {@code programJson} onto the good rows of {@code table} (column
     * {@code reasonColumn} NULL) and register the rejected rows as the temporary view {@code dlqView}.
     */
    public static void attach(StreamTableEnvironment tEnv, String table, String programJson, int reasonColumn,
                              String dlqView) {
        Program program = Program.parse(programJson);
        String src = program.source;
        DataStream<Row> all = tEnv.toDataStream(tEnv.from(table));
        DataStream<Row> rejected = all.filter(new Rejected(reasonColumn, true))
            .name("hw-rejected " + src).uid("hw-rejected-" + src);
        tEnv.createTemporaryView(dlqView, tEnv.fromDataStream(rejected));
        DataStream<Row> rows = all.filter(new Rejected(reasonColumn, false))
            .name("hw-events " + src).uid("hw-events-" + src);
        for (Program.Group g : program.groups) {
            String id = src + "-" + g.id;
            rows.filter(new HasKey(g.keyColumn)).name("hw-has-key " + id).uid("hw-has-key-" + id)
                .keyBy(new KeyOf(g.keyColumn), Types.STRING)
                .transform("hw-views " + id, TypeInformation.of(Update.class),
                    new ViewOperator(programJson, g.index))
                .uid("hw-views-" + id)
                .sinkTo(new RedisSink(programJson, g.index)).name("hw-store " + id).uid("hw-store-" + id);
        }
    }

    /** Rows with a reason (rejected: {@code want} true) or without one (good events). */
    static final class Rejected implements FilterFunction<Row> {
        private static final long serialVersionUID = 1L;
        private final int column;
        private final boolean want;

        Rejected(int column, boolean want) {
            this.column = column;
            this.want = want;
        }

        @Override
        public boolean filter(Row r) {
            return (r.getField(column) != null) == want;
        }
    }

    /** Rows whose join key is set (an item view skips searches, which have no item). */
    static final class HasKey implements FilterFunction<Row> {
        private static final long serialVersionUID = 1L;
        private final int column;

        HasKey(int column) {
            this.column = column;
        }

        @Override
        public boolean filter(Row r) {
            return r.getField(column) != null;
        }
    }

    /** The join key of a row, as text. */
    static final class KeyOf implements KeySelector<Row, String> {
        private static final long serialVersionUID = 1L;
        private final int column;

        KeyOf(int column) {
            this.column = column;
        }

        @Override
        public String getKey(Row r) {
            return r.getField(column).toString();
        }
    }
}
