package dev.headwater.flink.realtime;

import java.net.URI;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.charset.StandardCharsets;
import java.security.MessageDigest;
import java.security.NoSuchAlgorithmException;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.HashSet;
import java.util.HexFormat;
import java.util.List;
import java.util.Map;
import java.util.Set;

import org.apache.commons.pool2.impl.GenericObjectPoolConfig;

import redis.clients.jedis.AbstractPipeline;
import redis.clients.jedis.HostAndPort;
import redis.clients.jedis.Jedis;
import redis.clients.jedis.JedisCluster;
import redis.clients.jedis.Protocol;
import redis.clients.jedis.exceptions.JedisClusterException;
import redis.clients.jedis.exceptions.JedisClusterOperationException;
import redis.clients.jedis.exceptions.JedisConnectionException;
import redis.clients.jedis.exceptions.JedisDataException;
import redis.clients.jedis.exceptions.JedisRedirectionException;

/**
 * The online store as the JVM writes it: the packed value of pipelines/store/codec.py (format 1,
 * 72-byte header + float32 slots) written through pipelines/store/write.lua, and dictionary ids from
 * the same Lua as pipelines/windows/vector.py. Both scripts arrive as text from Python, so every tier
 * runs the same bytes. One connection, pipelined; not thread-safe (one per sink subtask).
 *
 * <p>{@code redis-cluster://HOST:PORT} (any node) opens a {@link JedisCluster} instead, as
 * pipelines/store/connect.py does in Python. Every key of one view, its freshness log and each
 * dictionary share a hash tag, so every script call touches one slot: a write chunk goes to one node
 * and the pipeline groups the chunks by node. A failover or a slot move surfaces as a
 * {@link #retriable} error; the writer drops the client and retries with a fresh view of the cluster.
 */
final class RedisStore implements AutoCloseable {
    static final int HEADER_BYTES = 72;
    static final int VERSION_BYTES = 32;
    /** The URL scheme of a Redis Cluster (pipelines/store/connect.py CLUSTER_SCHEME). */
    static final String CLUSTER_SCHEME = "redis-cluster";
    private static final int TIMEOUT_MS = 5000;
    private static final int CLUSTER_ATTEMPTS = 5;

    private final URI uri;
    private final String namespace;
    private final byte[] writeScript;
    private final byte[] writeSha;
    private final byte[] dictScript;
    /** Values of one field whose ids are cached (vector.py CACHE_BOUND); past it the cache starts over. */
    static final int CACHE_BOUND = 1 << 16;
    private final Map<String, Map<String, Integer>> ids = new HashMap<>();
    private final boolean cluster;
    private Jedis jedis;
    private JedisCluster jedisCluster;
    /** The nodes a new cluster client starts from: the URL's, then every node seen (the URL's may be down). */
    private final Set<HostAndPort> seeds = new HashSet<>();

    /**
     * One EVALSHA of write.lua: the keys of one view and their packed records, concatenated; and when a
     * record holds over an interval ({@link Update#validToMs}), every record's valid-to, little-endian
     * int64s (write.lua's ARGV[5]; null: none does, the call is as the Python tiers make it).
     */
    static final class Chunk {
        final List<byte[]> keys;
        final byte[] blob;
        final long expireAtMs;
        final int recordBytes;
        final byte[] validTo;

        Chunk(List<byte[]> keys, byte[] blob, long expireAtMs, int recordBytes, byte[] validTo) {
            this.keys = keys;
            this.blob = blob;
            this.expireAtMs = expireAtMs;
            this.recordBytes = recordBytes;
            this.validTo = validTo;
        }
    }

    RedisStore(String url, String namespace, String writeScript, String dictScript) {
        this.uri = URI.create(url);
        this.cluster = CLUSTER_SCHEME.equals(uri.getScheme());
        if (cluster && (uri.getHost() == null || uri.getPort() < 0)) {
            throw new IllegalArgumentException("online store URL '" + url
                + "': expected redis-cluster://HOST:PORT (any node of the cluster)");
        }
        if (cluster) {
            seeds.add(new HostAndPort(uri.getHost(), uri.getPort()));
        }
        this.namespace = namespace;
        this.writeScript = writeScript.getBytes(StandardCharsets.UTF_8);
        this.writeSha = sha1Hex(this.writeScript).getBytes(StandardCharsets.US_ASCII);
        this.dictScript = dictScript.getBytes(StandardCharsets.UTF_8);
    }

    private Jedis client() {
        if (jedis == null) {
            jedis = new Jedis(uri, TIMEOUT_MS);
        }
        return jedis;
    }

    private JedisCluster clusterClient() {
        if (jedisCluster == null) {
            jedisCluster = new JedisCluster(new HashSet<>(seeds), TIMEOUT_MS, TIMEOUT_MS, CLUSTER_ATTEMPTS,
                new GenericObjectPoolConfig<>());
        }
        return jedisCluster;
    }

