"""Feature-shaping energy scores: ReAct, VRA, ASH-P/-B/-S, SCALE, DICE, BATS, OptFS, LINe
(docs/detectors.md#feature-shaping-energy-scores).

Each reshapes the penultimate features (or the head's weights) and returns the energy
logsumexp(W h' + b) of the recomputed logits (head matmul in float32 at HIGHEST precision, the
logsumexp in the compute dtype). They assume non-negative (post-ReLU) features
(docs/detectors.md#pitfalls); on
signed features the formulas are applied unchanged (ASH-S/SCALE's exp(s1/s2) can overflow).
"""
from __future__ import annotations

import concurrent.futures
import functools
import os

import jax
import jax.numpy as jnp
import numpy as np

from fi_jax.detectors import core, selection, shared, stats
from fi_jax.detectors.core import (
  Detector,
  cdtype,
  check_number,
  check_percentile,
  check_seed,
  fc,
  head_logits,
  head_state,
  matmul,
  require,
)


def _energy_of(h, state):
  return jax.nn.logsumexp(head_logits(h, state["w"], state["b"]), axis=-1)


def sampled_entries(train, max_rows: int, seed: int, name: str) -> np.ndarray:
  """All entries of the fit features (flattened), or of a seeded uniform subset of `max_rows`
  rows (stats.RowSample); the same rows for every percentile and every detector that asks
  with the same (max_rows, seed): shared inside detectors.shared()."""
  def sample_rows():
    sample = stats.RowSample(max_rows, seed, ("features",))
    for start, chunk in stats.chunks(train):
      require(chunk.features is not None, f"{name} needs fit Outputs with features.")
      sample.add(start, chunk)
    return sample.result()["features"].reshape(-1)
  return shared.memo((train,), ("react_rows", max_rows, seed), sample_rows)


def entry_percentiles(entries: np.ndarray, qs) -> np.ndarray:
  """np.percentile(entries, qs) (numpy 'linear'; the same bits): read off one sorted copy of
  `entries`, made once inside detectors.shared() (ReAct's, VRA's and LINe's clip percentiles of
  the same sampled entries; one sort is cheaper than one np.percentile call on them:
  docs/performance.md)."""
  qs = [float(q) for q in np.atleast_1d(qs)]
  flat = np.asarray(entries).reshape(-1)
  if flat.size == 0:
    return np.atleast_1d(np.percentile(flat, qs))
  ordered = shared.memo((entries,), ("sorted_entries",), lambda: np.sort(flat))
  return np.array([sorted_quantile(ordered, q / 100.0) for q in qs], np.float64)


def sorted_quantile(ordered: np.ndarray, q: float, dtype=None):
  """np.quantile(x, [q])[0] (numpy 'linear', the same bits; a list of q, with which numpy
  interpolates by a float64 fraction) from `ordered` = np.sort(x) (non-empty). The neighbouring
  order statistics are first cast to `dtype` if given: float64 gives np.quantile of
  x.astype(float64) without the copy. NaN if x holds one (NaNs sort last)."""
  if np.isnan(ordered[-1]):
    return np.nan
  n = ordered.size
  vi = (n - 1) * q
  lo = int(np.floor(vi))
  cast = (lambda v: v) if dtype is None else np.dtype(dtype).type
  return _lerp(cast(ordered[lo]), cast(ordered[min(lo + 1, n - 1)]), vi - np.floor(vi))


class ReAct(Detector):
  """Energy of the logits of min(h, c) (Sun et al.); c = the `percentile`-th percentile
  (numpy 'linear') of *all entries* of the fit features. OpenOOD: percentile 90 of val5k
  activations; NINCO: quantile 0.99 of train. The percentile is exact over the fit features
  when the fit set has <= `max_rows` rows, else over all entries of a seeded uniform subset of
  `max_rows` rows (stats.RowSample; docs/detectors.md#react)."""
  name, needs = "react", frozenset({"features", "head"})
  fit_needs = frozenset({"features"})
  defaults = {"percentile": 90.0, "max_rows": 50_000, "seed": 0}
  presets = {"ninco": {"percentile": 99.0}, "openood": {"percentile": 90.0}}

  @classmethod
  def validate(cls, hp):
    check_percentile("react", hp)
    check_number("react", hp, "max_rows", lo=1, integer=True)
    check_seed("react", hp)

  def _fit(self, train, head):
    feats = sampled_entries(train, self.hparams["max_rows"], self.hparams["seed"], "react")
    (clip,) = entry_percentiles(feats, self.hparams["percentile"])
    return {**head_state(head), "clip": jnp.asarray(clip, jnp.float32)}

  def _score(self, state, features, logits):
    return _energy_of(jnp.minimum(jnp.asarray(features, jnp.float32), state["clip"]), state)


