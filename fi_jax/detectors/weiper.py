"""Weight-perturbation scores: WeiPer and WeiPer+KLD (Granz et al. NeurIPS'24)
(docs/detectors.md#weight-perturbation-scores).

The head's class vectors are perturbed r times, w~_c = w_c + delta |w_c| n / |n|, n ~ N(0, I_D)
drawn by numpy's `default_rng(seed)` (one [C, D] standard-normal draw per repeat, in order),
W~ = [W~_1 .. W~_r] as float32 [D, r C] (the model's head dtype) and the bias repeated.

`precision` (both detectors): "float32" (the default) computes as the official code does
(mgranz/weiper @ 1c27a4f7458570f60091d9c581e7fad6e5e369d1, Weiper/OpenOOD/openood/
postprocessors/weiper_kldiv/utils.py: torch's default float32 throughout): z~ = fl32(h W~ + b~),
the MSPs, the bin edges (its linspace: lo + fl32(i / n_bins) (fl32(hi + 1e-8) - lo)), the
histograms and the KLs in float32. "float64" computes z~ and everything after it in the compute
dtype (float64 under x64) with float64 edges (np.linspace): no bin decision moves with a float32
matmul's rounding.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from fi_jax.detectors import shared, stats
from fi_jax.detectors.core import (
  Detector,
  bin_index,
  cdtype,
  check_head,
  fc,
  log_max_softmax,
  matmul,
  require,
)


def perturbed_head(w, b, *, repeats: int, delta: float, seed: int):
  """(W~ float32 [D, r C], b~ float32 [r C]): repeat i occupies columns [i C, (i + 1) C).
  Each repeat is computed in place in the draw's [C, D] layout and written once, transposed,
  into the float32 result (the same float64 operations as w + (delta |w_c| n / |n|)^T)."""
  w = np.asarray(w, np.float64)
  d, c = w.shape
  rng = np.random.default_rng(seed)
  w_t = np.ascontiguousarray(w.T)                          # [C, D]
  scale = delta * np.linalg.norm(w, axis=0)[:, None]       # delta |w_c| [C, 1]
  wt = np.empty((d, repeats * c), np.float32)
  for i in range(repeats):
    n = rng.standard_normal((c, d))                         # [C, D]
    n /= np.linalg.norm(n, axis=1, keepdims=True)
    n *= scale
    n += w_t
    wt[:, i * c:(i + 1) * c] = n.T
  return wt, np.tile(np.asarray(b, np.float32), repeats)


PRECISIONS = ("float32", "float64")


def work_dtype(precision: str):
  """The dtype of z~ and what follows it: float32, or the compute dtype for "float64"."""
  return jnp.float32 if precision == "float32" else cdtype()


def _weiper_state(det, head) -> dict:
  """{wt, bt} on the device; inside `detectors.shared()` the same arrays for every detector
  with these (head, r, delta, seed): WeiPer recognises WeiPer+KLD's pass by them."""
  hp = det.hparams

  def build():
    wt, bt = perturbed_head(head.w, head.b, repeats=int(hp["repeats"]),
                            delta=float(hp["delta"]), seed=int(hp["seed"]))
    return jnp.asarray(wt), jnp.asarray(bt)
  wt, bt = shared.memo((head,), ("weiper_head", hp["repeats"], hp["delta"], hp["seed"]), build)
  return {"wt": wt, "bt": bt}


def _shared_score_key(hp) -> tuple:
  """The `shared` key (after wt and the features) of WeiPer's scores left by WeiPer+KLD."""
  return ("weiper_score", int(hp["repeats"]), int(hp["block_rows"]), hp["precision"])


def _perturbed_logits(h, wt, bt, repeats: int):
  """[B, r, C] perturbed logits in wt's dtype; wt, bt already in it (converted once, outside the
  loop over row blocks: XLA does not hoist a size-increasing convert out of a loop)."""
  z = matmul(h.astype(wt.dtype), wt) + bt
  return z.reshape(h.shape[0], int(repeats), -1)


