package dev.headwater.flink.realtime;

import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;
import java.util.TreeSet;

import org.apache.flink.types.Row;

/**
 * The window arithmetic of one group (one join key and slide), on one entity's {@link KeyState};
 * no Flink runtime here, so {@link AggregateCheck} drives the same code in tests.
 *
 * <p>Semantics (pipelines/windows, docs/concepts/windows.md): a feature with window W and slide S has, as of
 * boundary B (a multiple of S), the events with event time in {@code [B - W, B)}. The value of an
 * entity changes only at a boundary where one of its slices enters ({@code s + S}) or leaves
 * ({@code s + S + W}) a window, so {@link #fire} visits just those boundaries: work follows events,
 * not entities x slides. Each view's value is emitted when it differs from the one emitted before,
 * with the boundary of its last change as its event time.
 */
final class Aggregator {
    /** What {@link #add} did with an event. */
    enum Outcome { ACCEPTED, DUPLICATE, OUTSIDE, NO_FEATURE }

    /**
     * The event ids a backfill replay has folded, per entity and slice: the replay's own de-duplication
     * (a restored slice already holds the ids the live run saw, for the views it kept).
     */
    interface ReplayIds {
        /** Record {@code idHash} in {@code slice} of the current entity; false when it was already there. */
        boolean first(long slice, long idHash);
    }

    /**
     * Receives the values to write: view index in the group, event time (the boundary of the value's last
     * change), valid to (the value holds at every boundary in between: {@link #validTo}), slots, text
     * slots.
     */
    interface Emitter {
        void emit(int view, long eventTimeMs, long validToMs, float[] slots, String[] dict);
    }

    final Program.Group group;
    /** The views (name and version) the states this aggregator makes and reads are indexed by. */
    final Layout layout;
    final long slide;
    final Agg[] aggs;
    final long[] windows;
    /** Per distinct window, the features that use it. */
    final int[][] byWindow;
    private final float[] scratch;
    private final String[] scratchDict;
    /** Per feature, whether the event being added passes its filter (evaluated once per event). */
    private final boolean[] hits;
    /**
     * The greatest {@code upTo} a {@link #fire} was given since the job started: the operator fires
     * every entity due by it before it folds the next event, so no entity's state is behind it.
     */
    private long horizon = KeyState.NONE;

    Aggregator(Program.Group group) {
        this.group = group;
        this.layout = Layout.of(group);
        this.slide = group.slideMs;
        List<Program.Feature> fs = group.features;
        aggs = new Agg[fs.size()];
        TreeSet<Long> ws = new TreeSet<>();
        for (int i = 0; i < aggs.length; i++) {
            aggs[i] = Agg.of(fs.get(i));
            ws.add(fs.get(i).windowMs);
        }
        windows = ws.stream().mapToLong(Long::longValue).toArray();
        byWindow = new int[windows.length][];
        for (int w = 0; w < windows.length; w++) {
            List<Integer> mine = new ArrayList<>();
            for (int i = 0; i < aggs.length; i++) {
                if (fs.get(i).windowMs == windows[w]) {
                    mine.add(i);
                }
            }
            byWindow[w] = mine.stream().mapToInt(Integer::intValue).toArray();
        }
        int dim = group.views.stream().mapToInt(v -> v.dim).max().orElse(0);
        scratch = new float[dim];
        scratchDict = new String[dim];
        hits = new boolean[aggs.length];
    }

    /** Per feature, whether the last event {@link #add} saw passes its filter (ViewCpuStats splits by it). */
    boolean[] hits() {
        return hits;
    }

    /** A restart from a checkpoint (a fresh operator): no boundary is published yet. */
    void restart() {
        horizon = KeyState.NONE;
    }

    KeyState newState() {
        KeyState st = new KeyState();
        st.running = new Object[aggs.length];
        for (int i = 0; i < aggs.length; i++) {
            st.running[i] = aggs[i].newRunning();
        }
        st.views = new KeyState.ViewValue[group.views.size()];
        for (int v = 0; v < st.views.length; v++) {
            st.views[v] = new KeyState.ViewValue();
        }
        st.layout = layout;
        return st;
    }

