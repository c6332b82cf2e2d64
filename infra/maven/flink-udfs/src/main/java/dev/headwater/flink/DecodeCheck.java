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
 * <p>Usage: {@code java -cp ... dev.headwater.flink.DecodeCheck CONFIG.json NOW_MS}, CONFIG.json the
 * source's decoder config (pipelines/realtime/decode.py {@code decoder_config}). Input lines:
 * {@code value_hex fp_hex produce_ts_hex}, "-" for a null. Output lines: the reason ("ok" when the
 * record decodes), a tab, then for a good record "future" or "-" (the future-dated flag) and the
 * fields, each after a tab ("\N" for a null), for a rejected one the detail.
 */
public final class DecodeCheck {
    private DecodeCheck() {}

    public static void main(String[] args) throws IOException {
        String config = Files.readString(Path.of(args[0]), StandardCharsets.UTF_8);
        long now = Long.parseLong(args[1]);
        EventDecoder decoder = new EventDecoder(config);
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        StringBuilder out = new StringBuilder();
        for (String line = in.readLine(); line != null; line = in.readLine()) {
            String[] p = line.split(" ", -1);
            EventDecoder.Result r = decoder.decode(hex(p[0]), hex(p[1]), hex(p[2]), now);
            if (r.reason != null) {
                out.append(r.reason).append('\t').append(escape(r.detail)).append('\n');
                continue;
            }
            out.append("ok\t").append(r.future == null ? "-" : "future");
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
