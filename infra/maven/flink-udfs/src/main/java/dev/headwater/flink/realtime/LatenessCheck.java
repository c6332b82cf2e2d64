package dev.headwater.flink.realtime;

import java.io.BufferedReader;
import java.io.IOException;
import java.io.InputStreamReader;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ObjectNode;

/**
 * Drives {@link Lateness} over records given on stdin, without Flink, so tests compare the realtime
 * tier's {@code late} verdicts with the nearline rule on the same records, across restores.
 *
 * <p>Input: a first line {@code {"source", "event_time_field", "out_of_orderness_ms",
 * "allowed_lateness_ms", "replay_tag", "subtasks"}}, then one line per record {@code {"s": subtask,
 * "p": partition, "t": event time ms, "now": wall clock ms, "replay": false}}, or {@code {"restart":
 * {"subtasks": N, "replay_tag": TAG}}}: every subtask's checkpointed entries ({@link Lateness#entries})
 * are restored into each of N new subtasks, as {@link LateCheck}'s union state is (a partition may be
 * read by another subtask after the restore). Output: one line per record, {@code {"late": DETAIL}}
 * (null when accepted).
 */
public final class LatenessCheck {
    private LatenessCheck() {}

    public static void main(String[] args) throws IOException {
        ObjectMapper json = new ObjectMapper();
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        PrintStream out = new PrintStream(System.out, false, StandardCharsets.UTF_8);
        JsonNode cfg = json.readTree(in.readLine());
        List<Lateness> subtasks = start(cfg, cfg.path("subtasks").asInt(1), text(cfg.get("replay_tag")));
        for (String line = in.readLine(); line != null; line = in.readLine()) {
            JsonNode n = json.readTree(line);
            if (n.has("restart")) {
                JsonNode r = n.get("restart");
                List<Lateness> next = start(cfg, r.path("subtasks").asInt(1), text(r.get("replay_tag")));
                for (Lateness old : subtasks) {
                    for (Object[] e : old.entries()) {
                        for (Lateness l : next) {
                            l.restore((String) e[0], (Integer) e[1], (Long) e[2]);
                        }
                    }
                }
                subtasks = next;
                continue;
            }
            Lateness l = subtasks.get(n.path("s").asInt(0));
            int p = n.get("p").asInt();
            long t = n.get("t").asLong();
            long now = n.get("now").asLong();
            String detail = n.path("replay").asBoolean(false) ? l.judgeReplay(p, t, now) : l.judge(p, t, now);
            ObjectNode o = json.createObjectNode();
            o.put("late", detail);
            out.println(json.writeValueAsString(o));
        }
        out.flush();
    }

    private static String text(JsonNode n) {
        return n == null || n.isNull() ? null : n.asText();
    }

    private static List<Lateness> start(JsonNode cfg, int n, String replayTag) {
        List<Lateness> out = new ArrayList<>();
        for (int i = 0; i < n; i++) {
            out.add(new Lateness(cfg.get("source").asText(), cfg.get("event_time_field").asText(),
                cfg.get("out_of_orderness_ms").asLong(), cfg.get("allowed_lateness_ms").asLong(), replayTag));
        }
        return out;
    }
}
