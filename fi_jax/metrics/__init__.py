"""Stage 5, metrics: the in-device OOD metrics with bootstrap CIs (`device`, one jitted program
per set size), the numpy reference implementation the report's plots and tests use
(`reference`), multi-label (ReaL-style) accuracy (`multilabel`), the paired bootstrap of two detectors on the same images (`paired`), and for
the leaderboard the hardness ratio of two OOD sets with its paired bootstrap (`hardness`) and
the detectors' ranks with the Friedman test and Nemenyi CD (`ranking`).

May import: fi_jax.common, fi_jax.data, fi_jax.models, fi_jax.extract, fi_jax.detectors.
"""
from fi_jax.metrics.device import (
                                   METRICS,
                                   bootstrap_indices,
                                   classification_accuracy,
                                   ood_metrics,
                                   ood_metrics_and_table,
                                   per_group_metrics,
)

__all__ = ["METRICS", "bootstrap_indices", "classification_accuracy", "ood_metrics",
           "ood_metrics_and_table", "per_group_metrics"]
