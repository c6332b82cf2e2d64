"""The nearline store reports the bytes it holds per view (live keys + values), not its folder's size."""

from __future__ import annotations

from pathlib import Path

from headwater.pipelines.nearline.state import CHANGELOG_POS_KEY, PartitionStore, dedup_key, pane_key


def test_live_bytes_sum_keys_and_values_by_view(tmp_path: Path) -> None:
    store = PartitionStore(tmp_path, 0)
    try:
        a = pane_key("view_a", "u1", 1000)
        b = b"p\x1fview_b\x1fu1\x1f1000"  # a key of the old format counts for its view too
        d = dedup_key(17, 0)
        store.commit({a: b"x" * 10, b: b"y" * 30, d: b"z" * 5}, changelog_pos=4)
        live = store.live_bytes()
        assert live["panes:view_a"] == len(a) + 10
        assert live["panes:view_b"] == len(b) + 30
        assert live["dedup"] == len(d) + 5
        assert live["other"] == len(CHANGELOG_POS_KEY) + len(b"4")
        store.commit({a: None}, changelog_pos=5)  # a deleted record holds nothing
        assert "panes:view_a" not in store.live_bytes()
    finally:
        store.close()
