"""Ranks of several detectors over several blocks (models) and the Friedman test with the
Nemenyi critical difference (Demšar, "Statistical comparisons of classifiers over multiple data
sets", JMLR 2006), as the leaderboard reports them.

`values[i, j]` is the score of treatment j (a detector) in block i (a model); every block has
every treatment. With N blocks and k treatments:

  R[i, j]  rank of treatment j within block i, 1 = best (lowest value when
           `lower_is_better`), tied values share the mean of the ranks they span;
  Rbar[j]  = (1/N) sum_i R[i, j], the mean rank;
  chi2_F   = (12 / (N k (k+1)) sum_j S_j^2 - 3 N (k+1)) / C, S_j = sum_i R[i, j], with the tie
           correction C = 1 - sum over every group of t tied values in a block of (t^3 - t)
           / (N k (k^2 - 1)) (C = 1 without ties, and then chi2_F = 12 N / (k (k+1))
           (sum_j Rbar_j^2 - k (k+1)^2 / 4), Demšar's eq.); p = P(chi2 with k-1 df > chi2_F)
           (`scipy.stats.friedmanchisquare` computes the same statistic);
  F_F      = (N-1) chi2_F / (N (k-1) - chi2_F), Iman and Davenport's statistic, F-distributed
           with (k-1, (k-1)(N-1)) degrees of freedom (inf, p = 0 when the blocks agree
           perfectly);
  CD       = q_alpha sqrt(k (k+1) / (6 N)), Nemenyi's critical difference: two treatments
           whose mean ranks differ by more than CD differ at level alpha; q_alpha is the
           studentized range quantile q(1 - alpha; k, inf) / sqrt(2) (Demšar's table:
           1.960, 2.343, 2.569, 2.728, ... for k = 2, 3, 4, 5).

The chi-square, F and studentized range distributions come from scipy, which scikit-learn (a
runtime requirement) depends on.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np


def block_ranks(values: np.ndarray, lower_is_better: bool = True) -> np.ndarray:
  """[N, k] ranks within each row, 1 = best, ties as the mean of the ranks they span."""
  from scipy import stats
  v = np.asarray(values, np.float64)
  if v.ndim != 2 or not np.isfinite(v).all():
    raise ValueError(f"block_ranks needs a finite [blocks, treatments] array, got shape "
                     f"{v.shape}.")
  return stats.rankdata(v if lower_is_better else -v, axis=1, method="average")


def _tie_correction(ranks: np.ndarray) -> float:
  """C = 1 - sum (t^3 - t) / (N k (k^2 - 1)) over the groups of tied ranks of every block."""
  n, k = ranks.shape
  ties = 0.0
  for row in ranks:
    _, t = np.unique(row, return_counts=True)
    ties += float(np.sum(t.astype(np.float64) ** 3 - t))
  return 1.0 - ties / (n * k * (k * k - 1))


def nemenyi_q(k: int, alpha: float = 0.05) -> float:
  """q_alpha of the Nemenyi test for k treatments: q(1 - alpha; k, inf) / sqrt(2)."""
  from scipy import stats
  return float(stats.studentized_range.ppf(1 - alpha, k, np.inf) / math.sqrt(2))


def friedman(values: np.ndarray, lower_is_better: bool = True,
             alpha: float = 0.05) -> dict[str, Any]:
  """Mean ranks, the Friedman test and the Nemenyi CD of `values` [N blocks, k treatments]
  (the module docstring has the formulas). Returns n_blocks, n_treatments, mean_ranks [k],
  and, when N >= 2 and k >= 2, chi2, df, p, iman_davenport_f, f_df1, f_df2, f_p, alpha,
  q_alpha, cd (None otherwise)."""
  from scipy import stats
  ranks = block_ranks(values, lower_is_better)
  n, k = ranks.shape
  out: dict[str, Any] = {"n_blocks": n, "n_treatments": k,
                         "mean_ranks": ranks.mean(axis=0).tolist(), "alpha": alpha}
  keys = ("chi2", "df", "p", "iman_davenport_f", "f_df1", "f_df2", "f_p", "q_alpha", "cd")
  out.update(dict.fromkeys(keys))
  if n < 2 or k < 2:
    return out
  s = ranks.sum(axis=0)
  c = _tie_correction(ranks)
  if c <= 0:   # every block ties every treatment: no ranking information
    chi2 = 0.0
  else:
    chi2 = (12.0 / (n * k * (k + 1)) * float(np.sum(s * s)) - 3.0 * n * (k + 1)) / c
  chi2 = max(chi2, 0.0)
  denom = n * (k - 1) - chi2
  f = (n - 1) * chi2 / denom if denom > 0 else math.inf
  q = nemenyi_q(k, alpha)
  out.update(chi2=chi2, df=k - 1, p=float(stats.chi2.sf(chi2, k - 1)), iman_davenport_f=f,
             f_df1=k - 1, f_df2=(k - 1) * (n - 1),
             f_p=0.0 if math.isinf(f) else float(stats.f.sf(f, k - 1, (k - 1) * (n - 1))),
             q_alpha=q, cd=q * math.sqrt(k * (k + 1) / (6.0 * n)))
  return out