def _log_msp(z):
  """log max_c softmax(z)_c over the last axis, in z's dtype: float32 as the official code
  (softmax's max = 1 / sum_c exp(z_c - z_max)); the accurate log1p form otherwise."""
  if z.dtype == jnp.float32:
    return -jnp.log(jnp.sum(jnp.exp(z - jnp.max(z, -1, keepdims=True)), -1))
  return log_max_softmax(z)


def _log_mean_msp(z):
  """log mean_r max_c softmax(z_r) from [B, r, C] (log-sum-exp of the per-repeat log-MSPs)."""
  lm = _log_msp(z)
  return jax.nn.logsumexp(lm, axis=-1) - jnp.log(jnp.asarray(z.shape[1], z.dtype))


def _validate_common(name, hp):
  require(hp["precision"] in PRECISIONS,
          f"{name}: precision must be one of {PRECISIONS}, got {hp['precision']!r}.")
  require(int(hp["repeats"]) >= 1, f"{name}: repeats must be >= 1.")
  require(0 < hp["delta"] < np.inf, f"{name}: delta must be a finite number > 0.")
  require(int(hp["block_rows"]) >= 1, f"{name}: block_rows must be >= 1.")


def _map_blocks(fn, x, block: int):
  """fn over row blocks of x (padded to a multiple of `block`), results concatenated."""
  n = x.shape[0]
  blk = max(1, min(n, block))
  pad = (-n) % blk
  xs = jnp.pad(x, ((0, pad), (0, 0))).reshape(-1, blk, x.shape[1])
  out = jax.lax.map(fn, xs)
  return jax.tree.map(lambda a: a.reshape((-1,) + a.shape[2:])[:n], out)


class WeiPer(Detector):
  """WeiPer's perturbed-logit MSP: log mean_{i<=r} max_c softmax(z~_i)_c (the mean of the r
  perturbed MSPs, returned as its log). r = 100, delta = 2.1, seed = 0 (the official code's
  defaults); precision "float32" as the official code (module docstring). No fit besides
  drawing W~ from the head. Registered after WeiPer+KLD: inside
  `detectors.shared()` a suite scores that one first and WeiPer reuses its pass (the
  r C-column product is most of the cost of both)."""
  name, needs = "weiper", frozenset({"features", "head"})
  defaults = {"repeats": 100, "delta": 2.1, "seed": 0, "block_rows": 256,
              "precision": "float32"}
  score_only = frozenset({"block_rows", "precision"})

  def __init__(self, **hparams):
    super().__init__(**hparams)
    own = self._score_jit   # compiled once, for done=None: reused scores never reach it
    self._score_jit = lambda state, features, done: (
        own(state, features, None) if done is None else done)

  @classmethod
  def validate(cls, hp):
    _validate_common("weiper", hp)

  def _fit(self, train, head):
    check_head(head, self.name)
    return _weiper_state(self, head)

  def _score_args(self, state, outputs):
    # inside detectors.shared(), WeiPer+KLD's pass over these rows (same W~, same row blocks)
    # may have computed these very scores, with the same jitted expression
    key = _shared_score_key(self.hparams)
    done = shared.lookup((state["wt"], outputs.features), (), lambda extra, v: extra == key)
    return outputs.features, done

  def _score(self, state, features, done):
    del done   # None here (see __init__)
    dt = work_dtype(self.hparams["precision"])
    wt, bt, r = state["wt"].astype(dt), state["bt"].astype(dt), self.hparams["repeats"]
    return _map_blocks(lambda h: _log_mean_msp(_perturbed_logits(h, wt, bt, r)), features,
                       int(self.hparams["block_rows"]))


# ----------------------------------------------------------------------------- WeiPer+KLD