class VRA(Detector):
  """VRA-P (Xu et al. NeurIPS 2023): energy of the logits of the rectified features
  g(h) = 0 where h < a, h where a <= h <= b, b where h > b (mode 'zero', the paper's VRA-P);
  OpenOOD's `vra` postprocessor clips instead, g(h) = min(max(h, a), b) (mode 'clip').
  a, b = the `percentile_low` / `percentile_high` percentiles (numpy 'linear') of all entries of
  the fit features (seeded `max_rows` subset as ReAct). 10 / 90 (OpenOOD's defaults)."""
  name, needs = "vra", frozenset({"features", "head"})
  fit_needs = frozenset({"features"})
  defaults = {"percentile_low": 10.0, "percentile_high": 90.0, "mode": "zero",
              "max_rows": 50_000, "seed": 0}
  presets = {"openood": {"mode": "clip"}}
  score_only = frozenset({"mode"})

  @classmethod
  def validate(cls, hp):
    lo, hi = hp["percentile_low"], hp["percentile_high"]
    require(0 <= lo <= hi <= 100, "vra: need 0 <= percentile_low <= percentile_high <= 100.")
    require(hp["mode"] in ("zero", "clip"), "vra: mode must be 'zero' or 'clip'.")
    require(int(hp["max_rows"]) >= 1, "vra: max_rows must be >= 1.")

  def _fit(self, train, head):
    hp = self.hparams
    entries = sampled_entries(train, hp["max_rows"], hp["seed"], self.name)
    lo, hi = entry_percentiles(entries, [hp["percentile_low"], hp["percentile_high"]])
    return {**head_state(head), "low": jnp.asarray(lo, jnp.float32),
            "high": jnp.asarray(hi, jnp.float32)}

  def _score(self, state, features, logits):
    h = jnp.asarray(features, jnp.float32)
    if self.hparams["mode"] == "clip":
      g = jnp.clip(h, state["low"], state["high"])
    else:
      g = jnp.where(h < state["low"], 0.0, jnp.minimum(h, state["high"]))
    return _energy_of(g, state)


def _ash_keep(d: int, percentile: float) -> int:
  """Entries kept per sample: D - round(D * p / 100) (numpy's round-half-even, as OpenOOD)."""
  return d - int(np.round(d * percentile / 100.0))


def _prune(h, k: int):
  """(mask of the k largest entries per row (lax.top_k's choice among ties:
  selection.top_k_mask), s1 = sum h, s2 = sum of the kept entries)."""
  return _prune_jit(h, k=k)


def _prune_rows(h, k: int):
  h = jnp.asarray(h, jnp.float32)
  mask = selection.top_k_mask(h, k)
  return mask, jnp.sum(fc(h), -1), jnp.sum(jnp.where(mask, fc(h), 0.0), -1)


_prune_jit = core.selection_jit(_prune_rows, static_argnames=("k",))


def _ratio(s1, s2):
  """s1 / s2, and 1 where both are 0 (an all-zero row: pruning removed nothing, as whenever
  s1 == s2; the references give 0/0 = NaN). docs/detectors.md#ash_s."""
  return jnp.where((s1 == 0) & (s2 == 0), 1.0, s1 / s2)


def _pruned_args(det, outputs) -> tuple:
  """(features, (mask, s1, s2)); the pruning is shared inside `detectors.shared()` by every
  detector that keeps the same k of the same features."""
  d = np.shape(outputs.features)[-1]
  k = _ash_keep(d, det.hparams["percentile"])
  if k <= 0:
    raise ValueError(f"{det.name}: percentile {det.hparams['percentile']} keeps no feature of "
                     f"{d}.")
  return outputs.features, shared.memo((outputs.features,), ("ash_prune", k),
                                       lambda: _prune(outputs.features, k))


