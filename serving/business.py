"""Business metrics of the ranking service: impressions and clicks per model version, arm and fallback.

Two Prometheus counters in the service's registry, with the same labels:

- ``headwater_impressions_total{model_version, arm, fallback}``: items served in answers whose
  impressions are logged (``log_impressions`` true: what reaches the users and Kafka);
- ``headwater_clicks_total{model_version, arm, fallback}``: clicks posted to ``/v1/feedback``.

A click is attributed to the answer that showed the item through its ``request_id`` (or the
``session_id``, which defaults to the request id): the service keeps the labels of its last
``max_answers`` answers in memory. A click whose answer is not among them (another replica
served it, the service restarted, or the client sent no id) keeps the user's arm and gets
``model_version="unknown"`` and ``fallback="unknown"``, so the click total stays exact.

CTR is left to PromQL, over a window of one's choosing (a gauge since start would hide a change)::

    sum by (model_version, arm, fallback) (rate(headwater_clicks_total[5m]))
      / sum by (model_version, arm, fallback) (rate(headwater_impressions_total[5m]))

Label values: ``none`` for no model version (popularity, editorial), no arm (no experiment) and
no fallback (the DCN answered). The label sets stay small: a few model versions, arms and the four
fallback levels.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter

NONE = "none"
UNKNOWN = "unknown"
LABELS = ("model_version", "arm", "fallback")


class BusinessMetrics:
    """Counts impressions and clicks; remembers which answer showed what, for the clicks."""

    def __init__(self, registry: CollectorRegistry, max_answers: int = 100_000) -> None:
        """Register the counters in ``registry``; keep the labels of at most ``max_answers`` answers."""
        self.impressions = Counter(
            "headwater_impressions_total",
            "Items served in answers whose impressions are logged, by model version, arm and fallback.",
            LABELS,
            registry=registry,
        )
        self.clicks = Counter(
            "headwater_clicks_total",
            "Clicks posted to /v1/feedback, by the model version, arm and fallback of the answer that"
            " showed the item ('unknown' when that answer is not remembered).",
            LABELS,
            registry=registry,
        )
        self._answers: OrderedDict[str, tuple[str, str, str]] = OrderedDict()
        self._max = max_answers
        self._lock = threading.Lock()  # gRPC and REST handlers may run on different threads

    def served(
        self, request_id: str, session_id: str | None, items: int, answer: Mapping[str, Any], arm: str | None
    ) -> None:
        """Count ``items`` impressions of ``answer`` and remember its labels under its ids."""
        labels = (answer.get("model_version") or NONE, arm or NONE, answer.get("fallback") or NONE)
        self.impressions.labels(*labels).inc(items)
        with self._lock:
            for key in (request_id, session_id):
                if key is None:
                    continue
                self._answers[key] = labels
                self._answers.move_to_end(key)
            while len(self._answers) > self._max:
                self._answers.popitem(last=False)

    def clicked(self, request_id: str | None, session_id: str | None, arm: str | None) -> None:
        """Count one click, under the labels of the answer ``request_id`` (or ``session_id``) names."""
        labels = None
        with self._lock:
            for key in (request_id, session_id):
                if key is not None and key in self._answers:
                    labels = self._answers[key]
                    break
        if labels is None:
            labels = (UNKNOWN, arm or NONE, UNKNOWN)
        self.clicks.labels(*labels).inc()

    @property
    def remembered(self) -> int:
        """Answers whose labels are kept for their clicks."""
        return len(self._answers)
