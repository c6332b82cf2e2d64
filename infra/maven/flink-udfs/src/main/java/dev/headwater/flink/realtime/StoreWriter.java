package dev.headwater.flink.realtime;

import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.LinkedHashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;

import org.apache.flink.api.common.operators.ProcessingTimeService;
import org.apache.flink.api.connector.sink2.SinkWriter;
import org.apache.flink.api.connector.sink2.WriterInitContext;
import org.apache.flink.metrics.Counter;
import org.apache.flink.metrics.MetricGroup;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

import redis.clients.jedis.exceptions.JedisException;

/**
 * Buffers the values of one group's views and writes them in batches: every {@code flush_ms}, when
 * {@code max_pending_rows} are waiting, and before every checkpoint barrier.
 *
 * <p>Steps of a flush: 1. per view, the newest value of each entity (a later value of an entity
 * replaces a buffered one: under catch-up most intermediate values are never written); 2. text slots
 * get their dictionary ids; 3. values are packed and written by write.lua in chunks, all chunks in one
 * pipeline; 4. a view whose progress mark is ahead of every row written gets a progress entry in its
 * freshness log. A broken connection (on a Redis Cluster also a failover in progress,
 * {@link RedisStore#retriable}) is retried with backoff until Redis answers (the job waits; nothing
 * is dropped, and the retried writes are idempotent).
 */
final class StoreWriter implements SinkWriter<Update>, ProcessingTimeService.ProcessingTimeCallback {
    private static final Logger LOG = LoggerFactory.getLogger(StoreWriter.class);
    private static final long MAX_BACKOFF_MS = 5000;

    private final Program program;
    private final Program.Group group;
    private final RedisStore store;
    private final ProcessingTimeService time;
    private final List<LinkedHashMap<String, Update>> pending = new ArrayList<>();
    private final long[] progress;
    private final long[] progressWritten;
    private final Counter[] rowsWritten;
    private final long[] freshnessMs;
    private int pendingRows;

    StoreWriter(Program program, int groupIndex, WriterInitContext context) {
        this(program, groupIndex, context.getProcessingTimeService(), context.metricGroup());
    }

    StoreWriter(Program program, int groupIndex, ProcessingTimeService time, MetricGroup metrics) {
        this.program = program;
        this.group = program.groups.get(groupIndex);
        this.time = time;
        Program.Store cfg = program.store;
        this.store = new RedisStore(cfg.url, program.namespace, cfg.writeScript, cfg.dictScript);
        int n = group.views.size();
        progress = new long[n];
        progressWritten = new long[n];
        rowsWritten = new Counter[n];
        freshnessMs = new long[n];
        for (int v = 0; v < n; v++) {
            pending.add(new LinkedHashMap<>());
            progress[v] = Long.MIN_VALUE;
            progressWritten[v] = Long.MIN_VALUE;
            if (metrics != null) {
                MetricGroup m = metrics.addGroup("view", group.views.get(v).name);
                rowsWritten[v] = m.counter("hw_rows_written");
                int view = v;
                m.gauge("hw_freshness_ms", () -> freshnessMs[view]);
            }
        }
        if (time != null) {
            time.registerTimer(time.getCurrentProcessingTime() + cfg.flushMs, this);
        }
    }

    @Override
    public void write(Update u, Context context) {
        if (u.entity == null) {
            progress[u.view] = Math.max(progress[u.view], u.eventTimeMs);
            return;
        }
        if (pending.get(u.view).put(u.entity, u) == null) {
            pendingRows++;
        }
        if (pendingRows >= program.store.maxPendingRows) {
            flushAll();
        }
    }

    @Override
    public void flush(boolean endOfInput) {
        flushAll();
    }

    @Override
    public void onProcessingTime(long now) {
        flushAll();
        time.registerTimer(now + program.store.flushMs, this);
    }

