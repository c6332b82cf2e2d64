"""The ranking model's life: training sets, training, artifacts, evaluation, quality sets, skew, experiments.

The request path (:mod:`headwater.serving`) loads what this package trains and builds; this package
imports only :mod:`headwater.pipelines` and :mod:`headwater.registry`.
"""
