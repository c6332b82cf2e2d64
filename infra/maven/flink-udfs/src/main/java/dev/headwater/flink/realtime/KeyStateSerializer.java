package dev.headwater.flink.realtime;

import java.io.IOException;
import java.util.Map;

import org.apache.flink.api.common.typeutils.SimpleTypeSerializerSnapshot;
import org.apache.flink.api.common.typeutils.TypeSerializer;
import org.apache.flink.api.common.typeutils.TypeSerializerSnapshot;
import org.apache.flink.core.memory.DataInputDeserializer;
import org.apache.flink.core.memory.DataInputView;
import org.apache.flink.core.memory.DataOutputSerializer;
import org.apache.flink.core.memory.DataOutputView;
import org.apache.flink.types.StringValue;

/**
 * Flink serializer of {@link KeyState}: checkpoints, and the copy the heap state backend takes of a
 * state touched while an asynchronous snapshot of it is running. Format 1, self-describing partials.
 */
public final class KeyStateSerializer extends TypeSerializer<KeyState> {
    private static final long serialVersionUID = 1L;
    private static final byte FORMAT = 1;

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
        return new KeyState();
    }

    @Override
    public KeyState copy(KeyState from) {
        try {
            DataOutputSerializer out = new DataOutputSerializer(256);
            serialize(from, out);
            return deserialize(new DataInputDeserializer(out.getSharedBuffer(), 0, out.length()));
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
        out.writeByte(FORMAT);
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
        if (format != FORMAT) {
            throw new IOException("realtime key state format " + format + ", this jar reads " + FORMAT
                + ": start the job with --no-restore");
        }
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
        return o instanceof KeyStateSerializer;
    }

    @Override
    public int hashCode() {
        return KeyStateSerializer.class.hashCode();
    }

    @Override
    public TypeSerializerSnapshot<KeyState> snapshotConfiguration() {
        return new Snapshot();
    }

    /** The serializer has no configuration: the snapshot restores a new instance. */
    public static final class Snapshot extends SimpleTypeSerializerSnapshot<KeyState> {
        public Snapshot() {
            super(KeyStateSerializer::new);
        }
    }
}
