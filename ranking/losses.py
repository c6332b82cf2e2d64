"""The ranker's listwise and pairwise losses within slates, and the position bias fitted beside it.

:func:`slate_softmax_loss` and :func:`slate_pairwise_loss` order the rows of each slate (what
NDCG judges); :class:`PositionBias` is a per-slot logit offset fitted on the DCN's logits and
never served (the service ranks by what an item is worth, not by where it was shown).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt
import torch
from torch import nn


def slate_softmax_loss(logits: torch.Tensor, labels: torch.Tensor, slate: torch.Tensor) -> torch.Tensor:
    """Listwise loss: softmax cross-entropy within each slate, averaged over the slates with a click.

    Per slate: the cross-entropy between the softmax of its ``logits`` and its clicks as a
    distribution (``labels / sum(labels)`` within the slate).

    ``slate`` is a dense index (0..S-1) per row. For a slate of scores (1, 0, 0) and clicks (1, 0, 0)
    the loss is ``-log(e / (e + 2)) = 0.5514``. Slates without a click carry no order to learn and
    contribute nothing; a batch without any click gives 0 (still differentiable).
    """
    n = int(slate.max()) + 1 if len(slate) else 0
    top = torch.full((n,), -torch.inf, device=logits.device, dtype=logits.dtype)
    top = top.scatter_reduce(0, slate, logits.detach(), reduce="amax")
    shifted = logits - top[slate]
    log_norm = (
        torch.zeros(n, device=logits.device, dtype=logits.dtype).index_add(0, slate, shifted.exp()).log()
    )
    log_p = shifted - log_norm[slate]
    clicks = torch.zeros(n, device=logits.device, dtype=logits.dtype).index_add(0, slate, labels)
    has = clicks > 0
    target = labels / clicks[slate].clamp(min=1e-12)
    per_slate = -torch.zeros(n, device=logits.device, dtype=logits.dtype).index_add(0, slate, target * log_p)
    if not bool(has.any()):
        return logits.sum() * 0.0
    return per_slate[has].mean()


def slate_pairwise_loss(logits: torch.Tensor, labels: torch.Tensor, slate: torch.Tensor) -> torch.Tensor:
    """Pairwise (RankNet) loss within slates: ``log(1 + exp(s_neg - s_pos))``, mean over the pairs.

    The pairs are every (clicked, not clicked) pair of rows of one slate (``slate``: dense index per
    row). For scores (1, 0) with clicks (1, 0) the loss is ``log(1 + e^-1) = 0.3133``. A batch without such
    a pair gives 0 (still differentiable).
    """
    same = slate[:, None] == slate[None, :]
    pairs = same & (labels[:, None] > 0.5) & (labels[None, :] < 0.5)
    if not bool(pairs.any()):
        return logits.sum() * 0.0
    pos, neg = pairs.nonzero(as_tuple=True)
    return nn.functional.softplus(logits[neg] - logits[pos]).mean()


MAX_POSITION = 20
"""Slots past this share :class:`PositionBias`'s last offset."""


class PositionBias(nn.Module):
    """A learned logit offset per slot an impression was shown at, relative to the top slot.

    Fitted on the DCN's logits (``after``: :func:`fit_position_bias`) or trained beside it (``joint``:
    their logits add up), and never served: the service ranks by the DCN's logit alone, the score of
    an item shown at the top. Position 0 (unknown) gets no offset.
    """

    def __init__(self, slots: int = MAX_POSITION, *, scaled: bool = False) -> None:
        super().__init__()
        self.slots = slots
        self.weight = nn.Parameter(torch.zeros(slots + 1))
        self.scale = nn.Parameter(torch.ones(()), requires_grad=scaled)
        """Multiplies the DCN's logits in :func:`at_position` (fitted by ``after``; 1 when joint)."""

    def start_from(self, position: npt.NDArray[np.int64], label: npt.NDArray[np.float32]) -> None:
        """Start from each slot's log click rate against the top slot's (smoothed toward the mean rate).

        Adam moves a weight by about the learning rate a step; a few hundred steps from zero could
        not reach the offsets a slot 10 has (about -1.8 in the generator's click model).
        """
        known = (position > 0) & (position <= self.slots)
        base = max(float(label[known].mean()) if known.any() else 0.0, 1e-4)
        shown = np.bincount(position[known], minlength=self.slots + 1).astype(np.float64)
        clicked = np.bincount(position[known], weights=label[known], minlength=self.slots + 1)
        rate = (clicked + 1.0) / (shown + 1.0 / base)
        with torch.no_grad():
            self.weight.copy_(torch.from_numpy(np.log(rate) - np.log(rate[1])).float())

    def forward(self, position: torch.Tensor) -> torch.Tensor:
        """Offsets (B,) for ``position`` (B,) int64."""
        clipped = position.clamp(0, self.slots)
        offset = self.weight[clipped] - self.weight[1]
        return torch.where(clipped > 0, offset, torch.zeros_like(offset))

    def describe(self, mode: str) -> dict[str, Any]:
        """Return the mode, the scale and the offsets, for an artifact's metadata (never read back)."""
        return {"mode": mode, "scale": round(float(self.scale.detach()), 4), "offsets": self.offsets()}

    def offsets(self) -> list[float]:
        """Return the learned offsets of positions 1..slots (position 1 is 0 by construction)."""
        with torch.no_grad():
            values = self(torch.arange(1, self.slots + 1))
        return [round(float(v), 4) for v in values]


def fit_position_bias(
    logits: npt.NDArray[np.floating[Any]], position: npt.NDArray[np.int64], label: npt.NDArray[np.float32]
) -> PositionBias:
    """Fit a scale of the fixed ``logits`` and the per-slot offsets: full-batch L-BFGS of the log loss.

    The loss is convex in (scale, offsets). The scale recalibrates a listwise-trained DCN, whose
    logits are only defined up to a shift within a slate; it is positive for any useful model.
    """
    bias = PositionBias(scaled=True)
    fixed = torch.from_numpy(np.asarray(logits, np.float32))
    slots, labels = torch.from_numpy(position), torch.from_numpy(label)
    optimizer = torch.optim.LBFGS(bias.parameters(), lr=1.0, max_iter=100, line_search_fn="strong_wolfe")

    def closure() -> torch.Tensor:
        optimizer.zero_grad(set_to_none=True)
        loss = nn.functional.binary_cross_entropy_with_logits(bias.scale * fixed + bias(slots), labels)
        torch.autograd.backward(loss)
        return loss

    optimizer.step(closure)  # type: ignore[no-untyped-call]  # torch leaves LBFGS.step untyped
    return bias.eval()
