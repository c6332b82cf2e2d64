"""The online-vector slots of a feature: part of the contract between the registry and every tier.

A view's online value is one float32 vector. Most features take one slot named after the feature;
``top_k`` takes 2k: ``<feature>.top<i>`` (the dictionary id of the i-th most frequent value) then
``<feature>.share<i>``, i = 1..k. The tiers pack vectors in this order and the Feast views that
``apply`` writes declare exactly these fields, so a Feast client reads the same slots.
"""

from __future__ import annotations


def feature_slots(name: str, agg: str, k: int | None) -> tuple[str, ...]:
    """Return the slot names of one feature, in vector order."""
    if agg != "top_k":
        return (name,)
    if not k or k < 1:
        msg = f"feature {name!r}: top_k needs k >= 1 to lay out its slots, got k={k!r}"
        raise ValueError(msg)
    return (*(f"{name}.top{i}" for i in range(1, k + 1)), *(f"{name}.share{i}" for i in range(1, k + 1)))