def smoothing_matrix(nbins: int, size: int) -> np.ndarray:
  """S with (S q)_i = mean of q over the window [i - (size-1)//2, i + size - 1 - (size-1)//2],
  indices clamped to [0, nbins) (a length-`size` moving average with replicate padding, as
  torch's Conv1d(padding='same', padding_mode='replicate'))."""
  left = (size - 1) // 2
  s = np.zeros((nbins, nbins))
  for i in range(nbins):
    for j in range(i - left, i - left + size):
      s[i, min(max(j, 0), nbins - 1)] += 1.0 / size
  return s


def _histograms(x, edges):
  """Per row: the fraction of x's entries in each [edges_i, edges_{i+1}) ([B, nbins]), in the
  edges' dtype.

  Long rows are counted in pairs: entries 2j and 2j + 1 of a row add one to cell
  (bin_2j, bin_2j+1) of a per-row (nb + 1)^2 table, and a bin's count is its row sum plus its
  column sum (exact integers). That halves the scatter-adds, which dominate the cost once the
  binning is cheap; short rows (fewer pairs than table cells) are counted one by one."""
  nb = edges.shape[0] - 1
  n, length = x.shape
  idx = bin_index(x, edges)
  rows = jnp.arange(n)[:, None]
  if (nb + 1) ** 2 <= length // 2:
    idx = jnp.pad(idx, ((0, 0), (0, length % 2)), constant_values=nb)   # nb: not counted
    pairs = idx.reshape(n, -1, 2)
    cell = (rows * (nb + 1) + pairs[..., 0]) * (nb + 1) + pairs[..., 1]
    table = jnp.zeros(n * (nb + 1) ** 2, jnp.int32).at[cell.reshape(-1)].add(
        1, mode="promise_in_bounds").reshape(n, nb + 1, nb + 1)
    cnt = table.sum(2) + table.sum(1)
  else:
    cell = rows * (nb + 1) + idx
    cnt = jnp.zeros(n * (nb + 1), jnp.int32).at[cell.reshape(-1)].add(
        1, mode="promise_in_bounds").reshape(n, nb + 1)
  return cnt[:, :nb].astype(edges.dtype) / length


def official_edges(lo, hi, nbins: int, dtype) -> np.ndarray:
  """The bin edges [nbins + 1] from the fit minimum lo to the maximum hi + 1e-8: for float32 the
  official code's linspace in float32 (lo + fl32(i / nbins) (fl32(hi + 1e-8) - lo), each step
  rounded to float32), else np.linspace in float64."""
  if np.dtype(dtype) != np.float32:
    return np.linspace(float(lo), float(hi) + 1e-8, nbins + 1)
  f = np.float32
  lo, stop = f(lo), f(f(hi) + f(1e-8))
  steps = np.arange(nbins + 1, dtype=f) / f(nbins)
  return (lo + steps * (stop - lo)).astype(f)


def _sym_kl(p_mean, q, smooth, eps):
  """KL(p' || q') + KL(q' || p'), p' = normalise(p_mean + eps), q' = normalise(S q + eps), in
  q's dtype."""
  p = p_mean.astype(q.dtype) + eps
  p = p / jnp.sum(p)
  qs = matmul(q, smooth.T.astype(q.dtype)) + eps
  qs = qs / jnp.sum(qs, -1, keepdims=True)
  return jnp.sum((p - qs) * (jnp.log(p) - jnp.log(qs)), -1)


# fit rows per device call: the perturbed logits of a block are [rows, r C] (256 x 100k in the
# compute dtype: ~0.2 GB, with the histogram temporaries ~1 GB; 16384 rows would need ~65 GB)
FIT_BLOCK_ROWS = 256


@functools.partial(jax.jit, static_argnames=("dtype",))
def _minmax_chunk(h, wt, bt, dtype=None):
  """[min h, max h, min z~, max z~] of a block, z~ in `dtype` (None: the compute dtype)."""
  dt = cdtype() if dtype is None else dtype
  hh = jnp.asarray(h).astype(dt)
  z = matmul(hh, jnp.asarray(wt).astype(dt)) + jnp.asarray(bt).astype(dt)
  return jnp.stack([hh.min(), hh.max(), z.min(), z.max()])


