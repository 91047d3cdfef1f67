"""OOD detection metrics in JAX: exact (sklearn / numpy-equal), jitted, one device_get.

Scores are oriented higher = more in-distribution (ID). With S_in (n_id scores) and S_out
(n_ood scores), every metric below is defined exactly, with ties, as the reference it names:

* ``auroc``: P(s_in > s_out) + 1/2 P(s_in = s_out) (Mann-Whitney with half ties), which is
  ``sklearn.metrics.roc_auc_score(y=ID is 1, scores)``; label-symmetric.
* ``fpr95`` (convention D, ID positive; OpenOOD v1.0 era, classic papers): take the ROC curve
  of ``roc_curve(y=ID is 1, scores, drop_intermediate=False)``, i.e. one point per distinct
  score, thresholds s >= t; report the FPR (fraction of OOD accepted) at its first point whose
  TPR (fraction of ID accepted) >= ``tpr``. Ties at the threshold count as accepted.
  Equivalently t = the K-th largest ID score, K = min{k : k / n_id >= tpr} (float64 test, as
  sklearn), FPR = #{s_out >= t} / n_ood.
* ``fpr95_ood_positive`` (convention E, OpenOOD v1.5 since 2023-08): the same rule with OOD as
  the positive class and negated scores: the fraction of ID images *rejected* when at least
  ``tpr`` of the OOD images are rejected. Not comparable to ``fpr95``.
* ``fpr95_ninco`` (convention A, NINCO): t = ``np.quantile(S_in, 1 - tpr)`` (linear
  interpolation, numpy's exact arithmetic), FPR = #{s_out >= t} / n_ood. Because of the
  interpolation it is the only metric here that is not invariant to monotone score transforms.
* ``aupr_in`` / ``aupr_out``: average precision, ``sklearn.metrics.average_precision_score``
  (AP = sum_n (R_n - R_{n-1}) P_n over distinct thresholds), with ID positive and the scores
  (``in``), or OOD positive and the negated scores (``out``). Not OpenOOD's trapezoid AUPR.
* ``detection_error``: min over all points of the ROC curve (distinct thresholds plus the
  (0, 0) point) of 0.5 (1 - TPR) + 0.5 FPR (class-balanced; <= 0.5).
* ``tnr95`` = 1 - ``fpr95``.

sklearn's default ``roc_curve(..., drop_intermediate=True)`` (used in OpenOOD's code) returns
the same ``fpr95`` / ``fpr95_ood_positive`` except in one tie-only corner case: when the first
point reaching ``tpr`` is collinear with both neighbours (two consecutive tie blocks with
identical ID and OOD counts), sklearn drops it and the next kept point gives a larger FPR.
Without ties the two always agree. fi_jax reports the undropped (threshold-exact) value.

Aggregation: the plain keys pool all OOD images. With ``ood_groups`` (an int class id per OOD
image) each class is also scored against all ID images and the unweighted mean over classes is
reported under ``<metric>_macro`` (NINCO's headline); ids < 0 mean "no class" and are left out
of the macro average only. ``per_group_metrics`` returns the per-class table.

Bootstrap (``n_bootstrap > 0``): ID and OOD are resampled independently with replacement
(resample sizes n_id and n_ood, seeded), all pooled metrics are recomputed per resample, and
``<metric>_ci_low/high`` are the percentile interval at level ``ci`` (``np.quantile``, linear).
``bootstrap_indices`` returns the resamples, for reference computations.

How it is computed (and why it is fast): scores are mapped to order-preserving integer keys
(bit pattern of the float, -0.0 tied with +0.0: ``fi_jax.detectors.selection.order_key``), the ID keys
are sorted once and the OOD keys once (per grouping); every metric then comes from cumulative
counts and binary searches, no per-metric sort. A bootstrap resample only changes integer
multiplicities on the same sorted arrays (no re-sort), so resamples are vmapped in chunks
(bounded memory). Per-class metrics are segment sums over
OOD samples sorted by (class, score); only the per-class ``aupr_in`` needs passes over the ID
scores: n_id x min(n_classes, largest class) work, in chunks inside the jit (Fi-ImageNet's
522 classes of 1-3 images need one pass). Inputs are padded to a few bucket sizes (<= 12.5%
larger) with zero-weight entries so that different set sizes share compilations. Everything
runs in one jit on (possibly sharded, multi-process global) jax arrays, with explicit
transfers only (fine under ``jax.transfer_guard("disallow")``); the one host transfer is the
final ``jax.device_get``. Results do not depend on the sharding or the number of processes:
sums have a fixed order and divisions stay true divisions (XLA would otherwise turn x / n into
x * (1 / n), off by one ulp).

Accuracy: float64 when ``jax_enable_x64`` is on, float32 otherwise. All counts are exact
integers (int64 / int32) and score comparisons are on integer keys (exact also for subnormals,
which XLA on CPU compares as zero), so every FPR is an exact count ratio rounded once, and the
pooled TPR crossings use sklearn's float64 rule k / n >= tpr in both modes. Pooled AUROC and
AP are sums of <= n terms in [0, 1] added pairwise: absolute error <= (log2 n + 3) eps, i.e.
< 1e-14 in float64 and < 2e-6 in float32 for 10^7 scores. Per-class sums are scatter-adds
(error <= (n_class + 3) eps per class; per-class ``aupr_in`` <= n_class (log2 n_id + 3) eps).
``fpr95_ninco``'s threshold and the bootstrap percentiles are bit-identical to ``np.quantile``
in the same dtype (an opaque operand stops XLA from fusing numpy's a + d * g into an FMA;
checked on CPU), except between two *different subnormal* order statistics (|s| < 2.2e-308 in
float64), which XLA:CPU's flush-to-zero arithmetic interpolates as zeros. Float32 mode only: the per-class OOD-positive crossing tests
k / n_class >= tpr in float32, which can differ from float64 when k / n_class is within 6e-8
(relative) of ``tpr``; scores are cast to float32 first, which can create new ties.
"""
from __future__ import annotations

