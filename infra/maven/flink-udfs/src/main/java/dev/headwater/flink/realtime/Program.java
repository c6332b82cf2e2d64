package dev.headwater.flink.realtime;

import java.io.IOException;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import org.apache.flink.types.Row;

/**
 * The realtime plan as the JVM operators read it: compiled by pipelines/realtime/program.py from the
 * registry's realtime plan, one program per source (the contract between Python and the JVM, format 3: per-view versions). Parsed once per
 * operator instance in {@code open()}; the operators carry the JSON text, not these objects.
 *
 * <p>The event rows the operators receive have the columns of {@link #columns}, in order: the event
 * id as text (only when the source declares an {@code event_id}), the event time (epoch ms), the
 * source's fields the features read, and one BOOLEAN per distinct filter (evaluated by Flink SQL, so
 * the registry's filter grammar has one implementation per engine).
 */
public final class Program {
    public static final int FORMAT = 3;

    /** The source the program reads (operator uids and metrics carry it). */
    public final String source;
    /** Column of the event id (text), -1 when the source has none: then events are not de-duplicated. */
    public final int eventIdColumn;
    public final int eventTimeColumn;
    public final List<String> columns;
    /** Flink SQL type of each column (STRING, BIGINT, INT, DOUBLE, BOOLEAN). */
    public final List<String> columnTypes;
    public final long outOfOrdernessMs;
    /** The source's allowed lateness: an event further behind its partition's horizon is late ({@link Lateness}). */
    public final long allowedLatenessMs;
    /** Name of the source's event-time field (the late letter's detail names it). */
    public final String eventTimeField;
    public final long idleAdvanceMs;
    public final String namespace;
    public final Store store;
    public final List<Group> groups;
    /** Uid of the source's Kafka scan (a backfill rewinds the scan under a new one), default hw-kafka-source. */
    public final String scanUid;
    /** The backfill of this start (pipelines/realtime/backfill.py), or null: no view is replayed. */
    public final Seed seed;
    /** Where each operator subtask writes its views' timed work ({@link ViewCpuStats}), or null: nowhere. */
    public final String reportedDir;

    /**
     * A backfill at restore: the Kafka source was rewound before the offsets the restored checkpoint
     * holds (the switch), and rows read before the switch feed only the views being backfilled.
     */
    public static final class Seed implements java.io.Serializable {
        private static final long serialVersionUID = 1L;
        /** Columns of the record's Kafka partition (INT) and offset (BIGINT) in the routed rows. */
        public final int partitionColumn;
        public final int offsetColumn;
        /** Per partition, the first offset the restored checkpoint had not read. */
        public final Map<Integer, Long> boundary;
        /** The views ({@code name@version}) the replay feeds: new or changed since the checkpoint. */
        public final Set<String> views;

        Seed(JsonNode n) {
            partitionColumn = n.path("partition_column").asInt();
            offsetColumn = n.path("offset_column").asInt();
            Map<Integer, Long> b = new HashMap<>();
            n.path("boundary").fields()
                .forEachRemaining(e -> b.put(Integer.parseInt(e.getKey()), e.getValue().asLong()));
            boundary = Map.copyOf(b);
            Set<String> v = new HashSet<>();
            n.path("views").forEach(x -> v.add(x.asText()));
            views = Set.copyOf(v);
        }

        /** Whether the row was read before the switch (its partition's restored offset): a replayed row. */
        public boolean replayed(Row r) {
            Object p = r.getField(partitionColumn);
            Object o = r.getField(offsetColumn);
            if (p == null || o == null) {
                return false;
            }
            Long b = boundary.get(((Number) p).intValue());
            return b != null && ((Number) o).longValue() < b;
        }
    }

    /** Where and how the sink writes: the online store's Lua scripts come from Python, byte for byte. */
    public static final class Store {
        public final String url;
        public final String writeScript;
        public final String dictScript;
        public final long flushMs;
        public final int chunkRows;
        public final int maxPendingRows;
        /** Cap of a view's freshness log (pipelines/store/layout.py FRESHNESS_MAXLEN, as write.lua). */
        public final long freshnessMaxLen;

        Store(JsonNode n) {
            url = text(n, "url");
            writeScript = text(n, "write_script");
            dictScript = text(n, "dict_script");
            flushMs = n.path("flush_ms").asLong(100);
            chunkRows = n.path("chunk_rows").asInt(256);
            maxPendingRows = n.path("max_pending_rows").asInt(4096);
            freshnessMaxLen = n.path("freshness_maxlen").asLong(20000);
        }
    }

    /** The views of one (join key, slide): one keyed operator and one sink. */
    public static final class Group {
        public final int index;
        public final String id;
        public final int keyColumn;
        public final long slideMs;
        public final List<View> views = new ArrayList<>();
        /** Every feature of every view of the group, in view order: the operator's state is indexed by it. */
        public final List<Feature> features = new ArrayList<>();
        public final long maxWindowMs;

        Group(int index, JsonNode n) {
            this.index = index;
            id = text(n, "id");
            keyColumn = n.path("key_column").asInt();
            slideMs = positive(n, "slide_ms");
            long longest = 0;
            for (JsonNode v : n.path("views")) {
                View view = new View(views.size(), features.size(), v);
                views.add(view);
                features.addAll(view.features);
            }
            for (Feature f : features) {
                if (f.windowMs % slideMs != 0) {
                    throw new IllegalArgumentException("group " + id + ": feature " + f.name + " window "
                        + f.windowMs + " ms is not a multiple of the slide " + slideMs + " ms");
                }
                longest = Math.max(longest, f.windowMs);
            }
            if (views.isEmpty()) {
                throw new IllegalArgumentException("group " + id + " has no views");
            }
            maxWindowMs = longest;
        }
    }

