package dev.headwater.flink.realtime;

import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;

/**
 * The realtime tier's {@code late} verdict, the same function of the stream as the nearline tier's
 * (pipelines/nearline/task.py {@code _accept}): per source partition, per record in offset order, an
 * event is late when its event time is before its partition's horizon, the greatest event time of the
 * partition's accepted events (each capped by the wall clock, so an event from the near future does not
 * move it) minus the source's max out-of-orderness and allowed lateness. Only an accepted event (one
 * with no other reason and not late) moves the greatest event time.
 *
 * <p>Not Flink's watermark: that one is periodic (a burst is read before it moves), global over the
 * source's splits, idle-aware and not checkpointed (a restored job starts without one), so its verdict
 * on a record depends on timing. This one depends only on the partition's records before it, and its
 * state (one long per partition) is checkpointed by {@link LateCheck}, so a job restored from a
 * checkpoint and replaying from its offsets gives every record the verdict of an uninterrupted run.
 *
 * <p>The rows a backfill replays (read before its switch, pipelines/realtime/backfill.py) are judged
 * against their own greatest event times ({@link #judgeReplay}), which start empty at the rewind and are
 * tagged with the rewound scan's uid, so a later backfill starts its own; they feed only the backfilled
 * views, never the dead-letter topic (their letters were written by the run that first read them).
 */
final class Lateness {
    /** The tag of the live stream's entries in {@link #entries()}. */
    static final String LIVE = "live";

    private final String source;
    private final String eventTimeField;
    private final long outOfOrdernessMs;
    private final long allowedLatenessMs;
    private final String replayTag;
    private final Map<Integer, Long> live = new HashMap<>();
    private final Map<Integer, Long> replay = new HashMap<>();

    /**
     * @param replayTag the uid of the rewound scan whose replay this run judges (entries of another
     *     replay are dropped at restore), or null when the run replays nothing
     */
    Lateness(String source, String eventTimeField, long outOfOrdernessMs, long allowedLatenessMs, String replayTag) {
        this.source = source;
        this.eventTimeField = eventTimeField;
        this.outOfOrdernessMs = outOfOrdernessMs;
        this.allowedLatenessMs = allowedLatenessMs;
        this.replayTag = replayTag;
    }

    static Lateness of(Program program) {
        return new Lateness(program.source, program.eventTimeField, program.outOfOrdernessMs,
            program.allowedLatenessMs, program.seed == null ? null : program.scanUid);
    }

    /**
     * Judge a live event of {@code partition} with event time {@code t} (epoch ms) read at wall-clock
     * time {@code now}: null when it is accepted (and then it moves the partition's greatest event time),
     * else the dead letter's detail.
     */
    String judge(int partition, long t, long now) {
        return judge(live, partition, t, now);
    }

    /** Judge a row a backfill replays, against the replay's own greatest event times. */
    String judgeReplay(int partition, long t, long now) {
        return judge(replay, partition, t, now);
    }

    private String judge(Map<Integer, Long> maxes, int partition, long t, long now) {
        Long max = maxes.get(partition);
        if (max != null) {
            long horizon = max - outOfOrdernessMs - allowedLatenessMs;
            if (t < horizon) {
                return eventTimeField + " " + t + " ms is " + (horizon - t) + " ms before the horizon " + horizon
                    + " of partition " + partition + " (its greatest accepted event time " + max + " - max"
                    + " out-of-orderness " + outOfOrdernessMs + " ms - allowed lateness " + allowedLatenessMs
                    + " ms; source '" + source + "')";
            }
        }
        long seen = Math.min(t, now);  // the future does not move the horizon
        if (max == null || seen > max) {
            maxes.put(partition, seen);
        }
        return null;
    }

    /** The greatest accepted event time of a live partition, or null before its first accepted event. */
    Long max(int partition) {
        return live.get(partition);
    }

    /** The state to checkpoint: (tag, partition, greatest event time); tag {@link #LIVE} or the replay's. */
    List<Object[]> entries() {
        List<Object[]> out = new ArrayList<>();
        live.forEach((p, m) -> out.add(new Object[] {LIVE, p, m}));
        if (replayTag != null) {
            replay.forEach((p, m) -> out.add(new Object[] {replayTag, p, m}));
        }
        return out;
    }

    /**
     * Restore one checkpointed entry. Every subtask gets every subtask's entries (union state), so a
     * partition assigned elsewhere after a restore still finds its greatest event time; when a partition
     * has several (it moved between subtasks), the greatest wins: it only grows.
     */
    void restore(String tag, int partition, long max) {
        Map<Integer, Long> into = LIVE.equals(tag) ? live : tag.equals(replayTag) ? replay : null;
        if (into != null) {
            into.merge(partition, max, Math::max);
        }
    }
}