class _ASH(Detector):
  """Activation shaping (Djurisic et al.): keep the k = D - round(D p / 100) largest entries
  per sample (exactly k, by top-k index), then ASH-P: zero the rest; ASH-B: kept entries set to
  s1 / k; ASH-S: pruned vector times exp(s1 / s2). s1 = original sum, s2 = sum after pruning.
  OpenOOD ships ASH-B only, p = 90; p = 90 is the default of all three variants here."""
  needs = frozenset({"features", "head"})
  defaults = {"percentile": 90.0}
  mode = "p"

  @classmethod
  def validate(cls, hp):
    check_percentile(cls.name, hp)

  def _fit(self, train, head):
    return head_state(head)

  def _score_args(self, state, outputs):
    return _pruned_args(self, outputs)

  def _score(self, state, features, pruned):
    mask, s1, s2 = pruned
    h = jnp.asarray(features, jnp.float32)
    k = _ash_keep(h.shape[-1], self.hparams["percentile"])
    if self.mode == "p":
      shaped = jnp.where(mask, h, 0.0)
    elif self.mode == "b":
      shaped = jnp.where(mask, (s1 / k)[:, None], 0.0)
    else:
      shaped = fc(jnp.where(mask, h, 0.0)) * jnp.exp(_ratio(s1, s2))[:, None]
    return _energy_of(shaped, state)


class ASHP(_ASH):
  name, mode = "ash_p", "p"


class ASHB(_ASH):
  name, mode = "ash_b", "b"


class ASHS(_ASH):
  name, mode = "ash_s", "s"


class SCALE(Detector):
  """SCALE (Xu et al. ICLR'24): energy of W (r h) + b with r = exp(s1 / s2) from ASH's top-k
  pruning (the *unpruned* h is scaled). p = 85 (OpenOOD default)."""
  name, needs = "scale", frozenset({"features", "head"})
  defaults = {"percentile": 85.0}

  @classmethod
  def validate(cls, hp):
    check_percentile("scale", hp)

  def _fit(self, train, head):
    return head_state(head)

  def _score_args(self, state, outputs):
    return _pruned_args(self, outputs)

  def _score(self, state, features, pruned):
    _, s1, s2 = pruned
    h = jnp.asarray(features, jnp.float32)
    z = head_logits(h, state["w"], 0.0) * jnp.exp(_ratio(s1, s2))[:, None] + fc(state["b"])
    return jax.nn.logsumexp(z, axis=-1)


class DICE(Detector):
  """DICE (Sun & Li): m = mean fit feature; V[j, c] = w[j, c] m_j; tau = the p-th percentile
  of all D*C entries of V; w' = w * (V > tau); energy of h w' + b. OpenOOD: p = 90."""
  name, needs = "dice", frozenset({"features", "head"})
  fit_needs = frozenset({"features"})
  defaults = {"percentile": 90.0}

  @classmethod
  def validate(cls, hp):
    check_percentile("dice", hp)

  def _fit(self, train, head):
    st = stats.moments(train)
    mean = st["sum"] / st["n"]
    w = np.asarray(head.w, np.float64)
    contrib = w * mean[:, None]
    tau = np.percentile(contrib.reshape(-1), self.hparams["percentile"])
    return {"w": jnp.asarray(np.where(contrib > tau, w, 0.0), jnp.float32),
            "b": jnp.asarray(head.b, jnp.float32)}

  def _score(self, state, features, logits):
    return _energy_of(features, state)


def _energy64(h, state):
  """LSE(h W + b) with the matmul in the compute dtype (float64 under x64)."""
  return jax.nn.logsumexp(matmul(fc(h), fc(state["w"])) + fc(state["b"]), axis=-1)


# ----------------------------------------------------------------------------- BATS

@jax.jit
def _var_chunk(h, shift):
  x = fc(h) - shift
  return {"n": jnp.asarray(x.shape[0], x.dtype), "sum": jnp.sum(x, 0), "sumsq": jnp.sum(x * x, 0)}


