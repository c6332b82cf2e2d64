package dev.headwater.flink.realtime;

import java.util.ArrayList;
import java.util.List;

import org.apache.flink.api.common.functions.FilterFunction;
import org.apache.flink.api.common.typeinfo.TypeInformation;
import org.apache.flink.api.common.typeinfo.Types;
import org.apache.flink.api.dag.Transformation;
import org.apache.flink.api.java.functions.KeySelector;
import org.apache.flink.streaming.api.datastream.DataStream;
import org.apache.flink.streaming.api.transformations.LegacySourceTransformation;
import org.apache.flink.streaming.api.transformations.SourceTransformation;
import org.apache.flink.table.api.bridge.java.StreamTableEnvironment;
import org.apache.flink.types.Row;

/**
 * Adds the realtime tier's aggregation and store writes to a PyFlink job: the Python side builds the
 * Kafka source, the decode, the dead-letter routing and the filter columns in Flink SQL, then calls
 * {@link #attach} with the name of that table and the compiled program (pipelines/realtime/program.py),
 * once per source of the job: each source is its own pipeline (uids carry the source's name).
 *
 * <p>The table becomes one stream (so the source and the decode run once), and each row gets its
 * {@code late} verdict per Kafka partition ({@link LateCheck}). Rows with a reason go back
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
        DataStream<Row> routed = tEnv.toDataStream(tEnv.from(table));
        pinSourceUid(routed, program.scanUid, src);
        // the late verdict, per partition in offset order: forward from the scan (an error, not a
        // reshuffle, if the planner ever gave the routed table another parallelism)
        DataStream<Row> all = routed.forward()
            .process(new LateCheck(programJson, reasonColumn), routed.getType())
            .setParallelism(routed.getParallelism())
            .name("hw-late " + src).uid("hw-late-" + src);
        // a record the backfill replays (read before the switch) was dead-lettered by the run that read it
        DataStream<Row> rejected = all.filter(new Rejected(reasonColumn, true, program.seed))
            .name("hw-rejected " + src).uid("hw-rejected-" + src);
        tEnv.createTemporaryView(dlqView, tEnv.fromDataStream(rejected));
        DataStream<Row> rows = all.filter(new Rejected(reasonColumn, false, null))
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

    /**
     * Give the source's Kafka table scan the uid {@code uid} ({@code hw-kafka-<source>}, or the uid of a
     * rewound scan, pipelines/realtime/backfill.py), so its offsets restore into a job compiled from
     * another plan.
     *
     * <p>The table planner sets no uid (Flink 2.x {@code table.exec.uid.generation} is PLAN_ONLY: uids
     * only for a compiled plan, and its {@code table.exec.uid.format} {@code <id>_<transformation>}
     * numbers exec nodes in planning order anyway), so the scan would get a hash of its place in the
     * graph, which moves when a view adds a filter column or a source is added. The table has been
     * translated by {@code toDataStream} at this point: its one source transformation is among the
     * stream's predecessors, and its uid can still be set before the job graph is built. The operators
     * between the scan and here (projection, decode, rules) hold no state.
     */
    static void pinSourceUid(DataStream<Row> stream, String uid, String source) {
        List<Transformation<?>> scans = new ArrayList<>();
        for (Transformation<?> t : stream.getTransformation().getTransitivePredecessors()) {
            if (t instanceof SourceTransformation || t instanceof LegacySourceTransformation) {
                scans.add(t);
            }
        }
        if (scans.size() != 1) {
            throw new IllegalStateException("source " + source + ": expected one Kafka scan upstream of its"
                + " routed table, found " + scans.size() + " (" + scans + "); the realtime SQL half changed"
                + " shape (pipelines/realtime/sql.py)");
        }
        scans.get(0).setUid(uid);
    }

    /**
     * Rows with a reason (rejected: {@code want} true) or without one (good events); with a
     * {@code skip} seed, not the rows it replays.
     */
    static final class Rejected implements FilterFunction<Row> {
        private static final long serialVersionUID = 2L;
        private final int column;
        private final boolean want;
        private final Program.Seed skip;

        Rejected(int column, boolean want, Program.Seed skip) {
            this.column = column;
            this.want = want;
            this.skip = skip;
        }

        @Override
        public boolean filter(Row r) {
            return (r.getField(column) != null) == want && (skip == null || !skip.replayed(r));
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
