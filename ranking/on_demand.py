"""Request-time (on-demand) features: computed per (user, candidate, request) from stored vectors.

A ``tier: on_demand`` view (:class:`~headwater.registry.plans.PlanOnDemandView`) declares features
as expressions over user and item slots and the request (:mod:`headwater.registry.expr_value`).
:class:`OnDemandProgram` binds them once to the columns of the user and item vectors; then

* the service calls :meth:`OnDemandProgram.compute` with the user's vector (one row, broadcast)
  and the candidates' matrix: one numpy pass per expression node over all candidates, no Python
  loop per item;
* a training set calls :meth:`OnDemandProgram.compute_columns` with its ``user.<slot>`` and
  ``item.<slot>`` columns and each label's time.

Both end in the same :func:`~headwater.registry.expr_value.evaluate`, so a training row and a served
candidate with the same stored values get the same numbers. The features are *pair* slots: the
ranker takes them as extra item-side inputs, after the stored item slots (names from the plan).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from headwater.registry.errors import HeadwaterError
from headwater.registry.expr_value import REQUEST, Value, evaluate, from_json, refs_of, request_columns
from headwater.registry.plans import PlanOnDemandView

PAIR_PREFIX = "pair."
"""Prefix of the on-demand columns of a training-set Parquet (``pair.<feature>``)."""


class OnDemandBindingError(HeadwaterError, ValueError):
    """An on-demand feature reads a slot the bound user and item views do not have."""


@dataclass(frozen=True)
class _Step:
    ref: str
    """``<on-demand view>.<feature>``: how later expressions read the value."""
    name: str
    ast: Value


@dataclass(frozen=True)
class OnDemandProgram:
    """The on-demand features of the applied registry, bound to the user and item columns.

    ``names`` are the output slots in plan order; ``steps`` run in dependency order.
    """

    names: tuple[str, ...]
    steps: tuple[_Step, ...]
    user_columns: Mapping[str, int]
    """``view.slot`` -> column of the user vector, for the slots the expressions read."""
    item_columns: Mapping[str, int]

    @classmethod
    def bind(
        cls,
        views: Sequence[PlanOnDemandView],
        user_slots: Mapping[str, int],
        item_slots: Mapping[str, int],
    ) -> OnDemandProgram:
        """Bind ``views`` to ``{view.slot: column}`` of the user and item vectors.

        Raises:
            OnDemandBindingError: an expression reads a slot of neither side (a view not bound).
        """
        steps = {f"{v.name}.{f.name}": _Step(f"{v.name}.{f.name}", f.name, from_json(f.ast))
                 for v in views for f in v.features}  # fmt: skip
        user: dict[str, int] = {}
        item: dict[str, int] = {}
        for step in steps.values():
            for ref in refs_of(step.ast):
                if ref.view == REQUEST or ref.name in steps:
                    continue
                found = False
                for slots, out in ((user_slots, user), (item_slots, item)):
                    for slot, column in slots.items():  # the slot itself or a top_k feature's slots
                        if slot == ref.name or slot.startswith(ref.name + "."):
                            out[slot] = column
                            found = True
                if not found:
                    msg = (
                        f"on-demand feature {step.ref} reads {ref.name}, which no bound user or item view"
                        " has; apply the registry with that view, or build the training set with it"
                    )
                    raise OnDemandBindingError(msg)
        names = tuple(s.name for s in steps.values())
        return cls(names, tuple(_order(steps)), user, item)

    @property
    def width(self) -> int:
        """Number of on-demand slots."""
        return len(self.names)

    def compute_columns(
        self, columns: Mapping[str, npt.NDArray[np.float64] | float], time_ms: npt.ArrayLike, n: int
    ) -> dict[str, npt.NDArray[np.float64]]:
        """Evaluate every feature over ``n`` rows; ``columns`` maps ``view.slot`` to values.

        ``time_ms``: the request time (a scalar) or each row's label time, epoch milliseconds.
        """
        env: dict[str, npt.NDArray[np.float64] | float] = dict(columns)
        env.update(request_columns(time_ms))
        out: dict[str, npt.NDArray[np.float64]] = {}
        for step in self.steps:
            value = evaluate(step.ast, env, n)
            env[step.ref] = value
            out[step.name] = value
        return {name: out[name] for name in self.names}

    def compute(
        self, user: npt.NDArray[np.float32], items: npt.NDArray[np.float32], time_ms: npt.ArrayLike
    ) -> npt.NDArray[np.float32]:
        """Return the (n, width) on-demand slots of ``items`` (n, item_dim) for ``user``.

        ``user`` is one vector (user_dim,), broadcast to every candidate, or one row per item
        (n, user_dim). Vectors are in the registry's column order (before a model's reordering).
        """
        n = len(items)
        cols: dict[str, npt.NDArray[np.float64] | float] = {}
        for slot, j in self.user_columns.items():
            cols[slot] = float(user[j]) if user.ndim == 1 else user[:, j].astype(np.float64)
        for slot, j in self.item_columns.items():
            cols[slot] = items[:, j].astype(np.float64)
        values = self.compute_columns(cols, time_ms, n)
        out = np.empty((n, self.width), dtype=np.float32)
        for j, name in enumerate(self.names):
            out[:, j] = values[name]
        return out


def _order(steps: Mapping[str, _Step]) -> list[_Step]:
    """Order the steps: every on-demand input before its readers (the registry rejected cycles)."""
    done: dict[str, _Step] = {}

    def visit(ref: str, depth: int) -> None:
        if ref in done:
            return
        if depth > len(steps):
            msg = f"on-demand feature {ref} depends on itself; run `headwater check`"
            raise OnDemandBindingError(msg)
        for dep in refs_of(steps[ref].ast):
            if dep.name in steps:
                visit(dep.name, depth + 1)
        done[ref] = steps[ref]

    for ref in steps:
        visit(ref, 0)
    return list(done.values())


def slot_index(views: Sequence[tuple[str, Sequence[str]]]) -> dict[str, int]:
    """``{view.slot: column}`` of a side whose vector concatenates ``(view, slots)`` in order."""
    out: dict[str, int] = {}
    column = 0
    for view, slots in views:
        for slot in slots:
            out[f"{view}.{slot}"] = column
            column += 1
    return out


__all__ = ["PAIR_PREFIX", "OnDemandBindingError", "OnDemandProgram", "slot_index"]