def feature_mean_std(train) -> tuple[np.ndarray, np.ndarray]:
  """Per-dimension mean and (population) std of the fit features: float64 sums about the
  first chunk's mean K, in fixed chunks (batching-independent); shared inside shared()."""
  def compute():
    total, k = None, None
    for _, chunk in stats.chunks(train):
      require(chunk.features is not None, "This detector needs fit Outputs with features.")
      if k is None:
        k = np.asarray(jnp.mean(fc(chunk.features), 0), np.float64)
      total = stats.add_sums(total, _var_chunk(chunk.features, jnp.asarray(k, cdtype())))
    require(total is not None, "The fit set is empty.")
    d = total["sum"] / total["n"]
    var = np.maximum(total["sumsq"] / total["n"] - d * d, 0.0)
    return k + d, np.sqrt(var)
  return shared.memo((train,), ("feature_mean_std",), compute)


class BATS(Detector):
  """BATS (Zhu et al. NeurIPS'22) on the penultimate features: energy of W^T h' + b with
  h' = clip(h, mu - lam sigma, mu + lam sigma), mu / sigma the per-dimension mean / std of the
  fit features. The paper truncates the last BN layer's output to beta -+ lam |gamma| inside the
  network (the BN's own statistics); fi_jax sees only the pooled features, so the feature
  statistics of the fit set stand in for (beta, gamma) (docs/detectors.md#bats).
  lam = 1.05 (the paper's ImageNet ResNet-50 value)."""
  name, needs = "bats", frozenset({"features", "head"})
  fit_needs = frozenset({"features"})
  defaults = {"lam": 1.05}

  @classmethod
  def validate(cls, hp):
    require(0 < hp["lam"] < np.inf, "bats: lam must be a finite number > 0.")

  def _fit(self, train, head):
    mu, sd = feature_mean_std(train)
    lam = float(self.hparams["lam"])
    cd = cdtype()
    return {**head_state(head), "lo": jnp.asarray(mu - lam * sd, cd),
            "hi": jnp.asarray(mu + lam * sd, cd)}

  def _score(self, state, features, logits):
    return _energy64(jnp.clip(fc(features), state["lo"], state["hi"]), state)


# ----------------------------------------------------------------------------- OptFS

def _bins_of(h, left, width):
  """Index i of the interval [left_i, left_i + width) holding each entry of h; -1 if none
  (searchsorted(left, h, 'right') - 1, then the width test), by core.bin_index over the edges
  left_0 .. left_{n-1}, left_{n-1} + width (no binary search)."""
  n = left.shape[0]
  i = core.bin_index(h, jnp.append(left, left[-1] + width))      # n outside the edges
  ok = (i < n) & (h < left[jnp.minimum(i, n - 1)] + width)
  return jnp.where(ok, i, -1)


@functools.partial(jax.jit, static_argnames=("nbins",))
def _optfs_chunk(h, logits, w, left, width, *, nbins: int):
  """sum over rows and dims of w[j, pred] h_j per interval of h_j (float64)."""
  h = fc(h)
  pred = jnp.argmax(logits, -1)
  lc = h * fc(w).T[pred]
  idx = _bins_of(h, left, width)
  seg = jnp.where(idx >= 0, idx, nbins).reshape(-1)
  return {"n": jnp.asarray(h.shape[0], h.dtype),
          "contrib": jax.ops.segment_sum(lc.reshape(-1), seg, nbins + 1)[:nbins]}


