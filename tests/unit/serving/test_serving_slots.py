"""SlotMap, the one row allocator of the item cache and the item mirror: against a dict model."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from headwater.serving.slots import SlotMap

IDS = st.sampled_from([f"i{j}" for j in range(12)])
OPS = st.lists(
    st.one_of(
        st.tuples(st.just("take"), st.lists(IDS, max_size=5, unique=True)),
        st.tuples(st.just("forget"), IDS),
        st.tuples(st.just("evict"), st.integers(0, 3)),
    ),
    max_size=40,
)


@settings(max_examples=150, deadline=None)
@given(OPS)
def test_rows_are_unique_reused_and_match_a_dict_model(ops: list[tuple[str, object]]) -> None:
    slots = SlotMap()
    model: dict[str, int] = {}
    for op, arg in ops:
        if op == "take":
            new = [i for i in arg if i not in model]  # type: ignore[union-attr]
            if len(new) > len(slots.free):
                slots.add_rows(len(new) - len(slots.free) + 1)
            got = slots.take(new)
            model.update(zip(new, got.tolist(), strict=True))
        elif op == "forget":
            assert slots.forget(arg) == model.pop(arg, None)  # type: ignore[arg-type]
        else:
            held = sorted(model.values())[: int(arg)]  # type: ignore[call-overload]
            slots.release(held)
            model = {k: v for k, v in model.items() if v not in held}
        assert slots.row == model
        assert len(set(model.values())) == len(model)  # no row held twice
        assert not set(model.values()) & set(slots.free)  # a held row is never free
        assert len(model) + len(slots.free) == slots.capacity  # every row held or free
        ids = sorted(model)
        np.testing.assert_array_equal(slots.find([*ids, "nope"]), [*(model[i] for i in ids), -1])


def test_take_without_free_rows_says_so() -> None:
    slots = SlotMap()
    slots.add_rows(1)
    assert slots.take(["a"]).tolist() == [0]
    with pytest.raises(ValueError, match="1 rows wanted, 0 free"):
        slots.take(["b"])
    assert slots.take([]).tolist() == []
