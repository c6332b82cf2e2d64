package dev.headwater.flink;

import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.charset.CharacterCodingException;
import java.nio.charset.CharsetDecoder;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;

import org.apache.avro.Schema;
import org.apache.avro.generic.GenericData;
import org.apache.avro.generic.GenericDatumReader;
import org.apache.avro.generic.GenericRecord;
import org.apache.avro.io.BinaryDecoder;
import org.apache.avro.io.DecoderFactory;
import org.apache.avro.util.Utf8;

/**
 * Decodes and validates one record of any source of the plan exactly like headwater's Python codec
 * (pipelines/events/codec.py {@code EventCodec.decode}): same steps, same reason codes. Nothing here
 * knows a field name: the source comes as the JSON that pipelines/realtime/decode.py
 * {@code decoder_config} writes from the plan's {@code PlanSource} (every schema version, the current
 * schema's fields and kinds, the event-time field and unit, the id fields, the event-time limits) and the
 * Python codec's size bounds ({@code max_event_bytes}, {@code max_string_chars}: one definition, in
 * codec.py, not constants of the JVM's own).
 *
 * <p>Steps: 1. the {@code schema-fp} header names one of the source's schema versions (the writer
 * schema); 2. {@code produce-ts}, when present, is ASCII digits (at most 16); 3. the payload is one
 * Avro record of the writer schema that uses every byte, resolved into the current schema (Avro's
 * rules), and is {@code oversized} when over {@code max_event_bytes} (checked before it is read) or when
 * a string field has more than {@code max_string_chars} characters (checked after the read, before the
 * field checks, as in Python); 4. the event time lies in {@code [min_event_time_ms, max_event_time_ms)} and each string
 * key/event-id field meets the source's id policy ({@code invalid_id}, with the text of
 * pipelines/events/ids.py {@code check_id}: at most {@code id_max_bytes} UTF-8 bytes, none of the
 * {@code id_forbidden} code points, both from the config). The source's rules are not evaluated here: the realtime
 * SQL evaluates them ({@code hw_is_false(rule)}, {@link IsFalse}, pipelines/realtime/sql.py) right after this decode, so
 * a filter and a rule have one implementation per engine. Then 5. the record is flagged future-dated
 * (not rejected: the SQL rejects it after the rules, the order of the Python tiers) when its event
 * time is more than {@code max_future_ms} ahead of this process's clock. Never throws on bad input.
 */
public final class EventDecoder {
    static final int MAX_DETAIL_CHARS = 500;
    private static final ThreadLocal<CharsetDecoder> UTF8 =
        ThreadLocal.withInitial(StandardCharsets.UTF_8::newDecoder);

    /** The source as the decoder reads it (parsed once from the plan's JSON). */
    public static final class Config {
        public final String source;
        /** The {@code schema-fp} header value of each schema version (ASCII), oldest first. */
        final byte[][] fingerprints;
        final Schema[] writers;
        public final String[] names;
        /** Per field: string, enum, int, long, float, double, boolean or timestamp. */
        public final String[] kinds;
        public final String eventTime;
        final int timeField;
        /** 1000 when the event-time field is in micros, else 1. */
        final long timeDiv;
        /** The fields the id policy bounds (the string key and event id), and their roles (key, event_id). */
        final int[] idFields;
        final String[] idRoles;
        /** The longest id in UTF-8 bytes ({@code ids.max_bytes}). */
        final int idMaxBytes;
        /** {@code any} or {@code printable} ({@code ids.charset}), and its forbidden code point ranges. */
        final String idCharset;
        final int[][] idForbidden;
        final long minEventTimeMs;
        final long maxEventTimeMs;
        final long maxFutureMs;
        /** A payload over this many bytes is {@code oversized} (codec.py {@code max_event_bytes}). */
        final int maxEventBytes;
        /** A string field over this many characters is {@code oversized} ({@code max_string_chars}). */
        final int maxStringChars;
        /** The fields of kind string (the ones {@code maxStringChars} bounds; not enum symbols). */
        final int[] stringFields;

