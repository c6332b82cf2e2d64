package dev.headwater.flink;

import java.util.Arrays;

/**
 * The last record decoded in this thread, so the two functions the source table computes per record
 * ({@link DecodeEvent} for the fields, {@link EventTime} for the rowtime) decode it once. Matched by
 * content (value and both headers), so a hit is the same bytes and hence the same result, whether Flink
 * hands both functions the same arrays or copies (a copy is kept: the memcmp and the copy cost little
 * next to an Avro decode).
 */
final class Decoded {
    private static final ThreadLocal<Decoded> LAST = ThreadLocal.withInitial(Decoded::new);

    private EventDecoder decoder;
    private byte[] value;
    private byte[] fp;
    private byte[] produceTs;
    private EventDecoder.Result result;

    private Decoded() {}

    static EventDecoder.Result of(EventDecoder decoder, byte[] value, byte[] fp, byte[] produceTs) {
        Decoded last = LAST.get();
        if (last.result != null && last.decoder.config().source.equals(decoder.config().source)
                && same(last.value, value) && same(last.fp, fp) && same(last.produceTs, produceTs)) {
            return last.result;
        }
        EventDecoder.Result r = decoder.decode(value, fp, produceTs, System.currentTimeMillis());
        last.decoder = decoder;
        // copies: an array Flink hands out may be refilled with the next record
        last.value = value == null ? null : value.clone();
        last.fp = fp == null ? null : fp.clone();
        last.produceTs = produceTs == null ? null : produceTs.clone();
        last.result = r;
        return r;
    }

    private static boolean same(byte[] a, byte[] b) {
        return Arrays.equals(a, b);
    }
}
