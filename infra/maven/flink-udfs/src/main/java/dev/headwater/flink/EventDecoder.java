package dev.headwater.flink;

import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.charset.CharacterCodingException;
import java.nio.charset.CharsetDecoder;
import java.nio.charset.StandardCharsets;
import java.util.Arrays;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;

import org.apache.avro.Schema;
import org.apache.avro.generic.GenericData;
import org.apache.avro.generic.GenericDatumReader;
import org.apache.avro.generic.GenericRecord;
import org.apache.avro.io.BinaryDecoder;
import org.apache.avro.io.DecoderFactory;
import org.apache.avro.util.Utf8;

/**
 * Decodes and validates one behaviour event exactly like headwater's Python codec
 * (pipelines/events/codec.py, {@code EventCodec.decode} and {@code validate_event}) and the realtime
 * tier's future-dated check (pipelines/realtime/decode.py): same steps, same reason codes.
 *
 * <p>Steps: 1. the {@code schema-fp} header must equal the writer schema's fingerprint (given by
 * Python); 2. {@code produce-ts}, when present, is ASCII digits (at most 16); 3. the payload is one
 * Avro record of the schema that uses every byte; 4. the field rules; 5. the event time is at most
 * {@code maxFutureMs} ahead of this process's clock. Never throws on bad input.
 */
public final class EventDecoder {
    /** The decoded event's fields in Avro order (the realtime SQL job's EVENT_COLUMNS). */
    public static final String[] FIELDS = {
        "event_id", "user_id", "item_id", "event_type", "event_time", "session_id",
        "category", "price", "dwell_ms", "query", "position", "device",
    };

    static final long MIN_EVENT_TIME_MS = 946_684_800_000L;
    static final long MAX_EVENT_TIME_MS = 4_102_444_800_000L;
    static final int MAX_ID_CHARS = 128;
    static final int MAX_DETAIL_CHARS = 500;

    private static final Map<String, Schema> SCHEMAS = new ConcurrentHashMap<>();
    private static final ThreadLocal<CharsetDecoder> UTF8 =
        ThreadLocal.withInitial(StandardCharsets.UTF_8::newDecoder);

    private final Schema schema;
    private final GenericDatumReader<GenericRecord> reader;
    private final int[] positions;
    private BinaryDecoder decoder;

    /** Result of one record: a reason (null when good), a detail, and the fields in {@link #FIELDS} order. */
    public static final class Result {
        public final String reason;
        public final String detail;
        public final Object[] fields;

        Result(String reason, String detail, Object[] fields) {
            this.reason = reason;
            this.detail = detail;
            this.fields = fields;
        }

        /** The event time in UTC ms; 0 for a rejected record (never moves a watermark). */
        public long eventTime() {
            return reason == null ? (Long) fields[4] : 0L;
        }
    }

    /** Parses {@code schemaJson}, the event schema's JSON text (once per text and JVM). */
    public EventDecoder(String schemaJson) {
        this.schema = SCHEMAS.computeIfAbsent(schemaJson, s -> new Schema.Parser().parse(s));
        this.reader = new GenericDatumReader<>(schema, schema, new GenericData());
        this.positions = new int[FIELDS.length];
        for (int i = 0; i < FIELDS.length; i++) {
            Schema.Field f = schema.getField(FIELDS[i]);
            if (f == null) {
                throw new IllegalArgumentException(
                    "event schema " + schema.getFullName() + " has no field '" + FIELDS[i]
                        + "' that the realtime job decodes: update EventDecoder.FIELDS and the job together");
            }
            positions[i] = f.pos();
        }
    }

