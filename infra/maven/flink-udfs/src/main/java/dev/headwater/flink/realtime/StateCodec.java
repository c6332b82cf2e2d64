package dev.headwater.flink.realtime;

import java.io.DataInput;
import java.io.DataOutput;
import java.io.IOException;
import java.util.HashMap;
import java.util.Map;
import java.util.TreeMap;

import org.apache.flink.types.StringValue;

/**
 * Writes the partials and running accumulators of {@link Agg} (arrays, boxed field values, counters,
 * multisets), each behind a one-byte tag, so the state serializer needs no knowledge of the plan.
 */
final class StateCodec {
    private static final byte NULL = 0;
    private static final byte LONGS = 1;
    private static final byte DOUBLES = 2;
    private static final byte OBJECTS = 3;
    private static final byte STRING = 4;
    private static final byte LONG = 5;
    private static final byte DOUBLE = 6;
    private static final byte INT = 7;
    private static final byte BOOL = 8;
    private static final byte COUNTER = 9;
    private static final byte MULTISET = 10;

    private StateCodec() {}

    @SuppressWarnings("unchecked")
    static void write(Object o, DataOutput out) throws IOException {
        if (o == null) {
            out.writeByte(NULL);
        } else if (o instanceof long[]) {
            long[] a = (long[]) o;
            out.writeByte(LONGS);
            out.writeInt(a.length);
            for (long x : a) {
                out.writeLong(x);
            }
        } else if (o instanceof double[]) {
            double[] a = (double[]) o;
            out.writeByte(DOUBLES);
            out.writeInt(a.length);
            for (double x : a) {
                out.writeDouble(x);
            }
        } else if (o instanceof Object[]) {
            Object[] a = (Object[]) o;
            out.writeByte(OBJECTS);
            out.writeInt(a.length);
            for (Object x : a) {
                write(x, out);
            }
        } else if (o instanceof String) {
            out.writeByte(STRING);
            StringValue.writeString((String) o, out);
        } else if (o instanceof Long) {
            out.writeByte(LONG);
            out.writeLong((Long) o);
        } else if (o instanceof Double) {
            out.writeByte(DOUBLE);
            out.writeDouble((Double) o);
        } else if (o instanceof Integer) {
            out.writeByte(INT);
            out.writeInt((Integer) o);
        } else if (o instanceof Boolean) {
            out.writeByte(BOOL);
            out.writeBoolean((Boolean) o);
        } else if (o instanceof HashMap) {
            HashMap<Object, long[]> m = (HashMap<Object, long[]>) o;
            out.writeByte(COUNTER);
            out.writeInt(m.size());
            for (Map.Entry<Object, long[]> e : m.entrySet()) {
                write(e.getKey(), out);
                out.writeLong(e.getValue()[0]);
            }
        } else if (o instanceof TreeMap) {
            TreeMap<Double, long[]> m = (TreeMap<Double, long[]>) o;
            out.writeByte(MULTISET);
            out.writeInt(m.size());
            for (Map.Entry<Double, long[]> e : m.entrySet()) {
                out.writeDouble(e.getKey());
                out.writeLong(e.getValue()[0]);
            }
        } else {
            throw new IOException("realtime state: cannot write a " + o.getClass().getName());
        }
    }

    static Object read(DataInput in) throws IOException {
        byte tag = in.readByte();
        switch (tag) {
            case NULL:
                return null;
            case LONGS: {
                long[] a = new long[in.readInt()];
                for (int i = 0; i < a.length; i++) {
                    a[i] = in.readLong();
                }
                return a;
            }
            case DOUBLES: {
                double[] a = new double[in.readInt()];
                for (int i = 0; i < a.length; i++) {
                    a[i] = in.readDouble();
                }
                return a;
            }
            case OBJECTS: {
                Object[] a = new Object[in.readInt()];
                for (int i = 0; i < a.length; i++) {
                    a[i] = read(in);
                }
                return a;
            }
            case STRING:
                return StringValue.readString(in);
            case LONG:
                return in.readLong();
            case DOUBLE:
                return in.readDouble();
            case INT:
                return in.readInt();
            case BOOL:
                return in.readBoolean();
            case COUNTER: {
                int n = in.readInt();
                HashMap<Object, long[]> m = new HashMap<>(Math.max(4, n * 2));
                for (int i = 0; i < n; i++) {
                    Object k = read(in);
                    m.put(k, new long[] {in.readLong()});
                }
                return m;
            }
            case MULTISET: {
                int n = in.readInt();
                TreeMap<Double, long[]> m = new TreeMap<>();
                for (int i = 0; i < n; i++) {
                    double k = in.readDouble();
                    m.put(k, new long[] {in.readLong()});
                }
                return m;
            }
            default:
                throw new IOException("realtime state: unknown tag " + tag + " (state of another version?)");
        }
    }
}
