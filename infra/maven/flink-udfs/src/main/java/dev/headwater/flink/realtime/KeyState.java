package dev.headwater.flink.realtime;

import java.util.TreeMap;

/**
 * Everything the operator keeps for one entity of one group (Flink keyed state, written by
 * {@link KeyStateSerializer}).
 *
 * <ul>
 *   <li>{@link #slices}: per slice start (a multiple of the slide), the slice's partials per feature
 *       and the 64-bit hashes of its event ids (duplicates of an event fall in its own slice, so a
 *       duplicate is found there for as long as the slice lives, i.e. inside the longest window);</li>
 *   <li>{@link #boundary}: the boundary B the running accumulators stand at: {@link #running}[i] is
 *       feature i's window {@code [B - W_i, B)};</li>
 *   <li>{@link #scheduled}: the next boundary at which a slice enters or leaves a window (the
 *       operator's queue holds it), {@link #NONE} when nothing is queued;</li>
 *   <li>{@link #views}: per view, the value last computed and the boundary at which it last changed;</li>
 *   <li>{@link #layout}: the views (name and version) the arrays above are indexed by, in memory only
 *       (the serializer's snapshot holds it once); the operator adopts a restored state into the
 *       current program's layout ({@link Aggregator#adopt}). {@code null}: read from a format-1
 *       checkpoint, written before the layout was recorded.</li>
 * </ul>
 */
final class KeyState {
    static final long NONE = Long.MIN_VALUE;

    long boundary = NONE;
    long scheduled = NONE;
    final TreeMap<Long, Slice> slices = new TreeMap<>();
    Object[] running;
    ViewValue[] views;
    Layout layout;

    /**
     * One slice: its event-id hashes and a partial per feature (null: no event of that feature).
     *
     * <p>{@link #ids} keeps the hashes in arrival order (what the serializer writes). Past
     * {@link #SCAN_MAX} of them a transient open-addressing index answers {@link #has} in constant
     * time: a linear scan per event made a hot key's slice O(n^2) in its events (issue 33). The index
     * is rebuilt from {@link #ids} on the first lookup after a restore, never checkpointed.
     */
    static final class Slice {
        /** Up to this many ids a scan is faster than hashing. */
        static final int SCAN_MAX = 16;

        long[] ids;
        int size;
        Object[] partials;
        /** Open addressing over the ids (0 marks a free cell; the id 0 itself is {@link #hasZero}). */
        private long[] index;
        private boolean hasZero;

        Slice(int features) {
            ids = new long[2];
            partials = new Object[features];
        }

        Slice(long[] ids, Object[] partials) {
            this.ids = ids;
            this.size = ids.length;
            this.partials = partials;
        }

        boolean has(long id) {
            if (size <= SCAN_MAX) {
                for (int i = 0; i < size; i++) {
                    if (ids[i] == id) {
                        return true;
                    }
                }
                return false;
            }
            if (index == null) {
                rebuild(size);
            }
            if (id == 0) {
                return hasZero;
            }
            int mask = index.length - 1;
            for (int cell = mix(id) & mask; index[cell] != 0; cell = (cell + 1) & mask) {
                if (index[cell] == id) {
                    return true;
                }
            }
            return false;
        }

        void add(long id) {
            if (size == ids.length) {
                long[] grown = new long[size * 2];
                System.arraycopy(ids, 0, grown, 0, size);
                ids = grown;
            }
            ids[size++] = id;
            if (index != null) {
                if (2 * size > index.length) {
                    rebuild(size);
                } else {
                    insert(id);
                }
            }
        }

        private void rebuild(int n) {
            int capacity = Integer.highestOneBit(Math.max(4 * n, 64) - 1) << 1;
            index = new long[capacity];
            hasZero = false;
            for (int i = 0; i < n; i++) {
                insert(ids[i]);
            }
        }

        private void insert(long id) {
            if (id == 0) {
                hasZero = true;
                return;
            }
            int mask = index.length - 1;
            int cell = mix(id) & mask;
            while (index[cell] != 0 && index[cell] != id) {
                cell = (cell + 1) & mask;
            }
            index[cell] = id;
        }

        private static int mix(long id) {
            long h = id * 0x9E3779B97F4A7C15L;
            return (int) (h ^ (h >>> 32));
        }
    }

    /** The value of one view: slots (null before the first computation), text slots, last change. */
    static final class ViewValue {
        float[] slots;
        String[] dict;
        long changedAt = NONE;
        /** The value or its change boundary moved since it was last emitted. */
        boolean pending;
    }
}