        Config(JsonNode n) {
            source = n.path("source").asText();
            List<byte[]> fps = new ArrayList<>();
            List<Schema> schemas = new ArrayList<>();
            for (JsonNode s : n.path("schemas")) {
                fps.add(s.path("fingerprint").asText().getBytes(StandardCharsets.US_ASCII));
                schemas.add(new Schema.Parser().parse(s.path("json").asText()));  // a parser per version
            }
            if (schemas.isEmpty()) {
                throw new IllegalArgumentException("source " + source + ": the decoder config has no schema");
            }
            fingerprints = fps.toArray(new byte[0][]);
            writers = schemas.toArray(new Schema[0]);
            List<String> ns = new ArrayList<>();
            List<String> ks = new ArrayList<>();
            for (JsonNode f : n.path("fields")) {
                ns.add(f.path("name").asText());
                ks.add(f.path("kind").asText());
            }
            names = ns.toArray(new String[0]);
            kinds = ks.toArray(new String[0]);
            Schema current = writers[writers.length - 1];
            for (int i = 0; i < names.length; i++) {
                Schema.Field f = current.getField(names[i]);
                if (f == null || f.pos() != i) {
                    throw new IllegalArgumentException("source " + source + ": field " + names[i]
                        + " is not field " + i + " of the current schema: re-run `headwater apply`");
                }
            }
            eventTime = n.path("event_time").asText();
            timeField = ns.indexOf(eventTime);
            if (timeField < 0) {
                throw new IllegalArgumentException("source " + source + ": event_time " + eventTime
                    + " is not a field of the current schema");
            }
            timeDiv = "us".equals(n.path("time_unit").asText()) ? 1000L : 1L;
            List<Integer> ids = new ArrayList<>();
            for (JsonNode f : n.path("id_fields")) {
                ids.add(ns.indexOf(f.asText()));
            }
            idFields = ids.stream().mapToInt(Integer::intValue).toArray();
            List<String> roles = new ArrayList<>();
            for (JsonNode r : n.path("id_roles")) {
                roles.add(r.asText());
            }
            if (roles.size() != idFields.length) {
                throw new IllegalArgumentException("source " + source + ": the decoder config has " + roles.size()
                    + " id_roles for " + idFields.length + " id_fields: re-run `headwater apply`");
            }
            idRoles = roles.toArray(new String[0]);
            idMaxBytes = bound(n, "id_max_bytes");
            idCharset = n.path("id_charset").asText();
            List<int[]> forbidden = new ArrayList<>();
            for (JsonNode r : n.path("id_forbidden")) {
                forbidden.add(new int[] {r.path(0).asInt(), r.path(1).asInt()});
            }
            if (forbidden.isEmpty()) {
                throw new IllegalArgumentException("source " + source + ": the decoder config has no id_forbidden "
                    + "(it comes from pipelines/realtime/decode.py decoder_config)");
            }
            idForbidden = forbidden.toArray(new int[0][]);
            minEventTimeMs = n.path("min_event_time_ms").asLong();
            maxEventTimeMs = n.path("max_event_time_ms").asLong();
            maxFutureMs = n.path("max_future_ms").asLong();
            maxEventBytes = bound(n, "max_event_bytes");
            maxStringChars = bound(n, "max_string_chars");
            List<Integer> strings = new ArrayList<>();
            for (int i = 0; i < kinds.length; i++) {
                if ("string".equals(kinds[i])) {
                    strings.add(i);
                }
            }
            stringFields = strings.stream().mapToInt(Integer::intValue).toArray();
        }

        /** A positive size bound of the config: required, so a stale config fails at start, not per record. */
        private int bound(JsonNode n, String key) {
            JsonNode v = n.get(key);
            if (v == null || !v.canConvertToInt() || v.asInt() <= 0) {
                throw new IllegalArgumentException("source " + source + ": the decoder config has no positive "
                    + key + " (found " + v + "): it comes from pipelines/realtime/decode.py decoder_config");
            }
            return v.asInt();
        }

        /** Parse the JSON of pipelines/realtime/decode.py {@code decoder_config}. */
        public static Config parse(String json) {
            try {
                return new Config(new ObjectMapper().readTree(json));
            } catch (IOException e) {
                throw new IllegalArgumentException("decoder config is not valid JSON: " + e.getMessage(), e);
            }
        }

        Schema current() {
            return writers[writers.length - 1];
        }
    }

