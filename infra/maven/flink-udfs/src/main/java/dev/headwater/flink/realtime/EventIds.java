package dev.headwater.flink.realtime;

/**
 * 64-bit hashes of event ids, the form in which {@link KeyState} remembers them for deduplication:
 * 8 bytes an event instead of the id's text. Ids are compared within one entity's slice (a handful
 * of events), so a false duplicate needs two ids of one slice to share 64 bits.
 */
final class EventIds {
    private EventIds() {}

    /** FNV-1a over the UTF-16 code units, then MurmurHash3's 64-bit finalizer to spread the bits. */
    static long hash(String id) {
        long h = 0xcbf29ce484222325L;
        for (int i = 0; i < id.length(); i++) {
            char c = id.charAt(i);
            h = (h ^ (c & 0xff)) * 0x100000001b3L;
            h = (h ^ (c >>> 8)) * 0x100000001b3L;
        }
        h ^= h >>> 33;
        h *= 0xff51afd7ed558ccdL;
        h ^= h >>> 33;
        h *= 0xc4ceb9fe1a85ec53L;
        h ^= h >>> 33;
        return h;
    }
}
