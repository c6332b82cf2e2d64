package dev.headwater.flink.realtime;

import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.AtomicMoveNotSupportedException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardCopyOption;

import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ObjectNode;

/**
 * The time one {@link ViewOperator} subtask spends on each view of its group, for {@code headwater
 * costs} (cli/costs.py {@code tier_reported}: the realtime job's {@code reported} CPU).
 *
 * <p>The operator times each event's fold ({@link #added}: reading the entity's state, {@link
 * Aggregator#add}, scheduling, the values it emits) and each run of fires ({@link #fired}) with
 * {@code System.nanoTime} (wall time: a pair of calls took 80-100 ns on this VM at load 9, against 3-20 us
 * of work an event, so under 3 %; the thread's CPU clock took about 1 us a pair, ten times dearer). One call's time is split across the group's
 * views by their feature operations: an event's by the features of each view whose filter it passes
 * (none passes: by every feature, they were all tested), a fire's by each view's feature count (a
 * fire moves every feature's accumulators and recomputes every view). So the views' seconds add up to
 * the operator's timed work; the shared work outside it (Kafka, decode, SQL rules, the Redis sink's
 * thread) is in no view.
 *
 * <p>Every {@link #WRITE_EVERY_MS} the subtask writes {@code <reported_dir>/stats-<source>-<group
 * index>-<subtask>.json} (written to a temporary file, then renamed), in the nearline workers' format so
 * one reader serves both: {@code tasks[0].fold_s} per view (seconds since {@code fold_since}, epoch
 * seconds), plus {@code events} (the rows the operator read) and {@code hits} per view, {@code
 * written} (epoch seconds, the end of the window the figures cover), source, group and subtask.
 */
final class ViewCpuStats {
    static final long WRITE_EVERY_MS = 5_000;
    private static final ObjectMapper JSON = new ObjectMapper();

    private final Program.Group group;
    /** Per view, its share of a fire: its feature count over the group's. */
    private final double[] fireShare;
    /** Per view, the nanoseconds attributed to it. */
    private final double[] nanos;
    /** Per view, the events that passed one of its features' filters. */
    private final long[] hits;
    private long events;
    private long fires;
    private long addNanos;
    private long fireNanos;
    private final long sinceMs;
    private final Path file;
    private final String source;
    private final int subtask;
    private long nextWriteMs;

    /**
     * @param file where to write (null: counted, never written)
     * @param sinceMs the start of the window the counters cover (epoch ms)
     */
    ViewCpuStats(Program.Group group, String source, int subtask, Path file, long sinceMs) {
        this.group = group;
        this.source = source;
        this.subtask = subtask;
        this.file = file;
        this.sinceMs = sinceMs;
        this.nextWriteMs = sinceMs + WRITE_EVERY_MS;
        int n = group.views.size();
        nanos = new double[n];
        hits = new long[n];
        fireShare = new double[n];
        double all = group.features.size();
        for (Program.View v : group.views) {
            fireShare[v.index] = v.features.size() / all;
        }
    }

    /** The stats file of a subtask: {@code stats-<source>-<group index>-<subtask>.json} in {@code dir}. */
    static Path fileFor(String dir, String source, Program.Group group, int subtask) {
        return Path.of(dir).resolve("stats-" + source + "-" + group.index + "-" + subtask + ".json");
    }

    /**
     * One event's fold took {@code ns}: split it across the views by the features it passed
     * ({@code featureHits}, per feature of the group: {@link Aggregator#hits()} after the add).
     */
    void added(long ns, boolean[] featureHits) {
        events++;
        addNanos += ns;
        int total = 0;
        for (int i = 0; i < featureHits.length; i++) {
            if (featureHits[i]) {
                total++;
            }
        }
        if (total == 0) {  // no feature kept it: every filter was tested, split as a fire is
            for (int v = 0; v < nanos.length; v++) {
                nanos[v] += ns * fireShare[v];
            }
            return;
        }
        for (Program.View v : group.views) {
            int mine = 0;
            for (int j = 0; j < v.features.size(); j++) {
                if (featureHits[v.firstFeature + j]) {
                    mine++;
                }
            }
            if (mine > 0) {
                hits[v.index]++;
                nanos[v.index] += (double) ns * mine / total;
            }
        }
    }

    /** A run of {@code count} fires took {@code ns}: split it by the views' feature counts. */
    void fired(long ns, int count) {
        fires += count;
        fireNanos += ns;
        for (int v = 0; v < nanos.length; v++) {
            nanos[v] += ns * fireShare[v];
        }
    }

    /** Per view (group order), the seconds attributed to it so far. */
    double[] seconds() {
        double[] out = new double[nanos.length];
        for (int v = 0; v < out.length; v++) {
            out[v] = nanos[v] / 1e9;
        }
        return out;
    }

    /** The seconds timed in all (adds and fires): what the views' seconds add up to. */
    double totalSeconds() {
        return (addNanos + fireNanos) / 1e9;
    }

    /** The stats document as of {@code nowMs} (epoch ms). */
    ObjectNode document(long nowMs) {
        ObjectNode doc = JSON.createObjectNode();
        doc.put("source", source);
        doc.put("group", group.id);
        doc.put("subtask", subtask);
        doc.put("written", nowMs / 1000.0);
        ObjectNode task = doc.putArray("tasks").addObject();
        ObjectNode fold = task.putObject("fold_s");
        ObjectNode hit = task.putObject("hits");
        for (Program.View v : group.views) {
            fold.put(v.name, nanos[v.index] / 1e9);
            hit.put(v.name, hits[v.index]);
        }
        task.put("fold_since", sinceMs / 1000.0);
        task.put("events", events);
        task.put("fires", fires);
        task.put("add_s", addNanos / 1e9);
        task.put("fire_s", fireNanos / 1e9);
        return doc;
    }

    /** Whether the file is due: {@link #WRITE_EVERY_MS} has passed since the last write (no file: never). */
    boolean due(long nowMs) {
        return file != null && nowMs >= nextWriteMs;
    }

    /** Write the file now: a temporary file beside it, then renamed over it (a reader never sees half). */
    void write(long nowMs) throws IOException {
        if (file == null) {
            return;
        }
        nextWriteMs = nowMs + WRITE_EVERY_MS;
        Files.createDirectories(file.getParent());
        Path tmp = file.resolveSibling(file.getFileName() + ".tmp");
        Files.write(tmp, JSON.writeValueAsString(document(nowMs)).getBytes(StandardCharsets.UTF_8));
        try {
            Files.move(tmp, file, StandardCopyOption.REPLACE_EXISTING, StandardCopyOption.ATOMIC_MOVE);
        } catch (AtomicMoveNotSupportedException e) {
            Files.move(tmp, file, StandardCopyOption.REPLACE_EXISTING);
        }
    }
}
