package dev.headwater.flink.realtime;

import java.net.URI;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.charset.StandardCharsets;
import java.security.MessageDigest;
import java.security.NoSuchAlgorithmException;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.HexFormat;
import java.util.List;
import java.util.Map;
import java.util.Set;

import redis.clients.jedis.Jedis;
import redis.clients.jedis.Pipeline;
import redis.clients.jedis.Protocol;
import redis.clients.jedis.exceptions.JedisDataException;

/**
 * The online store as the JVM writes it: the packed value of pipelines/store/codec.py (format 1,
 * 72-byte header + float32 slots) written through pipelines/store/write.lua, and dictionary ids from
 * the same Lua as pipelines/windows/vector.py. Both scripts arrive as text from Python, so every tier
 * runs the same bytes. One connection, pipelined; not thread-safe (one per sink subtask).
 */
final class RedisStore implements AutoCloseable {
    static final int HEADER_BYTES = 72;
    static final int VERSION_BYTES = 32;

    private final URI uri;
    private final String namespace;
    private final byte[] writeScript;
    private final byte[] writeSha;
    private final byte[] dictScript;
    private final Map<String, Map<String, Integer>> ids = new HashMap<>();
    private Jedis jedis;

    /** One EVALSHA of write.lua: the keys of one view and their packed records, concatenated. */
    static final class Chunk {
        final List<byte[]> keys;
        final byte[] blob;
        final long expireAtMs;
        final int recordBytes;

        Chunk(List<byte[]> keys, byte[] blob, long expireAtMs, int recordBytes) {
            this.keys = keys;
            this.blob = blob;
            this.expireAtMs = expireAtMs;
            this.recordBytes = recordBytes;
        }
    }

    RedisStore(String url, String namespace, String writeScript, String dictScript) {
        this.uri = URI.create(url);
        this.namespace = namespace;
        this.writeScript = writeScript.getBytes(StandardCharsets.UTF_8);
        this.writeSha = sha1Hex(this.writeScript).getBytes(StandardCharsets.US_ASCII);
        this.dictScript = dictScript.getBytes(StandardCharsets.UTF_8);
    }

    private Jedis client() {
        if (jedis == null) {
            jedis = new Jedis(uri, 5000);
        }
        return jedis;
    }

    /** Drop the connection (after an error); the next call opens a new one. Keeps the id cache. */
    void reset() {
        if (jedis != null) {
            try {
                jedis.close();
            } catch (RuntimeException e) {
                // the connection is already broken; nothing to release
            }
            jedis = null;
        }
    }

    static String sha1Hex(byte[] script) {
        try {
            return HexFormat.of().formatHex(MessageDigest.getInstance("SHA-1").digest(script));
        } catch (NoSuchAlgorithmException e) {
            throw new IllegalStateException("no SHA-1 in this JVM", e);
        }
    }

    byte[] key(String view, String entity) {
        return (namespace + ":{" + view + "}:" + entity).getBytes(StandardCharsets.UTF_8);
    }

    /** Make sure every value of {@code field} in {@code values} has an id (assigned atomically in Redis). */
    void assignIds(String field, Set<String> values) {
        Map<String, Integer> cache = ids.computeIfAbsent(field, f -> new HashMap<>());
        List<String> missing = new ArrayList<>();
        for (String v : values) {
            if (!cache.containsKey(v)) {
                missing.add(v);
            }
        }
        if (missing.isEmpty()) {
            return;
        }
        missing.sort(PyText::compare);
        String hash = namespace + ":dict:{" + field + "}";
        List<byte[]> keys = List.of(bytes(hash), bytes(hash + ":next"));
        List<byte[]> args = new ArrayList<>();
        for (String v : missing) {
            args.add(bytes(v));
        }
        List<?> got = (List<?>) client().eval(dictScript, keys, args);
        for (int i = 0; i < missing.size(); i++) {
            cache.put(missing.get(i), ((Number) got.get(i)).intValue());
        }
    }

    /** The dictionary id of {@code value}, after {@link #assignIds} was given it. */
    int id(String field, String value) {
        return ids.get(field).get(value);
    }

    /** Run the write chunks in one pipeline; returns each chunk's status string (write.lua's reply). */
    String[] write(List<Chunk> chunks) {
        try {
            return runWrites(chunks);
        } catch (JedisDataException e) {
            if (e.getMessage() == null || !e.getMessage().startsWith("NOSCRIPT")) {
                throw e;
            }
            client().scriptLoad(writeScript);  // a new or flushed Redis: load once, then run again
            return runWrites(chunks);
        }
    }

    private String[] runWrites(List<Chunk> chunks) {
        Pipeline p = client().pipelined();
        List<redis.clients.jedis.Response<Object>> replies = new ArrayList<>();
        for (Chunk c : chunks) {
            List<byte[]> args = List.of(bytes(Long.toString(c.expireAtMs)),
                bytes(Integer.toString(c.recordBytes)), c.blob);
            replies.add(p.evalsha(writeSha, c.keys, args));
        }
        p.sync();
        String[] out = new String[chunks.size()];
        for (int i = 0; i < out.length; i++) {
            out[i] = new String((byte[]) replies.get(i).get(), StandardCharsets.US_ASCII);
        }
        return out;
    }

    /** Record in the view's freshness log that the tier published up to {@code boundaryMs} (no rows). */
    void progress(String view, long writeTimeMs, long boundaryMs, long maxLen) {
        client().sendCommand(Protocol.Command.XADD, bytes(namespace + ":fresh:{" + view + "}"), bytes("MAXLEN"),
            bytes("~"), bytes(Long.toString(maxLen)), bytes("*"), bytes("w"), bytes(Long.toString(writeTimeMs)),
            bytes("n"), bytes("0"), bytes("r"), bytes("0"), bytes("lo"), bytes("0"), bytes("hi"),
            bytes(Long.toString(boundaryMs)), bytes("s"), bytes(""));
    }

    /** Pack one value (pipelines/store/codec.py, format 1) into {@code buf} at its position. */
    static void pack(ByteBuffer buf, long eventTimeMs, long writeTimeMs, long expireAtMs, long schemaHash,
                     byte[] version, float[] slots) {
        buf.order(ByteOrder.LITTLE_ENDIAN);
        buf.put((byte) 'H').put((byte) 'W').put((byte) 1).put((byte) version.length);
        buf.putInt(slots.length);
        buf.putLong(eventTimeMs).putLong(writeTimeMs).putLong(expireAtMs);
        buf.putInt((int) schemaHash).putInt(0);
        buf.put(version);
        for (int i = version.length; i < VERSION_BYTES; i++) {
            buf.put((byte) 0);
        }
        for (float f : slots) {
            buf.putFloat(f);
        }
    }

    static byte[] bytes(String s) {
        return s.getBytes(StandardCharsets.UTF_8);
    }

    @Override
    public void close() {
        reset();
    }
}
