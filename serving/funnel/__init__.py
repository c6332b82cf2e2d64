"""The recommendation funnel behind ``POST /v1/recommend``: retrieve, drop seen, rank, re-rank, rules.

Modules: :mod:`.config` (``FunnelConfig``, the ``funnel`` section of the serving config),
:mod:`.recent` (the per-user recent impressions and clicks in Redis), :mod:`.rules` (diversity
by category, editorial pins), :mod:`headwater.ranking.reranker` (the attention re-ranker over
recent clicks; torch, imported on use) and :mod:`.stages` (the
:class:`~headwater.serving.funnel.stages.Funnel` itself).
"""
