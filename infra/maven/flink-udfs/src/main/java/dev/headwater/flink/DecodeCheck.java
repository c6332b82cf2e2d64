package dev.headwater.flink;

import java.io.BufferedReader;
import java.io.IOException;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.HexFormat;

/**
 * Decodes records given on stdin with {@link EventDecoder} and prints one line per record, so
 * tests compare the JVM decode with the Python codec on the same bytes.
 *
 * <p>Usage: {@code java -cp ... dev.headwater.flink.DecodeCheck SCHEMA.avsc FINGERPRINT MAX_FUTURE_MS NOW_MS}.
 * Input lines: {@code value_hex fp_hex produce_ts_hex}, "-" for a null. Output lines: the reason
 * ("ok" when good), a tab, then for a good record the fields joined by tabs ("\N" for a null), for
 * a rejected one the detail.
 */
public final class DecodeCheck {
    private DecodeCheck() {}

    public static void main(String[] args) throws IOException {
        String schema = Files.readString(Path.of(args[0]), StandardCharsets.UTF_8);
        byte[] expected = args[1].getBytes(StandardCharsets.US_ASCII);
        long maxFuture = Long.parseLong(args[2]);
        long now = Long.parseLong(args[3]);
        EventDecoder decoder = new EventDecoder(schema);
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        StringBuilder out = new StringBuilder();
        for (String line = in.readLine(); line != null; line = in.readLine()) {
            String[] p = line.split(" ", -1);
            EventDecoder.Result r = decoder.decode(hex(p[0]), hex(p[1]), hex(p[2]), expected, maxFuture, now);
            if (r.reason != null) {
                out.append(r.reason).append('\t').append(escape(r.detail)).append('\n');
                continue;
            }
            out.append("ok");
            for (Object f : r.fields) {
                out.append('\t').append(f == null ? "\\N" : escape(f.toString()));
            }
            out.append('\n');
        }
        System.out.print(out);
    }

    /** Backslash, tab and newline as {@code \\}, {@code \t}, {@code \n}: one record per line. */
    private static String escape(String s) {
        return s.replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n");
    }

    private static byte[] hex(String s) {
        return s.equals("-") ? null : HexFormat.of().parseHex(s);
    }
}
