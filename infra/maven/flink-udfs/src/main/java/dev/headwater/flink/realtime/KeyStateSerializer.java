package dev.headwater.flink.realtime;

import java.io.DataInput;
import java.io.DataOutput;
import java.io.IOException;
import java.util.Map;

import org.apache.flink.api.common.typeutils.SimpleTypeSerializerSnapshot;
import org.apache.flink.api.common.typeutils.TypeSerializer;
import org.apache.flink.api.common.typeutils.TypeSerializerSchemaCompatibility;
import org.apache.flink.api.common.typeutils.TypeSerializerSnapshot;
import org.apache.flink.core.memory.DataInputDeserializer;
import org.apache.flink.core.memory.DataInputView;
import org.apache.flink.core.memory.DataOutputSerializer;
import org.apache.flink.core.memory.DataOutputView;
import org.apache.flink.types.StringValue;

/**
 * Flink serializer of {@link KeyState}: checkpoints, and the copy the heap state backend takes of a
 * state touched while an asynchronous snapshot of it is running. Self-describing partials.
 *
 * <p>Format 2 (per-view versions): the serializer is built with its group's {@link Layout} (the views,
 * as {@code name@version}, that the partials are indexed by) and its snapshot ({@link LayoutSnapshot})
 * writes that layout once per checkpoint, not per key. On restore Flink reads the keys with the old
 * snapshot's serializer, which tags each {@link KeyState} with the old layout; when the layouts differ
 * the compatibility is "after migration", and the operator adopts every restored key into its own
 * layout in {@code open()} ({@link Aggregator#adopt}). The heap backend the job uses keeps the restored
 * objects, so no bytes are rewritten by Flink; {@link #serialize} refuses a state of another layout
 * rather than write it shifted.
 *
 * <p>Format 1 (before per-view versions; snapshot class {@link Snapshot}, no layout) is still read: its
 * keys get a {@code null} layout, which the operator takes for its own. pipelines/realtime/job.py only
 * restores such a checkpoint from the legacy folder of the very registry version the job is compiled
 * from, so that is exact.
 */
public final class KeyStateSerializer extends TypeSerializer<KeyState> {
    private static final long serialVersionUID = 2L;
    private static final byte FORMAT_1 = 1;
    private static final byte FORMAT = 2;

    /** The layout this serializer writes and tags what it reads with; null only for a format-1 restore. */
    private final Layout layout;

    public KeyStateSerializer(Layout layout) {
        this.layout = layout;
    }

    @Override
    public boolean isImmutableType() {
        return false;
    }

    @Override
    public TypeSerializer<KeyState> duplicate() {
        return this;  // stateless
    }

    @Override
    public KeyState createInstance() {
        KeyState st = new KeyState();
        st.layout = layout;
        return st;
    }

    @Override
    public KeyState copy(KeyState from) {
        try {
            DataOutputSerializer out = new DataOutputSerializer(256);
            writeBody(from, out);
            KeyState st = readBody(new DataInputDeserializer(out.getSharedBuffer(), 0, out.length()));
            st.layout = from.layout;  // a copy keeps the layout it was read with, adopted or not
            return st;
        } catch (IOException e) {
            throw new IllegalStateException("copying realtime key state failed", e);
        }
    }

    @Override
    public KeyState copy(KeyState from, KeyState reuse) {
        return copy(from);
    }

    @Override
    public int getLength() {
        return -1;
    }

    @Override
    public void serialize(KeyState st, DataOutputView out) throws IOException {
        if (st.layout != layout && (st.layout == null || !st.layout.equals(layout))) {
            throw new IllegalStateException("realtime key state of views [" + st.layout + "] written by the"
                + " serializer of views [" + layout + "]: the operator adopts every restored key in open();"
                + " this is a bug in dev.headwater.flink.realtime (or a state backend other than hashmap)");
        }
        out.writeByte(FORMAT);
        writeBody(st, out);
    }

    private static void writeBody(KeyState st, DataOutput out) throws IOException {
        out.writeLong(st.boundary);
        out.writeLong(st.scheduled);
        StateCodec.write(st.running, out);
        out.writeInt(st.slices.size());
        for (Map.Entry<Long, KeyState.Slice> e : st.slices.entrySet()) {
            KeyState.Slice s = e.getValue();
            out.writeLong(e.getKey());
            out.writeInt(s.size);
            for (int i = 0; i < s.size; i++) {
                out.writeLong(s.ids[i]);
            }
            StateCodec.write(s.partials, out);
        }
        out.writeInt(st.views == null ? 0 : st.views.length);
        for (KeyState.ViewValue v : st.views == null ? new KeyState.ViewValue[0] : st.views) {
            out.writeLong(v.changedAt);
            out.writeBoolean(v.pending);
            out.writeInt(v.slots == null ? -1 : v.slots.length);
            if (v.slots != null) {
                for (int i = 0; i < v.slots.length; i++) {
                    out.writeFloat(v.slots[i]);
                    StringValue.writeString(v.dict[i], out);
                }
            }
        }
    }

