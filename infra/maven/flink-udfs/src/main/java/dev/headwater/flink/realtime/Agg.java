package dev.headwater.flink.realtime;

import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;

import org.apache.flink.types.Row;

/**
 * One feature's aggregation, with the semantics of pipelines/windows/aggs.py (binding, docs/concepts/windows.md).
 *
 * <p>Two kinds of state: a <em>partial</em> per slice (the events of one slide-long slice of one
 * entity) and a <em>running</em> accumulator per entity, the merge of the partials of the slices
 * inside the window at the entity's current boundary. When the boundary moves, entering slices are
 * added ({@link #plus}) and leaving ones retracted ({@link #minus}), so the cost follows the events,
 * not entities x slides. Partials and accumulators are plain arrays and maps ({@link StateCodec}
 * writes them); a partial is mutated in place by {@link #add}, so a caller that keeps it inside an
 * accumulator retracts it first and adds it back after.
 */
abstract class Agg {
    static final Object NONE = null;

    final int hit;
    final int field;

    Agg(int hit, int field) {
        this.hit = hit;
        this.field = field;
    }

    /** The aggregation of a plan feature (a ratio builds its operands). */
    static Agg of(Program.Feature f) {
        switch (f.agg) {
            case "count": return new Count(f.hit, f.field);
            case "sum": return new Sum(f.hit, f.field);
            case "avg": return new Avg(f.hit, f.field);
            case "min": return new Extreme(f.hit, f.field, false);
            case "max": return new Extreme(f.hit, f.field, true);
            case "last": return new Last(f.hit, f.field, f.dictField != null);
            case "distinct_count": return new Distinct(f.hit, f.field);
            case "top_k": return new TopK(f.hit, f.field, f.k);
            case "ratio": return new Ratio(of(f.numerator), of(f.denominator));
            default: throw new IllegalArgumentException("feature " + f.name + ": aggregation '" + f.agg
                + "' is not one this jar knows; rebuild infra/ (`make setup`)");
        }
    }

    /** Whether the event passes the filter (a NULL filter result, SQL's unknown, drops it). */
    boolean hits(Row r) {
        return hit < 0 || Boolean.TRUE.equals(r.getField(hit));
    }

    /** Fold an event that passed the filter into {@code partial} (null: a new one); return the partial. */
    abstract Object add(Object partial, Row r, long t, String eventId);

    abstract Object newRunning();

    abstract void plus(Object running, long slice, Object partial);

    abstract void minus(Object running, long slice, Object partial);

    /** The value as a number (NaN = missing); text values (last of a text field) are NaN here. */
    abstract double value(Object running);

    /** Number of float32 slots of the result. */
    int slots() {
        return 1;
    }

    /** Write the result into {@code out[off..]}; a text value goes to {@code dict[off..]} (its id comes later). */
    void result(Object running, float[] out, String[] dict, int off) {
        out[off] = (float) value(running);
        dict[off] = null;
    }

    static double number(Object v) {
        return ((Number) v).doubleValue();
    }

    /** count, or count of events whose field is not null; empty -> 0. */
    static final class Count extends Agg {
        Count(int hit, int field) {
            super(hit, field);
        }

        @Override
        Object add(Object partial, Row r, long t, String eventId) {
            long[] p = partial == null ? new long[1] : (long[]) partial;
            if (field < 0 || r.getField(field) != null) {
                p[0]++;
            }
            return p;
        }

        @Override
        Object newRunning() {
            return new long[1];
        }

        @Override
        void plus(Object running, long slice, Object partial) {
            ((long[]) running)[0] += ((long[]) partial)[0];
        }

        @Override
        void minus(Object running, long slice, Object partial) {
            ((long[]) running)[0] -= ((long[]) partial)[0];
        }

        @Override
        double value(Object running) {
            return ((long[]) running)[0];
        }
    }

