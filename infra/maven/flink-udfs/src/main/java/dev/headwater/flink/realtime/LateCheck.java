package dev.headwater.flink.realtime;

import org.apache.flink.api.common.state.ListState;
import org.apache.flink.api.common.state.ListStateDescriptor;
import org.apache.flink.api.common.typeinfo.Types;
import org.apache.flink.api.java.tuple.Tuple3;
import org.apache.flink.api.common.functions.OpenContext;
import org.apache.flink.metrics.Counter;
import org.apache.flink.runtime.state.FunctionInitializationContext;
import org.apache.flink.runtime.state.FunctionSnapshotContext;
import org.apache.flink.streaming.api.checkpoint.CheckpointedFunction;
import org.apache.flink.streaming.api.functions.ProcessFunction;
import org.apache.flink.types.Row;
import org.apache.flink.util.Collector;

/**
 * Gives each routed row of a source its {@code late} verdict ({@link Lateness}), after the SQL half's
 * decode, rule and future-dated verdicts: a row without a reason whose event time is before its
 * partition's horizon gets reason {@code late} and the detail naming that horizon.
 *
 * <p>It runs in the source's subtasks (forward from the Kafka scan, same parallelism), where every
 * partition's records arrive in offset order; its state (the greatest accepted event time per
 * partition) is union operator state, checkpointed with the scan's offsets, so a restored job judges
 * the records it replays as the killed one did.
 *
 * <p>The routed row is the program's columns, then reason, detail, the raw record (key, value,
 * headers: the dead letter's bytes), partition and offset (pipelines/realtime/sql.py
 * {@code _routed_view}). The raw record is dropped here from the rows that stay good, so the window
 * operators get small rows.
 */
final class LateCheck extends ProcessFunction<Row, Row> implements CheckpointedFunction {
    private static final long serialVersionUID = 1L;
    static final String STATE = "hw-late-max";
    static final String LATE = "late";
    /** Columns after the reason: detail, key, value, headers, partition, offset. */
    static final int TAIL = 7;

    private final String programJson;
    private final int reasonColumn;

    private transient Program program;
    private transient Lateness lateness;
    private transient ListState<Tuple3<String, Integer, Long>> saved;
    private transient Counter late;

    LateCheck(String programJson, int reasonColumn) {
        this.programJson = programJson;
        this.reasonColumn = reasonColumn;
    }

    private void init() {
        if (lateness == null) {
            program = Program.parse(programJson);
            lateness = Lateness.of(program);
        }
    }

    @Override
    public void initializeState(FunctionInitializationContext context) throws Exception {
        init();
        saved = context.getOperatorStateStore().getUnionListState(
            new ListStateDescriptor<>(STATE, Types.TUPLE(Types.STRING, Types.INT, Types.LONG)));
        if (context.isRestored()) {
            for (Tuple3<String, Integer, Long> e : saved.get()) {
                lateness.restore(e.f0, e.f1, e.f2);
            }
        }
    }

    @Override
    public void snapshotState(FunctionSnapshotContext context) throws Exception {
        saved.clear();
        for (Object[] e : lateness.entries()) {
            saved.add(Tuple3.of((String) e[0], (Integer) e[1], (Long) e[2]));
        }
    }

    @Override
    public void open(OpenContext openContext) throws Exception {
        init();
        late = getRuntimeContext().getMetricGroup().addGroup("source", program.source).counter("hw_late");
    }

    @Override
    public void processElement(Row r, Context ctx, Collector<Row> out) throws Exception {
        if (r.getArity() != reasonColumn + TAIL) {
            throw new IllegalStateException("source " + program.source + ": routed row has " + r.getArity()
                + " columns, expected " + (reasonColumn + TAIL) + " (program columns, reason, detail, key, value,"
                + " headers, partition, offset: pipelines/realtime/sql.py _routed_view)");
        }
        if (r.getField(reasonColumn) == null) {
            Object t = r.getField(program.eventTimeColumn);
            int partition = ((Number) r.getField(reasonColumn + 5)).intValue();
            long now = System.currentTimeMillis();
            boolean replay = program.seed != null && program.seed.replayed(r);
            String detail = t == null ? null : replay
                ? lateness.judgeReplay(partition, ((Number) t).longValue(), now)
                : lateness.judge(partition, ((Number) t).longValue(), now);
            if (detail != null) {
                r.setField(reasonColumn, LATE);
                r.setField(reasonColumn + 1, detail);
                late.inc();
            } else {
                for (int c = reasonColumn + 2; c < reasonColumn + 5; c++) {
                    r.setField(c, null);  // a good row: the raw record is not needed downstream
                }
            }
        }
        out.collect(r);
    }
}