    /** One feature view: its store layout and its features' slots. */
    public static final class View {
        public final int index;
        public final String name;
        /** The view's version (what defines its values), stamped on every value it writes. */
        public final String version;
        public final long ttlMs;
        public final long schemaHash;
        public final int dim;
        /** Index of this view's first feature in {@link Group#features}. */
        public final int firstFeature;
        public final List<Feature> features = new ArrayList<>();
        /** Per slot: the dictionary field whose ids the slot holds, or null for a number. */
        public final String[] dictFields;

        View(int index, int firstFeature, JsonNode n) {
            this.index = index;
            this.firstFeature = firstFeature;
            name = text(n, "name");
            version = text(n, "version");
            ttlMs = n.path("ttl_ms").asLong();
            schemaHash = n.path("schema_hash").asLong();
            dim = n.path("dim").asInt();
            int offset = 0;
            for (JsonNode f : n.path("features")) {
                Feature feature = new Feature(f, offset);
                features.add(feature);
                offset += feature.slots;
            }
            if (offset != dim) {
                throw new IllegalArgumentException("view " + name + ": features take " + offset
                    + " slots, the layout has " + dim);
            }
            dictFields = new String[dim];
            for (Feature f : features) {
                if (f.dictField != null) {
                    int tops = "top_k".equals(f.agg) ? f.k : 1;
                    for (int i = 0; i < tops; i++) {
                        dictFields[f.slotOffset + i] = f.dictField;
                    }
                }
            }
        }
    }

    /** One aggregation: kind, window, filter and field columns; a ratio has two operands. */
    public static final class Feature {
        public final String name;
        public final String agg;
        public final long windowMs;
        /** Column of the filter's BOOLEAN, -1 for none. */
        public final int hit;
        /** Column of the field, -1 for none. */
        public final int field;
        public final int k;
        /** Field whose values are stored as dictionary ids (top_k, and last of a text field); else null. */
        public final String dictField;
        public final Feature numerator;
        public final Feature denominator;
        public final int slotOffset;
        public final int slots;

        Feature(JsonNode n, int slotOffset) {
            this.slotOffset = slotOffset;
            name = text(n, "name");
            agg = text(n, "agg");
            windowMs = n.path("window_ms").asLong();
            hit = n.path("hit").asInt(-1);
            field = n.path("field").asInt(-1);
            k = n.path("k").asInt(0);
            dictField = n.hasNonNull("dict_field") ? n.get("dict_field").asText() : null;
            numerator = n.hasNonNull("numerator") ? new Feature(n.get("numerator"), 0) : null;
            denominator = n.hasNonNull("denominator") ? new Feature(n.get("denominator"), 0) : null;
            slots = "top_k".equals(agg) ? 2 * k : 1;
        }
    }

    private Program(JsonNode n) {
        int format = n.path("format").asInt();
        if (format != FORMAT) {
            throw new IllegalArgumentException("realtime program format " + format + ", this jar reads "
                + FORMAT + ": rebuild infra/ (`make setup`) or re-run `headwater apply`");
        }
        source = text(n, "source");
        eventIdColumn = n.path("event_id_column").asInt(-1);
        eventTimeColumn = n.path("event_time_column").asInt();
        List<String> cols = new ArrayList<>();
        n.path("columns").forEach(c -> cols.add(c.asText()));
        columns = List.copyOf(cols);
        List<String> types = new ArrayList<>();
        n.path("column_types").forEach(c -> types.add(c.asText()));
        columnTypes = List.copyOf(types);
        outOfOrdernessMs = n.path("out_of_orderness_ms").asLong();
        allowedLatenessMs = n.path("allowed_lateness_ms").asLong(0);
        eventTimeField = n.path("event_time_field").asText("event_time");
        idleAdvanceMs = n.path("idle_advance_ms").asLong(0);
        namespace = text(n, "namespace");
        store = new Store(n.path("store"));
        List<Group> gs = new ArrayList<>();
        for (JsonNode g : n.path("groups")) {
            gs.add(new Group(gs.size(), g));
        }
        groups = List.copyOf(gs);
        scanUid = n.hasNonNull("scan_uid") ? n.get("scan_uid").asText() : "hw-kafka-" + source;
        seed = n.hasNonNull("seed") ? new Seed(n.get("seed")) : null;
        reportedDir = n.hasNonNull("reported_dir") ? n.get("reported_dir").asText() : null;
    }

    /** Parse the JSON text written by pipelines/realtime/program.py. */
    public static Program parse(String json) {
        try {
            return new Program(new ObjectMapper().readTree(json));
        } catch (IOException e) {
            throw new IllegalArgumentException("realtime program is not valid JSON: " + e.getMessage(), e);
        }
    }

    private static String text(JsonNode n, String key) {
        JsonNode v = n.get(key);
        if (v == null || v.isNull()) {
            throw new IllegalArgumentException("realtime program: missing key '" + key + "' in " + n);
        }
        return v.asText();
    }

    private static long positive(JsonNode n, String key) {
        long v = n.path(key).asLong();
        if (v <= 0) {
            throw new IllegalArgumentException("realtime program: '" + key + "' must be > 0, got " + n.get(key));
        }
        return v;
    }
}
