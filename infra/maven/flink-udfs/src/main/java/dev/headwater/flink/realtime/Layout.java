package dev.headwater.flink.realtime;

import java.util.Arrays;
import java.util.HashMap;
import java.util.List;
import java.util.Map;

/**
 * What a group's keyed state is indexed by: its views, each as {@code name@version} with its number of
 * features, in program order. {@link KeyState#running}, every slice's partials and {@link KeyState#views}
 * follow this order, so a state written under one layout is read under another by {@link #featureMap}
 * and {@link #viewMap}: a view whose name and version are in both keeps its partials, others start empty.
 *
 * <p>The version (registry/plans.py {@code view_version}) changes with whatever defines the view's values
 * (aggregation, field, filter, window, slide, source), never with a description or owner; the name is in
 * the id too, so two views of the same definition never share a state and a renamed view starts empty.
 */
final class Layout {
    final String[] views;
    final int[] features;

    Layout(String[] views, int[] features) {
        if (views.length != features.length) {
            throw new IllegalArgumentException("layout: " + views.length + " views, " + features.length
                + " feature counts");
        }
        this.views = views;
        this.features = features;
    }

    /** The layout of a compiled group. */
    static Layout of(Program.Group group) {
        String[] ids = new String[group.views.size()];
        int[] counts = new int[ids.length];
        for (int v = 0; v < ids.length; v++) {
            Program.View view = group.views.get(v);
            ids[v] = view.name + "@" + view.version;
            counts[v] = view.features.size();
        }
        return new Layout(ids, counts);
    }

    int featureCount() {
        return Arrays.stream(features).sum();
    }

    /** Per view of this layout, its index in {@code old}, or -1 (a new or changed view). */
    int[] viewMap(Layout old) {
        Map<String, Integer> at = new HashMap<>();
        for (int v = 0; v < old.views.length; v++) {
            at.put(old.views[v], v);
        }
        int[] out = new int[views.length];
        for (int v = 0; v < views.length; v++) {
            Integer o = at.get(views[v]);
            // the same id with another feature count cannot happen (the version hashes the features);
            // a corrupt or hand-made state must not be read shifted, so such a view starts empty
            out[v] = o != null && old.features[o] == features[v] ? o : -1;
        }
        return out;
    }

    /** Per feature of this layout, the index of the same feature in {@code old}, or -1. */
    int[] featureMap(Layout old) {
        int[] oldFirst = firsts(old.features);
        int[] first = firsts(features);
        int[] views = viewMap(old);
        int[] out = new int[featureCount()];
        Arrays.fill(out, -1);
        for (int v = 0; v < views.length; v++) {
            if (views[v] >= 0) {
                for (int j = 0; j < features[v]; j++) {
                    out[first[v] + j] = oldFirst[views[v]] + j;
                }
            }
        }
        return out;
    }

    private static int[] firsts(int[] counts) {
        int[] out = new int[counts.length];
        for (int v = 1; v < counts.length; v++) {
            out[v] = out[v - 1] + counts[v - 1];
        }
        return out;
    }

    /** The view ids of {@code old} this layout does not keep. */
    List<String> dropped(Layout old) {
        List<String> kept = Arrays.asList(views);
        return Arrays.stream(old.views).filter(id -> !kept.contains(id)).toList();
    }

    @Override
    public boolean equals(Object o) {
        return o instanceof Layout l && Arrays.equals(views, l.views) && Arrays.equals(features, l.features);
    }

    @Override
    public int hashCode() {
        return 31 * Arrays.hashCode(views) + Arrays.hashCode(features);
    }

    @Override
    public String toString() {
        return String.join(", ", views);
    }
}
