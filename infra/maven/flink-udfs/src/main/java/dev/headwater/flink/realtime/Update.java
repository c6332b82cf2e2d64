package dev.headwater.flink.realtime;

/**
 * One value for the online store, from {@link ViewOperator} to {@link RedisSink}: the view (its index
 * in the group), the entity, the event time (the window boundary of the value's last change), the
 * float32 slots and, per slot, the text whose dictionary id the slot takes (null for a number).
 *
 * <p>{@link #validToMs}: the value holds at every boundary from {@link #eventTimeMs} (its last change)
 * to this one (the boundary before the entity's next change, no later than the operator's published
 * boundary: {@code Aggregator.validTo}); write.lua dates it at the stored event time when that falls
 * inside, so a value another run, or the entity's state before it was dropped, wrote there is compared
 * with it at the same time (issue 16: a job restored after a kill -9 that reads the partitions in
 * another order; an entity dropped while a partition behind was left out of the watermark).
 *
 * <p>An update with a null {@link #entity} is a progress mark: the operator's clock has passed
 * boundary {@link #eventTimeMs} and every value up to it is published, changed or not.
 *
 * <p>A Flink POJO (public fields, no-arg constructor), so it travels without Kryo.
 */
public final class Update {
    public int view;
    public String entity;
    public long eventTimeMs;
    public long validToMs;
    public float[] slots;
    public String[] dict;

    public Update() {}

    public Update(int view, String entity, long eventTimeMs, long validToMs, float[] slots, String[] dict) {
        this.view = view;
        this.entity = entity;
        this.eventTimeMs = eventTimeMs;
        this.validToMs = validToMs;
        this.slots = slots;
        this.dict = dict;
    }

    /** A progress mark of view {@code view} up to {@code boundaryMs}. */
    public static Update progress(int view, long boundaryMs) {
        return new Update(view, null, boundaryMs, boundaryMs, null, null);
    }
}
