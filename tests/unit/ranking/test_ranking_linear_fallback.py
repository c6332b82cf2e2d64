"""The linear fallback, trained on a small synthetic set, must rank the holdout better than popularity."""

from __future__ import annotations

import numpy as np
import pytest

from headwater.ranking.evaluation import auc, ndcg_at_k, popularity_scores
from headwater.ranking.inputs import moments, split_by_time, standardized
from headwater.ranking.model import LinearRanker, linear_logits
from headwater.ranking.synthetic import make_world, small_registry, training_set
from headwater.ranking.train import TrainOptions, train_linear
from headwater.ranking.trainset import TrainingSet

MARGIN = 0.05
"""Seed 1: the planted user x item signal gives the linear model an AUC far above popularity's."""
REGISTRY = small_registry(
    {"u": ["a", "b", "c:max"], "v": ["d", "e"]}, {"i": ["x", "y:avg"], "j": ["z", "w"]}, "i.x"
)


@pytest.fixture(scope="module")
def split() -> tuple[TrainingSet, TrainingSet]:
    world = make_world(REGISTRY, users=200, items=200, seed=1)
    ts = training_set(REGISTRY, world, slates=2_500, seed=1)
    train_rows, test_rows = split_by_time(ts, 0.25)
    return ts.take(train_rows), ts.take(test_rows)


def test_linear_fallback_beats_popularity_on_the_holdout(split: tuple[TrainingSet, TrainingSet]) -> None:
    train, test = split
    norm = (*moments(train.user), *moments(train.item))
    state = train_linear(train, TrainOptions(seed=0), norm)
    linear = linear_logits(state, *standardized(test, norm)).numpy()
    popular = popularity_scores(train.item_ids, train.label, test.item_ids)
    linear_auc, popular_auc = auc(test.label, linear), auc(test.label, popular)
    assert linear_auc > popular_auc + MARGIN, (linear_auc, popular_auc)
    assert linear_auc > 0.6
    assert ndcg_at_k(test.group, test.label, linear) > ndcg_at_k(test.group, test.label, popular)

    # The serving path (numpy, one user vector at a time) scores exactly what training evaluated.
    ranker = LinearRanker({k: v.numpy() for k, v in state.items()})
    served = [float(ranker.score(test.user[r], test.item[r : r + 1])[0]) for r in range(50)]
    np.testing.assert_allclose(served, linear[:50], rtol=1e-4, atol=1e-4)
