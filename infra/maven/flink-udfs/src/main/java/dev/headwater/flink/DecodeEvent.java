package dev.headwater.flink;

import java.util.ArrayList;
import java.util.List;
import java.util.Optional;

import org.apache.flink.table.api.DataTypes;
import org.apache.flink.table.catalog.DataTypeFactory;
import org.apache.flink.table.functions.ScalarFunction;
import org.apache.flink.table.types.DataType;
import org.apache.flink.table.types.inference.TypeInference;
import org.apache.flink.types.Row;

/**
 * {@code hw_decode_<n>(value, schema_fp, produce_ts)}: the realtime job's Avro decode of one source, in
 * the JVM. Built with the source's decoder config (pipelines/realtime/decode.py {@code decoder_config}),
 * so its row type is the source's: {@code hw_reason} (NULL for a record that decodes), {@code hw_detail},
 * {@code hw_future} (the future-dated detail, else NULL), {@code hw_time_ms} (the event time in ms, 0
 * for a rejected record), then the current schema's fields (NULL for a rejected record) typed as
 * {@link #sqlType} says.
 */
public class DecodeEvent extends ScalarFunction {
    private static final long serialVersionUID = 1L;
    /** The columns before the source's fields. */
    public static final String[] HEAD = {"hw_reason", "hw_detail", "hw_future", "hw_time_ms"};

    private final String config;
    private transient EventDecoder decoder;

    public DecodeEvent(String config) {
        this.config = config;
    }

    public Row eval(byte[] value, byte[] fp, byte[] produceTs) {
        if (decoder == null) {
            decoder = new EventDecoder(config);
        }
        EventDecoder.Result r = Decoded.of(decoder, value, fp, produceTs);
        Object[] out = new Object[HEAD.length + decoder.config().names.length];
        out[0] = r.reason;
        out[1] = r.detail;
        out[2] = r.future;
        out[3] = r.timeMs;
        if (r.reason == null) {
            System.arraycopy(r.fields, 0, out, HEAD.length, r.fields.length);
        }
        return Row.of(out);
    }

    /** The Flink SQL type of a field of {@code kind} (the registry's field kinds). */
    public static DataType sqlType(String kind) {
        switch (kind) {
            case "string":
            case "enum":
                return DataTypes.STRING();
            case "int":
                return DataTypes.INT();
            case "long":
            case "timestamp":
                return DataTypes.BIGINT();
            case "float":
            case "double":
                return DataTypes.DOUBLE();
            case "boolean":
                return DataTypes.BOOLEAN();
            default:
                throw new IllegalArgumentException("field kind '" + kind + "' has no SQL type here: rebuild infra/");
        }
    }

    @Override
    public TypeInference getTypeInference(DataTypeFactory typeFactory) {
        EventDecoder.Config c = EventDecoder.Config.parse(config);
        List<DataTypes.Field> fields = new ArrayList<>();
        fields.add(DataTypes.FIELD(HEAD[0], DataTypes.STRING()));
        fields.add(DataTypes.FIELD(HEAD[1], DataTypes.STRING()));
        fields.add(DataTypes.FIELD(HEAD[2], DataTypes.STRING()));
        fields.add(DataTypes.FIELD(HEAD[3], DataTypes.BIGINT()));
        for (int i = 0; i < c.names.length; i++) {
            fields.add(DataTypes.FIELD(c.names[i], sqlType(c.kinds[i])));
        }
        DataType row = DataTypes.ROW(fields.toArray(new DataTypes.Field[0])).bridgedTo(Row.class);
        return TypeInference.newBuilder()
            .typedArguments(DataTypes.BYTES(), DataTypes.BYTES(), DataTypes.BYTES())
            .outputTypeStrategy(ctx -> Optional.of(row))
            .build();
    }

    /**
     * Declared non-deterministic (it is not: the same bytes decode the same way) so that the planner
     * computes the row once per record: for a deterministic call it inlines {@code hw_decode(...)} into
     * every reference to one of its fields (each event column, each rule, each filter), dozens of calls.
     */
    @Override
    public boolean isDeterministic() {
        return false;
    }
}