@jax.jit
def _logit_bounds(h, wt, bt, wt_max):
  """([4, B] per row: lower and upper bounds on the min of z~, lower and upper bounds on its
  max; [2] min, max of h) from one float32 pass: z32 = fl32(fl32(h w~) + b~), reduced per row.
  With S = sum_k |h_k w~_kc| <= |h| |w~_c| <= |h| max_c |w~_c| (= wt_max), the float32 dot of
  the float32 h is within (gamma_D + u) S of the exact h w~_c (any summation order; u = 2^-24,
  gamma_D = D u / (1 - D u)), the float32 bias addition within 1.01 u |z32| more, and the
  compute-dtype z~ within gamma_D S plus a few of its own ulps of the exact value: so
  E = 3 D u |h| wt_max + 2 u max_c |z32| + D float32 tiny (flushed subnormals) bounds
  |z32 - z~| for every entry of the row. Only [B]-sized vectors are computed in the compute
  dtype; the [B, r C] block stays float32 and is reduced as it is produced."""
  hh = fc(h)
  f32 = lambda a: jnp.asarray(a, jnp.float32)   # noqa: E731
  z = matmul(f32(h), f32(wt)) + f32(bt)
  zmin, zmax = fc(z.min(1)), fc(z.max(1))
  d, fi = h.shape[1], np.finfo(np.float32)
  err = ((1.5 * d * float(fi.eps)) * jnp.linalg.norm(hh, axis=1) * fc(wt_max)
         + float(fi.eps) * jnp.maximum(jnp.abs(zmin), jnp.abs(zmax)) + d * float(fi.tiny))
  return (jnp.stack([zmin - err, zmin + err, zmax - err, zmax + err]),
          jnp.stack([hh.min(), hh.max()]))


def _fit_block(h, start: int) -> np.ndarray:
  """Fit rows start .. start + FIT_BLOCK_ROWS - 1, a shorter last block padded with copies of
  its last row: every block has one shape (one compilation of each per-block function); the
  copies change no minimum or maximum, and the density sums mask them out."""
  block = np.asarray(h[start:start + FIT_BLOCK_ROWS])
  return np.pad(block, ((0, FIT_BLOCK_ROWS - len(block)), (0, 0)), mode="edge")


