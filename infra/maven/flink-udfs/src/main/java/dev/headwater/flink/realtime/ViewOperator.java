package dev.headwater.flink.realtime;

import java.util.ArrayList;
import java.util.HashSet;
import java.util.List;
import java.util.PriorityQueue;
import java.util.TreeMap;
import java.util.stream.Stream;

import org.apache.flink.api.common.operators.ProcessingTimeService.ProcessingTimeCallback;
import org.apache.flink.api.common.state.ValueState;
import org.apache.flink.api.common.state.ValueStateDescriptor;
import org.apache.flink.metrics.Counter;
import org.apache.flink.metrics.MetricGroup;
import org.apache.flink.runtime.state.StateInitializationContext;
import org.apache.flink.runtime.state.VoidNamespace;
import org.apache.flink.streaming.api.operators.AbstractStreamOperator;
import org.apache.flink.streaming.api.operators.OneInputStreamOperator;
import org.apache.flink.streaming.api.watermark.Watermark;
import org.apache.flink.streaming.runtime.streamrecord.StreamRecord;
import org.apache.flink.types.Row;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * The realtime tier's keyed window operator: every view of one (join key, slide) group, per entity.
 *
 * <p>Its clock is the greatest event time it has seen (or the watermark plus the source's
 * out-of-orderness, whichever is ahead), never ahead of the wall clock. A boundary B is published as
 * soon as the clock passes it, not when the watermark does: the watermark still bounds lateness
 * (upstream, later events go to the dead-letter topic), but an out-of-order event that arrives after
 * its boundary was published revises the value at once ({@link Aggregator#add}). So the write of a
 * value follows its boundary by the pipeline's latency, not by the out-of-orderness.
 *
 * <p>Each entity's next change boundary (a slice entering or leaving a window) sits in a queue ordered
 * by time; when the clock passes it, the entity is fired ({@link Aggregator#fire}). The queue is
 * rebuilt from the keyed state on restore, so checkpoints hold only the keyed state (plus Kafka
 * offsets upstream): after a kill -9 the job replays from the checkpoint's offsets and writes the same
 * values (the store keeps the newer event time, and an equal value is a no-op).
 *
 * <p>An entity whose slices have all left its windows keeps its state, empty, as a tombstone (its last
 * value's boundary), until the source's watermark (Flink's: the slowest partition's, leaving out a
 * split silent for the idle timeout) is past that boundary by more than the out-of-orderness and
 * allowed lateness ({@link Aggregator#disposable}, which says what covers a tombstone gone too early).
 * The clock is the greatest event time of all partitions: after a restore with a backlog, one
 * partition's events come minutes behind another's, and an entity's next event may be older than the
 * boundary of the empty value it was given. The tombstone folds it as an out-of-order event, so the
 * value written is dated no earlier than the stored one; a fresh state would date its values before
 * it, and the store, which keeps the newer event time, would keep the empty value (issue 16's
 * "online 0, offline has events").
 *
 * <p>After a restore (a kill -9 and a restart from the last checkpoint), the job killed may have
 * written values after that checkpoint which this one, reading the partitions in another order, never
 * computes; it could write them only at boundaries up to the wall clock at this restore. So until the
 * clock is past that wall clock, every entity fired across a change boundary emits all its views,
 * changed or not, each with the interval it holds over ({@link Aggregator#fire(KeyState, long, long,
 * Aggregator.Emitter)}); write.lua dates such a value at the stored event time when it falls inside.
 *
 * <p>Each time the clock passes a boundary, a progress mark per view goes to the sink, so the
 * freshness log knows the tier published up to it even when no value changed.
 *
 * <p>Backfill ({@link Program#seed}, pipelines/realtime/backfill.py): after a restore into a plan with
 * new or changed views, the Kafka source starts before the offsets the checkpoint holds (the switch).
 * A row read before the switch is folded into the backfilled views' features only, with its own
 * de-duplication ({@link Aggregator.ReplayIds}); a group without such views skips it. Rows from the
 * switch on are the live stream, for every view. So a kept view sees every event once and a
 * backfilled one every event of its windows once, as in an uninterrupted run.
 *
 * <p>Each event's fold and each run of fires is timed and split across the group's views by their
 * feature operations ({@link ViewCpuStats}); when the program names a {@code reported_dir}, each
 * subtask writes its figures there every 5 s and at close, for {@code headwater costs} (issue 17).
 */
public final class ViewOperator extends AbstractStreamOperator<Update>
        implements OneInputStreamOperator<Row, Update>, ProcessingTimeCallback {
    private static final long serialVersionUID = 1L;
    private static final Logger LOG = LoggerFactory.getLogger(ViewOperator.class);
    static final String STATE = "hw-entities";
    /** The clock advances with the wall clock on an idle stream only when it is this close to it. */
    static final long LIVE_HORIZON_MS = 10 * 60 * 1000L;
    static final long TICK_MS = 100;

    private final String programJson;
    private final int groupIndex;

    private transient Program program;
    private transient Program.Group group;
    private transient Aggregator agg;
    private transient ValueState<KeyState> state;
    private transient PriorityQueue<Due> queue;
    /** Entities whose slices have all left their windows, by boundary: dropped once the watermark allows. */
    private transient PriorityQueue<Due> tombstones;
    private transient long maxEventTime;
    private transient long watermarkClock;
    private transient long clock;
    private transient long lastElementAt;
    private transient long published;
    private transient Object currentKey;
    private transient StreamRecord<Update> record;
    private transient Aggregator.Emitter emitter;
    private transient Counter events;
    private transient Counter duplicates;
    private transient Counter outside;
    private transient Counter ignored;
    private transient Counter emitted;
    private transient Counter replayed;
    /** Per feature, whether a backfill replays into it; null when this group backfills no view. */
    private transient boolean[] replayMask;
    /** The replay's event ids per slice (entity mixed in), pruned once the clock is far past the slice. */
    private transient TreeMap<Long, HashSet<Long>> replayIds;
    private transient Aggregator.ReplayIds replayDedupe;
    /** The last row was a replayed one: no progress marks for the past boundaries the replay crosses. */
    private transient boolean replaying;
    /** Restored from a checkpoint (set before {@link #open}). */
    private transient boolean restored;
    /** The wall clock at the restore: a fire across a change boundary up to it emits every view (or NONE). */
    private transient long catchUpTo;
    /** Each view's share of the timed work, written for `headwater costs` (ViewCpuStats). */
    private transient ViewCpuStats cpu;

    /** An entity's next change boundary in the queue (stale when the entity's state says otherwise). */
    private static final class Due {
        final long at;
        final Object key;

        Due(long at, Object key) {
            this.at = at;
            this.key = key;
        }
    }

    public ViewOperator(String programJson, int groupIndex) {
        this.programJson = programJson;
        this.groupIndex = groupIndex;
    }

    @Override
    public void initializeState(StateInitializationContext context) throws Exception {
        super.initializeState(context);
        restored = context.isRestored();
    }

    @Override
    public void open() throws Exception {
        super.open();
        program = Program.parse(programJson);
        group = program.groups.get(groupIndex);
        agg = new Aggregator(group);
        state = getPartitionedState(new ValueStateDescriptor<>(STATE, new KeyStateSerializer(agg.layout)));
        queue = new PriorityQueue<>((a, b) -> Long.compare(a.at, b.at));
        tombstones = new PriorityQueue<>((a, b) -> Long.compare(a.at, b.at));
        maxEventTime = Long.MIN_VALUE;
        watermarkClock = Long.MIN_VALUE;
        clock = Long.MIN_VALUE;
        published = Long.MIN_VALUE;
        record = new StreamRecord<>(null);
        emitter = (view, eventTime, validTo, slots, dict) -> {
            emitted.inc();
            output.collect(record.replace(new Update(view, (String) currentKey, eventTime, validTo, slots, dict)));
        };
        MetricGroup m = getMetricGroup().addGroup("source", program.source).addGroup("group", group.id);
        events = m.counter("hw_events");
        duplicates = m.counter("hw_duplicates");
        outside = m.counter("hw_outside_window");
        ignored = m.counter("hw_no_feature");
        emitted = m.counter("hw_values_emitted");
        replayed = m.counter("hw_replayed");
        replayMask = replayMask(program, group);
        replayIds = new TreeMap<>();
        replayDedupe = (slice, idHash) -> replayIds.computeIfAbsent(slice, x -> new HashSet<>())
            .add(idHash * 0x9E3779B97F4A7C15L + currentKey.hashCode());
        replaying = false;
        m.gauge("hw_clock_lag_ms", () -> clock == Long.MIN_VALUE ? -1L : now() - clock);
        m.gauge("hw_queued_entities", () -> (long) queue.size());
        m.gauge("hw_tombstones", () -> (long) tombstones.size());
        restoreQueue();
        catchUpTo = restored ? now() : KeyState.NONE;
        lastElementAt = now();
        int subtask = getRuntimeContext().getTaskInfo().getIndexOfThisSubtask();
        cpu = new ViewCpuStats(group, program.source, subtask, program.reportedDir == null ? null
            : ViewCpuStats.fileFor(program.reportedDir, program.source, group, subtask), lastElementAt);
        getProcessingTimeService().registerTimer(now() + TICK_MS, this);
    }

    @Override
    public void close() throws Exception {
        if (cpu != null) {
            writeCpu(System.currentTimeMillis());  // the last figures of this run
        }
        super.close();
    }

    /** Write the views' timed work; a failed write is logged, never fails the job (it is a report). */
    private void writeCpu(long at) {
        try {
            cpu.write(at);
        } catch (java.io.IOException | RuntimeException e) {
            LOG.warn("source {} group {}: cannot write the views' CPU stats: {}", program.source, group.id,
                e.toString());
        }
    }

    /** Per feature of the group, whether its view is one the program's seed backfills; null if none is. */
    static boolean[] replayMask(Program program, Program.Group group) {
        if (program.seed == null) {
            return null;
        }
        boolean[] mask = new boolean[group.features.size()];
        boolean any = false;
        for (Program.View v : group.views) {
            if (program.seed.views.contains(v.name + "@" + v.version)) {
                for (int j = 0; j < v.features.size(); j++) {
                    mask[v.firstFeature + j] = true;
                }
                any = true;
            }
        }
        return any ? mask : null;
    }

    /**
     * After a restore, bring every entity's state into this program's layout and queue every entity
     * with a scheduled change (the queue is not checkpointed).
     *
     * <p>A restored state may come from a job compiled from another plan (one checkpoint folder for
     * the job, whatever the registry version): {@link Aggregator#adopt} keeps the views whose name and
     * version are still in the group and drops the others, here, for every key, before the first event;
     * so a dropped view's partials do not outlive the restore (they are in no later checkpoint). A
     * group that is gone altogether is state no operator claims, which the job drops at restore
     * ({@code execution.state-recovery.ignore-unclaimed-state}).
     */
    private void restoreQueue() throws Exception {
        List<Object> keys = new ArrayList<>();
        try (Stream<Object> s = getKeyedStateBackend().getKeys(STATE, VoidNamespace.INSTANCE)) {
            s.forEach(keys::add);
        }
        Layout from = null;
        long adopted = 0;
        for (Object key : keys) {
            setCurrentKey(key);
            KeyState st = state.value();
            if (st == null) {
                continue;
            }
            Layout was = st.layout;
            if (agg.adopt(st)) {
                from = was;
                adopted++;
                st.scheduled = KeyState.NONE;  // the windows changed: so may the next change boundary
                schedule(st, key);
                if (replayMask != null) {
                    currentKey = key;  // a backfilled view has a value from the switch on, as in a run without restart
                    agg.refresh(st, emitter);
                }
                state.update(st);
            } else if (st.scheduled != KeyState.NONE) {
                queue.add(new Due(st.scheduled, key));
            }
            if (st.slices.isEmpty()) {
                tombstones.add(new Due(st.boundary, key));
            }
        }
        if (adopted > 0) {
            LOG.info("source {} group {}: restored {} entities into views [{}] from views [{}]; dropped [{}],"
                + " started empty [{}]", program.source, group.id, adopted, agg.layout, from,
                String.join(", ", agg.layout.dropped(from)), String.join(", ", from.dropped(agg.layout)));
        } else if (!keys.isEmpty()) {
            LOG.info("source {} group {}: restored {} entities, views [{}] unchanged", program.source, group.id,
                keys.size(), agg.layout);
        }
    }

    private long now() {
        return getProcessingTimeService().getCurrentProcessingTime();
    }

    @Override
    public void processElement(StreamRecord<Row> element) throws Exception {
        Row r = element.getValue();
        boolean replay = program.seed != null && program.seed.replayed(r);
        lastElementAt = now();
        replaying = replay;
        if (replay && replayMask == null) {
            return;  // read before the switch, and every view of this group has it in its restored state
        }
        long started = System.nanoTime();
        long t = (Long) r.getField(program.eventTimeColumn);
        String id = program.eventIdColumn < 0 ? null : (String) r.getField(program.eventIdColumn);
        events.inc();
        if (replay) {
            replayed.inc();
        }
        // an accepted event from the near future (within the source's max_future) moves the clock only
        // up to the wall clock: else it would publish boundaries ahead of the events still on their way
        maxEventTime = Math.max(maxEventTime, Math.min(t, lastElementAt));
        KeyState st = state.value();
        boolean fresh = st == null;
        if (fresh) {
            st = agg.newState();
        }
        currentKey = getCurrentKey();
        Aggregator.Outcome outcome = replay
            ? agg.add(st, r, t, id, replayMask, replayDedupe, emitter)
            : agg.add(st, r, t, id, emitter);
        switch (outcome) {
            case ACCEPTED:
                if (fresh) {
                    state.update(st);
                }
                schedule(st, currentKey);
                break;
            case DUPLICATE:
                duplicates.inc();
                break;
            case OUTSIDE:
                outside.inc();
                break;
            default:
                ignored.inc();
        }
        cpu.added(System.nanoTime() - started, agg.hits());
        advance();
    }

    @Override
    public void processWatermark(Watermark mark) throws Exception {
        super.processWatermark(mark);
        long t = mark.getTimestamp();
        if (t > Long.MIN_VALUE + program.outOfOrdernessMs && t < Long.MAX_VALUE - program.outOfOrdernessMs) {
            watermarkClock = Math.max(watermarkClock, t + program.outOfOrdernessMs);
        }
        advance();
        long late = program.outOfOrdernessMs + program.allowedLatenessMs;
        while (t > Long.MIN_VALUE + late && !tombstones.isEmpty() && t - late > tombstones.peek().at) {
            Due due = tombstones.poll();
            setCurrentKey(due.key);
            KeyState st = state.value();
            if (st != null && Aggregator.disposable(st, t, late)) {
                state.clear();  // no event still to come is older than its last value's boundary
            }
        }
    }

    @Override
    public void onProcessingTime(long time) throws Exception {
        advance();
        if (cpu.due(time)) {
            writeCpu(time);
        }
        getProcessingTimeService().registerTimer(time + TICK_MS, this);
    }

    private void schedule(KeyState st, Object key) {
        long c = agg.nextChange(st);
        if (c != KeyState.NONE && (st.scheduled == KeyState.NONE || c < st.scheduled)) {
            st.scheduled = c;
            queue.add(new Due(c, key));
        }
    }

    /** Move the clock, then fire every entity whose next change boundary it has passed. */
    private void advance() throws Exception {
        long now = now();
        long c = Math.max(maxEventTime, watermarkClock);
        boolean idle = now - lastElementAt >= program.idleAdvanceMs;
        replaying &= !idle;
        if (program.idleAdvanceMs > 0 && idle && c != Long.MIN_VALUE && now - c <= LIVE_HORIZON_MS) {
            c = Math.max(c, now - program.idleAdvanceMs);  // a quiet live stream: windows still slide
        }
        clock = Math.max(clock, Math.min(c, now));
        if (clock == Long.MIN_VALUE) {
            return;
        }
        long upTo = agg.sliceOf(clock);
        boolean firing = !queue.isEmpty() && queue.peek().at <= upTo;
        long started = firing ? System.nanoTime() : 0L;
        int fired = 0;
        while (!queue.isEmpty() && queue.peek().at <= upTo) {
            Due due = queue.poll();
            setCurrentKey(due.key);
            KeyState st = state.value();
            if (st == null || st.scheduled != due.at) {
                continue;  // stale: the entity was rescheduled earlier or is gone
            }
            st.scheduled = KeyState.NONE;
            currentKey = due.key;
            agg.fire(st, upTo, catchUpTo, emitter);
            fired++;
            if (st.slices.isEmpty()) {
                // every slice has left every window, its empty value is written: a tombstone until the
                // watermark says no event older than its boundary can come (Aggregator.disposable)
                tombstones.add(new Due(st.boundary, due.key));
            } else {
                schedule(st, due.key);
            }
        }
        if (firing) {
            cpu.fired(System.nanoTime() - started, fired);
        }
        if (!replayIds.isEmpty()) {  // a replayed slice this old is outside every entity's windows
            replayIds.headMap(upTo - 2 * (group.maxWindowMs + group.slideMs) - program.outOfOrdernessMs).clear();
        }
        if (upTo > published && !replaying) {
            published = upTo;
            for (int v = 0; v < group.views.size(); v++) {
                output.collect(record.replace(Update.progress(v, upTo)));
            }
        }
    }
}
