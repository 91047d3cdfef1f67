"""OpenMax (Bendale & Boult, CVPR 2016) as OpenOOD implements it: per-class Weibull models of
the logit-space distances of correctly classified fit rows to their class mean, and the
recalibrated 'unknown' probability (docs/detectors.md#openmax).

The Weibull fit is libMR's `MR.fit_high(tail, len(tail))` (libMR 0.1.9, the library OpenOOD
calls): the tail is sorted in decreasing order and shifted to start at 1 (translate_amount = 1
minus its smallest value); x = log of the shifted tail is normalised to x0 = (x - max) / range
in [-1, 0], and the Gumbel scale sigma of x0 is the root of libMR's likelihood equation
sigma + mean(x0) - sum x0 e^(x0/sigma) / sum e^(x0/sigma) = 0, found as libMR finds it: the
bracket grown from sqrt(6) std(x0) / pi by halving / doubling, then the dfzero (Brent) root
finder with tol = 1e-6, whose stopping rule leaves sigma up to ~2e-6 from the exact root. The
same iteration is run here (in float64, per class), so the parameters equal libMR's, not the
exact MLE (they differ by a few 1e-6 relative; docs/detectors.md#openmax).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from fi_jax.detectors import stats
from fi_jax.detectors.core import HIGHEST, Detector, Outputs, cdtype, fc, require

_LIBMR_TOL = 1e-6                       # weibull_fit's `tol` in libMR 0.1.9


def _scale_eq(sig: float, x0: np.ndarray, xbar: float) -> float:
  """libMR's likelihood equation in the Gumbel scale sigma (root = the MLE)."""
  e = np.exp(x0 / sig)
  return sig + xbar - float(np.sum(e * x0)) / float(np.sum(e))


def _dfzero(a: float, b: float, x0: np.ndarray, xbar: float, tol: float) -> float:
  """The root of _scale_eq in [a, b] by libMR's dfzero (Brent: bisection, secant and inverse
  quadratic steps; stops when half the bracket is <= 2 tol max(|b|, 1))."""
  f = lambda s: _scale_eq(s, x0, xbar)
  fa, fb = f(a), f(b)
  if fa == 0:
    return a
  if fb == 0:
    return b
  c, fc, d, e = 0.0, fb, 0.0, 0.0
  while fb != 0:
    if (fb > 0) == (fc > 0):
      c, fc = a, fa
      d = e = b - a
    if abs(fc) < abs(fb):
      a, b, c = b, c, b
      fa, fb, fc = fb, fc, fb
    m = 0.5 * (c - b)
    tolerance = 2.0 * tol * max(abs(b), 1.0)
    if abs(m) <= tolerance or fb == 0.0:
      break
    if abs(e) < tolerance or abs(fa) <= abs(fb):
      d = e = m
    else:
      s = fb / fa
      if a == c:
        p, q = 2.0 * m * s, 1.0 - s
      else:
        q, r = fa / fc, fb / fc
        p = s * (2.0 * m * q * (q - r) - (b - a) * (r - 1.0))
        q = (q - 1.0) * (r - 1.0) * (s - 1.0)
      if p > 0:
        q = -q
      else:
        p = -p
      if 2.0 * p < 3.0 * m * q - abs(tolerance * q) and p < abs(0.5 * e * q):
        e, d = d, p / q
      else:
        d = e = m
    a, fa = b, fb
    if abs(d) > tolerance:
      b = b + d
    elif b > c:
      b = b - tolerance
    else:
      b = b + tolerance
    fb = f(b)
  return b


def _libmr_sigma(x0: np.ndarray) -> float:
  """libMR's Gumbel scale of the normalised log-tail x0 (max 0, min -1)."""
  n = len(x0)
  xbar = float(np.sum(x0)) / n
  sig = np.sqrt(6.0) * float(np.sqrt(np.sum((x0 - xbar) ** 2) / (n - 1))) / np.pi
  with np.errstate(under="ignore"):
    if _scale_eq(sig, x0, xbar) > 0:
      upper, lower = sig, 0.5 * sig
      while _scale_eq(lower, x0, xbar) > 0:
        upper, lower = lower, 0.5 * lower
        if lower < np.finfo(np.float64).tiny:
          return float("nan")
    else:
      lower, upper = sig, 2.0 * sig
      while _scale_eq(upper, x0, xbar) < 0:
        lower, upper = upper, 2.0 * upper
        if not np.isfinite(upper):
          return float("nan")
    return _dfzero(lower, upper, x0, xbar, _LIBMR_TOL)


def weibull_fit_high(tails: np.ndarray, mask: np.ndarray):
  """libMR fit_high on every row of `tails` [C, T] (entries where `mask` is False are
  ignored): (scale [C], shape [C], small [C], valid [C]). A row with < 2 entries or no spread
  is not valid (libMR cannot fit it); its parameters are placeholders (1, 1)."""
  tails = np.asarray(tails, np.float64)
  mask = np.asarray(mask, bool)
  c = len(tails)
  scale, shape, small = np.ones(c), np.ones(c), np.zeros(c)
  valid = np.zeros(c, bool)
  for i in range(c):
    t = np.sort(tails[i][mask[i]])[::-1]                  # libMR sorts in decreasing order
    if not len(t):
      continue
    small[i] = t[-1]
    x = np.log(t + 1.0 - t[-1])
    maxx, rng = x.max(), x.max() - x.min()
    if len(t) < 2 or not rng > 0:
      continue
    x0 = (x - maxx) / rng
    sig = _libmr_sigma(x0)
    if not np.isfinite(sig):
      continue
    with np.errstate(under="ignore"):
      mu = sig * np.log(float(np.sum(np.exp(x0 / sig))) / len(t))
    scale[i], shape[i], valid[i] = np.exp(rng * mu + maxx), 1.0 / (rng * sig), True
  return scale, shape, small, valid


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
    a = int(self.hparams["alpha"])
    a_eff = min(a, z.shape[-1])
    # omega is 0 off the top-alpha logits, so w_c is needed only there: the distances and the
    # Weibull CDF of those alpha classes per row ([N, alpha], not [N, C]). The top-k selects on
    # the model's float32 logits when they are float32 (the same order and ties as in the
    # compute dtype; a float64 top-k is ~100x slower on CPUs)
    raw = jnp.asarray(logits)
    _, top = jax.lax.top_k(raw if raw.dtype == jnp.float32 else z, a_eff)
    d2 = (jnp.sum(z * z, -1, keepdims=True)
          - 2.0 * jnp.einsum("nc,nkc->nk", z, state["mav"][top], precision=HIGHEST)
          + state["mav_sq"][top])
    y = jnp.sqrt(jnp.maximum(d2, 0.0)) + 1.0 - state["small"][top]
    ok = state["valid"][top] & (y >= 0)
    w = jnp.where(ok, -jnp.expm1(-(jnp.where(ok, y, 0.0) / state["scale"][top])
                                 ** state["shape"][top]), 0.0)
    weights = (a - jnp.arange(a_eff, dtype=z.dtype)) / a
    zt = jnp.take_along_axis(z, top, -1)
    rows = jnp.arange(z.shape[0])[:, None]
    v = z.at[rows, top].set(zt * (1.0 - w * weights))
    v0 = jnp.sum(zt * w * weights, -1)
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