    /**
     * Neumaier-compensated addition into {@code acc[i]} (sum) and {@code acc[i + 1]} (error): adding and
     * retracting the same values leaves the sum as exact as summing the live ones from scratch.
     */
    static void compensated(double[] acc, int i, double x) {
        double s = acc[i];
        double t = s + x;
        if (Math.abs(s) >= Math.abs(x)) {
            acc[i + 1] += (s - t) + x;
        } else {
            acc[i + 1] += (x - t) + s;
        }
        acc[i] = t;
    }

    /** Sum of non-null values; empty -> 0. Partial {sum}; running {sum, error}. */
    static final class Sum extends Agg {
        Sum(int hit, int field) {
            super(hit, field);
        }

        @Override
        Object add(Object partial, Row r, long t, String eventId) {
            double[] p = partial == null ? new double[2] : (double[]) partial;
            Object v = r.getField(field);
            if (v != null) {
                compensated(p, 0, number(v));
            }
            return p;
        }

        @Override
        Object newRunning() {
            return new double[2];
        }

        @Override
        void plus(Object running, long slice, Object partial) {
            double[] p = (double[]) partial;
            compensated((double[]) running, 0, p[0]);
            compensated((double[]) running, 0, p[1]);
        }

        @Override
        void minus(Object running, long slice, Object partial) {
            double[] p = (double[]) partial;
            compensated((double[]) running, 0, -p[0]);
            compensated((double[]) running, 0, -p[1]);
        }

        @Override
        double value(Object running) {
            double[] a = (double[]) running;
            return a[0] + a[1];
        }
    }

    /** Mean of non-null values; empty -> NaN. Partial and running {sum, error, n}. */
    static final class Avg extends Agg {
        Avg(int hit, int field) {
            super(hit, field);
        }

        @Override
        Object add(Object partial, Row r, long t, String eventId) {
            double[] p = partial == null ? new double[3] : (double[]) partial;
            Object v = r.getField(field);
            if (v != null) {
                compensated(p, 0, number(v));
                p[2]++;
            }
            return p;
        }

        @Override
        Object newRunning() {
            return new double[3];
        }

        @Override
        void plus(Object running, long slice, Object partial) {
            double[] a = (double[]) running;
            double[] p = (double[]) partial;
            compensated(a, 0, p[0]);
            compensated(a, 0, p[1]);
            a[2] += p[2];
        }

        @Override
        void minus(Object running, long slice, Object partial) {
            double[] a = (double[]) running;
            double[] p = (double[]) partial;
            compensated(a, 0, -p[0]);
            compensated(a, 0, -p[1]);
            a[2] -= p[2];
        }

        @Override
        double value(Object running) {
            double[] a = (double[]) running;
            return a[2] == 0 ? Double.NaN : (a[0] + a[1]) / a[2];
        }
    }

    /**
     * min or max of non-null values; empty -> NaN. Partial {extreme of the slice} (NaN: none); running a
     * multiset of the slices' extremes (value -> number of slices), so a leaving slice is retracted.
     */
    static final class Extreme extends Agg {
        final boolean max;

        Extreme(int hit, int field, boolean max) {
            super(hit, field);
            this.max = max;
        }

        @Override
        Object add(Object partial, Row r, long t, String eventId) {
            double[] p = partial == null ? new double[] {Double.NaN} : (double[]) partial;
            Object v = r.getField(field);
            if (v != null) {
                double x = number(v);
                p[0] = Double.isNaN(p[0]) ? x : (max ? Math.max(p[0], x) : Math.min(p[0], x));
            }
            return p;
        }

        @Override
        Object newRunning() {
            return new TreeMap<Double, long[]>();
        }

        @Override
        @SuppressWarnings("unchecked")
        void plus(Object running, long slice, Object partial) {
            double x = ((double[]) partial)[0];
            if (!Double.isNaN(x)) {
                ((TreeMap<Double, long[]>) running).computeIfAbsent(x, k -> new long[1])[0]++;
            }
        }

