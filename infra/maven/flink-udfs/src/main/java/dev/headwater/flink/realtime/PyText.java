package dev.headwater.flink.realtime;

import java.math.BigDecimal;

/**
 * Python's view of field values, where the shared online layout depends on it: the dictionary
 * (pipelines/windows/vector.py) keys a value by Python's {@code str(v)}, and top_k breaks count ties by
 * Python's ordering (code points for text, numbers by value). The JVM must give the same text and
 * order, or two tiers would store different ids for one value.
 */
final class PyText {
    private PyText() {}

    /** Python's {@code str(v)} of a field value (str, int, float or bool). */
    static String str(Object v) {
        if (v instanceof String) {
            return (String) v;
        }
        if (v instanceof Double || v instanceof Float) {
            return repr(((Number) v).doubleValue());
        }
        if (v instanceof Boolean) {
            return (Boolean) v ? "True" : "False";
        }
        return v.toString();
    }

    /** Python's {@code repr(float)}: shortest round-trip digits, exponent form below 1e-4 or from 1e16. */
    static String repr(double d) {
        if (Double.isNaN(d)) {
            return "nan";
        }
        if (Double.isInfinite(d)) {
            return d > 0 ? "inf" : "-inf";
        }
        if (d == 0) {
            return (1 / d < 0) ? "-0.0" : "0.0";
        }
        BigDecimal exact = new BigDecimal(Double.toString(d)).stripTrailingZeros();
        String digits = exact.unscaledValue().abs().toString();
        int exponent = digits.length() - 1 - exact.scale();  // d = 0.digits x 10^(exponent + 1)
        String sign = d < 0 ? "-" : "";
        if (exponent < -4 || exponent >= 16) {
            String mantissa = digits.length() == 1 ? digits : digits.charAt(0) + "." + digits.substring(1);
            String exp = String.format("%s%02d", exponent < 0 ? "-" : "+", Math.abs(exponent));
            return sign + mantissa + "e" + exp;
        }
        String plain = exact.abs().toPlainString();
        return sign + (plain.contains(".") ? plain : plain + ".0");
    }

    /** Python's {@code <} on two values of one field: code points for text, value for numbers. */
    static int compare(Object a, Object b) {
        if (a instanceof String && b instanceof String) {
            String x = (String) a;
            String y = (String) b;
            int i = 0;
            int j = 0;
            while (i < x.length() && j < y.length()) {
                int cx = x.codePointAt(i);
                int cy = y.codePointAt(j);
                if (cx != cy) {
                    return Integer.compare(cx, cy);
                }
                i += Character.charCount(cx);
                j += Character.charCount(cy);
            }
            return Integer.compare(x.length() - i, y.length() - j);
        }
        if ((a instanceof Long || a instanceof Integer) && (b instanceof Long || b instanceof Integer)) {
            return Long.compare(((Number) a).longValue(), ((Number) b).longValue());
        }
        if (a instanceof Number && b instanceof Number) {
            return Double.compare(((Number) a).doubleValue(), ((Number) b).doubleValue());
        }
        return str(a).compareTo(str(b));
    }
}