    boolean isCluster() {
        return cluster;
    }

    /**
     * Whether {@code e} is an outage the writer should wait out (retry with a new client): a lost
     * connection, and on a cluster a failover in progress (CLUSTERDOWN, TRYAGAIN, MOVED/ASK, a
     * replica still read-only, attempts exhausted). Anything else is a bug to fail on.
     */
    static boolean retriable(RuntimeException e) {
        if (e instanceof JedisConnectionException || e instanceof JedisClusterOperationException
            || e instanceof JedisRedirectionException || e instanceof JedisClusterException) {
            return true;
        }
        if (e instanceof JedisDataException && e.getMessage() != null) {
            String m = e.getMessage();
            return m.startsWith("CLUSTERDOWN") || m.startsWith("TRYAGAIN") || m.startsWith("LOADING")
                || m.startsWith("READONLY") || m.startsWith("MASTERDOWN");
        }
        return false;
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
        if (jedisCluster != null) {
            try {
                for (String node : jedisCluster.getClusterNodes().keySet()) {
                    seeds.add(HostAndPort.from(node));
                }
                jedisCluster.close();  // the next client reads the slot map afresh (after a failover)
            } catch (RuntimeException e) {
                // nodes already gone; nothing to release
            }
            jedisCluster = null;
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
        if (cache.size() > CACHE_BOUND) {
            cache.clear();  // bounded memory at any cardinality: the ids stay in Redis
        }
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
        List<byte[]> keys = List.of(bytes(hash), bytes(hash + ":overflow"));  // vector.py assign_script
        List<byte[]> args = new ArrayList<>();
        for (String v : missing) {
            args.add(bytes(v));
        }
        List<?> got = (List<?>) (cluster ? clusterClient().eval(dictScript, keys, args)
            : client().eval(dictScript, keys, args));
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
            loadWriteScript(chunks);  // a new or flushed Redis: load once, then run again
            return runWrites(chunks);
        }
    }

    /** Load write.lua where {@code chunks} go: the one node, or on a cluster each chunk's node. */
    private void loadWriteScript(List<Chunk> chunks) {
        if (!cluster) {
            client().scriptLoad(writeScript);
            return;
        }
        // a promoted replica has no script cache of its own: load it on every node this flush writes to
        Set<String> views = new HashSet<>();
        for (Chunk c : chunks) {
            byte[] sample = c.keys.get(0);
            if (views.add(new String(sample, StandardCharsets.UTF_8))) {
                clusterClient().scriptLoad(writeScript, sample);
            }
        }
    }

    private String[] runWrites(List<Chunk> chunks) {
        List<redis.clients.jedis.Response<Object>> replies = new ArrayList<>();
        try (AbstractPipeline p = cluster ? clusterClient().pipelined() : client().pipelined()) {
            for (Chunk c : chunks) {
                List<byte[]> args = c.validTo == null
                    ? List.of(bytes(Long.toString(c.expireAtMs)), bytes(Integer.toString(c.recordBytes)), c.blob)
                    : List.of(bytes(Long.toString(c.expireAtMs)), bytes(Integer.toString(c.recordBytes)), c.blob,
                        new byte[0], c.validTo);  // no fence (ARGV[4] empty)
                replies.add(p.evalsha(writeSha, c.keys, args));
            }
            p.sync();
        }
        String[] out = new String[chunks.size()];
        for (int i = 0; i < out.length; i++) {
            Object reply;
            try {
                reply = replies.get(i).get();
            } catch (IllegalStateException e) {
                // a cluster pipeline whose node went away leaves that node's replies unset (its sync
                // does not throw): the same outage as a broken connection, retried by the writer
                throw new JedisConnectionException("a Redis Cluster node did not answer the write pipeline", e);
            }
            out[i] = new String((byte[]) reply, StandardCharsets.US_ASCII);
        }
        return out;
    }

    /** Record in the view's freshness log that the tier published up to {@code boundaryMs} (no rows). */
    void progress(String view, long writeTimeMs, long boundaryMs, long maxLen) {
        byte[] key = bytes(namespace + ":fresh:{" + view + "}");
        byte[][] args = {key, bytes("MAXLEN"), bytes("~"), bytes(Long.toString(maxLen)), bytes("*"), bytes("w"),
            bytes(Long.toString(writeTimeMs)), bytes("n"), bytes("0"), bytes("r"), bytes("0"), bytes("lo"),
            bytes("0"), bytes("hi"), bytes(Long.toString(boundaryMs)), bytes("s"), bytes("")};
        if (cluster) {
            clusterClient().sendCommand(key, Protocol.Command.XADD, args);
        } else {
            client().sendCommand(Protocol.Command.XADD, args);
        }
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
