package dev.headwater.flink.realtime;

import java.io.BufferedReader;
import java.io.IOException;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ObjectNode;

import org.apache.flink.types.Row;

/**
 * Drives {@link ViewCpuStats} without Flink, so tests check how the timed work is split across views
 * (tests/unit/pipelines/realtime/test_realtime_cost_stats.py).
 *
 * <p>Input: the program JSON on the first line, then one JSON line each:
 * <ul>
 *   <li>{@code {"added": {"group": G, "ns": N, "hits": [true, false, ...]}}}: an event's fold of N ns
 *       whose features' filters gave these hits (one per feature of group G), as the operator reports it;
 *   <li>{@code {"fired": {"group": G, "ns": N, "count": C}}}: a run of C fires of N ns;
 *   <li>an array: an event row of the program's columns, folded by each group's {@link Aggregator} and
 *       timed as {@link ViewOperator} times it ({@code System.nanoTime} around the add);
 *   <li>{@code {"clock": T}}: every entity of every group fired up to T, timed as one run per group;
 *   <li>{@code {"overhead": N}}: N back-to-back {@code System.nanoTime} pairs, timed: prints
 *       {@code {"overhead_ns": ns a pair}} (what timing each event costs on this machine).
 * </ul>
 * Output (after an overhead line's answer): per group one line, its stats document ({@link
 * ViewCpuStats#document}) plus {@code total_s} (the seconds timed in all); when the program has a
 * {@code reported_dir}, each group's file is written there too, as the operator writes it.
 */
public final class ViewCpuStatsCheck {
    private ViewCpuStatsCheck() {}

    public static void main(String[] args) throws IOException {
        ObjectMapper json = new ObjectMapper();
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        Program program = Program.parse(in.readLine());
        List<Aggregator> aggs = new ArrayList<>();
        List<ViewCpuStats> stats = new ArrayList<>();
        List<Map<String, KeyState>> states = new ArrayList<>();
        long start = System.currentTimeMillis();
        for (Program.Group g : program.groups) {
            aggs.add(new Aggregator(g));
            stats.add(new ViewCpuStats(g, program.source, 0, program.reportedDir == null ? null
                : ViewCpuStats.fileFor(program.reportedDir, program.source, g, 0), start));
            states.add(new HashMap<>());
        }
        Aggregator.Emitter drop = (view, eventTime, validTo, slots, dict) -> { };
        StringBuilder out = new StringBuilder();
        for (String line = in.readLine(); line != null; line = in.readLine()) {
            JsonNode n = json.readTree(line);
            if (n.has("added")) {
                JsonNode a = n.get("added");
                JsonNode h = a.get("hits");
                boolean[] hits = new boolean[h.size()];
                for (int i = 0; i < hits.length; i++) {
                    hits[i] = h.get(i).asBoolean();
                }
                stats.get(a.get("group").asInt()).added(a.get("ns").asLong(), hits);
            } else if (n.has("fired")) {
                JsonNode f = n.get("fired");
                stats.get(f.get("group").asInt()).fired(f.get("ns").asLong(), f.get("count").asInt());
            } else if (n.has("clock")) {
                long clock = n.get("clock").asLong();
                for (int g = 0; g < aggs.size(); g++) {
                    Aggregator agg = aggs.get(g);
                    long started = System.nanoTime();
                    for (KeyState st : states.get(g).values()) {
                        agg.fire(st, agg.sliceOf(clock), drop);
                    }
                    stats.get(g).fired(System.nanoTime() - started, states.get(g).size());
                }
            } else if (n.has("overhead")) {
                long count = n.get("overhead").asLong();
                long sink = 0;
                long started = System.nanoTime();
                for (long i = 0; i < count; i++) {
                    long a = System.nanoTime();
                    sink += System.nanoTime() - a;
                }
                double each = (System.nanoTime() - started) / (double) count;
                out.append("{\"overhead_ns\":").append(each).append(",\"sink\":").append(sink > -1).append("}\n");
            } else {
                Row r = AggregateCheck.row(program, n);
                long t = (Long) r.getField(program.eventTimeColumn);
                String id = program.eventIdColumn < 0 ? null : (String) r.getField(program.eventIdColumn);
                for (Program.Group g : program.groups) {
                    long started = System.nanoTime();
                    Aggregator agg = aggs.get(g.index);
                    Object key = r.getField(g.keyColumn);
                    if (key == null) {
                        continue;
                    }
                    KeyState st = states.get(g.index).computeIfAbsent(key.toString(), k -> agg.newState());
                    agg.add(st, r, t, id, drop);
                    stats.get(g.index).added(System.nanoTime() - started, agg.hits());
                }
            }
        }
        long now = System.currentTimeMillis();
        for (ViewCpuStats s : stats) {
            s.write(now);
            ObjectNode doc = s.document(now);
            doc.put("total_s", s.totalSeconds());
            out.append(json.writeValueAsString(doc)).append('\n');
        }
        System.out.print(out);
    }
}