    /**
     * Bring a restored state into this group's layout: the partials, running accumulators and last
     * values of every view whose name and version the layout still has are kept as they are (so their
     * windows go on exactly); a new or changed view starts empty (no partial in any slice, a fresh
     * accumulator, no value yet: its first computation is written); a dropped view's partials go.
     * Slices, their event ids and the boundary belong to the entity and are kept: an event seen before
     * is still a duplicate for every view.
     *
     * @return true when the state's arrays were rebuilt (its next change boundary must be recomputed)
     */
    boolean adopt(KeyState st) {
        if (st.layout == layout) {
            return false;
        }
        if (st.layout == null || st.layout.equals(layout)) {
            st.layout = layout;  // format 1 (restored from its own registry version's folder) or unchanged
            return false;
        }
        int[] features = layout.featureMap(st.layout);
        int[] views = layout.viewMap(st.layout);
        Object[] running = new Object[aggs.length];
        for (int i = 0; i < aggs.length; i++) {
            running[i] = features[i] >= 0 ? st.running[features[i]] : aggs[i].newRunning();
        }
        st.running = running;
        for (KeyState.Slice slice : st.slices.values()) {
            Object[] partials = new Object[aggs.length];
            for (int i = 0; i < aggs.length; i++) {
                partials[i] = features[i] >= 0 ? slice.partials[features[i]] : null;
            }
            slice.partials = partials;
        }
        KeyState.ViewValue[] values = new KeyState.ViewValue[views.length];
        for (int v = 0; v < views.length; v++) {
            values[v] = views[v] >= 0 ? st.views[views[v]] : new KeyState.ViewValue();
        }
        st.views = values;
        st.layout = layout;
        return true;
    }

    long sliceOf(long t) {
        return Math.floorDiv(t, slide) * slide;
    }

    /**
     * Fold one event into the entity's state.
     *
     * <p>Steps: 1. an event that no feature keeps changes nothing; 2. an event older than the longest
     * window at the entity's boundary cannot change a value it will publish (OUTSIDE), though a view may
     * have to be dated later ({@link #restamp}); 3. an id already
     * in its slice is a duplicate (a null {@code eventId}: the source has no event id, no de-duplication); 4. the partials of its slice take it, and where the slice is already
     * inside a feature's window (an out-of-order event), that feature's running accumulator too; 5. then
     * the value at the current boundary has changed: it is emitted now, as a revision; and a view one of
     * whose windows the event's slice has already left is dated no earlier than where it left
     * ({@link #restamp}).
     */
    Outcome add(KeyState st, Row r, long t, String eventId, Emitter out) {
        return add(st, r, t, eventId, null, null, out);
    }

    /**
     * Fold an event into only the features {@code only} marks (null: all), de-duplicated by
     * {@code replay} instead of the slice's ids (null: by the slice's ids): a backfill replay of an
     * event read before the switch, for the views that did not see it. Its id still joins the slice's
     * ids, so a later duplicate from the live stream is found for every view.
     */
    Outcome add(KeyState st, Row r, long t, String eventId, boolean[] only, ReplayIds replay, Emitter out) {
        // Step 1
        boolean any = false;
        for (int i = 0; i < aggs.length; i++) {
            hits[i] = (only == null || only[i]) && aggs[i].hits(r);
            any |= hits[i];
        }
        if (!any) {
            return Outcome.NO_FEATURE;
        }
        long s = sliceOf(t);
        // Step 2
        if (st.boundary == KeyState.NONE) {
            st.boundary = s;  // the value at s holds nothing yet: the entity's first slice enters at s + S
        } else if (s < st.boundary - group.maxWindowMs) {
            restamp(st, s);  // its windows have all closed, but a view may still be dated inside them
            emitPending(st, horizon, out);
            return Outcome.OUTSIDE;
        }
        // Step 3
        KeyState.Slice slice = st.slices.get(s);
        if (eventId != null && replay != null) {
            long id = EventIds.hash(eventId);
            if (!replay.first(s, id)) {
                return Outcome.DUPLICATE;
            }
            if (slice == null) {
                slice = new KeyState.Slice(aggs.length);
                st.slices.put(s, slice);
            }
            if (!slice.has(id)) {
                slice.add(id);
            }
        } else if (eventId != null) {
            long id = EventIds.hash(eventId);
            if (slice != null && slice.has(id)) {
                return Outcome.DUPLICATE;
            }
            if (slice == null) {
                slice = new KeyState.Slice(aggs.length);
                st.slices.put(s, slice);
            }
            slice.add(id);
        } else if (slice == null) {
            slice = new KeyState.Slice(aggs.length);
            st.slices.put(s, slice);
        }
        // Step 4
        boolean entered = s < st.boundary;
        boolean revised = false;
        for (int i = 0; i < aggs.length; i++) {
            if (!hits[i]) {
                continue;
            }
            Agg a = aggs[i];
            Object p = slice.partials[i];
            boolean live = entered && s >= st.boundary - group.features.get(i).windowMs;
            if (live && p != null) {
                a.minus(st.running[i], s, p);
            }
            p = a.add(p, r, t, eventId);
            slice.partials[i] = p;
            if (live) {
                a.plus(st.running[i], s, p);
                revised = true;
            }
        }
        // Step 5
        if (revised) {
            computeViews(st, s + slide);
        }
        if (entered) {
            restamp(st, s);
        }
        emitPending(st, horizon, out);
        return Outcome.ACCEPTED;
    }