    /** Write everything buffered, retrying a lost connection until it is back. */
    void flushAll() {
        boolean progressDue = false;
        for (int v = 0; v < progress.length; v++) {
            progressDue |= progress[v] > progressWritten[v];
        }
        if (pendingRows == 0 && !progressDue) {
            return;
        }
        long backoff = 100;
        while (true) {
            try {
                writeOnce();
                return;
            } catch (JedisException e) {
                if (!RedisStore.retriable(e)) {
                    throw e;
                }
                LOG.warn("online store at {} unreachable ({}); retrying in {} ms", program.store.url,
                    e.getMessage(), backoff);
                store.reset();
                try {
                    Thread.sleep(backoff);
                } catch (InterruptedException ie) {
                    Thread.currentThread().interrupt();
                    throw new IllegalStateException("interrupted while waiting for the online store", ie);
                }
                backoff = Math.min(MAX_BACKOFF_MS, backoff * 2);
            }
        }
    }

    private void writeOnce() {
        long now = System.currentTimeMillis();
        for (int v = 0; v < pending.size(); v++) {
            Map<String, Update> rows = pending.get(v);
            Program.View view = group.views.get(v);
            long hi = Long.MIN_VALUE;
            if (!rows.isEmpty()) {
                List<Update> batch = new ArrayList<>(rows.values());
                fillDictionaryIds(view, batch);  // Step 2
                long written = 0;
                for (String status : store.write(chunks(view, batch, now))) {  // Step 3
                    written += status.chars().filter(ch -> ch == '1').count();
                }
                for (Update u : batch) {
                    hi = Math.max(hi, u.eventTimeMs);
                }
                if (rowsWritten[v] != null) {
                    rowsWritten[v].inc(written);
                }
                freshnessMs[v] = now - hi;
            }
            if (progress[v] > Math.max(hi, progressWritten[v])) {  // Step 4
                store.progress(view.name, now, progress[v], program.store.freshnessMaxLen);
            }
            progressWritten[v] = Math.max(progressWritten[v], Math.max(progress[v], hi));
        }
        for (Map<String, Update> rows : pending) {
            rows.clear();
        }
        pendingRows = 0;
    }

    private void fillDictionaryIds(Program.View view, List<Update> batch) {
        Map<String, Set<String>> wanted = new LinkedHashMap<>();
        for (Update u : batch) {
            for (int i = 0; i < view.dim; i++) {
                if (view.dictFields[i] != null && u.dict[i] != null) {
                    wanted.computeIfAbsent(view.dictFields[i], f -> new LinkedHashSet<>()).add(u.dict[i]);
                }
            }
        }
        wanted.forEach(store::assignIds);
        for (Update u : batch) {
            for (int i = 0; i < view.dim; i++) {
                if (view.dictFields[i] != null && u.dict[i] != null) {
                    u.slots[i] = store.id(view.dictFields[i], u.dict[i]);
                }
            }
        }
    }

    private List<RedisStore.Chunk> chunks(Program.View view, List<Update> batch, long now) {
        int size = RedisStore.HEADER_BYTES + 4 * view.dim;
        long expireAt = view.ttlMs > 0 ? now + view.ttlMs : 0;
        int step = program.store.chunkRows;
        byte[] version = view.version.getBytes(StandardCharsets.US_ASCII);
        List<RedisStore.Chunk> out = new ArrayList<>();
        for (int start = 0; start < batch.size(); start += step) {
            int end = Math.min(batch.size(), start + step);
            ByteBuffer buf = ByteBuffer.allocate(size * (end - start));
            List<byte[]> keys = new ArrayList<>(end - start);
            boolean interval = false;
            for (Update u : batch.subList(start, end)) {
                keys.add(store.key(view.name, u.entity));
                RedisStore.pack(buf, u.eventTimeMs, now, expireAt, view.schemaHash, version, u.slots);
                interval |= u.validToMs > u.eventTimeMs;
            }
            byte[] validTo = null;
            if (interval) {  // a value that holds over an interval: write.lua may date it at the stored time
                ByteBuffer v = ByteBuffer.allocate(8 * (end - start)).order(ByteOrder.LITTLE_ENDIAN);
                for (Update u : batch.subList(start, end)) {
                    v.putLong(Math.max(u.validToMs, u.eventTimeMs));
                }
                validTo = v.array();
            }
            out.add(new RedisStore.Chunk(keys, buf.array(), expireAt, size, validTo));
        }
        return out;
    }

    @Override
    public void close() {
        store.close();
    }
}
