"""fi_jax.metrics vs scikit-learn / numpy: wall time for all OOD metrics together.

    .venv/bin/python bench/metrics.py [--repeats 3]

1. pooled: all metrics on 10^6 ID + 10^5 OOD scores (sklearn sorts once per metric,
   fi_jax sorts once in all);
2. macro: Fi-ImageNet-1k-sized per-class metrics (48,365 ID, 655 OOD images in 522 classes)
   vs a loop of sklearn calls per class;
3. bootstrap: 100 resamples of the Fi-ImageNet-sized set vs a loop of sklearn calls.

fi_jax times are warm (compiled beforehand) and include the device_get of the results. Each
line also checks that both sides agree (max abs difference over the metrics).
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402

jax.config.update("jax_enable_x64", True)

from sklearn.metrics import average_precision_score, roc_auc_score, roc_curve  # noqa: E402

from fi_jax.metrics import device as metrics

KEYS = ("auroc", "fpr95", "fpr95_ood_positive", "fpr95_ninco", "aupr_in", "aupr_out",
        "detection_error")


def sklearn_metrics(x: np.ndarray, y: np.ndarray, tpr: float = 0.95) -> dict[str, float]:
  """The reference: every metric the way OpenOOD / NINCO code computes it."""
  lab = np.r_[np.ones(len(x)), np.zeros(len(y))]
  s = np.r_[x, y]
  out = {"auroc": roc_auc_score(lab, s)}
  fpr, tp, _ = roc_curve(lab, s, drop_intermediate=False)
  out["fpr95"] = fpr[np.argmax(tp >= tpr)]
  out["detection_error"] = np.min(0.5 * (1 - tp) + 0.5 * fpr)
  fpr, tp, _ = roc_curve(1 - lab, -s, drop_intermediate=False)
  out["fpr95_ood_positive"] = fpr[np.argmax(tp >= tpr)]
  out["fpr95_ninco"] = np.mean(y >= np.quantile(x, 1 - tpr))
  out["aupr_in"] = average_precision_score(lab, s)
  out["aupr_out"] = average_precision_score(1 - lab, -s)
  return out


def timed(fn, repeats: int):
  best, res = np.inf, None
  for _ in range(repeats):
    t = time.perf_counter()
    res = fn()
    best = min(best, time.perf_counter() - t)
  return best, res


def report(name: str, t_ref: float, t_jax: float, diff: float) -> None:
  print(f"{name:<44s} sklearn {t_ref:8.3f} s   fi_jax {t_jax:8.3f} s   "
        f"ratio {t_ref / t_jax:7.1f}x   max|diff| {diff:.1e}", flush=True)


def bench_pooled(rng, repeats):
  x, y = rng.normal(1.0, 1.0, 1_000_000), rng.normal(0.0, 1.0, 100_000)
  metrics.ood_metrics(x, y)                                  # compile
  t_jax, got = timed(lambda: metrics.ood_metrics(x, y), repeats)
  t_ref, ref = timed(lambda: sklearn_metrics(x, y), repeats)
  report("pooled, 1e6 ID + 1e5 OOD, all metrics", t_ref, t_jax,
         max(abs(got[k] - ref[k]) for k in KEYS))


def fi_sized(rng):
  x = np.round(rng.normal(1.0, 1.0, 48_365), 3)
  y = np.round(rng.normal(0.0, 1.0, 655), 3)
  groups = np.r_[np.arange(522), rng.integers(0, 522, 655 - 522)]
  return x, y, rng.permutation(groups)


def bench_macro(rng, repeats):
  x, y, g = fi_sized(rng)
  classes = np.unique(g)

  def ref():
    per = [sklearn_metrics(x, y[g == c]) for c in classes]
    return {k: np.mean([p[k] for p in per]) for k in KEYS}
  metrics.ood_metrics(x, y, ood_groups=g)
  t_jax, got = timed(lambda: metrics.ood_metrics(x, y, ood_groups=g), repeats)
  t_ref, want = timed(ref, 1)
  report("macro, 48k ID vs 522 classes (655 OOD)", t_ref, t_jax,
         max(abs(got[k + "_macro"] - want[k]) for k in KEYS))


def bench_bootstrap(rng, repeats, n_boot=100):
  x, y, _ = fi_sized(rng)
  ii, oo = metrics.bootstrap_indices(len(x), len(y), n_boot, seed=0)
  xs, ys = np.sort(x), np.sort(y)

  def ref():
    vals = [sklearn_metrics(xs[ii[b]], ys[oo[b]]) for b in range(n_boot)]
    return {k: np.quantile([v[k] for v in vals], [0.025, 0.975]) for k in KEYS}
  metrics.ood_metrics(x, y, n_bootstrap=n_boot)
  t_jax, got = timed(lambda: metrics.ood_metrics(x, y, n_bootstrap=n_boot), repeats)
  t_ref, want = timed(ref, 1)
  diff = max(max(abs(got[k + "_ci_low"] - want[k][0]), abs(got[k + "_ci_high"] - want[k][1]))
             for k in KEYS)
  report(f"bootstrap CIs, {n_boot} resamples of 48k + 655", t_ref, t_jax, diff)


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--repeats", type=int, default=3, help="timed runs (best is reported)")
  args = parser.parse_args()
  print(f"jax {jax.__version__} on {jax.devices()[0].platform}, x64 on, best of "
        f"{args.repeats} (sklearn side of macro / bootstrap: one run)")
  rng = np.random.default_rng(0)
  bench_pooled(rng, args.repeats)
  bench_macro(rng, args.repeats)
  bench_bootstrap(rng, args.repeats)


if __name__ == "__main__":
  main()