    /**
     * Date each view no earlier than the boundary where slice {@code s} (before the entity's boundary)
     * left the windows of the view's features the event being added hits.
     *
     * <p>A view's value is the one at the entity's boundary B, emitted with the boundary T of its last
     * change, and the store compares it with offline's value at T: so the value must be the same at
     * every boundary from T to B. An out-of-order event of slice s that a feature's window has already
     * dropped at B (s + S + W <= B) leaves that feature's value at B alone, but it is inside that
     * window at the boundaries before s + S + W: when T is earlier, offline's value at T holds the event
     * and this one does not. The value at B, unchanged, holds from s + S + W on, so it is re-emitted
     * dated there (issue 16: "online 0, offline has events" after a restore with a backlog, where one
     * partition's events arrive minutes behind another's and so behind the entity's boundary).
     */
    private void restamp(KeyState st, long s) {
        for (Program.View view : group.views) {
            KeyState.ViewValue vv = st.views[view.index];
            if (vv.slots == null) {
                continue;  // no value yet (a view adopted empty): its first one comes with the next change
            }
            long at = KeyState.NONE;
            for (int j = 0; j < view.features.size(); j++) {
                int i = view.firstFeature + j;
                long left = s + slide + group.features.get(i).windowMs;
                if (hits[i] && left <= st.boundary) {
                    at = Math.max(at, left);
                }
            }
            if (at > vv.changedAt) {
                vv.changedAt = at;
                vv.pending = true;
            }
        }
    }

    /**
     * Whether an entity's state may be dropped: every slice has left every window (its empty value is
     * emitted) and {@code watermark} (the source's, the slowest partition's greatest event time minus
     * the out-of-orderness) is more than {@code lateMs} (out-of-orderness plus allowed lateness) past
     * the entity's boundary, so no event still to come is older than that boundary.
     *
     * <p>Until then the state stays, empty, as a tombstone: it remembers the boundary its last value is
     * dated at. Without it, an event older than that boundary (from a partition behind the others, or
     * out of order) would start a fresh state whose values are dated before the stored one, which the
     * store keeps (it keeps the newer event time): the stored empty value would stay, though offline's
     * value at its boundary holds the event. With it, the event is folded as any out-of-order event.
     *
     * <p>The watermark is Flink's, which leaves out a split silent for the idle timeout: after a restore
     * with a backlog it can run minutes ahead of a partition still to be read, and a tombstone goes too
     * early. The fresh state's values then hold up to the published boundary ({@link #validTo}), past
     * the stored empty value's time, and write.lua writes them there (issue 16, the soak's payments).
     */
    static boolean disposable(KeyState st, long watermark, long lateMs) {
        return st.slices.isEmpty() && st.boundary != KeyState.NONE && watermark > Long.MIN_VALUE + lateMs
            && watermark - lateMs > st.boundary;
    }

    /**
     * Compute every view at the entity's boundary and emit those whose value is new (a view adopted
     * empty gets its value at once, not at the entity's next change).
     */
    void refresh(KeyState st, Emitter out) {
        if (st.boundary != KeyState.NONE) {
            computeViews(st, st.boundary);
            emitPending(st, KeyState.NONE, out);
        }
    }

    /** The next boundary after the entity's where one of its slices enters or leaves a window. */
    long nextChange(KeyState st) {
        long b = st.boundary;
        long best = Long.MAX_VALUE;
        Long s = st.slices.ceilingKey(b);
        if (s != null) {
            best = s + slide;
        }
        for (long w : windows) {
            s = st.slices.ceilingKey(b - w);
            if (s != null) {
                best = Math.min(best, s + slide + w);
            }
        }
        return best == Long.MAX_VALUE ? KeyState.NONE : best;
    }

    /**
     * Move the entity to the latest change boundary at or before {@code upTo} (the operator's clock),
     * visiting each change boundary on the way, and emit the views whose value changed.
     */
    void fire(KeyState st, long upTo, Emitter out) {
        fire(st, upTo, KeyState.NONE, out);
    }

