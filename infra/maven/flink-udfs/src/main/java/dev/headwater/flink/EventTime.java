package dev.headwater.flink;

import java.util.Optional;

import org.apache.flink.table.api.DataTypes;
import org.apache.flink.table.catalog.DataTypeFactory;
import org.apache.flink.table.functions.ScalarFunction;
import org.apache.flink.table.types.inference.TypeInference;

/**
 * {@code hw_event_time_<n>(value, schema_fp, produce_ts)}: the rowtime (UTC ms) of a record of one
 * source: {@link EventDecoder.Result#rowtime}, i.e. 0 for a record {@link DecodeEvent} rejects or flags
 * future-dated, else its event time capped by the wall clock (a computed column cannot read another
 * computed column, so the source's watermark is defined on this one). The decode of a record is shared
 * with {@link DecodeEvent} when both run on it in one thread ({@link Decoded}).
 */
public class EventTime extends ScalarFunction {
    private static final long serialVersionUID = 1L;

    private final String config;
    private transient EventDecoder decoder;

    public EventTime(String config) {
        this.config = config;
    }

    public long eval(byte[] value, byte[] fp, byte[] produceTs) {
        if (decoder == null) {
            decoder = new EventDecoder(config);
        }
        return Decoded.of(decoder, value, fp, produceTs).rowtime(System.currentTimeMillis());
    }

    @Override
    public TypeInference getTypeInference(DataTypeFactory typeFactory) {
        return TypeInference.newBuilder()
            .typedArguments(DataTypes.BYTES(), DataTypes.BYTES(), DataTypes.BYTES())
            .outputTypeStrategy(ctx -> Optional.of(DataTypes.BIGINT().notNull().bridgedTo(long.class)))
            .build();
    }

    @Override
    public boolean isDeterministic() {
        return true;
    }
}
