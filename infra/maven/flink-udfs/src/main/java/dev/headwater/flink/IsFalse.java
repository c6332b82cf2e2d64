package dev.headwater.flink;

import org.apache.flink.table.annotation.DataTypeHint;
import org.apache.flink.table.functions.ScalarFunction;

/**
 * {@code hw_is_false(condition)}: TRUE exactly when {@code condition} is FALSE (not when it is NULL): a
 * source rule fails only then (SQL CHECK semantics, as the Python codec's {@code compile_rule}).
 *
 * <p>Why a function and not {@code (condition) IS FALSE}: the planner rewrites {@code (a >= 0) IS FALSE}
 * into {@code a < 0}, which is not the same for a NaN (both comparisons are false), so a rule such as
 * {@code amount >= 0} would hold for a NaN amount in SQL and fail in Python. The planner cannot look
 * through a function call, so the condition is evaluated as written (IEEE comparisons: NaN compares false).
 */
public class IsFalse extends ScalarFunction {
    private static final long serialVersionUID = 1L;

    public @DataTypeHint("BOOLEAN NOT NULL") boolean eval(Boolean condition) {
        return condition != null && !condition;
    }

    /**
     * Declared non-deterministic (it is not) so that the planner evaluates a source's rules once per
     * record: it would otherwise inline them into every reference to the reason and detail columns.
     */
    @Override
    public boolean isDeterministic() {
        return false;
    }
}