class OptFS(Detector):
  """OptFS (Zhao et al. ICLR'24): a piecewise-constant shaping h'_j = theta_i(h_j) h_j over 100
  equal intervals [l_i, l_i + width) spanning the 0.1% and 99.9% quantiles of all fit feature
  entries (l = numpy arange(q_lo, q_hi, width), width = (q_hi - q_lo) / 100; entries outside
  every interval are zeroed); theta = 1000 I / |I|_2 with I_i = mean over fit rows of
  sum_j [h_j in interval i] W[j, pred] h_j (pred = argmax of the fit logits). Score 'energy':
  LSE(W^T h' + b) (default); 'vanilla': <W[:, pred], h'> (the official code's default). The
  quantiles and I are taken over the fit rows, or over a seeded subset of `max_rows` rows
  (the rows ReAct samples with the same max_rows and seed), in one pass."""
  name, needs = "optfs", frozenset({"features", "logits", "head"})
  fit_needs = frozenset({"features", "logits"})
  defaults = {"score": "energy", "max_rows": 50_000, "seed": 0}
  score_only = frozenset({"score"})

  @classmethod
  def validate(cls, hp):
    require(hp["score"] in ("energy", "vanilla"), "optfs: score must be 'energy' or 'vanilla'.")
    require(int(hp["max_rows"]) >= 1, "optfs: max_rows must be >= 1.")

  def _fit(self, train, head):
    mr, seed = self.hparams["max_rows"], self.hparams["seed"]
    # one pass (a one-shot iterator is read once): the rows ReAct samples, with their logits
    sample = stats.RowSample(mr, seed, ("features", "logits"))
    for start, chunk in stats.chunks(train):
      require(chunk.features is not None and chunk.logits is not None,
              "optfs needs fit Outputs with features and logits.")
      sample.add(start, chunk)
    rows = sample.result()
    ordered = np.sort(rows["features"].reshape(-1))           # cheaper than np.quantile's partition
    lo, hi = (sorted_quantile(ordered, q, np.float64) for q in (1e-3, 1 - 1e-3))
    require(hi > lo, "optfs: the fit features are constant; no interval to shape.")
    width = (hi - lo) / 100.0
    left = np.arange(lo, hi, width)
    cd = cdtype()
    part = _optfs_chunk(rows["features"], rows["logits"], jnp.asarray(head.w, jnp.float32),
                        jnp.asarray(left, cd), jnp.asarray(width, cd), nbins=len(left))
    contrib = np.asarray(part["contrib"], np.float64) / float(part["n"])
    norm = np.linalg.norm(contrib)
    require(norm > 0, "optfs: the fit contributions are all zero.")
    return {**head_state(head), "left": jnp.asarray(left, cd), "width": jnp.asarray(width, cd),
            "theta": jnp.asarray(contrib / norm * 1000.0, cd)}

  def _score(self, state, features, logits):
    h = fc(features)
    idx = _bins_of(h, state["left"], state["width"])
    shaped = jnp.where(idx >= 0, state["theta"][jnp.maximum(idx, 0)], 0.0) * h
    if self.hparams["score"] == "vanilla":
      wp = fc(state["w"]).T[jnp.argmax(logits, -1)]
      return jnp.sum(wp * shaped, -1)
    return _energy64(shaped, state)


# ----------------------------------------------------------------------------- LINe

def _line_scores(x, pred, state, blk: int):
  """LSE over k' of sum_j x_j mask_a[y, j] W[j, k'] [|c[y, j]| W[j, k'] > t_w[y]] + b_k', y = pred.

  The masked head only depends on the predicted class: rows are sorted by class and taken in
  blocks of `blk` rows of one class (a class's last block is padded), so each block builds one
  [D, C] masked head and does one [blk, D] x [D, C] matmul; a loop over the blocks actually
  used (at most N / blk + min(N, C)) keeps the shapes fixed."""
  n = x.shape[0]
  c = state["w"].shape[1]
  w, b = fc(state["w"]), fc(state["b"])
  order = jnp.argsort(pred, stable=True)
  counts = jnp.bincount(pred, length=c)
  row_start = jnp.cumsum(counts) - counts
  nblk = (counts + blk - 1) // blk
  blk_end = jnp.cumsum(nblk)
  blk_start = blk_end - nblk

  def body(i, out):
    k = jnp.searchsorted(blk_end, i, side="right")
    pos = row_start[k] + (i - blk_start[k]) * blk + jnp.arange(blk)
    valid = pos < row_start[k] + counts[k]
    rows = order[jnp.minimum(pos, n - 1)]
    wk = jnp.where(state["abs_contrib"][k][:, None] * w > state["thresh_w"][k], w, 0.0)
    s = jax.nn.logsumexp(matmul(x[rows] * state["mask_a"][k], wk) + b, axis=-1)
    return out.at[jnp.where(valid, rows, n)].set(s, mode="drop")

  return jax.lax.fori_loop(0, blk_end[-1], body, jnp.zeros((n,), x.dtype))


_THRESH_SAMPLE = 8192                   # entries sampled to bracket a class's percentile


