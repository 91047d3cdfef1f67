"""OpenMax (Bendale & Boult, CVPR 2016) as OpenOOD implements it: per-class Weibull models of
the logit-space distances of correctly classified fit rows to their class mean, and the
recalibrated 'unknown' probability (docs/detectors.md#openmax).

The Weibull fit follows libMR's `MR.fit_high(tail, len(tail))` parameterisation: the tail is
shifted to start at 1 (translate_amount = 1 minus its smallest value), and (scale, shape) is
the maximum-likelihood Weibull fit of the shifted tail, i.e. the Gumbel MLE of its logarithm
in libMR's normalised coordinates x0 = (log y - max) / range in [-1, 0]. fi_jax solves the
likelihood equation to machine precision by bisection; libMR stops its root finder at an
absolute tolerance of 1e-6 on the normalised Gumbel scale, so its parameters can differ from
the exact MLE by a few 1e-6 relative.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from fi_jax.detectors import stats
from fi_jax.detectors.core import Detector, Outputs, cdtype, fc, matmul, require


def weibull_fit_high(tails: np.ndarray, mask: np.ndarray, iters: int = 200):
  """libMR fit_high on every row of `tails` [C, T] (entries where `mask` is False are
  ignored): (scale [C], shape [C], small [C], valid [C]). A row with < 2 entries or no spread
  is not valid (libMR cannot fit it); its parameters are placeholders (1, 1)."""
  tails = np.asarray(tails, np.float64)
  mask = np.asarray(mask, bool)
  cnt = mask.sum(1)
  small = np.where(mask, tails, np.inf).min(1)
  small = np.where(cnt > 0, small, 0.0)
  y = np.where(mask, tails - small[:, None] + 1.0, 1.0)            # translate_amount = 1
  x = np.log(y)
  maxx = np.where(mask, x, -np.inf).max(1)
  maxx = np.where(cnt > 0, maxx, 0.0)
  rng = maxx                                                         # min log y = log 1 = 0
  valid = (cnt >= 2) & (rng > 0)
  rng = np.where(valid, rng, 1.0)
  x0 = np.where(mask, (x - maxx[:, None]) / rng[:, None], 0.0)        # in [-1, 0], max 0
  n = np.maximum(cnt, 1)
  xbar = x0.sum(1) / n

  def g(sig):                                  # sigma + mean(x0) - weighted mean: root = MLE
    e = np.where(mask, np.exp(x0 / sig[:, None]), 0.0)
    return sig + xbar - (e * x0).sum(1) / np.maximum(e.sum(1), 1e-300)

  # g(sigma) < 0 as sigma -> 0 (mean(x0) < 0 = max) and g >= sigma - 1 > 0 above 1
  lo, hi = np.zeros(len(tails)), np.ones(len(tails))
  for _ in range(iters):
    mid = 0.5 * (lo + hi)
    with np.errstate(under="ignore"):
      pos = g(mid) > 0
    hi, lo = np.where(pos, mid, hi), np.where(pos, lo, mid)
  sig = np.where(valid, 0.5 * (lo + hi), 1.0)
  with np.errstate(under="ignore", divide="ignore"):
    mu = sig * np.log(np.where(mask, np.exp(x0 / sig[:, None]), 0.0).sum(1) / n)
  scale = np.where(valid, np.exp(rng * mu + maxx), 1.0)
  shape = np.where(valid, 1.0 / (rng * sig), 1.0)
  return scale, shape, small, valid


@jax.jit
def _distances(z, mav, mav_sq):
  """Euclidean distances [N, C] of logit rows to every class mean (compute dtype)."""
  z = fc(z)
  d2 = jnp.sum(z * z, -1, keepdims=True) - 2.0 * matmul(z, mav.T) + mav_sq[None, :]
  return jnp.sqrt(jnp.maximum(d2, 0.0))


def _logits_view(train):
  """The fit set with the logits in place of the features (class means of the logits)."""
  for _, chunk in stats.chunks(train):
    require(chunk.logits is not None and chunk.labels is not None,
            "openmax needs fit Outputs with logits and labels.")
    yield Outputs(chunk.logits, chunk.logits, chunk.labels)


class OpenMax(Detector):
  """OpenMax (OpenOOD's `openmax`): mean activation vectors MAV_c = mean logits of the fit rows
  labelled and predicted c; per class a Weibull (libMR fit_high) of the `tail` largest
  Euclidean distances of those rows to MAV_c. Test: w_c = WeibullCDF(|z - MAV_c|), omega = the
  weights (alpha + 1 - r) / alpha of the top-`alpha` logits (rank r = 1..alpha, else 0),
  v_c = z_c (1 - w_c omega_c), v_0 = sum_c z_c w_c omega_c; s = -softmax([v, v_0])_0 (minus the
  unknown probability). tail = 20, alpha = 3 (OpenOOD). A class without a fittable tail (< 2
  correctly classified rows or no spread) gets w_c = 0. A one-shot fit iterator uses a seeded
  `max_rows` row subset for the distances (exact when the set is smaller)."""
  name, needs = "openmax", frozenset({"logits"})
  fit_needs = frozenset({"logits", "labels"})
  defaults = {"tail": 20, "alpha": 3, "max_rows": 1_000_000, "seed": 0}
  score_only = frozenset({"alpha"})

  @classmethod
  def validate(cls, hp):
    require(isinstance(hp["tail"], (int, np.integer)) and hp["tail"] >= 2,
            "openmax: tail must be an int >= 2.")
    require(isinstance(hp["alpha"], (int, np.integer)) and hp["alpha"] >= 1,
            "openmax: alpha must be an int >= 1.")
    require(int(hp["max_rows"]) >= 1, "openmax: max_rows must be >= 1.")

  def _fit(self, train, head):
    first, train = stats.peek(train)
    require(first.logits is not None, "openmax needs fit Outputs with logits.")
    c = int(np.shape(first.logits)[1])
    if stats.is_reiterable(train):
      st = stats.moments(_Reiter(train), num_classes=c, group="correct")
      src = train
    else:
      sample = stats.RowSample(self.hparams["max_rows"], self.hparams["seed"],
                               ("logits", "labels"))
      st = stats.moments(_logits_view(train), num_classes=c, group="correct",
                         on_chunk=sample.add)
      s = sample.result()
      src = Outputs(None, s["logits"], s["labels"])
    mav, valid_mav = stats.class_means(st)
    t = int(self.hparams["tail"])
    cls_top, dist_top = np.zeros((0,), np.int64), np.zeros((0,))
    for _, chunk in stats.chunks(src):
      z = np.asarray(chunk.logits, np.float64)
      y = np.asarray(chunk.labels).astype(np.int64)
      ok = (y >= 0) & (y < c) & (z.argmax(1) == y)
      d = np.sqrt(np.sum((z[ok] - mav[y[ok]]) ** 2, axis=1))
      cls_top, dist_top = _top_per_class(np.concatenate([cls_top, y[ok]]),
                                         np.concatenate([dist_top, d]), t)
    tails = np.zeros((c, t))
    mask = np.zeros((c, t), bool)
    rank = _rank_in_class(cls_top, dist_top)
    tails[cls_top, rank] = dist_top
    mask[cls_top, rank] = True
    scale, shape, small, valid = weibull_fit_high(tails, mask)
    cd = cdtype()
    mav = jnp.asarray(mav, cd)
    return {"mav": mav, "mav_sq": jnp.sum(mav * mav, -1), "scale": jnp.asarray(scale, cd),
            "shape": jnp.asarray(shape, cd), "small": jnp.asarray(small, cd),
            "valid": jnp.asarray(valid & valid_mav)}

  def _score(self, state, features, logits):
    z = fc(logits)
    d = _distances(z, state["mav"], state["mav_sq"])
    y = d + 1.0 - state["small"]
    ok = state["valid"][None, :] & (y >= 0)
    w = jnp.where(ok, -jnp.expm1(-(jnp.where(ok, y, 0.0) / state["scale"]) ** state["shape"]),
                  0.0)
    a = int(self.hparams["alpha"])
    a_eff = min(a, z.shape[-1])
    _, top = jax.lax.top_k(z, a_eff)
    weights = (a - jnp.arange(a_eff, dtype=z.dtype)) / a
    omega = jnp.zeros_like(z).at[jnp.arange(z.shape[0])[:, None], top].set(weights[None, :])
    v = z * (1.0 - w * omega)
    v0 = jnp.sum(z * w * omega, -1)
    lse = jnp.logaddexp(jax.nn.logsumexp(v, -1), v0)
    return -jnp.exp(v0 - lse)


class _Reiter:
  """A re-iterable logits view of a re-iterable fit set."""

  def __init__(self, train):
    self.train = train

  def __iter__(self):
    return _logits_view(self.train)


def _rank_in_class(cls: np.ndarray, dist: np.ndarray) -> np.ndarray:
  """Position of each entry among its class's entries, by decreasing distance."""
  order = np.lexsort((-dist, cls))
  rank = np.empty(len(cls), np.int64)
  sc = cls[order]
  starts = np.r_[0, np.flatnonzero(np.diff(sc)) + 1]
  pos = np.arange(len(sc)) - np.repeat(starts, np.diff(np.r_[starts, len(sc)]))
  rank[order] = pos
  return rank


def _top_per_class(cls: np.ndarray, dist: np.ndarray, t: int):
  """The t largest distances of every class (ties: the order is irrelevant to the fit)."""
  if not len(cls):
    return cls, dist
  keep = _rank_in_class(cls, dist) < t
  return cls[keep], dist[keep]
