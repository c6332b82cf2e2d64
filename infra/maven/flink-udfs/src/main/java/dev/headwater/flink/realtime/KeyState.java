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

    /** One slice: its event-id hashes and a partial per feature (null: no event of that feature). */
    static final class Slice {
        long[] ids;
        int size;
        Object[] partials;

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
            for (int i = 0; i < size; i++) {
                if (ids[i] == id) {
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