def _lerp(v0: float, v1: float, gamma: float) -> float:
  """numpy's 'linear' percentile interpolation between neighbouring order statistics (the
  same float operations, so the same bits)."""
  diff = v1 - v0
  return v1 - diff * (1 - gamma) if gamma >= 0.5 else v0 + diff * gamma


def _line_weight_thresholds(absc, w, p: float) -> np.ndarray:
  """t[k] = np.percentile(absc[k][:, None] * w, p) for every class k (bit-identical): C
  selections over the D*C products each (the fit's cost), classes split over threads.

  The two order statistics a percentile interpolates are found among the products inside a
  bracket: the bracket comes from a fixed sample of the products (+-4 standard deviations of the
  sample rank about the target), the products below it are counted and the few inside it
  partitioned (~5x faster than np.percentile's partition of all D*C products); a bracket that
  misses (rare) falls back to np.percentile."""
  n = w.size
  vi = (n - 1) * (p / 100.0)                               # numpy's 'linear' virtual index
  lo_i = int(np.floor(vi))
  gamma = vi - np.floor(vi)
  fast = (n > 8 * _THRESH_SAMPLE and 0 <= lo_i < n - 1 and np.isfinite(w).all()
          and np.isfinite(absc).all())
  sample = np.random.default_rng(0).choice(n, _THRESH_SAMPLE, replace=False) if fast else None
  f = lo_i / n
  margin = int(4 * np.sqrt(_THRESH_SAMPLE * f * (1 - f))) + 2
  r_lo = max(0, int(f * _THRESH_SAMPLE) - margin)
  r_hi = min(_THRESH_SAMPLE - 1, int(f * _THRESH_SAMPLE) + margin + 1)

  def one(buf):
    flat = buf.reshape(-1)
    if fast:
      est = np.partition(flat[sample], [r_lo, r_hi])
      lo, hi = est[r_lo], est[r_hi]
      below = int(np.count_nonzero(flat < lo))
      k = lo_i - below
      if k >= 0:
        cand = flat[(flat >= lo) & (flat <= hi)]
        if k + 1 < len(cand):
          v = np.partition(cand, [k, k + 1])
          return _lerp(v[k], v[k + 1], gamma)
    return np.percentile(flat, p, overwrite_input=True)

  def run(ks):
    buf = np.empty_like(w)
    out = []
    for k in ks:
      np.multiply(absc[k][:, None], w, out=buf)
      out.append(one(buf))
    return out
  parts = np.array_split(np.arange(len(absc)), max(1, min(4, os.cpu_count() or 1)))
  with concurrent.futures.ThreadPoolExecutor(len(parts)) as ex:
    return np.concatenate([np.asarray(r, np.float64) for r in ex.map(run, parts)])