def _fit_minmax(h, wt, bt) -> np.ndarray:
  """[min h, max h, min z~, max z~] over the fit rows, equal to a pass of _minmax_chunk over
  all FIT_BLOCK_ROWS blocks: a float32 pass bounds every row's extremes, and _minmax_chunk
  reruns only the blocks with a row that can hold the minimum or the maximum of z~ (rows
  whose lower bound on the min is above the least upper bound cannot, and likewise for the
  max). Saves most of a compute-dtype matmul pass."""
  starts = range(0, len(h), FIT_BLOCK_ROWS)
  w64 = np.asarray(wt, np.float64)
  col_sq = np.einsum("dc,dc->c", w64, w64)   # |w~_c|^2 without a [D, r C] temporary
  wt_max = jnp.asarray(np.sqrt(col_sq.max()) * (1 + 1e-12), cdtype())   # max_c |w~_c|, rounded up
  del w64
  wt_c = fc(wt)   # for the reruns: converted once
  parts = [_logit_bounds(_fit_block(h, i), wt, bt, wt_max) for i in starts]
  rb = np.concatenate([np.asarray(p[0], np.float64) for p in parts], axis=1)[:, :len(h)]
  hb = np.stack([np.asarray(p[1], np.float64) for p in parts])
  may_hold = (rb[0] <= rb[1].min()) | (rb[3] >= rb[2].max())
  mm = np.array([hb[:, 0].min(), hb[:, 1].max(), np.inf, -np.inf])
  for i in sorted({int(r) // FIT_BLOCK_ROWS * FIT_BLOCK_ROWS for r in np.flatnonzero(may_hold)}):
    part = np.asarray(_minmax_chunk(_fit_block(h, i), wt_c, bt), np.float64)
    mm[2], mm[3] = min(mm[2], part[2]), max(mm[3], part[3])
  return mm


@functools.partial(jax.jit, static_argnames=("nbins",))
def _density_sums(h, n_valid, wt, bt, edges_h, edges_z, *, nbins: int):
  """Sums over the first n_valid rows of h (the rest: a block's padding) of the per-row
  histograms of h and of z~ (z~ in the edges' dtype; the sums in the compute dtype)."""
  del nbins
  dt = edges_z.dtype
  hh = h.astype(dt)
  z = matmul(hh, wt.astype(dt)) + bt.astype(dt)
  valid = (jnp.arange(h.shape[0]) < n_valid)[:, None]
  return {"n": jnp.asarray(n_valid, cdtype()),
          "dens_h": jnp.sum(fc(jnp.where(valid, _histograms(hh, edges_h), 0)), 0),
          "dens_z": jnp.sum(fc(jnp.where(valid, _histograms(z, edges_z), 0)), 0)}


@functools.partial(jax.jit, static_argnames=("repeats", "block_rows"))
def _kld_pass(h, wt, bt, edges_z, *, repeats: int, block_rows: int):
  """Per row, from one product with W~ (row blocks of `block_rows`): WeiPer's score
  log mean_r MSP(z~_r) (WeiPer's own expression), mean_r MSP(z~_r) and the fractions of the
  r C entries of z~ in the bins of edges_z; z~ in the edges' dtype."""
  wt, bt = wt.astype(edges_z.dtype), bt.astype(edges_z.dtype)   # once, outside the block loop

  def block(hb):
    z = _perturbed_logits(hb, wt, bt, repeats)
    return (_log_mean_msp(z), jnp.mean(jnp.exp(_log_msp(z)), -1),
            _histograms(z.reshape(hb.shape[0], -1), edges_z))
  return _map_blocks(block, h, block_rows)


class WeiPerKLD(Detector):
  """WeiPer+KLD: -(KLs(P_h, Q_h(x)) + lam1 KLs(P_z, Q_z(x)) - lam2 mean_i MSP(z~_i)).

  Q_h(x) / Q_z(x): the histogram (fractions over `n_bins` equal bins between the fit minimum
  and maximum + 1e-8) of the D entries of h / the r C entries of z~; P_h / P_z: the mean of the
  fit rows' histograms; KLs(p, q) = KL(p'||q') + KL(q'||p') with p' = normalised (p + eps),
  q' = normalised (moving average of q over `smoothing` (Q_h) / `smoothing_perturbed` (Q_z) bins
  + eps), eps = `epsilon` (h) / `epsilon_noise` (z~). The official code's defaults: r = 100,
  delta = 2.1, n_bins = 100, smoothing = smoothing_perturbed = 20, epsilon = 0.01,
  epsilon_noise = 0.025, lam1 = lam2 = 1. The fit (min / max, then the mean histograms, as the
  official exact_minmax setup) reads the fit rows, or a seeded subset of `max_rows` rows.
  precision "float32" (the default) computes as the official code, "float64" in the compute
  dtype (module docstring); the fit's histogram sums are accumulated in the compute dtype."""
  name, needs = "weiper_kld", frozenset({"features", "head"})
  fit_needs = frozenset({"features"})
  defaults = {"repeats": 100, "delta": 2.1, "seed": 0, "n_bins": 100, "smoothing": 20,
              "smoothing_perturbed": 20, "epsilon": 0.01, "epsilon_noise": 0.025,
              "lambda_1": 1.0, "lambda_2": 1.0, "max_rows": 50_000, "block_rows": 256,
              "precision": "float32"}
  score_only = frozenset({"block_rows", "lambda_1", "lambda_2"})

  @classmethod
  def validate(cls, hp):
    _validate_common("weiper_kld", hp)
    require(int(hp["n_bins"]) >= 2, "weiper_kld: n_bins must be >= 2.")
    for k in ("smoothing", "smoothing_perturbed"):
      require(1 <= int(hp[k]) <= int(hp["n_bins"]), f"weiper_kld: {k} must be in [1, n_bins].")
    for k in ("epsilon", "epsilon_noise"):
      require(0 < hp[k] < np.inf, f"weiper_kld: {k} must be a finite number > 0.")
    for k in ("lambda_1", "lambda_2"):
      require(0 <= hp[k] < np.inf, f"weiper_kld: {k} must be a finite number >= 0.")
    require(int(hp["max_rows"]) >= 1, "weiper_kld: max_rows must be >= 1.")

  def _fit(self, train, head):
    check_head(head, self.name)
    hp = self.hparams
    st = _weiper_state(self, head)
    sample = stats.RowSample(int(hp["max_rows"]), int(hp["seed"]), ("features",))
    for start, chunk in stats.chunks(train):
      require(chunk.features is not None, "weiper_kld needs fit Outputs with features.")
      sample.add(start, chunk)
    h = sample.result()["features"]
    nb = int(hp["n_bins"])
    dt = work_dtype(hp["precision"])
    if dt == jnp.float32:   # one float32 pass, as the official code's exact_minmax setup
      parts = np.stack([np.asarray(_minmax_chunk(_fit_block(h, i), st["wt"], st["bt"],
                                                 dtype=jnp.float32))
                        for i in range(0, len(h), FIT_BLOCK_ROWS)])
      mm = np.array([parts[:, 0].min(), parts[:, 1].max(), parts[:, 2].min(), parts[:, 3].max()])
    else:
      mm = _fit_minmax(h, st["wt"], st["bt"])
    edges_h = official_edges(mm[0], mm[1], nb, dt)
    edges_z = official_edges(mm[2], mm[3], nb, dt)
    wt_c = st["wt"].astype(dt)   # converted once for all blocks, like the bin edges
    edges_h, edges_z = jnp.asarray(edges_h, dt), jnp.asarray(edges_z, dt)
    total = None
    for i in range(0, len(h), FIT_BLOCK_ROWS):
      total = stats.add_sums(total, _density_sums(
          _fit_block(h, i), min(FIT_BLOCK_ROWS, len(h) - i), wt_c, st["bt"], edges_h, edges_z,
          nbins=nb))
    return {**st, "edges_h": edges_h, "edges_z": edges_z,
            "dens_h": jnp.asarray(total["dens_h"] / total["n"], dt),
            "dens_z": jnp.asarray(total["dens_z"] / total["n"], dt)}

  def _score_args(self, state, outputs):
    hp = self.hparams
    lmsp, msp, q_z = _kld_pass(outputs.features, state["wt"], state["bt"], state["edges_z"],
                               repeats=int(hp["repeats"]), block_rows=int(hp["block_rows"]))
    shared.store((state["wt"], outputs.features), _shared_score_key(hp), lmsp)   # for WeiPer
    return outputs.features, msp, q_z

  def _score(self, state, features, msp, q_z):
    hp = self.hparams
    nb = int(hp["n_bins"])
    dt = state["edges_h"].dtype
    s_h = jnp.asarray(smoothing_matrix(nb, int(hp["smoothing"])), dt)
    s_z = jnp.asarray(smoothing_matrix(nb, int(hp["smoothing_perturbed"])), dt)
    kl_h = _map_blocks(
        lambda h: _sym_kl(state["dens_h"], _histograms(h.astype(dt), state["edges_h"]), s_h,
                          float(hp["epsilon"])), features, int(hp["block_rows"]))
    kl_z = _sym_kl(state["dens_z"], q_z, s_z, float(hp["epsilon_noise"]))
    return -(kl_h + float(hp["lambda_1"]) * kl_z - float(hp["lambda_2"]) * msp)