    /**
     * {@link #fire}, and when it crosses a change boundary at or before {@code catchUpTo}, emit every
     * view that has a value, changed or not (each with the interval it holds over).
     *
     * <p>Why (issue 16): a job killed -9 after its last checkpoint may have written values the restored
     * job, replaying the same events from the checkpoint's offsets, never computes. The partitions come
     * in another order: the killed job crossed boundary B of an entity before reading an older event of
     * another partition and wrote the value without it, dated B; the restored job reads that event
     * first, so at B its value does not change and it writes nothing, and the store keeps the killed
     * job's newer B. The killed job could write only at change boundaries up to its own clock, never
     * ahead of the wall clock at the restore: so where the restored job crosses such a boundary, it
     * re-emits its value with the interval [last change, boundary] it holds over, and write.lua dates it
     * at the stored event time when that falls inside (a replay in the same order finds the same value
     * there: unchanged, nothing written).
     */
    void fire(KeyState st, long upTo, long catchUpTo, Emitter out) {
        horizon = Math.max(horizon, upTo);
        boolean caughtUp = false;
        for (long c = nextChange(st); c != KeyState.NONE && c <= upTo; c = nextChange(st)) {
            advance(st, c);
            computeViews(st, c);
            caughtUp |= c <= catchUpTo;
        }
        st.slices.headMap(st.boundary - group.maxWindowMs, false).clear();  // left every window
        if (caughtUp) {
            for (KeyState.ViewValue vv : st.views) {
                vv.pending |= vv.slots != null;
            }
        }
        emitPending(st, upTo, out);
    }

    /** Move the running accumulators from the entity's boundary to {@code to}: entering slices first. */
    private void advance(KeyState st, long to) {
        long from = st.boundary;
        for (Map.Entry<Long, KeyState.Slice> e : st.slices.subMap(from, true, to, false).entrySet()) {
            Object[] p = e.getValue().partials;
            for (int i = 0; i < aggs.length; i++) {
                if (p[i] != null) {
                    aggs[i].plus(st.running[i], e.getKey(), p[i]);
                }
            }
        }
        for (int w = 0; w < windows.length; w++) {
            long win = windows[w];
            TreeMap<Long, KeyState.Slice> sl = st.slices;
            for (Map.Entry<Long, KeyState.Slice> e : sl.subMap(from - win, true, to - win, false).entrySet()) {
                Object[] p = e.getValue().partials;
                for (int i : byWindow[w]) {
                    if (p[i] != null) {
                        aggs[i].minus(st.running[i], e.getKey(), p[i]);
                    }
                }
            }
        }
        st.boundary = to;
    }

    /** Recompute every view's value; a view whose slots differ records {@code changedAt} as its change. */
    private void computeViews(KeyState st, long changedAt) {
        for (Program.View view : group.views) {
            for (int j = 0; j < view.features.size(); j++) {
                int i = view.firstFeature + j;
                aggs[i].result(st.running[i], scratch, scratchDict, view.features.get(j).slotOffset);
            }
            KeyState.ViewValue vv = st.views[view.index];
            boolean same = vv.slots != null
                && Arrays.equals(vv.slots, 0, view.dim, scratch, 0, view.dim)
                && Arrays.equals(vv.dict, 0, view.dim, scratchDict, 0, view.dim);
            if (!same) {
                vv.slots = Arrays.copyOf(scratch, view.dim);
                vv.dict = Arrays.copyOf(scratchDict, view.dim);
                vv.changedAt = Math.max(vv.changedAt, changedAt);
                vv.pending = true;
            }
        }
    }

    /**
     * The last boundary at which the entity's values (computed at its boundary) still hold, given the
     * events folded so far: the boundary before its next change, but no later than {@code upTo} (the
     * greatest boundary the operator has published; beyond it, events still to come in order change the
     * values); the entity's boundary when {@code upTo} is not past it.
     *
     * <p>Why (issue 16): write.lua dates a value at the stored event time when that falls inside
     * [event time, valid to]. An entity dropped as a tombstone while one partition was left out of the
     * source's watermark (Flink's idle timeout: a split silent for 5 s, as after a restore with a
     * backlog) starts afresh when that partition's older events arrive; its values are dated before the
     * empty value the store holds, which they would leave in place. They hold up to the published
     * boundary, past the stored one, so they are written there.
     */
    long validTo(KeyState st, long upTo) {
        if (upTo <= st.boundary) {
            return st.boundary;
        }
        long next = nextChange(st);
        return next == KeyState.NONE ? upTo : Math.max(st.boundary, Math.min(upTo, next - slide));
    }

    private void emitPending(KeyState st, long upTo, Emitter out) {
        long validTo = KeyState.NONE;
        for (int v = 0; v < st.views.length; v++) {
            KeyState.ViewValue vv = st.views[v];
            if (vv.pending) {
                vv.pending = false;
                if (validTo == KeyState.NONE) {
                    validTo = validTo(st, upTo);
                }
                out.emit(v, vv.changedAt, validTo, vv.slots.clone(), vv.dict.clone());
            }
        }
    }
}