class LINe(Detector):
  """LINe (Ahn et al. CVPR'23), the official post-hoc form: contributions c[k, j] = mu_k[j] W[j, k]
  (the class-mean first-order Taylor / Shapley approximation h_j dz_y/dh_j of the fit rows of
  true class k); per class k: weight mask [|c[k, j]| W[j, k'] > t_k], t_k = the p_w-th
  percentile of all D*C entries of |c[k]|[:, None] * W; activation mask [c[k, j] > a_k], a_k the
  p_a-th percentile of c[k]. Score: x = min(h, clip), y = argmax(W^T x + b),
  LSE over k' of sum_j x_j amask[y, j] W[j, k'] wmask_y[j, k'] + b_k'. clip = the
  `clip_percentile`-th percentile of the fit entries (ReAct's rule and rows; the official code
  takes an absolute 0.8 for ResNet-50; `clip` > 0 sets an absolute value). A class with no fit
  row has zero contributions (all its features masked). p_w = p_a = 10 (official ImageNet)."""
  name, needs = "line", frozenset({"features", "head"})
  fit_needs = frozenset({"features", "labels"})
  defaults = {"p_w": 10.0, "p_a": 10.0, "clip_percentile": 90.0, "clip": None,
              "max_rows": 50_000, "seed": 0, "block_elems": 1 << 24}
  score_only = frozenset({"block_elems"})

  @classmethod
  def validate(cls, hp):
    for k in ("p_w", "p_a", "clip_percentile"):
      require(0 <= hp[k] <= 100, f"line: {k} must be in [0, 100].")
    require(hp["clip"] is None or hp["clip"] > 0, "line: clip must be None or > 0.")
    require(int(hp["max_rows"]) >= 1, "line: max_rows must be >= 1.")
    require(int(hp["block_elems"]) >= 1, "line: block_elems must be >= 1.")

  def _fit(self, train, head):
    w = np.asarray(head.w, np.float64)
    hp = self.hparams
    sample = None
    if hp["clip"] is None and not stats.is_reiterable(train):
      # a one-shot iterator is read once: sample the clip rows in the moments pass
      sample = stats.RowSample(hp["max_rows"], hp["seed"], ("features",))
    st = stats.moments(train, num_classes=w.shape[1], group="label",
                       on_chunk=None if sample is None else sample.add)
    means, _ = stats.class_means(st)                      # zeros for empty classes
    contrib = means * w.T                                  # [C, D]
    absc = np.abs(contrib)
    t_w = _line_weight_thresholds(absc, w, hp["p_w"])
    t_a = np.percentile(contrib, hp["p_a"], axis=1)
    if hp["clip"] is not None:
      clip = float(hp["clip"])
    else:
      ent = (sample.result()["features"].reshape(-1) if sample is not None else
             sampled_entries(train, hp["max_rows"], hp["seed"], "line"))
      (clip,) = entry_percentiles(ent, hp["clip_percentile"])
    cd = cdtype()
    return {**head_state(head), "abs_contrib": jnp.asarray(absc, cd),
            "thresh_w": jnp.asarray(t_w, cd), "mask_a": jnp.asarray(contrib > t_a[:, None], cd),
            "clip": jnp.asarray(clip, cd)}

  def _blk(self, n: int, d: int, c: int) -> int:
    """Rows per block: at most block_elems / (D C), and the mean rows per class of the n rows
    scored rounded up to a power of two (padding a class's last block costs little; sets of
    similar sizes, e.g. the demo's ID test and OOD sets, then share one compiled program)."""
    per_class = -(-n // c)
    return max(1, min(int(self.hparams["block_elems"]) // max(d * c, 1),
                      1 << max(per_class - 1, 0).bit_length()))

  def _score(self, state, features, logits):
    x, pred = _line_clip_pred(features, state)
    n, d = x.shape
    return _line_scores(x, pred, state, self._blk(n, d, state["w"].shape[1]))

  def _score_blocked(self, state, outputs):
    """The rows sorted by predicted class *before* they are cut into score-block-row blocks:
    a block then holds whole classes, and each class's masked heads are built about once per
    set, not once per block (the cost of LINe's score). Two fixed-shape jitted calls per block
    (prediction, scores) serve every set whose rows per class round to the same `blk`."""
    block = core.score_block()
    n, blocks = core.score_blocks(outputs, block)
    if blocks is None:
      return super()._score_blocked(state, outputs)
    pred = np.concatenate([np.asarray(_line_clip_pred(b.features, state)[1])
                           for b in blocks])[:n]
    order = np.argsort(pred, kind="stable")
    feats = np.asarray(outputs.features)
    c = int(np.shape(state["w"])[1])
    blk = self._blk(n, feats.shape[1], c)
    out = np.empty(n, np.float64)
    for start in range(0, n, block):
      rows = order[start:start + block]
      pad = block - len(rows)
      rows_p = np.concatenate([rows, np.repeat(rows[-1:], pad)])
      pred_p = np.concatenate([pred[rows], np.full(pad, c, pred.dtype)])   # class c: no class
      s = _line_sorted_block(jax.device_put(feats[rows_p]), jax.device_put(pred_p), state,
                             blk=blk)
      out[rows] = np.asarray(s)[:len(rows)]
    return jax.device_put(out.astype(np.dtype(cdtype())))


@jax.jit
def _line_clip_pred(features, state):
  """(x = min(h, clip), predicted class argmax(W^T x + b))."""
  x = jnp.minimum(fc(features), state["clip"])
  return x, jnp.argmax(matmul(x, fc(state["w"])) + fc(state["b"]), -1)


@functools.partial(jax.jit, static_argnames=("blk",))
def _line_sorted_block(features, pred, state, *, blk: int):
  """LINe scores of a block of rows with given predicted classes (class C = a padding row)."""
  return _line_scores(jnp.minimum(fc(features), state["clip"]), pred, state, blk)
