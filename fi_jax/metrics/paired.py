"""The paired bootstrap of two detectors (or models) on the same images (`report compare
--pair`)."""
from __future__ import annotations

import numpy as np

from fi_jax.metrics.reference import auroc, fpr_at_tpr


def paired_bootstrap(a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray], *,
                     n_bootstrap: int = 1000, seed: int = 0, tpr: float = 0.95,
                     ci: float = 0.95) -> dict[str, float]:
  """Paired bootstrap of AUROC and FPR@TPR differences (a - b) on the same images.

  `a` and `b` are (ID scores, OOD scores) of two detectors / models on the *same* examples in
  the same order. Each resample draws ID and OOD examples independently with replacement
  (sizes n_id and n_ood, as fi_jax.metrics' CIs) and applies the same draw to both, so that
  the per-image correlation between a and b is kept. Returns the observed differences, the
  percentile CI at level `ci`, and a two-sided p-value for "no difference":
  p = min(1, 2 min((1 + #{d* <= 0}) / (B + 1), (1 + #{d* >= 0}) / (B + 1))).
  """
  (ai, ao), (bi, bo) = [tuple(np.asarray(x, np.float64) for x in p) for p in (a, b)]
  if ai.shape != bi.shape or ao.shape != bo.shape:
    raise ValueError(f"Paired scores must cover the same examples: ID {ai.shape} vs "
                     f"{bi.shape}, OOD {ao.shape} vs {bo.shape}.")
  fns = {"auroc": auroc, "fpr95": lambda i, o: fpr_at_tpr(i, o, tpr)}
  rng = np.random.default_rng(seed)
  draws = {k: [] for k in fns}
  for _ in range(n_bootstrap):
    i = rng.integers(0, len(ai), len(ai))
    o = rng.integers(0, len(ao), len(ao))
    for k, fn in fns.items():
      draws[k].append(fn(ai[i], ao[o]) - fn(bi[i], bo[o]))
  out = {"n_id": len(ai), "n_ood": len(ao), "n_bootstrap": n_bootstrap}
  for k, fn in fns.items():
    d = np.asarray(draws[k])
    out[f"{k}_a"], out[f"{k}_b"] = fn(ai, ao), fn(bi, bo)
    out[f"{k}_diff"] = out[f"{k}_a"] - out[f"{k}_b"]
    if n_bootstrap:
      out[f"{k}_diff_ci_low"] = float(np.quantile(d, (1 - ci) / 2))
      out[f"{k}_diff_ci_high"] = float(np.quantile(d, 1 - (1 - ci) / 2))
      out[f"{k}_p"] = float(min(1.0, 2 * min((1 + np.sum(d <= 0)) / (n_bootstrap + 1),
                                              (1 + np.sum(d >= 0)) / (n_bootstrap + 1))))
  return out
