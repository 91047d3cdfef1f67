"""Nearest-neighbour scores: KNN and NNGuide (docs/detectors.md#nearest-neighbour-scores), exact,
blockwise, optionally sharded.

Both scores need only order statistics of each query's similarities to the bank: KNN the k-th
largest, NNGuide the sum of the k largest. Similarities are float32 inner products at HIGHEST
precision (as faiss IndexFlatIP/L2), computed block by block: query blocks of `query_block` rows
against bank blocks of about `bank_block` rows, so N_test x N_bank never exists whole.

The selection is exact and sort-free (XLA:CPU's TopK takes about 1 ms a row at k = 1000, more
than the similarity matmul itself):
* similarities become int32 keys with the same order (`_order_keys`; masked rows: -inf);
* a block row is cut into groups of g entries (g ~ sqrt(n / k)) and only the groups whose
  maximum reaches a threshold t are kept, t such that between k and k + k/8 groups reach it.
  This keeps every one of the row's k largest entries: >= k entries are >= t, so the k-th
  largest is >= t, and every entry at or above it lies in a group whose maximum reaches t.
  Where ties at the k-th largest group maximum u exceed the k + k/8 slots, all groups above u
  and the first of those at u (index order) up to k are kept: each adds an entry = u;
* t is found by a bracketed root search on the count #(keys >= t) (`_threshold`: a normal-
  quantile first guess, then Illinois false position, ~5-10 counting passes where a bitwise
  binary search takes 32), the kept groups are compacted through a bit-packed mask
  (`_kept_indices`) and gathered; candidates of several bank blocks, or of several devices,
  are merged by the same selection;
* the same search over the final candidates, started at t, gives for every requested k the
  exact k-th largest value (the smallest key at or above the threshold it finds) and, for
  NNGuide, the top-k sum = sum(entries above it) + (k - their count) * that value.
Rows are selected 128 at a time: a search runs until the slowest row of its block ends.
With several local devices the bank is sharded along its rows (NamedSharding over a 1-D 'bank'
mesh, each shard a multiple of 64 rows); each device selects its candidate groups, which are
all-gathered and merged (the same values as one device).
"""
from __future__ import annotations

import functools
import logging
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from fi_jax.detectors import shared, stats
from fi_jax.detectors.core import HIGHEST, Detector, energy, fc, l2_normalize, require

_AXIS = "bank"
_ROW_ALIGN = 64         # bank rows per shard are a multiple of this (the largest group size)


# ----------------------------------------------------------------------------- exact selection

def _order_keys(x):
  """int32 keys ordered as the float32 values x (-0.0 just below +0.0; NaN outside +-inf)."""
  b = lax.bitcast_convert_type(jnp.asarray(x, jnp.float32), jnp.int32)
  return b ^ ((b >> 31) & jnp.int32(0x7FFFFFFF))


def _from_keys(u):
  """The float32 values of keys (inverse of _order_keys)."""
  return lax.bitcast_convert_type(u ^ ((u >> 31) & jnp.int32(0x7FFFFFFF)), jnp.float32)


_SIGN = np.uint32(0x80000000)


def _unsigned(key):
  """int32 keys as uint32 in the same order (for overflow-free interval arithmetic)."""
  return lax.bitcast_convert_type(key, jnp.uint32) ^ _SIGN


def _signed(u):
  return lax.bitcast_convert_type(u ^ _SIGN, jnp.int32)


def _count_at_least(keys, t):
  return jnp.sum(keys >= t[:, None], axis=1, dtype=jnp.int32)