        @Override
        @SuppressWarnings("unchecked")
        void minus(Object running, long slice, Object partial) {
            double x = ((double[]) partial)[0];
            if (!Double.isNaN(x)) {
                TreeMap<Double, long[]> m = (TreeMap<Double, long[]>) running;
                long[] n = m.get(x);
                if (n != null && --n[0] <= 0) {
                    m.remove(x);
                }
            }
        }

        @Override
        @SuppressWarnings("unchecked")
        double value(Object running) {
            TreeMap<Double, long[]> m = (TreeMap<Double, long[]>) running;
            if (m.isEmpty()) {
                return Double.NaN;
            }
            return max ? m.lastKey() : m.firstKey();
        }
    }

    /**
     * The field of the event with the greatest (event_time, event_id), even when it is null (then
     * NaN); empty -> NaN. Partial {t, id, value} of the slice's last event. Running {slice start,
     * partial} of the newest slice in the window that has one: events of a newer slice are later, and
     * when that slice leaves every older one has left too, so nothing needs a scan.
     */
    static final class Last extends Agg {
        final boolean text;

        Last(int hit, int field, boolean text) {
            super(hit, field);
            this.text = text;
        }

        @Override
        Object add(Object partial, Row r, long t, String eventId) {
            Object[] p = (Object[]) partial;
            String id = eventId == null ? "" : eventId;  // no event id: the first of a time tie stays
            if (p == null || t > (Long) p[0] || (t == (Long) p[0] && id.compareTo((String) p[1]) > 0)) {
                return new Object[] {t, id, r.getField(field)};
            }
            return p;
        }

        @Override
        Object newRunning() {
            return new Object[2];
        }

        @Override
        void plus(Object running, long slice, Object partial) {
            Object[] a = (Object[]) running;
            if (a[0] == null || slice >= (Long) a[0]) {
                a[0] = slice;
                a[1] = partial;
            }
        }

        @Override
        void minus(Object running, long slice, Object partial) {
            Object[] a = (Object[]) running;
            if (a[0] != null && slice == (Long) a[0]) {
                a[0] = null;
                a[1] = null;
            }
        }

        Object last(Object running) {
            Object[] p = (Object[]) ((Object[]) running)[1];
            return p == null ? null : p[2];
        }

        @Override
        double value(Object running) {
            Object v = last(running);
            if (v instanceof Boolean b && !text) {
                return b ? 1.0 : 0.0;  // Python's float(True)
            }
            return v instanceof Number && !text ? number(v) : Double.NaN;  // text has no number: NaN
        }

        @Override
        void result(Object running, float[] out, String[] dict, int off) {
            Object v = last(running);
            out[off] = (float) value(running);
            dict[off] = text && v != null ? PyText.str(v) : null;
        }
    }

    /** Base of distinct_count and top_k: value -> count over non-null values, retractable. */
    abstract static class Counter extends Agg {
        Counter(int hit, int field) {
            super(hit, field);
        }

        @Override
        @SuppressWarnings("unchecked")
        Object add(Object partial, Row r, long t, String eventId) {
            HashMap<Object, long[]> p = partial == null ? new HashMap<>(4) : (HashMap<Object, long[]>) partial;
            Object v = r.getField(field);
            if (v != null) {
                p.computeIfAbsent(v, x -> new long[1])[0]++;
            }
            return p;
        }

        @Override
        Object newRunning() {
            return new HashMap<Object, long[]>();
        }

        @Override
        @SuppressWarnings("unchecked")
        void plus(Object running, long slice, Object partial) {
            HashMap<Object, long[]> a = (HashMap<Object, long[]>) running;
            for (Map.Entry<Object, long[]> e : ((HashMap<Object, long[]>) partial).entrySet()) {
                a.computeIfAbsent(e.getKey(), x -> new long[1])[0] += e.getValue()[0];
            }
        }

