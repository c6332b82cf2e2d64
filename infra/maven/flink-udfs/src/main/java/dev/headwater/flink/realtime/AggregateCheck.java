package dev.headwater.flink.realtime;

import java.io.BufferedReader;
import java.io.IOException;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.util.HashMap;
import java.util.Map;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ArrayNode;
import com.fasterxml.jackson.databind.node.ObjectNode;

import org.apache.flink.api.common.typeutils.TypeSerializer;
import org.apache.flink.api.common.typeutils.TypeSerializerSchemaCompatibility;
import org.apache.flink.api.common.typeutils.TypeSerializerSnapshot;
import org.apache.flink.core.memory.DataInputDeserializer;
import org.apache.flink.core.memory.DataOutputSerializer;
import org.apache.flink.types.Row;

/**
 * Drives {@link Aggregator} over events given on stdin, without Flink, and prints every value it emits,
 * so tests compare the JVM aggregation with the Python reference (pipelines/windows/reference.py) on the
 * same events.
 *
 * <p>Input: the program JSON on the first line, then one line per event, a JSON array of the program's
 * columns, or {@code {"clock": T}} to move the clock. The clock is the greatest event time seen (as in
 * {@link ViewOperator} without the wall-clock cap); after each line every entity whose next change
 * boundary the clock has passed is fired, entity by entity in order of that boundary.
 * A line {@code {"restart": PROGRAM}} stands for a job restored from a checkpoint into a job compiled
 * from another plan: every entity's state goes through the checkpoint path (the group's
 * {@link KeyStateSerializer} and its versioned snapshot, written and read back as bytes; the new
 * serializer's compatibility with the old snapshot; the old snapshot's restore serializer), groups are
 * matched by id (a group the new program lacks is dropped, as the job's ignore-unclaimed-state does),
 * and each state is adopted by the new group's {@link Aggregator}; the lines after it are rows of
 * the new program. The clock is kept (the restored job's clock comes back with the replayed events),
 * except when the new program has a seed: then it restarts, as the job's does, and the replay brings it back.
 * When the new program has a backfill seed ({@link Program#seed}), every restored entity of a group
 * with a backfilled view is refreshed (as {@link ViewOperator} does at open), and a line
 * {@code {"replay": ROW}} is a row read before the switch: folded into the backfilled views' features
 * only, with the replay's own de-duplication, skipped by a group without a backfilled view.
 * A line {@code {"watermark": W}} is the source's watermark reaching the operator: an entity whose
 * slices have all left its windows is dropped once W is past its boundary by more than the
 * out-of-orderness plus the allowed lateness ({@link Aggregator#disposable}); until then it stays, a
 * tombstone, as in the job. {@code {"checkpoint": true}} keeps a copy of every state (through the
 * serializer), and {@code {"kill": true}} stands for a kill -9 and a restore from that checkpoint: the
 * states go back to the copy and the clock restarts (the lines after it are the replay, from the
 * checkpoint's offsets); the values emitted in between stay emitted (the store has them). The restored
 * job catches up as {@link ViewOperator} does: a fire across a change boundary up to the killed job's
 * clock (the job uses the wall clock at the restore, never behind it) emits every view.
 * Output: one JSON object per emitted value: group, view, entity, event_time, valid_to (the value
 * holds at every boundary from event_time to it), slots (as text: NaN), dict; a line
 * {"restored": {group: entities}} per restart; then a last line {"outcomes": {...}}
 * with the count of each {@link Aggregator.Outcome}.
 */
public final class AggregateCheck {
    private AggregateCheck() {}

