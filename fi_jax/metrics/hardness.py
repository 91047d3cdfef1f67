"""The hardness ratio of two OOD sets and its paired bootstrap CI (the leaderboard's "set A is
r times harder than set B").

For a group G of (model, detector) pairs, all scored on the same ID test images and on the same
images of the numerator set A and the denominator set B:

  ratio(G) = mean over G of FPR@95(id, A) / mean over G of FPR@95(id, B)

with FPR@95 as `fi_jax.metrics.reference.fpr_at_tpr` (ID-positive; threshold = the K-th
largest ID score, K = min{k : k / n_id >= tpr}; the fraction of OOD scores >= threshold).

Paired bootstrap: resample b = 0, 1, ..., B-1 draws, from one `np.random.default_rng(seed)`
and in this order, `i = rng.integers(0, n_id, n_id)` (ID test), `a = rng.integers(0, n_a, n_a)`
(set A), `o = rng.integers(0, n_b, n_b)` (set B), each with replacement; every pair of every
group is evaluated on that same resample (id[i], A[a]) and (id[i], B[o]), so the numerator
and the denominator, and the models and detectors, share the draw and their correlation
through the images is kept. The CI is the (1 - ci)/2 and (1 + ci)/2 quantiles of the B
resampled ratios (`np.quantile`, linear interpolation); a resample whose denominator mean is 0
gives an infinite ratio (a null bound in the JSON files).
"""
from __future__ import annotations

import math
from typing import Mapping, Sequence

import numpy as np

from fi_jax.metrics.reference import threshold_rank

# scores gathered per resample, at most (rows x examples) elements at a time
_CHUNK_ELEMS = 1 << 22


def fpr_rows(id_scores: np.ndarray, ood_scores: np.ndarray, tpr: float,
             id_draw: np.ndarray, ood_draw: np.ndarray) -> np.ndarray:
  """[P] FPR@TPR of every row of id_scores [P, n_id] / ood_scores [P, n_ood] on the resample
  (id_scores[:, id_draw], ood_scores[:, ood_draw]); row p equals
  `fpr_at_tpr(id_scores[p, id_draw], ood_scores[p, ood_draw], tpr)`."""
  n = len(id_draw)
  k = threshold_rank(n, tpr)
  p = id_scores.shape[0]
  out = np.empty(p, np.float64)
  step = max(1, _CHUNK_ELEMS // max(n, len(ood_draw), 1))
  for s in range(0, p, step):
    x = id_scores[s:s + step][:, id_draw]
    t = np.partition(x, n - k, axis=1)[:, n - k]
    out[s:s + step] = np.mean(ood_scores[s:s + step][:, ood_draw] >= t[:, None], axis=1)
  return out


class _Thresholds:
  """The FPR@TPR thresholds of P rows of ID scores [P, n] on resamples given as counts (how
  often each example is drawn): the K-th largest resampled score is the L-th smallest, L =
  n - K + 1, which lies among the lowest few L of each row's sorted scores; so only the
  counts of those (`head` = 2 L + 64 of them; every row when they hold fewer than L draws)
  are summed. Equal to np.partition's value on the resampled scores (`fpr_rows`)."""

  def __init__(self, id_scores: np.ndarray, tpr: float):
    n = id_scores.shape[1]
    self.order = np.argsort(id_scores, axis=1, kind="stable")
    self.sorted = np.take_along_axis(id_scores, self.order, axis=1)
    self.low = n - threshold_rank(n, tpr) + 1    # L, 1-based
    self.head = min(n, 2 * self.low + 64)

  def __call__(self, counts: np.ndarray) -> np.ndarray:
    """[P] thresholds of the resample with `counts` [n] draws per example."""
    cum = np.cumsum(counts[self.order[:, :self.head]], axis=1)
    short = cum[:, -1] < self.low
    if short.any():   # rare: fewer than L draws among the lowest `head` scores
      cum_all = np.cumsum(counts[self.order[short]], axis=1)
      pos_all = np.argmax(cum_all >= self.low, axis=1)
    pos = np.argmax(cum >= self.low, axis=1)
    t = self.sorted[np.arange(len(pos)), pos]
    if short.any():
      t[short] = self.sorted[short][np.arange(int(short.sum())), pos_all]
    return t


def _fpr_at(ood_scores: np.ndarray, ood_draw: np.ndarray, t: np.ndarray) -> np.ndarray:
  """[P] share of the resampled OOD scores (ood_scores[:, ood_draw]) >= t[p]."""
  out = np.empty(len(t), np.float64)
  step = max(1, _CHUNK_ELEMS // max(len(ood_draw), 1))
  for s in range(0, len(t), step):
    out[s:s + step] = np.mean(ood_scores[s:s + step][:, ood_draw] >= t[s:s + step, None],
                              axis=1)
  return out


def _ratio(num: np.ndarray, den: np.ndarray) -> float:
  d = float(np.mean(den))
  n = float(np.mean(num))
  if d == 0:
    return math.inf if n > 0 else math.nan
  return n / d


def hardness_bootstrap(id_scores: np.ndarray, num_scores: np.ndarray, den_scores: np.ndarray,
                       groups: Mapping[str, Sequence[int]], *, tpr: float = 0.95,
                       n_bootstrap: int = 1000, seed: int = 0,
                       ci: float = 0.95) -> dict[str, dict]:
  """The hardness ratio of every group and its paired bootstrap CI (module docstring).

  id_scores [P, n_id], num_scores [P, n_a], den_scores [P, n_b]: one row per (model,
  detector) pair, the examples in the same order in every row. `groups`: {name: the rows of
  the group}. Returns {name: {"ratio", "fpr_num", "fpr_den" (the means over the group),
  "n_pairs", "ci_low", "ci_high", "n_bootstrap"}} (CI bounds None without resamples)."""
  id_scores, num_scores, den_scores = (np.asarray(x, np.float64)
                                       for x in (id_scores, num_scores, den_scores))
  n_id, n_a, n_b = id_scores.shape[1], num_scores.shape[1], den_scores.shape[1]
  full = [np.arange(n) for n in (n_id, n_a, n_b)]
  fa = fpr_rows(id_scores, num_scores, tpr, full[0], full[1])
  fb = fpr_rows(id_scores, den_scores, tpr, full[0], full[2])
  rows = {g: np.asarray(list(r), np.int64) for g, r in groups.items()}
  draws = {g: np.empty(n_bootstrap) for g in rows}
  rng = np.random.default_rng(seed)
  thresholds = _Thresholds(id_scores, tpr) if n_bootstrap else None
  for b in range(n_bootstrap):
    i = rng.integers(0, n_id, n_id)
    a = rng.integers(0, n_a, n_a)
    o = rng.integers(0, n_b, n_b)
    t = thresholds(np.bincount(i, minlength=n_id))   # one ID resample for both sets
    ra = _fpr_at(num_scores, a, t)
    rb = _fpr_at(den_scores, o, t)
    for g, r in rows.items():
      draws[g][b] = _ratio(ra[r], rb[r])
  out = {}
  for g, r in rows.items():
    d = draws[g]
    lo = hi = None
    if n_bootstrap:
      with np.errstate(invalid="ignore"):
        lo, hi = (float(np.quantile(d, q)) for q in ((1 - ci) / 2, (1 + ci) / 2))
    out[g] = {"ratio": _ratio(fa[r], fb[r]), "fpr_num": float(np.mean(fa[r])),
              "fpr_den": float(np.mean(fb[r])), "n_pairs": int(len(r)), "ci_low": lo,
              "ci_high": hi, "n_bootstrap": n_bootstrap}
  return out