import functools
import math
from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from fi_jax.detectors.selection import from_order_key, order_key

METRICS = ("auroc", "fpr95", "fpr95_ood_positive", "fpr95_ninco", "aupr_in", "aupr_out",
           "detection_error")
_CI_METRICS = METRICS + ("tnr95",)
_BUDGET = 1 << 20          # elements per chunk of per-class aupr_in work
_BOOT_BUDGET = 1 << 18     # elements per chunk of bootstrap resamples (cache-sized: faster)


# ----------------------------------------------------------------------------- helpers

def _dtypes() -> tuple[Any, Any]:
  """(float, int) working dtypes: 64-bit when jax_enable_x64 is on, else 32-bit."""
  if jax.config.jax_enable_x64:
    return jnp.float64, jnp.int64
  return jnp.float32, jnp.int32


def _bucket(n: int) -> int:
  """Padded size for n entries: >= 512 and at most 12.5% above n (few distinct shapes)."""
  if n <= 512:
    return 512
  step = 1 << (n.bit_length() - 4)
  return -(-n // step) * step


def _opaque(x: jax.Array, zero: jax.Array) -> jax.Array:
  """x, but hidden from the compiler so that a following add is not fused into an FMA."""
  idt = jnp.int64 if x.dtype == jnp.float64 else jnp.int32
  return lax.bitcast_convert_type(lax.bitcast_convert_type(x, idt) ^ zero, x.dtype)


def _lerp(a: jax.Array, b: jax.Array, g: jax.Array, zero: jax.Array) -> jax.Array:
  """numpy's quantile interpolation between order statistics a <= b, bit for bit.

  g = (gamma, 1 - gamma) as numpy computes them (float64 on the host, cast to a.dtype).
  """
  g = g.astype(a.dtype)
  d = b - a
  lerp = jnp.where(g[0] >= 0.5, b - _opaque(d * g[1], zero), a + _opaque(d * g[0], zero))
  # a == b: numpy gives a (+ 0); selected, not computed, so a subnormal a survives XLA:CPU's
  # flush-to-zero arithmetic
  return jnp.where(a == b, a, lerp)


def _div(a: jax.Array, b: jax.Array) -> jax.Array:
  """a / b, correctly rounded. XLA rewrites x / broadcast(n) as x * (1 / n) (1 ulp off, and
  differently per program); the barrier keeps a true division, so results are exact count
  ratios and identical across shardings / vmapping."""
  b = lax.optimization_barrier(jnp.broadcast_to(b, jnp.broadcast_shapes(a.shape, b.shape)))
  return a / b


def _tree_sum(x: jax.Array) -> jax.Array:
  """Pairwise sum over axis 0 (error O(log n) eps, unlike a sequential reduction)."""
  n = x.shape[0]
  p = 1 << max(0, (n - 1).bit_length())
  x = jnp.pad(x, [(0, p - n)] + [(0, 0)] * (x.ndim - 1))
  while x.shape[0] > 1:
    h = x.shape[0] // 2
    x = x[:h] + x[h:]
  return x[0]


def _first(flags: jax.Array) -> jax.Array:
  return jnp.concatenate([jnp.ones((1,), bool), flags])


def _last(flags: jax.Array) -> jax.Array:
  return jnp.concatenate([flags, jnp.ones((1,), bool)])


def _min_k(n: int, tpr: float) -> int:
  """Smallest k in [1, n] with k / n >= tpr, tested in float64 as sklearn's roc_curve does."""
  k = min(max(math.ceil(tpr * n), 1), n)
  while k > 1 and (k - 1) / n >= tpr:
    k -= 1
  while k < n and k / n < tpr:
    k += 1
  return k


def _quantile_plan(n: int, q: float) -> tuple[int, int, float, float]:
  """numpy's 'linear' quantile: order statistics (0-based) and weights, numpy's float64 rule."""
  h = (n - 1) * q
  if h >= n - 1:
    return n - 1, n - 1, 0.0, 1.0
  lo = math.floor(h)
  g = h - lo
  return lo, lo + 1, g, 1.0 - g


# ----------------------------------------------------------------------------- input checks

def _as_array(x: Any) -> Any:
  if not isinstance(x, jax.Array):
    x = np.asarray(x)
  return x


def _check_scores(x: Any, name: str) -> Any:
  x = _as_array(x)
  if x.ndim != 1:
    raise ValueError(f"{name} must be a 1-D array of scores (higher = more ID), got shape "
                     f"{tuple(x.shape)}; flatten or select one score column.")
  if x.shape[0] == 0:
    raise ValueError(f"{name} is empty: metrics need at least one score in each set.")
  if np.dtype(x.dtype).kind not in "biuf":
    raise ValueError(f"{name} must hold real numbers, got dtype {x.dtype}.")
  return x


def _check_groups(g: Any, n_ood: int) -> Any:
  g = _as_array(g)
  if g.ndim != 1 or g.shape[0] != n_ood:
    raise ValueError(f"ood_groups must be 1-D with one class id per OOD score, i.e. shape "
                     f"({n_ood},), got shape {tuple(g.shape)}.")
  if np.dtype(g.dtype).kind not in "iu":
    raise ValueError(f"ood_groups must hold integer class ids (negative = no class), got "
                     f"dtype {g.dtype}.")
  return g


def _check_options(tpr: float, n_bootstrap: int, ci: float) -> None:
  if not 0.0 < float(tpr) <= 1.0:
    raise ValueError(f"tpr must be in (0, 1], got {tpr!r}.")
  if isinstance(n_bootstrap, bool) or int(n_bootstrap) != n_bootstrap or n_bootstrap < 0:
    raise ValueError(f"n_bootstrap must be an integer >= 0, got {n_bootstrap!r}.")
  if not 0.0 < float(ci) < 1.0:
    raise ValueError(f"ci must be in (0, 1), e.g. 0.95, got {ci!r}.")


# ----------------------------------------------------------------------------- device side

@functools.partial(jax.jit, static_argnames=("size", "fdt"))
def _score_keys(x: jax.Array, size: int, fdt: Any) -> tuple[jax.Array, jax.Array]:
  """Integer keys padded to `size` with the largest key (sorts last), and all-finite flag."""
  x = x.astype(fdt)
  k = order_key(x)
  pad = jnp.full((size - x.shape[0],), jnp.iinfo(k.dtype).max, k.dtype)
  return jnp.concatenate([k, pad]), jnp.all(jnp.isfinite(x))


@functools.partial(jax.jit, static_argnames=("size", "idt"))
def _group_keys(g: jax.Array, size: int, idt: Any) -> jax.Array:
  """Class ids, with 'no class' (< 0) and padding mapped to the largest id (sorts last)."""
  sent = jnp.iinfo(idt).max
  g = jnp.where(g < 0, sent, g.astype(idt))
  return jnp.concatenate([g, jnp.full((size - g.shape[0],), sent, idt)])


class _Groups(NamedTuple):
  """OOD samples sorted by (class, score) and the index structure metrics need."""
  okey: jax.Array      # OOD keys, ascending within each class
  valid: jax.Array     # belongs to a class (real sample, id >= 0)
  dense: jax.Array     # class index 0..count-1; num_segments where not valid
  gstart: jax.Array    # first sample of its class
  gfirst: jax.Array    # index of the first sample of its class
  run_last: jax.Array  # index of the last sample with the same (class, score)
  left: jax.Array      # #ID keys < okey (positions in the sorted ID keys)
  right: jax.Array     # #ID keys <= okey
  count: jax.Array     # number of classes
  gid: jax.Array       # class id of each dense class
  num_segments: int    # static upper bound on count


def _groups(okey: jax.Array, gkey: jax.Array, ida: jax.Array, num_segments: int) -> _Groups:
  n = okey.shape[0]
  idx = jnp.arange(n)
  sent = jnp.iinfo(gkey.dtype).max
  gstart = _first(gkey[1:] != gkey[:-1])
  rstart = gstart | _first(okey[1:] != okey[:-1])
  valid = gkey != sent
  # #ID keys < okey and <= okey, in one binary search (keys are integers)
  top = jnp.iinfo(okey.dtype).max
  pos = jnp.searchsorted(ida, jnp.concatenate([okey, jnp.minimum(okey, top - 1) + 1]))
  dense = jnp.where(valid, jnp.cumsum(gstart & valid) - 1, num_segments)
  gid = jnp.zeros((num_segments,), gkey.dtype).at[
      jnp.where(gstart & valid, dense, num_segments)].set(gkey, mode="drop")
  return _Groups(
      okey=okey, valid=valid, dense=dense, gstart=gstart,
      gfirst=lax.cummax(jnp.where(gstart, idx, 0)),
      run_last=lax.cummin(jnp.where(_last(rstart[1:]), idx, n), reverse=True),
      left=pos[:n], right=pos[n:],
      count=jnp.sum(gstart & valid), gid=gid, num_segments=num_segments)


def _segsum(x: jax.Array, gr: _Groups) -> jax.Array:
  """Per-class float sums: pairwise for one class (pooled), scatter-add per class otherwise."""
  if gr.num_segments == 1:
    return _tree_sum(x)[None]
  return jax.ops.segment_sum(x, gr.dense, gr.num_segments)


def _aupr_in(t: jax.Array, id_w: jax.Array, gr: _Groups, o_w: jax.Array, n_g: jax.Array,
             fdt: Any) -> jax.Array:
  """AP with ID positive, per class: (1/n_id) sum_i w_i T_i / (T_i + F_g(i)).

  T_i = #ID >= s_i and F_g(i) = #OOD_g >= s_i for ID sample i; summing w_i per sample equals
  sklearn's sum over distinct thresholds of (recall step) x precision. F_g is piecewise
  constant in i, so the cost is n_id x min(#classes, largest class): per class, or per level
  of F (prefix sums over i for each F, looked up per OOD sample) -- e.g. Fi-ImageNet's 522
  mostly single-image classes need only a few levels.
  """
  if gr.num_segments == 1:
    return _aupr_in_by_class(t, id_w, gr, o_w, n_g, fdt)
  return lax.cond(jnp.max(n_g) <= gr.count,
                  lambda: _aupr_in_by_level(t, id_w, gr, o_w, n_g, fdt),
                  lambda: _aupr_in_by_class(t, id_w, gr, o_w, n_g, fdt))


def _aupr_in_by_class(t, id_w, gr, o_w, n_g, fdt):
  n = id_w.shape[0]
  n_in = jnp.sum(id_w).astype(fdt)
  tf = t.astype(fdt)[:, None]
  wf = id_w.astype(fdt)[:, None]

  def chunk_values(col, ng):
    # hist[r, c] = weight of class-c OOD samples with exactly r ID keys <= them
    hist = jnp.zeros((n + 1, ng.shape[0]), id_w.dtype).at[gr.right, col].add(o_w, mode="drop")
    f = (ng[None, :] - jnp.cumsum(hist, axis=0)[:n]).astype(fdt)     # #OOD_g >= s_i
    term = jnp.where(wf > 0, _div(wf * tf, jnp.maximum(tf + f, 1)), 0)
    return _div(_tree_sum(term), n_in)

  if gr.num_segments == 1:
    return chunk_values(jnp.where(gr.valid, 0, 1), n_g)
  c = max(1, min(gr.num_segments, _BUDGET // (n + 1)))
  ng_pad = jnp.concatenate([n_g, jnp.zeros((c,), n_g.dtype)])

  def body(state):
    i, out = state
    rel = gr.dense - i * c
    col = jnp.where(gr.valid & (rel >= 0) & (rel < c), rel, c)
    vals = chunk_values(col, lax.dynamic_slice(ng_pad, (i * c,), (c,)))
    return i + 1, lax.dynamic_update_slice(out, vals, (i * c,))

  _, out = lax.while_loop(lambda s: s[0] * c < gr.count, body,
                          (jnp.zeros((), gr.count.dtype), jnp.zeros((gr.num_segments + c,), fdt)))
  return out[:gr.num_segments]


def _aupr_in_by_level(t, id_w, gr, o_w, n_g, fdt):
  n, m, S = id_w.shape[0], o_w.shape[0], gr.num_segments
  wc = jnp.cumsum(id_w)
  n_in = wc[-1]
  tf = t.astype(fdt)[:, None]
  wf = id_w.astype(fdt)[:, None]
  ok = o_w > 0
  oc = jnp.cumsum(o_w)
  # OOD sample j covers ID positions [prev_j, right_j), where F_g = OOD_g weight from j upwards
  f_j = n_g[jnp.minimum(gr.dense, S - 1)] - (oc - o_w - (oc[gr.gfirst] - o_w[gr.gfirst]))
  prev = jnp.where(gr.gstart, 0, jnp.concatenate([jnp.zeros((1,), gr.right.dtype),
                                                  gr.right[:-1]]))
  c = max(1, min(m, 32, _BUDGET // (n + 1)))

  def body(state):
    f0, acc = state
    level = (f0 + jnp.arange(c)).astype(fdt)[None, :]
    vals = jnp.where(wf > 0, _div(wf * tf, tf + level), 0)
    p = jnp.concatenate([jnp.zeros((1, c), fdt), jnp.cumsum(vals, axis=0)])   # prefix sums
    col = f_j - f0
    use = ok & (col >= 0) & (col < c)
    col = jnp.clip(col, 0, c - 1)
    return f0 + c, acc + jnp.where(use, p[gr.right, col] - p[prev, col], 0)

  _, contrib = lax.while_loop(lambda s: s[0] <= jnp.max(n_g), body,
                              (jnp.ones((), n_g.dtype), jnp.zeros((m,), fdt)))
  # above a class's highest OOD sample F_g = 0: each ID sample adds w_i
  top = jax.ops.segment_max(jnp.where(ok, gr.right, 0), gr.dense, S)
  tail = n_in - jnp.where(top > 0, wc[jnp.maximum(top - 1, 0)], 0)
  total = jax.ops.segment_sum(contrib, gr.dense, S) + tail.astype(fdt)
  return _div(total, n_in.astype(fdt))


def _evaluate(ida: jax.Array, id_start: jax.Array, id_w: jax.Array, gr: _Groups,
              o_w: jax.Array, c: dict) -> dict[str, jax.Array]:
  """All metrics per class (arrays [num_segments]) for integer sample weights id_w / o_w.

  ida: sorted ID keys (padding last); id_w: multiplicity of each (0 for padding, bootstrap
  counts in resamples); o_w: multiplicity of each OOD sample in gr's order (0 = not counted).
  """
  fdt = jnp.float64 if ida.dtype == jnp.int64 else jnp.float32
  n = id_w.shape[0]
  S = gr.num_segments
  tpr = c["tpr"].astype(fdt)

  wc = jnp.cumsum(id_w)                    # ID weight at sorted positions <= i
  n_in = wc[-1]
  nin_f = n_in.astype(fdt)

  def id_below(pos):                       # ID weight at sorted positions < pos
    return jnp.where(pos > 0, wc[jnp.maximum(pos - 1, 0)], 0)

  def id_key_of_rank(m):                   # key of the m-th smallest ID score (1-based)
    return ida[jnp.minimum(jnp.searchsorted(wc, m, side="left"), n - 1)]

  le_id = id_below(gr.right)
  gt = n_in - le_id                        # #ID > s_j
  eq = le_id - id_below(gr.left)           # #ID == s_j
  oc = jnp.cumsum(o_w)
  le = oc[gr.run_last] - (oc[gr.gfirst] - o_w[gr.gfirst])   # #OOD_g <= s_j
  n_g = jax.ops.segment_sum(o_w, gr.dense, S)
  ng_j = jnp.maximum(n_g, 1)[jnp.minimum(gr.dense, S - 1)]
  ng_f = jnp.maximum(n_g, 1).astype(fdt)
  ok = gr.valid & (o_w > 0)
  wf = o_w.astype(fdt)

  def frac_at_least(thr_ok):               # per class: #OOD_g passing / n_g
    return _div(jax.ops.segment_sum(jnp.where(ok & thr_ok, o_w, 0), gr.dense, S).astype(fdt),
                ng_f)

  out = {}
  out["auroc"] = _div(_segsum(jnp.where(
      ok, _div(wf * (gt.astype(fdt) + 0.5 * eq.astype(fdt)), nin_f), 0), gr), ng_f)

  # D: threshold = K-th largest ID score (first ROC point with TPR >= tpr)
  tau = id_key_of_rank(n_in - c["k_in"] + 1)
  out["fpr95"] = frac_at_least(gr.okey >= tau)

  # E: per class, the lowest OOD score whose OOD-CDF reaches tpr; FPR = #ID <= it / n_id
  if S == 1:
    reach = le >= c["k_out"]
  else:
    reach = _div(le.astype(fdt), ng_j.astype(fdt)) >= tpr
  first = jax.ops.segment_min(jnp.where(ok & reach, jnp.arange(le.shape[0]), le.shape[0]),
                              gr.dense, S)
  out["fpr95_ood_positive"] = _div(
      nin_f - gt[jnp.minimum(first, le.shape[0] - 1)].astype(fdt), nin_f)

  # A: numpy linear quantile of the ID scores at 1 - tpr
  thr = _lerp(from_order_key(id_key_of_rank(c["q"][0] + 1)),
              from_order_key(id_key_of_rank(c["q"][1] + 1)), c["q_g"], c["zero"])
  out["fpr95_ninco"] = frac_at_least(gr.okey >= order_key(thr))

  # AP, OOD positive: each OOD sample adds (1/n_g) x precision at its own score
  den = jnp.maximum(le + (n_in - gt), 1).astype(fdt)
  out["aupr_out"] = _div(_segsum(jnp.where(ok, _div(wf * le.astype(fdt), den), 0), gr), ng_f)

  # detection error: the best point between consecutive OOD scores of the class
  cand = (0.5 * (1 - _div(gt.astype(fdt), nin_f))
          + 0.5 * _div((ng_j - le).astype(fdt), ng_j.astype(fdt)))
  out["detection_error"] = jnp.minimum(
      jax.ops.segment_min(jnp.where(ok, cand, jnp.inf), gr.dense, S), 0.5)

  # AP, ID positive
  t = n_in - lax.cummax(jnp.where(id_start, wc - id_w, 0))     # #ID >= s_i
  out["aupr_in"] = _aupr_in(t, id_w, gr, jnp.where(ok, o_w, 0), n_g, fdt)
  out["n"] = n_g
  return out


def _seed_words(seed: int, idt: Any) -> dict[str, np.ndarray]:
  """The bootstrap seed as integer operands: {'seed': seed} when it fits the working int dtype
  (int32 with x64 off), else {'seed': low 32 bits, 'seed_hi': the rest} (any Python int)."""
  seed = int(seed)
  info = np.iinfo(idt)
  if info.min <= seed <= info.max:
    return {"seed": np.asarray(seed, idt)}
  lo = seed & 0xFFFFFFFF
  return {"seed": np.asarray(lo - (1 << 32) if lo >= 1 << 31 else lo, idt),
          "seed_hi": np.asarray((seed >> 32) % (1 << 31), idt)}


def _key(c: dict) -> jax.Array:
  """The PRNG key of the bootstrap seed (`_seed_words`): key(seed), or for a seed beyond the
  int dtype key(low 32 bits) folded with the high bits."""
  key = jax.random.key(c["seed"])
  if "seed_hi" in c:
    key = jax.random.fold_in(key, c["seed_hi"])
  return key


def _draws(key: jax.Array, r: jax.Array, size_id: int, size_ood: int, n_id: jax.Array,
           n_ood: jax.Array, idt: Any) -> tuple[jax.Array, jax.Array]:
  """Resample r: uniform positions in [0, n) (the first n are used) for ID and for OOD."""
  k1, k2 = jax.random.split(jax.random.fold_in(key, r))
  return (jax.random.randint(k1, (size_id,), 0, n_id, dtype=idt),
          jax.random.randint(k2, (size_ood,), 0, n_ood, dtype=idt))


def _counts(draws: jax.Array, n: jax.Array) -> jax.Array:
  """Multiplicity of each sorted position in a resample (its first n draws)."""
  keep = (jnp.arange(draws.shape[0]) < n).astype(draws.dtype)
  return jnp.zeros_like(draws).at[draws].add(keep)


def _core(id_keys, ood_keys, gkeys, ok_id, ok_ood, c, *, num_segments, n_boot):
  """Pooled metrics (+ per-class table and macro means, + bootstrap CIs) in one jit."""
  idt = id_keys.dtype
  fdt = jnp.float64 if idt == jnp.int64 else jnp.float32
  n_id_pad, n_ood_pad = id_keys.shape[0], ood_keys.shape[0]
  sent = jnp.iinfo(idt).max

  ida = lax.sort(id_keys)
  id_start = _first(ida[1:] != ida[:-1])
  id_w = (jnp.arange(n_id_pad) < c["n_id"]).astype(idt)
  osorted = lax.sort(ood_keys)
  pooled = _groups(osorted, jnp.where(osorted == sent, sent, 0), ida, 1)
  o_w = (jnp.arange(n_ood_pad) < c["n_ood"]).astype(idt)
  out = {"ok_id": ok_id, "ok_ood": ok_ood}

  if not n_boot:
    res = _evaluate(ida, id_start, id_w, pooled, o_w, c)
    out.update({m: res[m][0] for m in METRICS})
  else:
    # replicate -1 is the sample itself; 0..n_boot-1 are resamples (one traced evaluation)
    def replicate(r):
      di, do = _draws(_key(c), r, n_id_pad, n_ood_pad, c["n_id"], c["n_ood"], idt)
      wi = jnp.where(r < 0, id_w, _counts(di, c["n_id"]))
      wo = jnp.where(r < 0, o_w, _counts(do, c["n_ood"]))
      rr = _evaluate(ida, id_start, wi, pooled, wo, c)
      return {m: rr[m][0] for m in METRICS}

    per_chunk = max(1, min(n_boot + 1, _BOOT_BUDGET // (n_id_pad + n_ood_pad)))
    n_chunks = -(-(n_boot + 1) // per_chunk)
    reps = jnp.arange(-1, n_chunks * per_chunk - 1).reshape(n_chunks, per_chunk)
    vals = lax.map(jax.vmap(replicate), reps)
    vals = {m: v.reshape(-1) for m, v in vals.items()}
    out.update({m: v[0] for m, v in vals.items()})
    vals = {m: v[1:n_boot + 1] for m, v in vals.items()}
    vals["tnr95"] = 1 - vals["fpr95"]
    for m in _CI_METRICS:
      v = jnp.sort(vals[m])
      out[f"{m}_ci_low"] = _lerp(v[c["ci_lo"][0]], v[c["ci_lo"][1]], c["ci_lo_g"], c["zero"])
      out[f"{m}_ci_high"] = _lerp(v[c["ci_hi"][0]], v[c["ci_hi"][1]], c["ci_hi_g"], c["zero"])

  if num_segments:
    gk, ok_sorted = lax.sort((gkeys, ood_keys), num_keys=2)
    gr = _groups(ok_sorted, gk, ida, num_segments)
    per = _evaluate(ida, id_start, id_w, gr, gr.valid.astype(idt), c)
    used = jnp.arange(num_segments) < gr.count
    cnt = jnp.maximum(gr.count, 1).astype(fdt)
    for m in METRICS:
      out[f"{m}_macro"] = _tree_sum(jnp.where(used, per[m], 0)) / cnt
    out["n_ood_groups"] = gr.count
    out["table"] = {"group": gr.gid, "n_ood": per["n"], **{m: per[m] for m in METRICS}}
  return out


@functools.lru_cache(maxsize=None)
def _core_jit(out_sharding: Any) -> Any:
  return jax.jit(_core, static_argnames=("num_segments", "n_boot"), out_shardings=out_sharding)


def _replicated(*arrays: Any) -> Any:
  """A replicated output sharding over the inputs' mesh (so multi-process device_get works)."""
  for a in arrays:
    s = getattr(a, "sharding", None)
    if isinstance(s, jax.sharding.NamedSharding):
      return jax.sharding.NamedSharding(s.mesh, jax.sharding.PartitionSpec())
  return None


# ----------------------------------------------------------------------------- public API

@functools.partial(jax.jit, static_argnames=("fdt",))
def _count_nonfinite(x: jax.Array, fdt: Any) -> jax.Array:
  return jnp.sum(~jnp.isfinite(x.astype(fdt)))


def _nonfinite_error(x: Any, arg: str, name: Optional[str], fdt: Any) -> ValueError:
  """The error for non-finite scores: what failed (`name`), which argument, how many."""
  try:
    if isinstance(x, jax.Array):
      bad = int(jax.device_get(_count_nonfinite(x, fdt)))
    else:
      with np.errstate(over="ignore"):
        bad = int((~np.isfinite(np.asarray(x).astype(fdt))).sum())
    count = f" {bad} of {x.shape[0]}"
  except Exception:  # a non-addressable array: no count
    count = ""
  where = f"{name}: " if name else ""
  cast = (" (after the cast to float32: x64 is off)" if fdt == jnp.float32
          and np.dtype(x.dtype) == np.float64 else "")
  return ValueError(f"{where}{arg} has{count} NaN or infinite values{cast}; fix the detector "
                    f"or drop those samples before computing metrics.")


def _dense_groups(g: Any, idt: Any) -> tuple[Any, Optional[np.ndarray]]:
  """(group ids that fit `idt`, None) when they already do; else (dense ranks of the ids >= 0
  as idt, -1 for the rest; the sorted distinct ids) so that ids beyond int32 (x64 off) or int64
  never wrap. Host arrays only (a jax array already has a jax dtype)."""
  if isinstance(g, jax.Array) or not g.size:
    return g, None
  info = np.iinfo(idt)
  if int(g.max()) <= info.max and int(g.min()) >= info.min:
    return g, None
  valid = g >= 0
  uniq = np.unique(g[valid])
  dense = np.full(g.shape, -1, idt)
  dense[valid] = np.searchsorted(uniq, g[valid])
  return dense, uniq


def _run(id_scores, ood_scores, tpr, ood_groups, n_bootstrap, ci, seed, name=None):
  _check_options(tpr, n_bootstrap, ci)
  id_scores = _check_scores(id_scores, "id_scores")
  ood_scores = _check_scores(ood_scores, "ood_scores")
  n_id, n_ood = int(id_scores.shape[0]), int(ood_scores.shape[0])
  fdt, idt = _dtypes()
  group_ids = None
  if ood_groups is not None:
    ood_groups, group_ids = _dense_groups(_check_groups(ood_groups, n_ood), idt)
  # explicit transfers only (works under jax.transfer_guard("disallow")); outputs replicated
  # over the inputs' mesh so that a multi-process run can device_get them
  rep = _replicated(id_scores, ood_scores, ood_groups)
  put = lambda a: a if isinstance(a, jax.Array) else jax.device_put(a, rep)  # noqa: E731
  size_id, size_ood = _bucket(n_id), _bucket(n_ood)
  id_keys, ok_id = _score_keys(put(id_scores), size_id, fdt)
  ood_keys, ok_ood = _score_keys(put(ood_scores), size_ood, fdt)
  gkeys = _group_keys(put(ood_groups), size_ood, idt) if ood_groups is not None else None
  q = _quantile_plan(n_id, 1.0 - float(tpr))
  ci_lo = _quantile_plan(max(int(n_bootstrap), 1), (1 - float(ci)) / 2)
  ci_hi = _quantile_plan(max(int(n_bootstrap), 1), (1 + float(ci)) / 2)
  c = {"n_id": n_id, "n_ood": n_ood, "k_in": _min_k(n_id, float(tpr)),
       "k_out": _min_k(n_ood, float(tpr)), "q": q[:2], "ci_lo": ci_lo[:2], "ci_hi": ci_hi[:2],
       "zero": 0}
  c = {k: np.asarray(v, dtype=idt) for k, v in c.items()}
  c.update(_seed_words(seed, idt))
  c.update({k: np.asarray(v, dtype=fdt) for k, v in (
      ("q_g", q[2:]), ("ci_lo_g", ci_lo[2:]), ("ci_hi_g", ci_hi[2:]), ("tpr", float(tpr)))})
  core = _core_jit(rep)
  out = core(id_keys, ood_keys, gkeys, ok_id, ok_ood, jax.device_put(c, rep),
             num_segments=size_ood if ood_groups is not None else 0,
             n_boot=int(n_bootstrap))
  out = jax.device_get(out)
  if not out["ok_id"]:
    raise _nonfinite_error(id_scores, "id_scores", name, fdt)
  if not out["ok_ood"]:
    raise _nonfinite_error(ood_scores, "ood_scores", name, fdt)
  if ood_groups is not None and int(out["n_ood_groups"]) == 0:
    raise ValueError(f"{name + ': ' if name else ''}ood_groups has no class id >= 0 (negative "
                     f"ids mean 'no class'); pass ood_groups=None for pooled metrics only.")
  if group_ids is not None:
    out["table"]["group"] = group_ids[np.asarray(out["table"]["group"])[
        :int(out["n_ood_groups"])]]
  return out, n_id, n_ood


def ood_metrics(id_scores: Any, ood_scores: Any, *, tpr: float = 0.95,
                ood_groups: Optional[Any] = None, n_bootstrap: int = 0, ci: float = 0.95,
                seed: int = 0, name: Optional[str] = None) -> dict[str, float]:
  """All OOD metrics (module docstring) as a flat dict of Python floats (one CSV row).

  Args:
    id_scores: [n_id] ID test scores, higher = more ID (numpy or jax, possibly sharded).
    ood_scores: [n_ood] OOD scores, same orientation.
    tpr: the TPR level of the fpr95* keys (key names stay `fpr95...`; the level is `tpr`).
    ood_groups: optional [n_ood] int class id per OOD sample (< 0: no class) -> `*_macro`.
    n_bootstrap: number of bootstrap resamples (0 = no confidence intervals).
    ci: confidence level of the percentile intervals.
    seed: bootstrap seed (any int; docs/metrics.md#bootstrap-confidence-intervals).
    name: what is being evaluated (e.g. "fdbd on ood/ninco"), named in error messages.

  Returns:
    auroc, fpr95 (ID positive), fpr95_ood_positive (OpenOOD v1.5), fpr95_ninco (NINCO),
    aupr_in, aupr_out, detection_error, tnr95, n_id, n_ood, tpr; with ood_groups also
    `<metric>_macro` and n_ood_groups; with n_bootstrap also `<metric>_ci_low/_ci_high`,
    n_bootstrap and ci_level.
  """
  out, n_id, n_ood = _run(id_scores, ood_scores, tpr, ood_groups, n_bootstrap, ci, seed, name)
  return _flat(out, n_id, n_ood, tpr, ood_groups is not None, n_bootstrap, ci)


def ood_metrics_and_table(id_scores: Any, ood_scores: Any, ood_groups: Any, *,
                          tpr: float = 0.95, n_bootstrap: int = 0, ci: float = 0.95,
                          seed: int = 0, name: Optional[str] = None
                          ) -> tuple[dict[str, float], dict[str, np.ndarray]]:
  """(`ood_metrics(..., ood_groups=ood_groups)`, `per_group_metrics(...)`) from one pass: the
  per-class table is computed once, by the same program as the macro keys."""
  out, n_id, n_ood = _run(id_scores, ood_scores, tpr, ood_groups, n_bootstrap, ci, seed, name)
  return (_flat(out, n_id, n_ood, tpr, True, n_bootstrap, ci), _table(out))


def _flat(out: dict, n_id: int, n_ood: int, tpr: float, grouped: bool, n_bootstrap: int,
          ci: float) -> dict[str, float]:
  res = {m: float(out[m]) for m in METRICS}
  res["tnr95"] = 1.0 - res["fpr95"]
  res.update(n_id=float(n_id), n_ood=float(n_ood), tpr=float(tpr))
  if grouped:
    res.update({f"{m}_macro": float(out[f"{m}_macro"]) for m in METRICS})
    res["n_ood_groups"] = float(out["n_ood_groups"])
  if n_bootstrap:
    for m in _CI_METRICS:
      res[f"{m}_ci_low"] = float(out[f"{m}_ci_low"])
      res[f"{m}_ci_high"] = float(out[f"{m}_ci_high"])
    res.update(n_bootstrap=float(n_bootstrap), ci_level=float(ci))
  return res


def per_group_metrics(id_scores: Any, ood_scores: Any, ood_groups: Any, *,
                      tpr: float = 0.95) -> dict[str, np.ndarray]:
  """Per OOD class (each vs all ID): arrays `group` (class id, ascending), `n_ood`, the seven
  metrics of `METRICS` and `tnr95`. OOD samples with class id < 0 are left out."""
  out, _, _ = _run(id_scores, ood_scores, tpr, ood_groups, 0, 0.95, 0)
  return _table(out)


def _table(out: dict) -> dict[str, np.ndarray]:
  k = int(out["n_ood_groups"])
  table = {name: np.asarray(v)[:k] for name, v in out["table"].items()}
  table["tnr95"] = 1.0 - table["fpr95"]
  return table


@functools.partial(jax.jit, static_argnames=("n_boot", "size_id", "size_ood"))
def _all_draws(seed, n_id, n_ood, *, n_boot, size_id, size_ood):
  idt = n_id.dtype
  key = _key(seed)
  return jax.vmap(lambda r: _draws(key, r, size_id, size_ood, n_id, n_ood, idt))(
      jnp.arange(n_boot))


def bootstrap_indices(n_id: int, n_ood: int, n_bootstrap: int,
                      seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
  """The resamples `ood_metrics(..., n_bootstrap, seed)` uses, as ([B, n_id], [B, n_ood]) int
  arrays of positions into the ascending-sorted ID and OOD scores (np.sort(scores)[idx])."""
  _, idt = _dtypes()
  i, o = _all_draws(_seed_words(seed, idt), jnp.asarray(n_id, idt), jnp.asarray(n_ood, idt),
                    n_boot=int(n_bootstrap), size_id=_bucket(n_id), size_ood=_bucket(n_ood))
  i, o = jax.device_get((i, o))
  return np.asarray(i)[:, :n_id], np.asarray(o)[:, :n_ood]


@jax.jit
def _accuracy(logits: jax.Array, labels: jax.Array) -> jax.Array:
  valid = labels >= 0
  hit = (jnp.argmax(logits, axis=-1) == labels) & valid
  return jnp.sum(hit) / jnp.sum(valid)


def classification_accuracy(logits: Any, labels: Any) -> float:
  """Top-1 accuracy over samples with label >= 0 (others ignored); NaN if there are none."""
  logits, labels = _as_array(logits), _as_array(labels)
  if logits.ndim != 2:
    raise ValueError(f"logits must be [n, num_classes], got shape {tuple(logits.shape)}.")
  if labels.ndim != 1 or labels.shape[0] != logits.shape[0]:
    raise ValueError(f"labels must be 1-D with one label per logits row ({logits.shape[0]}), "
                     f"got shape {tuple(labels.shape)}.")
  if np.dtype(labels.dtype).kind not in "iu":
    raise ValueError(f"labels must be integers (negative = ignore), got dtype {labels.dtype}.")
  rep = _replicated(logits, labels)
  put = lambda a: a if isinstance(a, jax.Array) else jax.device_put(a, rep)  # noqa: E731
  return float(jax.device_get(_accuracy(put(logits), put(labels))))