    public static void main(String[] args) throws IOException {
        ObjectMapper json = new ObjectMapper();
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        String text = in.readLine();
        Program program = Program.parse(text);
        Aggregator[] aggs = new Aggregator[program.groups.size()];
        java.util.List<Map<String, KeyState>> states = new java.util.ArrayList<>();
        for (Program.Group g : program.groups) {
            aggs[g.index] = new Aggregator(g);
            states.add(new HashMap<>());
        }
        StringBuilder out = new StringBuilder();
        Map<String, Integer> outcomes = new HashMap<>();
        long clock = Long.MIN_VALUE;
        long catchUpTo = KeyState.NONE;
        java.util.List<Map<String, KeyState>> saved = new java.util.ArrayList<>();
        for (Program.Group g : program.groups) {
            saved.add(new HashMap<>());  // a kill before any checkpoint: the job starts empty
        }
        java.util.List<Map<String, Map<Long, java.util.Set<Long>>>> replayIds = new java.util.ArrayList<>();
        for (String line = in.readLine(); line != null; line = in.readLine()) {
            JsonNode node = json.readTree(line);
            if (node.isObject() && node.has("restart")) {
                Program next = Program.parse(node.get("restart").asText());
                Aggregator[] nextAggs = new Aggregator[next.groups.size()];
                java.util.List<Map<String, KeyState>> nextStates = new java.util.ArrayList<>();
                ObjectNode restored = json.createObjectNode();
                for (Program.Group g : next.groups) {
                    nextAggs[g.index] = new Aggregator(g);
                    Map<String, KeyState> mine = new HashMap<>();
                    for (Program.Group old : program.groups) {
                        if (old.id.equals(g.id)) {
                            mine = checkpoint(aggs[old.index], states.get(old.index), nextAggs[g.index]);
                        }
                    }
                    restored.put(g.id, mine.size());
                    nextStates.add(mine);
                }
                program = next;
                aggs = nextAggs;
                states = nextStates;
                replayIds = new java.util.ArrayList<>();
                if (program.seed != null) {
                    clock = Long.MIN_VALUE;  // the job's clock restarts, and the replayed rows bring it back
                }
                for (Program.Group g : program.groups) {
                    replayIds.add(new HashMap<>());
                    if (ViewOperator.replayMask(program, g) != null) {
                        for (Map.Entry<String, KeyState> e : states.get(g.index).entrySet()) {
                            aggs[g.index].refresh(e.getValue(), emitter(json, out, g, e.getKey()));
                        }
                    }
                }
                out.append(json.writeValueAsString(json.createObjectNode().set("restored", restored)))
                    .append('\n');
                continue;
            }
            if (node.isObject() && node.has("watermark")) {
                long wm = node.get("watermark").asLong();
                for (Program.Group g : program.groups) {
                    long late = program.outOfOrdernessMs + program.allowedLatenessMs;
                    states.get(g.index).values().removeIf(st -> Aggregator.disposable(st, wm, late));
                }
                continue;
            }
            if (node.isObject() && (node.has("checkpoint") || node.has("kill"))) {
                boolean kill = node.has("kill");
                java.util.List<Map<String, KeyState>> copy = new java.util.ArrayList<>();
                for (Program.Group g : program.groups) {
                    copy.add(checkpoint(aggs[g.index], (kill ? saved : states).get(g.index), aggs[g.index]));
                }
                if (kill) {
                    states = copy;
                    catchUpTo = Math.max(catchUpTo, clock);
                    clock = Long.MIN_VALUE;  // the restored job's clock comes back with the replayed rows
                    for (Aggregator a : aggs) {
                        a.restart();  // a fresh operator: nothing published yet
                    }
                } else {
                    saved = copy;
                }
                continue;
            }
            boolean replay = node.isObject() && node.has("replay");
            if (replay) {
                node = node.get("replay");
            }
            if (node.isObject()) {
                clock = Math.max(clock, node.get("clock").asLong());
            } else {
                Row r = row(program, node);
                long t = (Long) r.getField(program.eventTimeColumn);
                String id = program.eventIdColumn < 0 ? null : (String) r.getField(program.eventIdColumn);
                clock = Math.max(clock, t);
                for (Program.Group g : program.groups) {
                    Object key = r.getField(g.keyColumn);
                    if (key == null) {
                        continue;
                    }
                    String entity = key.toString();
                    boolean[] mask = replay ? ViewOperator.replayMask(program, g) : null;
                    if (replay && mask == null) {
                        continue;
                    }
                    KeyState st = states.get(g.index).get(entity);
                    boolean fresh = st == null;
                    if (fresh) {
                        st = aggs[g.index].newState();
                    }
                    Map<Long, java.util.Set<Long>> seen = replay
                        ? replayIds.get(g.index).computeIfAbsent(entity, x -> new HashMap<>()) : null;
                    Aggregator.Outcome o = replay
                        ? aggs[g.index].add(st, r, t, id, mask,
                            (slice, h) -> seen.computeIfAbsent(slice, x -> new java.util.HashSet<>()).add(h),
                            emitter(json, out, g, entity))
                        : aggs[g.index].add(st, r, t, id, emitter(json, out, g, entity));
                    outcomes.merge(o.name(), 1, Integer::sum);
                    if (fresh && o == Aggregator.Outcome.ACCEPTED) {
                        states.get(g.index).put(entity, st);
                    }
                }
            }
            fireAll(json, out, program, aggs, states, clock, catchUpTo);
        }
        ObjectNode last = json.createObjectNode();
        ObjectNode counts = last.putObject("outcomes");
        outcomes.forEach(counts::put);
        out.append(json.writeValueAsString(last)).append('\n');
        System.out.print(out);
    }

