"""Numpy reference implementations of the OOD metrics the report's plots and the paired
bootstrap use; they equal fi_jax.metrics.device's values (tests/metrics)."""
from __future__ import annotations

import math

import numpy as np


def auroc(id_scores: np.ndarray, ood_scores: np.ndarray) -> float:
  """P(s_id > s_ood) + 1/2 P(tie) (Mann-Whitney), the same value as fi_jax.metrics'."""
  n_id, n_ood = len(id_scores), len(ood_scores)
  _, inverse, counts = np.unique(np.concatenate([id_scores, ood_scores]), return_inverse=True,
                                 return_counts=True)
  ranks = (np.cumsum(counts) - (counts - 1) / 2.0)[inverse]   # average ranks of ties, 1-based
  return float((ranks[:n_id].sum() - n_id * (n_id + 1) / 2) / (n_id * n_ood))


def threshold_rank(n: int, tpr: float = 0.95) -> int:
  """K = min{k : k / n >= tpr}: the rank (1 = largest) of the ID score that is `fpr_at_tpr`'s
  threshold among n ID scores."""
  return next(k for k in range(max(1, int(math.floor(tpr * n)) - 1), n + 1)
              if float(k) / float(n) >= tpr)


def fpr_at_tpr(id_scores: np.ndarray, ood_scores: np.ndarray, tpr: float = 0.95) -> float:
  """ID-positive FPR@TPR as fi_jax.metrics' `fpr95`: threshold t = the K-th largest ID score,
  K = min{k : k / n_id >= tpr}; the fraction of OOD scores >= t."""
  n = len(id_scores)
  k = threshold_rank(n, tpr)
  t = np.partition(np.asarray(id_scores), n - k)[n - k]
  return float(np.mean(np.asarray(ood_scores) >= t))


def roc_curve(id_scores: np.ndarray, ood_scores: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """(FPR, TPR) at every distinct threshold, ID positive, from (0, 0) to (1, 1)."""
  s = np.concatenate([id_scores, ood_scores])
  y = np.concatenate([np.ones(len(id_scores)), np.zeros(len(ood_scores))])
  order = np.argsort(-s, kind="stable")
  s, y = s[order], y[order]
  last = np.r_[np.flatnonzero(np.diff(s) != 0), len(s) - 1]
  tp, fp = np.cumsum(y)[last], np.cumsum(1 - y)[last]
  return (np.r_[0.0, fp / max(1, len(ood_scores))], np.r_[0.0, tp / max(1, len(id_scores))])