        @Override
        @SuppressWarnings("unchecked")
        void minus(Object running, long slice, Object partial) {
            HashMap<Object, long[]> a = (HashMap<Object, long[]>) running;
            for (Map.Entry<Object, long[]> e : ((HashMap<Object, long[]>) partial).entrySet()) {
                long[] n = a.get(e.getKey());
                if (n != null && (n[0] -= e.getValue()[0]) <= 0) {
                    a.remove(e.getKey());
                }
            }
        }
    }

    /** Number of distinct non-null values; empty -> 0. */
    static final class Distinct extends Counter {
        Distinct(int hit, int field) {
            super(hit, field);
        }

        @Override
        double value(Object running) {
            return ((HashMap<?, ?>) running).size();
        }
    }

    /** The k most frequent non-null values, count desc then value asc, share = count / non-null count. */
    static final class TopK extends Counter {
        final int k;

        TopK(int hit, int field, int k) {
            super(hit, field);
            this.k = k;
        }

        @Override
        int slots() {
            return 2 * k;
        }

        @Override
        double value(Object running) {
            return Double.NaN;
        }

        @Override
        @SuppressWarnings("unchecked")
        void result(Object running, float[] out, String[] dict, int off) {
            HashMap<Object, long[]> a = (HashMap<Object, long[]>) running;
            long total = 0;
            List<Map.Entry<Object, long[]>> entries = new ArrayList<>(a.entrySet());
            for (Map.Entry<Object, long[]> e : entries) {
                total += e.getValue()[0];
            }
            entries.sort((x, y) -> {
                int byCount = Long.compare(y.getValue()[0], x.getValue()[0]);
                return byCount != 0 ? byCount : PyText.compare(x.getKey(), y.getKey());
            });
            for (int i = 0; i < k; i++) {
                if (i < entries.size()) {
                    Map.Entry<Object, long[]> e = entries.get(i);
                    out[off + i] = Float.NaN;  // the dictionary id, filled in by the sink
                    dict[off + i] = PyText.str(e.getKey());
                    out[off + k + i] = (float) ((double) e.getValue()[0] / (double) total);
                } else {
                    out[off + i] = Float.NaN;
                    dict[off + i] = null;
                    out[off + k + i] = 0f;
                }
            }
        }
    }

    /** numerator / denominator, each a scalar aggregation with its own filter; NaN when den is 0 or NaN. */
    static final class Ratio extends Agg {
        final Agg num;
        final Agg den;

        Ratio(Agg num, Agg den) {
            super(-1, -1);
            this.num = num;
            this.den = den;
        }

        @Override
        boolean hits(Row r) {
            return num.hits(r) || den.hits(r);
        }

        @Override
        Object add(Object partial, Row r, long t, String eventId) {
            Object[] p = partial == null ? new Object[2] : (Object[]) partial;
            if (num.hits(r)) {
                p[0] = num.add(p[0], r, t, eventId);
            }
            if (den.hits(r)) {
                p[1] = den.add(p[1], r, t, eventId);
            }
            return p;
        }

        @Override
        Object newRunning() {
            return new Object[] {num.newRunning(), den.newRunning()};
        }

        @Override
        void plus(Object running, long slice, Object partial) {
            Object[] a = (Object[]) running;
            Object[] p = (Object[]) partial;
            if (p[0] != null) {
                num.plus(a[0], slice, p[0]);
            }
            if (p[1] != null) {
                den.plus(a[1], slice, p[1]);
            }
        }

        @Override
        void minus(Object running, long slice, Object partial) {
            Object[] a = (Object[]) running;
            Object[] p = (Object[]) partial;
            if (p[0] != null) {
                num.minus(a[0], slice, p[0]);
            }
            if (p[1] != null) {
                den.minus(a[1], slice, p[1]);
            }
        }

        @Override
        double value(Object running) {
            Object[] a = (Object[]) running;
            double d = den.value(a[1]);
            if (Double.isNaN(d) || d == 0) {
                return Double.NaN;
            }
            return num.value(a[0]) / d;
        }
    }
}