    /**
     * One group's states through a checkpoint and a restore into {@code into}'s layout, as the job does:
     * written by the old serializer, its snapshot written and read back, compatibility resolved by the
     * new serializer's snapshot, read by the restored snapshot's serializer, then adopted.
     */
    private static Map<String, KeyState> checkpoint(Aggregator from, Map<String, KeyState> states, Aggregator into)
            throws IOException {
        KeyStateSerializer old = new KeyStateSerializer(from.layout);
        DataOutputSerializer snap = new DataOutputSerializer(256);
        TypeSerializerSnapshot.writeVersionedSnapshot(snap, old.snapshotConfiguration());
        Map<String, byte[]> bytes = new HashMap<>();
        for (Map.Entry<String, KeyState> e : states.entrySet()) {
            DataOutputSerializer o = new DataOutputSerializer(256);
            old.serialize(e.getValue(), o);
            bytes.put(e.getKey(), o.getCopyOfBuffer());
        }
        TypeSerializerSnapshot<KeyState> restored = TypeSerializerSnapshot.readVersionedSnapshot(
            new DataInputDeserializer(snap.getCopyOfBuffer()), AggregateCheck.class.getClassLoader());
        KeyStateSerializer current = new KeyStateSerializer(into.layout);
        TypeSerializerSchemaCompatibility<KeyState> compat =
            current.snapshotConfiguration().resolveSchemaCompatibility(restored);
        if (compat.isIncompatible() || compat.isCompatibleAsIs() != from.layout.equals(into.layout)) {
            throw new IllegalStateException("compatibility " + compat + " of [" + into.layout + "] with ["
                + from.layout + "]");
        }
        TypeSerializer<KeyState> reader = restored.restoreSerializer();
        Map<String, KeyState> out = new HashMap<>();
        for (Map.Entry<String, byte[]> e : bytes.entrySet()) {
            KeyState st = reader.deserialize(new DataInputDeserializer(e.getValue()));
            if (into.adopt(st)) {
                st.scheduled = KeyState.NONE;
            }
            DataOutputSerializer again = new DataOutputSerializer(256);
            current.serialize(st, again);  // the next checkpoint: refused unless adopted
            out.put(e.getKey(), st);
        }
        return out;
    }

    private static void fireAll(ObjectMapper json, StringBuilder out, Program program, Aggregator[] aggs,
                                java.util.List<Map<String, KeyState>> states, long clock, long catchUpTo) {
        if (clock == Long.MIN_VALUE) {
            return;
        }
        for (Program.Group g : program.groups) {
            Aggregator agg = aggs[g.index];
            long upTo = agg.sliceOf(clock);
            Map<String, KeyState> mine = states.get(g.index);
            while (true) {
                String due = null;
                long dueAt = Long.MAX_VALUE;
                for (Map.Entry<String, KeyState> e : mine.entrySet()) {
                    long c = agg.nextChange(e.getValue());
                    if (c != KeyState.NONE && c <= upTo && c < dueAt) {
                        dueAt = c;
                        due = e.getKey();
                    }
                }
                if (due == null) {
                    break;
                }
                agg.fire(mine.get(due), upTo, catchUpTo, emitter(json, out, g, due));  // drained: a tombstone stays
            }
        }
    }

    private static Aggregator.Emitter emitter(ObjectMapper json, StringBuilder out, Program.Group g, String entity) {
        return (view, eventTime, validTo, slots, dict) -> {
            ObjectNode o = json.createObjectNode();
            o.put("group", g.id);
            o.put("view", g.views.get(view).name);
            o.put("entity", entity);
            o.put("event_time", eventTime);
            o.put("valid_to", validTo);
            ArrayNode s = o.putArray("slots");
            for (float f : slots) {
                s.add(Float.toString(f));
            }
            ArrayNode d = o.putArray("dict");
            for (String x : dict) {
                d.add(x);
            }
            try {
                out.append(json.writeValueAsString(o)).append('\n');
            } catch (IOException e) {
                throw new IllegalStateException(e);
            }
        };
    }

    /** The event row of the program's columns from a JSON array of values (null: a null field). */
    static Row row(Program program, JsonNode values) {
        Row r = new Row(program.columns.size());
        for (int i = 0; i < program.columns.size(); i++) {
            JsonNode v = values.get(i);
            if (v == null || v.isNull()) {
                continue;
            }
            switch (program.columnTypes.get(i)) {
                case "BIGINT": r.setField(i, v.asLong()); break;
                case "INT": r.setField(i, v.asInt()); break;
                case "DOUBLE": r.setField(i, v.asDouble()); break;
                case "BOOLEAN": r.setField(i, v.asBoolean()); break;
                default: r.setField(i, v.asText());
            }
        }
        return r;
    }
}
