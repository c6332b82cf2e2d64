package dev.headwater.flink.realtime;

import java.io.ByteArrayInputStream;
import java.io.DataInputStream;
import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;

import org.apache.flink.core.fs.FSDataInputStream;
import org.apache.flink.runtime.checkpoint.Checkpoints;
import org.apache.flink.runtime.checkpoint.OperatorState;
import org.apache.flink.runtime.checkpoint.OperatorSubtaskState;
import org.apache.flink.runtime.checkpoint.metadata.CheckpointMetadata;
import org.apache.flink.runtime.state.OperatorStateHandle;

/**
 * The Kafka offsets a checkpoint restores: per Kafka scan of the job, per topic partition, the first
 * offset the restored source reads (pipelines/realtime/backfill.py uses them as the switch of a
 * backfill).
 *
 * <p>Exact by construction: it reads the very state the restored source starts from. A FLIP-27 source
 * operator keeps its splits as the operator list state {@code SourceReaderState}, each element
 * {@code SimpleVersionedSerialization} of the connector's {@code KafkaPartitionSplitSerializer} (version
 * 0: topic as UTF, partition int, starting offset long, stopping offset long), and the Kafka reader
 * snapshots a split with the offset after the last record it emitted before the checkpoint barrier.
 * The consumer group's committed offsets are not exact: they are committed after the checkpoint
 * completes, asynchronously, and a kill between the two leaves them behind.
 */
public final class CheckpointOffsets {
    static final String SPLITS_STATE = "SourceReaderState";

    private CheckpointOffsets() {}

    /**
     * Read {@code <chk>/_metadata}; return one line per split: {@code uid \t operator id \t topic \t
     * partition \t offset} (uid empty when the metadata has none). A negative offset is the
     * connector's placeholder for a split not read yet (earliest, latest or committed).
     */
    public static String read(String checkpointDir) throws IOException {
        Path meta = Path.of(checkpointDir, "_metadata");
        CheckpointMetadata md;
        try (DataInputStream in = new DataInputStream(new ByteArrayInputStream(Files.readAllBytes(meta)))) {
            md = Checkpoints.loadCheckpointMetadata(in, CheckpointOffsets.class.getClassLoader(), checkpointDir);
        }
        StringBuilder out = new StringBuilder();
        for (OperatorState op : md.getOperatorStates()) {
            String uid = op.getOperatorUid().orElse("");
            for (OperatorSubtaskState sub : op.getStates()) {
                for (OperatorStateHandle h : sub.getManagedOperatorState()) {
                    OperatorStateHandle.StateMetaInfo info = h.getStateNameToPartitionOffsets().get(SPLITS_STATE);
                    if (info == null) {
                        continue;
                    }
                    for (Split s : splits(h, info.getOffsets())) {
                        out.append(uid).append('\t').append(op.getOperatorID()).append('\t').append(s.topic)
                            .append('\t').append(s.partition).append('\t').append(s.offset).append('\n');
                    }
                }
            }
        }
        return out.toString();
    }

    /** One Kafka split of a source reader's state. */
    record Split(String topic, int partition, long offset) {}

    private static List<Split> splits(OperatorStateHandle h, long[] offsets) throws IOException {
        List<Split> out = new ArrayList<>();
        try (FSDataInputStream in = h.openInputStream()) {
            for (long at : offsets) {
                in.seek(at);
                DataInputStream data = new DataInputStream(in);
                byte[] element = new byte[data.readInt()];  // BytePrimitiveArraySerializer: length, bytes
                data.readFully(element);
                out.add(split(element));
            }
        }
        return out;
    }

    static Split split(byte[] element) throws IOException {
        DataInputStream in = new DataInputStream(new ByteArrayInputStream(element));
        int version = in.readInt();  // SimpleVersionedSerialization: version, length, bytes
        int length = in.readInt();
        if (version != 0 || length != element.length - 8) {
            throw new IOException("Kafka split state of serializer version " + version + " (length " + length
                + "): this reader knows version 0 (flink-connector-kafka 5.0); rebuild infra/ for the connector"
                + " in infra/lib/flink, or restart with --no-backfill");
        }
        return new Split(in.readUTF(), in.readInt(), in.readLong());
    }

    /** Print the splits of the checkpoint folders given (a check by hand). */
    public static void main(String[] args) throws IOException {
        for (String a : args) {
            System.out.print(read(a));
        }
    }
}