def _threshold(keys, k: int, slack: int = 0, lower=None):
  """Per row of int32 keys [B, n] (n >= k): (t, c) with c = #(keys >= t) in [k, k + slack],
  or c > k + slack and t the k-th largest key (entries tied at it). `lower` [B]: optional keys
  with >= k entries at or above them (a known bracket end).

  Bracketed root finding on the count, one counting pass a step: a first guess at the normal
  quantile of the entries >= lower, then Illinois false position (invariant #(>= lo) >= k >
  #(>= hi); an end kept twice in a row has its weight halved). ~3-10 passes on smooth data
  where a bitwise binary search takes 32; after 24 steps it bisects, so it always ends."""
  hi = jnp.max(keys, axis=1)
  if lower is None:
    lo, c_lo = jnp.min(keys, axis=1), jnp.full(hi.shape, keys.shape[1], jnp.int32)
  else:
    lo, c_lo = lower, _count_at_least(keys, lower)
  c_hi = _count_at_least(keys, hi)
  at_max = c_hi >= k                       # the maximum is tied k times or more: the answer
  lo, c_lo = jnp.where(at_max, hi, lo), jnp.where(at_max, c_hi, c_lo)

  def open_(lo, hi, c_lo):
    return ~at_max & (c_lo > k + slack) & (_unsigned(hi) - _unsigned(lo) > 1)

  def update(lo, hi, c_lo, c_hi, t):
    c = _count_at_least(keys, t)
    active = open_(lo, hi, c_lo)
    up, down = active & (c >= k), active & (c < k)
    return (up, down, c, jnp.where(up, t, lo), jnp.where(down, t, hi),
            jnp.where(up, c, c_lo), jnp.where(down, c, c_hi))

  # first guess: mean + z * spread of the entries >= lo, z the normal quantile of 1 - k / c_lo
  x = jnp.where(keys >= lo[:, None], keys.astype(jnp.float32), 0.0)
  m = c_lo.astype(jnp.float32)
  mean = jnp.sum(x, axis=1) / m
  spread = jnp.sqrt(jnp.maximum(jnp.sum(x * x, axis=1) / m - mean * mean, 0.0))
  z = jax.scipy.special.ndtri(jnp.clip(1.0 - k / m, 1e-6, 1.0 - 1e-6))
  guess = jnp.clip(mean + z * spread, lo.astype(jnp.float32), hi.astype(jnp.float32))
  _, _, _, lo, hi, c_lo, c_hi = update(lo, hi, c_lo, c_hi, guess.astype(jnp.int32))

  def body(state):
    i, lo, hi, c_lo, c_hi, f_lo, f_hi, side = state
    a, span = _unsigned(lo), _unsigned(hi) - _unsigned(lo)
    secant = jnp.clip(f_lo / (f_lo - f_hi) * span.astype(jnp.float32), 1.0, 4.29e9)
    step = jnp.where(i < 24, secant.astype(jnp.uint32), span // 2)
    step = jnp.clip(step, 1, jnp.maximum(span, 2) - 1)
    up, down, c, lo, hi, c_lo, c_hi = update(lo, hi, c_lo, c_hi, _signed(a + step))
    f = (c - k).astype(jnp.float32)
    return (i + 1, lo, hi, c_lo, c_hi,
            jnp.where(up, f, jnp.where(down & (side < 0), f_lo / 2, f_lo)),
            jnp.where(down, f, jnp.where(up & (side > 0), f_hi / 2, f_hi)),
            jnp.where(up, 1, jnp.where(down, -1, side)))

  f = lambda c: (c - k).astype(jnp.float32)
  state = lax.while_loop(lambda st: jnp.any(open_(st[1], st[2], st[3])), body,
                         (0, lo, hi, c_lo, c_hi, f(c_lo), f(c_hi),
                          jnp.zeros(lo.shape, jnp.int32)))
  return state[1], state[3]


def _kept_indices(keep, slots: int):
  """[B, slots] int32: the column indices of the True entries of each row of keep [B, n] in
  order, n (out of range) past the last. The mask is packed into 32-bit words: a binary
  search over the words' running popcounts finds each slot's word, and five popcount halvings
  the bit within it (cheaper on XLA:CPU than a prefix sum and a search over n)."""
  b, n = keep.shape
  bits = jnp.pad(keep, ((0, 0), (0, (-n) % 32))).reshape(b, -1, 32).astype(jnp.uint32)
  words = jnp.sum(bits << jnp.arange(32, dtype=jnp.uint32), axis=2, dtype=jnp.uint32)
  ends = jnp.cumsum(lax.population_count(words).astype(jnp.int32), axis=1)  # inclusive
  want = jnp.arange(1, slots + 1, dtype=jnp.int32)
  w = jax.vmap(lambda e: jnp.searchsorted(e, want, side="left", method="scan"))(ends)
  valid = w < words.shape[1]
  w = jnp.minimum(w, words.shape[1] - 1)
  word = jnp.take_along_axis(words, w, axis=1)
  rank = want - (jnp.take_along_axis(ends, w, axis=1)
                 - lax.population_count(word).astype(jnp.int32))   # 1-based within the word
  pos = jnp.zeros_like(rank)
  for width in (16, 8, 4, 2, 1):
    low = lax.population_count((word >> pos.astype(jnp.uint32))
                               & jnp.uint32((1 << width) - 1)).astype(jnp.int32)
    skip = rank > low
    rank = jnp.where(skip, rank - low, rank)
    pos = jnp.where(skip, pos + width, pos)
  return jnp.where(valid, w * 32 + pos, n)


def _slots(k: int) -> int:
  """Groups kept for k: k plus 1/8 slack, which lets the threshold search stop early."""
  return k + k // 8


def _top_groups_rows(vals, k: int):
  """(groups, lower): the groups of float32 vals [B, G, g] whose maxima reach a threshold
  that >= k and <= _slots(k) of them reach, [B, _slots(k), g] (-inf filled); they hold the k
  largest entries of each row (module doc). Where ties at the k-th largest maximum exceed the
  slots, exactly k are kept in index order. lower [B]: that threshold key (>= k kept entries
  are >= it); all groups and None if G <= _slots(k)."""
  b, n_groups, _ = vals.shape
  slots = _slots(k)
  if n_groups <= slots:
    return vals, None
  # keys: a total order, NaN included; the barrier keeps XLA from recomputing the maxima
  # from vals in every pass of the search
  gmax = lax.optimization_barrier(jnp.max(_order_keys(vals), axis=-1))
  t, c = _threshold(gmax, k, slots - k)

  def tie_order():                         # t is the k-th largest maximum where c > slots
    above, at = gmax > t[:, None], gmax == t[:, None]
    room = k - jnp.sum(above, axis=1, keepdims=True, dtype=jnp.int32)
    return above | (at & (jnp.cumsum(at, axis=1, dtype=jnp.int32) <= room))
  keep = lax.cond(jnp.any(c > slots), tie_order, lambda: gmax >= t[:, None])
  idx = _kept_indices(keep, slots)
  groups = jnp.take_along_axis(vals, idx[:, :, None], axis=1, mode="fill",
                               fill_value=-jnp.inf)
  return groups, t


def _order_stats_rows(cand, ks: tuple[int, ...], lower=None, sums: bool = True):
  """(k-th largest value [B, m] float32, sum of the k largest [B, m] in the compute dtype, or
  None without `sums`) of the float32 candidates [B, M] of each row, for every k in ks
  (lower: as in _threshold). The largest k is searched first; its k-th largest bounds the
  search of each smaller k."""
  keys = lax.optimization_barrier(_order_keys(cand))
  kth_of, sum_of = {}, {}
  for k in sorted(ks, reverse=True):
    t, _ = _threshold(keys, k, 0, lower)
    # the k-th largest is the smallest key >= t (t itself where it is tied)
    lower = jnp.min(jnp.where(keys >= t[:, None], keys, jnp.iinfo(jnp.int32).max), axis=1)
    kth_of[k] = kth = _from_keys(lower)
    if sums:
      above = keys > lower[:, None]
      n_above = jnp.sum(above, axis=1, dtype=jnp.int32)
      sum_of[k] = jnp.sum(jnp.where(above, fc(cand), 0), axis=1) + (k - n_above) * fc(kth)
  return (jnp.stack([kth_of[k] for k in ks], axis=1),
          jnp.stack([sum_of[k] for k in ks], axis=1) if sums else None)


_SELECT_ROWS = 128   # rows selected together: the searches run until their slowest row ends


def _by_rows(fn, *arrays):
  """fn(*arrays) on blocks of _SELECT_ROWS rows (lax.map) when the rows divide evenly: fewer
  search passes (the slowest row of a smaller block) and cache-sized temporaries."""
  b = arrays[0].shape[0]
  if b <= _SELECT_ROWS or b % _SELECT_ROWS:
    return fn(*arrays)
  split = lambda x: x.reshape(b // _SELECT_ROWS, _SELECT_ROWS, *x.shape[1:])
  out = lax.map(lambda xs: fn(*xs), tuple(split(x) for x in arrays))
  return jax.tree.map(lambda y: y.reshape(b, *y.shape[2:]), out)


def _top_groups(vals, k: int):
  """_top_groups_rows by blocks of rows."""
  return _by_rows(lambda v: _top_groups_rows(v, k), vals)


def _order_stats(cand, ks: tuple[int, ...], lower=None, sums: bool = True):
  """_order_stats_rows by blocks of rows."""
  if lower is None:
    return _by_rows(lambda c: _order_stats_rows(c, ks, None, sums), cand)
  return _by_rows(lambda c, low: _order_stats_rows(c, ks, low, sums), cand, lower)


def _group_size(n: int, k: int) -> int:
  """Entries per group, a power of two <= 64 near sqrt(n / k): balances the n/g maxima that
  are searched against the k*g candidates that are kept."""
  g = 1
  while g < _ROW_ALIGN and 4 * g * g * k <= n:
    g *= 2
  return g


def _final_stats(groups_lower, ks, sums: bool = True):
  groups, lower = groups_lower
  return _order_stats(groups.reshape(groups.shape[0], -1), ks, lower, sums)


def row_order_stats(s, ks: tuple[int, ...]):
  """(k-th largest [B, m], top-k sum [B, m]) of each row of s [B, n] for every k in ks (exact,
  by the grouped selection above; -inf counts as a value). For tests and callers with scores
  already in memory."""
  s = jnp.asarray(s, jnp.float32)
  b, n = s.shape
  g = _group_size(n, max(ks))
  s = jnp.pad(s, ((0, 0), (0, (-n) % g)), constant_values=-jnp.inf)
  return _final_stats(_top_groups(s.reshape(b, -1, g), max(ks)), ks)


# ----------------------------------------------------------------------------- blockwise search

def _local_candidates(q, bank, n_valid, offset, k: int, bank_block: int):
  """(groups [Bq, K, g] float32, lower): candidate groups holding the k largest similarities
  of queries q [Bq, D] to the bank rows with global index offset + r < n_valid (see
  _top_groups). The bank's row count is a multiple of 64 (so of g). Balanced blocks of
  > _slots(k) groups each; the last block is clamped to the end of the bank and its rows
  already seen are masked (no padding copy of the bank)."""
  nl = bank.shape[0]
  nblocks = max(1, math.ceil(nl / bank_block))
  g = _group_size(math.ceil(nl / nblocks), k)
  nb = min(nl, max(g * math.ceil(nl / nblocks / g), g * (_slots(k) + 1)))
  nblocks = math.ceil(nl / nb)

  def block(i):
    start = jnp.minimum(i * nb, nl - nb)
    blk = lax.dynamic_slice_in_dim(bank, start, nb, axis=0)
    s = lax.dot_general(q, blk, (((1,), (1,)), ((), ())), precision=HIGHEST,
                        preferred_element_type=jnp.float32)
    rows = start + jnp.arange(nb)
    ok = (rows >= i * nb) & (offset + rows < n_valid)
    s = jnp.where(ok[None, :], s, -jnp.inf)
    return _top_groups(s.reshape(q.shape[0], nb // g, g), k)

  if nblocks == 1:
    return block(0)
  return lax.fori_loop(
      1, nblocks, lambda i, c: _top_groups(jnp.concatenate([c[0], block(i)[0]], axis=1), k),
      block(0))


@functools.partial(jax.jit,
                   static_argnames=("ks", "query_block", "bank_block", "mesh", "sums"))
def knn_order_stats(queries, bank, n_valid, *, ks: tuple[int, ...], query_block: int,
                    bank_block: int, mesh=None, sums: bool = True):
  """For every k in ks: the k-th largest inner product [N, m] (float32) of each float32 query
  with the first n_valid bank rows, and the sum of the k largest [N, m] (compute dtype; None
  without `sums`)."""
  n, d = queries.shape
  k = max(ks)
  qb = max(1, min(query_block, n))
  nq = math.ceil(n / qb)
  qs = jnp.pad(queries, ((0, nq * qb - n), (0, 0))).reshape(nq, qb, d)

  if mesh is None:
    def run(qs, bank, n_valid):
      return lax.map(
          lambda qq: _final_stats(_local_candidates(qq, bank, n_valid, 0, k, bank_block), ks,
                                  sums), qs)
  else:
    def shard(qs, bank, n_valid):
      offset = lax.axis_index(_AXIS) * bank.shape[0]

      def one(qq):
        local, _ = _local_candidates(qq, bank, n_valid, offset, k, bank_block)
        every = lax.all_gather(local, _AXIS, axis=1, tiled=True)
        return _final_stats(_top_groups(every, k), ks, sums)
      return lax.map(one, qs)
    # the merge is computed identically on every device from the all-gathered candidates
    run = jax.shard_map(shard, mesh=mesh, in_specs=(P(), P(_AXIS), P()), out_specs=P(),
                        check_vma=False)
  kth, top_sum = run(qs, bank, n_valid)
  unpad = lambda x: None if x is None else x.reshape(nq * qb, -1)[:n]
  return unpad(kth), unpad(top_sum)


# ----------------------------------------------------------------------------- bank

def bank_mesh():
  """A 1-D mesh over the local devices, or None with a single device."""
  devs = jax.local_devices()
  if len(devs) < 2:
    return None
  return Mesh(np.array(devs), (_AXIS,), axis_types=(jax.sharding.AxisType.Auto,))


def _shards() -> int:
  mesh = bank_mesh()
  return 1 if mesh is None else mesh.devices.size


def place_bank(parts) -> dict:
  """{'bank': the rows of `parts` (an array, or a list of row blocks) in one float32 array
  zero-padded to a multiple of 64 x the local device count (one copy), sharded along its rows
  when there are several devices; 'n': the number of real rows}."""
  parts = [np.asarray(p, np.float32) for p in (parts if isinstance(parts, list) else [parts])]
  n = sum(p.shape[0] for p in parts)
  rows = np.zeros((n + (-n) % (_ROW_ALIGN * _shards()), parts[0].shape[1]), np.float32)
  np.concatenate(parts, out=rows[:n])
  mesh = bank_mesh()
  if mesh is None:
    return {"bank": jnp.asarray(rows), "n": jnp.asarray(n, jnp.int32)}
  return {"bank": jax.device_put(rows, NamedSharding(mesh, P(_AXIS))),
          "n": jnp.asarray(n, jnp.int32)}


def _bank_for_scoring(bank):
  """(bank, mesh): zero-padded to 64 x shards rows if it is not (a bank placed elsewhere) and
  sharded over the local devices when there are several."""
  mesh = bank_mesh()
  align = _ROW_ALIGN * _shards()
  if bank.shape[0] % align:
    bank = jnp.pad(jnp.asarray(bank, jnp.float32), ((0, (-bank.shape[0]) % align), (0, 0)))
  if mesh is None:
    return bank, None
  sharding = NamedSharding(mesh, P(_AXIS))
  if getattr(bank, "sharding", None) != sharding:
    bank = jax.device_put(bank, sharding)
  return bank, mesh


@jax.jit
def _normalize32(h):
  return l2_normalize(jnp.asarray(h, jnp.float32))


@jax.jit
def _guides(h, logits):
  """NNGuide's guide vectors h_hat * LSE(z) (float32) for every row of a chunk."""
  return _normalize32(h) * energy(logits).astype(jnp.float32)[:, None]


class _BankDetector(Detector):
  """Shared blockwise order statistics of the similarities to state['bank']."""
  defaults = {"query_block": 512, "bank_block": 131072}
  score_only = frozenset({"k", "query_block", "bank_block"})

  @classmethod
  def validate(cls, hp):
    require(int(hp["k"]) >= 1, f"{cls.name}: k must be >= 1.")
    require(int(hp["query_block"]) >= 1 and int(hp["bank_block"]) >= 1,
            f"{cls.name}: query_block and bank_block must be >= 1.")

  def _k(self, state) -> int:
    n = int(state["n"])
    require(n >= 1, f"{self.name}: the bank is empty.")
    if self.hparams["k"] > n:
      logging.warning("%s: k=%d > bank size %d; using k=%d.", self.name, self.hparams["k"], n, n)
    return min(int(self.hparams["k"]), n)

  uses_top_sum = True                      # NNGuide: the mean of the top k; KNN: not needed

  def order_stats(self, state, queries, ks: tuple[int, ...]):
    """(k-th largest similarity, sum of the k largest or None), each [N, len(ks)], of the
    normalised queries to the bank, for every k in ks."""
    bank, mesh = _bank_for_scoring(state["bank"])
    return knn_order_stats(queries, bank, state["n"], ks=tuple(ks),
                           query_block=int(self.hparams["query_block"]),
                           bank_block=int(self.hparams["bank_block"]), mesh=mesh,
                           sums=self.uses_top_sum)

  def _features_stats(self, state, features):
    """(k-th largest similarity [N], mean of the k largest [N] or None) of the features'
    normalised rows. Inside `detectors.shared()` one search on the same bank and features
    serves every k announced for this detector (`shared(detectors=...)`): the candidates kept
    for the largest k hold the top entries of every smaller one."""
    k = self._k(state)
    hit = shared.lookup((state["bank"], features), (),
                        lambda extra, v: extra[0] == "order_stats" and k in v)
    if hit is None:
      n = int(state["n"])
      ks = tuple(sorted({k} | {min(j, n) for j in shared.ks(self.name)}))
      kth, top_sum = self.order_stats(state, _normalize32(features), ks)
      hit = {j: (kth[:, i], None if top_sum is None else top_sum[:, i] / j)
             for i, j in enumerate(ks)}
      shared.store((state["bank"], features), ("order_stats",), hit)
    return hit[k]

  def _score_args(self, state, outputs):
    return (*self._features_stats(state, outputs.features),
            outputs.logits if "logits" in self.needs else None)


class KNN(_BankDetector):
  """Deep nearest neighbours (Sun et al.): s = -|h_hat - h_hat_(K)|^2 = -(2 - 2 cos_K), cos_K
  the K-th largest cosine to the L2-normalised fit features (the bank: all of them, as OpenOOD
  and NINCO; the references' +1e-10 per component is not added). K = 1000 (paper repo, NINCO),
  50 (OpenOOD default); K is clamped to the bank size."""
  name, needs = "knn", frozenset({"features"})
  fit_needs = frozenset({"features"})
  defaults = {"k": 1000, **_BankDetector.defaults}
  presets = {"ninco": {"k": 1000}, "openood": {"k": 50}}
  uses_top_sum = False

  def _fit(self, train, head):
    parts = []
    for _, chunk in stats.chunks(train):
      require(chunk.features is not None, "knn needs fit Outputs with features.")
      parts.append(np.asarray(_normalize32(chunk.features)))
    require(bool(parts), "knn: the fit set is empty.")
    return place_bank(parts)

  def _score(self, state, kth, top_mean, logits):
    return -(2.0 - 2.0 * fc(kth))


class NNGuide(_BankDetector):
  """NNGuide (Park et al.): guide bank g_i = h_hat_i * LSE(z_i) over a seeded alpha fraction of
  the fit rows (each row kept with probability alpha by a hash of its row index: independent of
  batching; OpenOOD takes the first ~1% of a shuffled loader); s = LSE(z) * mean of the K
  largest <h_hat, g_i>. K = 100, alpha = 0.01 (OpenOOD); K is clamped to the bank size."""
  name, needs = "nnguide", frozenset({"features", "logits"})
  fit_needs = frozenset({"features", "logits"})
  defaults = {"k": 100, "alpha": 0.01, "seed": 0, **_BankDetector.defaults}

  @classmethod
  def validate(cls, hp):
    super().validate(hp)
    require(0 < hp["alpha"] <= 1, "nnguide: alpha must be in (0, 1].")

  def _fit(self, train, head):
    parts = []
    for start, chunk in stats.chunks(train):
      require(chunk.features is not None and chunk.logits is not None,
              "nnguide needs fit Outputs with features and logits.")
      keep = stats.bernoulli_mask(self.hparams["seed"], start, stats.num_rows(chunk),
                                  self.hparams["alpha"])
      if keep.any():
        parts.append(np.asarray(_guides(chunk.features, chunk.logits))[keep])
    if not parts:
      raise ValueError(f"nnguide: the alpha={self.hparams['alpha']} sample of the fit set is "
                       "empty; use a larger fit set or alpha.")
    return place_bank(parts)

  def _score(self, state, kth, top_mean, logits):
    return energy(logits) * top_mean