    @Override
    public KeyState deserialize(DataInputView in) throws IOException {
        byte format = in.readByte();
        if (format != FORMAT && format != FORMAT_1) {
            throw new IOException("realtime key state format " + format + ", this jar reads " + FORMAT_1
                + " and " + FORMAT + ": a checkpoint of a newer headwater; run that release, or start this"
                + " one with --no-restore (its windows start empty)");
        }
        KeyState st = readBody(in);
        // format 1 (and the restore serializer of its snapshot) has no layout: the operator adopts it as is
        st.layout = format == FORMAT_1 ? null : layout;
        return st;
    }

    private static KeyState readBody(DataInput in) throws IOException {
        KeyState st = new KeyState();
        st.boundary = in.readLong();
        st.scheduled = in.readLong();
        st.running = (Object[]) StateCodec.read(in);
        int slices = in.readInt();
        for (int n = 0; n < slices; n++) {
            long start = in.readLong();
            long[] ids = new long[in.readInt()];
            for (int i = 0; i < ids.length; i++) {
                ids[i] = in.readLong();
            }
            st.slices.put(start, new KeyState.Slice(ids, (Object[]) StateCodec.read(in)));
        }
        st.views = new KeyState.ViewValue[in.readInt()];
        for (int n = 0; n < st.views.length; n++) {
            KeyState.ViewValue v = new KeyState.ViewValue();
            v.changedAt = in.readLong();
            v.pending = in.readBoolean();
            int dim = in.readInt();
            if (dim >= 0) {
                v.slots = new float[dim];
                v.dict = new String[dim];
                for (int i = 0; i < dim; i++) {
                    v.slots[i] = in.readFloat();
                    v.dict[i] = StringValue.readString(in);
                }
            }
            st.views[n] = v;
        }
        return st;
    }

    @Override
    public KeyState deserialize(KeyState reuse, DataInputView in) throws IOException {
        return deserialize(in);
    }

    @Override
    public void copy(DataInputView in, DataOutputView out) throws IOException {
        serialize(deserialize(in), out);
    }

    @Override
    public boolean equals(Object o) {
        return o instanceof KeyStateSerializer k && java.util.Objects.equals(layout, k.layout);
    }

    @Override
    public int hashCode() {
        return java.util.Objects.hashCode(layout);
    }

    @Override
    public TypeSerializerSnapshot<KeyState> snapshotConfiguration() {
        return new LayoutSnapshot(layout);
    }

    /**
     * Format 2's snapshot: the layout, once per state. Compatible as is with a snapshot of the same
     * layout; after migration (the operator adopts the keys) with another layout or with format 1.
     */
    public static final class LayoutSnapshot implements TypeSerializerSnapshot<KeyState> {
        private static final int VERSION = 1;
        private Layout layout;

        /** For Flink's reflective restore; {@link #readSnapshot} sets the layout. */
        public LayoutSnapshot() {}

        LayoutSnapshot(Layout layout) {
            this.layout = layout;
        }

        @Override
        public int getCurrentVersion() {
            return VERSION;
        }

        @Override
        public void writeSnapshot(DataOutputView out) throws IOException {
            out.writeInt(layout.views.length);
            for (int v = 0; v < layout.views.length; v++) {
                out.writeUTF(layout.views[v]);
                out.writeInt(layout.features[v]);
            }
        }

        @Override
        public void readSnapshot(int readVersion, DataInputView in, ClassLoader cl) throws IOException {
            if (readVersion != VERSION) {
                throw new IOException("realtime key state snapshot version " + readVersion + ", this jar reads "
                    + VERSION + ": a checkpoint of a newer headwater; start with --no-restore");
            }
            String[] views = new String[in.readInt()];
            int[] features = new int[views.length];
            for (int v = 0; v < views.length; v++) {
                views[v] = in.readUTF();
                features[v] = in.readInt();
            }
            layout = new Layout(views, features);
        }

        @Override
        public TypeSerializer<KeyState> restoreSerializer() {
            return new KeyStateSerializer(layout);
        }

        @Override
        public TypeSerializerSchemaCompatibility<KeyState> resolveSchemaCompatibility(
                TypeSerializerSnapshot<KeyState> old) {
            if (old instanceof LayoutSnapshot l && layout.equals(l.layout)) {
                return TypeSerializerSchemaCompatibility.compatibleAsIs();
            }
            if (old instanceof LayoutSnapshot || old instanceof Snapshot) {
                return TypeSerializerSchemaCompatibility.compatibleAfterMigration();
            }
            return TypeSerializerSchemaCompatibility.incompatible();
        }
    }

    /** Format 1's snapshot (no configuration), kept so its checkpoints restore: keys without a layout. */
    public static final class Snapshot extends SimpleTypeSerializerSnapshot<KeyState> {
        public Snapshot() {
            super(() -> new KeyStateSerializer(null));
        }
    }
}