    /** Decode one record; {@code expectedFp} is the schema-fp header value the writer schema has. */
    public Result decode(byte[] value, byte[] fp, byte[] produceTs, byte[] expectedFp,
                         long maxFutureMs, long nowMs) {
        // Step 1
        if (fp == null) {
            return reject("missing_fingerprint", "no 'schema-fp' header on the record");
        }
        if (!Arrays.equals(fp, expectedFp)) {
            return reject("unknown_fingerprint", "schema-fp " + bytesRepr(fp, 40)
                + " is not the schema this consumer knows (" + ascii(expectedFp) + ")");
        }
        // Step 2
        if (produceTs != null && (produceTs.length == 0 || produceTs.length > 16 || !digits(produceTs))) {
            return reject("invalid_header",
                "produce-ts must be UTC milliseconds in ASCII digits, found " + bytesRepr(produceTs, 40));
        }
        // Step 3
        if (value == null || value.length == 0) {
            return reject("empty_payload", "the record has no value (tombstone or empty bytes)");
        }
        GenericRecord record;
        try {
            decoder = DecoderFactory.get().binaryDecoder(value, decoder);
            record = reader.read(null, decoder);
            if (!decoder.isEnd()) {
                int left = decoder.inputStream().available();
                return reject("corrupt_payload", left + " trailing bytes after a "
                    + (value.length - left) + "-byte record");
            }
        } catch (IOException | RuntimeException e) {
            return reject("corrupt_payload", "not an Avro " + schema.getName() + " record: "
                + e.getClass().getSimpleName() + ": " + e.getMessage());
        }
        Object[] fields = new Object[FIELDS.length];
        for (int i = 0; i < FIELDS.length; i++) {
            Object v = record.get(positions[i]);
            if (v instanceof Utf8 u) {
                // Avro's Java reader replaces invalid UTF-8; the Python codec rejects it: so do we.
                try {
                    v = UTF8.get().decode(ByteBuffer.wrap(u.getBytes(), 0, u.getByteLength())).toString();
                } catch (CharacterCodingException e) {
                    return reject("corrupt_payload", "not an Avro " + schema.getName()
                        + " record: field " + FIELDS[i] + " is not valid UTF-8");
                }
            }
            fields[i] = v instanceof GenericData.EnumSymbol ? v.toString() : v;
        }
        // Step 4
        String problem = validate(fields);
        if (problem != null) {
            return reject("invalid_field", problem);
        }
        // Step 5
        long ts = (Long) fields[4];
        if (ts > nowMs + maxFutureMs) {
            return reject("future_dated", String.format(
                "event_time %d is %.1f s ahead of the realtime tier's clock (at most %s s allowed)",
                ts, (ts - nowMs) / 1000.0, seconds(maxFutureMs)));
        }
        return new Result(null, null, fields);
    }

    /** The rules Avro cannot express (codec.py validate_event); null when the event is valid. */
    static String validate(Object[] f) {
        for (int i : new int[] {0, 1, 5}) {
            String s = (String) f[i];
            int n = s.codePointCount(0, s.length());
            if (n == 0 || n > MAX_ID_CHARS) {
                return FIELDS[i] + ": expected 1.." + MAX_ID_CHARS + " characters, found " + n + " ("
                    + strRepr(s) + ")";
            }
        }
        String kind = (String) f[3];
        long ts = (Long) f[4];
        if (ts < MIN_EVENT_TIME_MS || ts >= MAX_EVENT_TIME_MS) {
            return "event_time: expected UTC ms between years 2000 and 2100, found " + ts;
        }
        String item = (String) f[2];
        if (!kind.equals("search") && (item == null || item.isEmpty())) {
            return "item_id: required for a " + kind + " event, found " + (item == null ? "None" : "''");
        }
        String query = (String) f[9];
        if (kind.equals("search") && (query == null || query.isEmpty())) {
            return "query: required for a search event, found " + (query == null ? "None" : "''");
        }
        Long dwell = (Long) f[8];
        if (kind.equals("dwell") && dwell == null) {
            return "dwell_ms: required for a dwell event, found null";
        }
        if (dwell != null && dwell < 0) {
            return "dwell_ms: expected >= 0, found " + dwell;
        }
        Double price = (Double) f[7];
        if (price != null && !(Double.isFinite(price) && price >= 0)) {
            return "price: expected a finite number >= 0, found " + price;
        }
        Integer position = (Integer) f[10];
        if (position != null && position < 1) {
            return "position: expected >= 1 (1 = top of the slate), found " + position;
        }
        return null;
    }

    private static Result reject(String reason, String detail) {
        String d = detail.length() > MAX_DETAIL_CHARS ? detail.substring(0, MAX_DETAIL_CHARS) : detail;
        return new Result(reason, d, null);
    }

    private static boolean digits(byte[] b) {
        for (byte c : b) {
            if (c < '0' || c > '9') {
                return false;
            }
        }
        return true;
    }

    private static String ascii(byte[] b) {
        return new String(b, StandardCharsets.US_ASCII);
    }

    private static String bytesRepr(byte[] b, int max) {
        StringBuilder sb = new StringBuilder("b'");
        for (int i = 0; i < Math.min(b.length, max); i++) {
            int c = b[i] & 0xff;
            sb.append(c >= 32 && c < 127 && c != '\'' && c != '\\' ? String.valueOf((char) c)
                : String.format("\\x%02x", c));
        }
        return sb.append('\'').toString();
    }

    private static String strRepr(String s) {
        return "'" + (s.length() > 40 ? s.substring(0, 40) : s) + "'";
    }

    private static String seconds(long ms) {
        return ms % 1000 == 0 ? Long.toString(ms / 1000) : Double.toString(ms / 1000.0);
    }
}