    /**
     * Result of one record: a reason (null when the record decodes), a detail, the future-dated detail
     * (null unless the event time is too far ahead), the event time in ms, and the current schema's
     * fields (Avro order; strings and enum symbols as String, float as Double, timestamps raw).
     */
    public static final class Result {
        public final String reason;
        public final String detail;
        public final String future;
        public final long timeMs;
        public final Object[] fields;

        Result(String reason, String detail, String future, long timeMs, Object[] fields) {
            this.reason = reason;
            this.detail = detail;
            this.future = future;
            this.timeMs = timeMs;
            this.fields = fields;
        }

        /**
         * The rowtime of the record: 0 (1970, never moves a watermark) when it is rejected or future-dated,
         * else its event time capped by {@code nowMs}, so an accepted event from the near future cannot push
         * the watermark past the wall clock and make the events after it late.
         */
        public long rowtime(long nowMs) {
            return reason != null || future != null ? 0L : Math.min(timeMs, nowMs);
        }
    }

    private final Config config;
    private final GenericDatumReader<GenericRecord>[] readers;
    private final GenericRecord[] reuse;
    private BinaryDecoder decoder;

    /** A decoder of the source {@code configJson} describes. */
    public EventDecoder(String configJson) {
        this(Config.parse(configJson));
    }

    @SuppressWarnings("unchecked")
    public EventDecoder(Config config) {
        this.config = config;
        Schema current = config.current();
        readers = new GenericDatumReader[config.writers.length];
        for (int i = 0; i < readers.length; i++) {
            Schema writer = i == readers.length - 1 ? current : config.writers[i];
            readers[i] = new GenericDatumReader<>(writer, current, new GenericData());
        }
        reuse = new GenericRecord[readers.length];
    }

    public Config config() {
        return config;
    }

    /** Decode one record at wall-clock time {@code nowMs}. */
    public Result decode(byte[] value, byte[] fp, byte[] produceTs, long nowMs) {
        // Step 1
        if (fp == null) {
            return reject("missing_fingerprint", "no 'schema-fp' header on the record");
        }
        int version = -1;
        for (int i = config.fingerprints.length - 1; i >= 0; i--) {
            if (Arrays.equals(fp, config.fingerprints[i])) {
                version = i;
                break;
            }
        }
        if (version < 0) {
            StringBuilder known = new StringBuilder();
            for (byte[] f : config.fingerprints) {
                known.append(known.length() == 0 ? "" : ", ").append(new String(f, StandardCharsets.US_ASCII));
            }
            return reject("unknown_fingerprint", "schema-fp " + bytesRepr(fp, 40) + " is no schema version of source '"
                + config.source + "' (known: " + known + "); list the new schema in sources.yaml and apply");
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
        if (value.length > config.maxEventBytes) {
            return reject("oversized", "a " + value.length + "-byte payload is over the " + config.maxEventBytes
                + "-byte limit of source '" + config.source + "'");
        }
        GenericRecord record;
        try {
            decoder = DecoderFactory.get().binaryDecoder(value, decoder);
            record = readers[version].read(reuse[version], decoder);
            reuse[version] = record;
            if (!decoder.isEnd()) {
                int left = decoder.inputStream().available();
                return reject("corrupt_payload", left + " trailing bytes after a "
                    + (value.length - left) + "-byte record");
            }
        } catch (IOException | RuntimeException e) {
            reuse[version] = null;  // a half-read record is no base for the next one
            return reject("corrupt_payload", "not an Avro record of source '" + config.source + "': "
                + e.getClass().getSimpleName() + ": " + e.getMessage());
        }
        Object[] fields = new Object[config.names.length];
        for (int i = 0; i < fields.length; i++) {
            Object v = record.get(i);
            if (v instanceof Utf8 u) {
                // Avro's Java reader replaces invalid UTF-8; the Python codec rejects it: so do we.
                try {
                    v = UTF8.get().decode(ByteBuffer.wrap(u.getBytes(), 0, u.getByteLength())).toString();
                } catch (CharacterCodingException e) {
                    return reject("corrupt_payload", "not an Avro record of source '" + config.source
                        + "': field " + config.names[i] + " is not valid UTF-8");
                }
            } else if (v instanceof GenericData.EnumSymbol) {
                v = v.toString();
            } else if (v instanceof Float f) {
                v = f.doubleValue();
            }
            fields[i] = v;
        }
        // A string has at most as many characters as bytes: a payload within the bound cannot hold a
        // string over it (the common case skips the look at every string field, as in Python).
        if (value.length > config.maxStringChars) {
            String over = oversized(fields);
            if (over != null) {
                return reject("oversized", over);
            }
        }
        // Step 4
        Object ts = fields[config.timeField];
        if (ts == null) {
            return reject("invalid_field", config.eventTime + ": the event time is null");
        }
        long ms = Math.floorDiv((Long) ts, config.timeDiv);
        String problem = validate(fields, ms);
        if (problem != null) {
            return reject("invalid_field", problem);
        }
        problem = checkIds(fields);
        if (problem != null) {
            return reject("invalid_id", problem);
        }
        // Step 5
        String future = null;
        if (ms > nowMs + config.maxFutureMs) {
            future = String.format("%s %d (UTC ms) is %.1f s ahead of the realtime tier's clock (at most %s s "
                + "allowed: max_future of source '%s')", config.eventTime, ms, (ms - nowMs) / 1000.0,
                seconds(config.maxFutureMs), config.source);
        }
        return new Result(null, null, future, ms, fields);
    }

    /** The checks Avro cannot express, but the rules (codec.py EventCodec.validate); null when valid. */
    private String validate(Object[] f, long ms) {
        if (ms < config.minEventTimeMs || ms >= config.maxEventTimeMs) {
            return config.eventTime + ": expected UTC ms in [" + config.minEventTimeMs + ", "
                + config.maxEventTimeMs + ") (source '" + config.source
                + "': min_event_time in sources.yaml), found " + ms;
        }
        return null;
    }

    /** The id policy (pipelines/events/ids.py {@code check_id}, the same text); null when every id meets it. */
    private String checkIds(Object[] f) {
        for (int j = 0; j < config.idFields.length; j++) {
            String what = config.idRoles[j] + " " + config.names[config.idFields[j]];
            String s = (String) f[config.idFields[j]];
            if (s == null) {
                return "id-empty: " + what + " is null";
            }
            if (s.isEmpty()) {
                return "id-empty: " + what + " is empty";
            }
            // the decode above refused invalid UTF-8, so the text has no lone surrogate (id-invalid-utf8)
            int size = s.getBytes(StandardCharsets.UTF_8).length;
            if (size > config.idMaxBytes) {
                return "id-too-long: " + what + " is " + size + " bytes, limit " + config.idMaxBytes;
            }
            int index = 0;
            for (int k = 0; k < s.length(); index++) {
                int cp = s.codePointAt(k);
                for (int[] r : config.idForbidden) {
                    if (r[0] <= cp && cp <= r[1]) {
                        String kind = "printable".equals(config.idCharset) ? "id-not-printable" : "id-has-nul";
                        return String.format("%s: %s has U+%04X at character %d (ids.charset %s)", kind, what, cp,
                            index, config.idCharset);
                    }
                }
                k += Character.charCount(cp);
            }
        }
        return null;
    }

    /** Name the first string field over {@code maxStringChars} characters (code points), if any. */
    private String oversized(Object[] f) {
        for (int i : config.stringFields) {
            if (f[i] instanceof String s && s.length() > config.maxStringChars) {  // UTF-16 units >= code points
                int n = s.codePointCount(0, s.length());
                if (n > config.maxStringChars) {
                    return config.names[i] + ": " + n + " characters (" + strRepr(s) + "...) is over the limit of "
                        + config.maxStringChars + " characters of source '" + config.source + "'";
                }
            }
        }
        return null;
    }

    private static Result reject(String reason, String detail) {
        String d = detail.length() > MAX_DETAIL_CHARS ? detail.substring(0, MAX_DETAIL_CHARS) : detail;
        return new Result(reason, d, null, 0L, null);
    }

    private static boolean digits(byte[] b) {
        for (byte c : b) {
            if (c < '0' || c > '9') {
                return false;
            }
        }
        return true;
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
        int end = s.offsetByCodePoints(0, Math.min(40, s.codePointCount(0, s.length())));
        return "'" + s.substring(0, end) + "'";
    }

    private static String seconds(long ms) {
        return ms % 1000 == 0 ? Long.toString(ms / 1000) : Double.toString(ms / 1000.0);
    }
}
