"""Exact, sort-free order statistics of the rows of a matrix, and float order keys.

For each row of float32 scores: the k-th largest value and the sum of the k largest, for
several k at once, exactly (the KNN and NNGuide detectors use it; see docs/detectors.md). It
replaces XLA's TopK, which on CPU takes about 1 ms a row at k = 1000:
* values become integer keys with the same order (`order_key`; masked entries: -inf);
* a row is cut into groups of g entries (g ~ sqrt(n / k), `group_size`) and only the groups
  whose maximum reaches a threshold t are kept, t such that between k and `slots(k)` = k + k/8
  groups reach it. This keeps every one of the row's k largest entries: >= k entries are >= t,
  so the k-th largest is >= t, and every entry at or above it lies in a group whose maximum
  reaches t. Where ties at the k-th largest group maximum u exceed the slots, all groups
  above u and the first of those at u (index order) up to k are kept: each adds an entry = u;
* t is found by a bracketed root search on the count #(keys >= t) (`_threshold`: a normal-
  quantile first guess, then Illinois false position, ~5-10 counting passes where a bitwise
  binary search takes 32), the kept groups are compacted through a bit-packed mask
  (`kept_indices`) and gathered (`top_groups`); candidates of several blocks, or of several
  devices, are merged by the same selection;
* the same search over the final candidates, started at t, gives for every requested k the
  exact k-th largest value (the smallest key at or above the threshold it finds) and the
  top-k sum = sum(entries above it) + (k - their count) * that value (`group_order_stats`;
  `grouped_order_stats` runs both steps on one block of rows at a time, so that the candidates
  of all the rows are never stacked in memory).
Rows are selected 128 at a time: a search runs until the slowest row of its block ends.
`row_order_stats` runs it all on a matrix in memory; `reference_top_k` computes the same with
`lax.top_k` (the oracle of the tests).

Order keys: `order_key` maps float32 / float64 to int32 / int64 keys whose integer order is
the float order, with -0.0 and +0.0 equal (they are equal values) and NaN outside +-inf.
Comparisons are on the bits on purpose: XLA on CPU compares subnormals as zero. The metrics
(fi_jax.metrics) sort the same keys.
"""
from __future__ import annotations

from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

MAX_GROUP = 64        # the largest group size (a bank blocked in multiples of it fits any g)
_SELECT_ROWS = 128    # rows selected together: the searches run until their slowest row ends
_SIGN = np.uint32(0x80000000)
_KEY_DTYPES = {np.dtype(np.float32): jnp.int32, np.dtype(np.float64): jnp.int64}
_FLOAT_DTYPES = {np.dtype(np.int32): jnp.float32, np.dtype(np.int64): jnp.float64}


# ----------------------------------------------------------------------------- order keys

def order_key(x: jax.Array) -> jax.Array:
  """Signed-integer keys (int32 for float32, int64 for float64) in the order of the float
  values x: -0.0 gets +0.0's key (they tie), NaN sorts outside +-inf by its sign bit."""
  idt = _KEY_DTYPES.get(np.dtype(x.dtype))
  if idt is None:
    raise TypeError(f"order_key takes float32 or float64 values, got {x.dtype}; cast first.")
  b = lax.bitcast_convert_type(x, idt)
  k = b ^ ((b >> (jnp.iinfo(idt).bits - 1)) & jnp.iinfo(idt).max)   # negatives: reversed
  return jnp.where(k == -1, 0, k)                                   # -0.0 -> +0.0's key


def from_order_key(k: jax.Array) -> jax.Array:
  """The float values of keys (the inverse of order_key; key 0 is +0.0)."""
  fdt = _FLOAT_DTYPES.get(np.dtype(k.dtype))
  if fdt is None:
    raise TypeError(f"from_order_key takes int32 or int64 keys, got {k.dtype}.")
  return lax.bitcast_convert_type(k ^ ((k >> (jnp.iinfo(k.dtype).bits - 1))
                                       & jnp.iinfo(k.dtype).max), fdt)


def _keys32(x):
  return order_key(jnp.asarray(x, jnp.float32))


def _wide(x) -> jax.Array:
  """x in the sum dtype: float64 when x64 is enabled, else float32 (read at trace time; the
  detectors' compute dtype)."""
  return jnp.asarray(x).astype(jax.dtypes.canonicalize_dtype(jnp.float64))


# ----------------------------------------------------------------------------- search

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
  # max as ~min(~keys): where keys are themselves maxima (top_groups), XLA would merge a max of
  # them into one reduction over the groups' entries, which then must be written out
  hi = ~jnp.min(~keys, axis=1)
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


def kept_indices(keep: jax.Array, slots: int) -> jax.Array:
  """[B, slots] int32: the column indices of the True entries of each row of keep [B, n] in
  order, n (out of range) past the last. The mask is packed into 32-bit words: a binary
  search over the words' running popcounts finds each slot's word, and the popcounts of the
  word's 32 prefixes the bit within it (cheaper on XLA:CPU than a prefix sum and a search over
  n)."""
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
  # the bit: the number of prefixes word & (2**(j+1) - 1), j < 32, holding < rank set bits. A
  # reduction, so XLA computes it once per slot (elementwise steps would be recomputed for each
  # gathered entry inside top_groups' gather)
  prefixes = jnp.uint32(0xFFFFFFFF) >> jnp.arange(31, -1, -1, dtype=jnp.uint32)
  low = lax.population_count(word[..., None] & prefixes).astype(jnp.int32)
  pos = jnp.sum(low < rank[..., None], axis=-1, dtype=jnp.int32)
  return jnp.where(valid, w * 32 + pos, n)


def slots(k: int) -> int:
  """Groups kept for k: k plus 1/8 slack, which lets the threshold search stop early."""
  return k + k // 8


def group_size(n: int, k: int) -> int:
  """Entries per group, a power of two <= MAX_GROUP near sqrt(n / k): balances the n/g maxima
  that are searched against the k*g candidates that are kept."""
  g = 1
  while g < MAX_GROUP and 4 * g * g * k <= n:
    g *= 2
  return g


# ----------------------------------------------------------------------------- selection

def _first_k(above, at, k: int):
  """above, plus the first entries of `at` in index order up to k entries in all (a row
  [B, n] per row of the bool masks; `at` holds the ties at the k-th largest)."""
  room = k - jnp.sum(above, axis=1, keepdims=True, dtype=jnp.int32)
  return above | (at & (jnp.cumsum(at, axis=1, dtype=jnp.int32) <= room))


def _top_groups_rows(vals, k: int, valid=None):
  """top_groups on one block of rows."""
  b, n_groups, _ = vals.shape
  n_slots = slots(k)
  masked = vals if valid is None else jnp.where(valid, vals, -jnp.inf)
  if n_groups <= n_slots:
    return masked, None
  # keys: a total order, NaN included. The mask is applied as vals are read (for the maxima,
  # then for the gathered groups): no masked copy of vals is written.
  gmax = jnp.max(_keys32(masked), axis=-1)
  t, c = _threshold(gmax, k, n_slots - k)

  def tie_order():                         # t is the k-th largest maximum where c > slots
    return _first_k(gmax > t[:, None], gmax == t[:, None], k)
  keep = lax.cond(jnp.any(c > n_slots), tie_order, lambda: gmax >= t[:, None])
  idx = kept_indices(keep, n_slots)[:, :, None]
  groups = jnp.take_along_axis(vals, idx, axis=1, mode="fill", fill_value=-jnp.inf)
  if valid is not None:
    groups = jnp.where(jnp.take_along_axis(valid[None], idx, axis=1, mode="fill",
                                           fill_value=False), groups, -jnp.inf)
  return groups, t


def _order_stats_rows(cand, ks: tuple[int, ...], lower=None, sums: bool = True):
  """order_stats on one block of rows."""
  keys = lax.optimization_barrier(_keys32(cand))
  kth_of, sum_of = {}, {}
  for k in sorted(ks, reverse=True):
    t, _ = _threshold(keys, k, 0, lower)
    # the k-th largest is the smallest key >= t (t itself where it is tied)
    lower = jnp.min(jnp.where(keys >= t[:, None], keys, jnp.iinfo(jnp.int32).max), axis=1)
    kth_of[k] = kth = from_order_key(lower)
    if sums:
      above = keys > lower[:, None]
      n_above = jnp.sum(above, axis=1, dtype=jnp.int32)
      sum_of[k] = jnp.sum(jnp.where(above, _wide(cand), 0), axis=1) + (k - n_above) * _wide(kth)
  return (jnp.stack([kth_of[k] for k in ks], axis=1),
          jnp.stack([sum_of[k] for k in ks], axis=1) if sums else None)


def _by_rows(fn, *arrays):
  """fn(*arrays) on blocks of _SELECT_ROWS rows (lax.map) when the rows divide evenly: fewer
  search passes (the slowest row of a smaller block) and cache-sized temporaries."""
  b = arrays[0].shape[0]
  if b <= _SELECT_ROWS or b % _SELECT_ROWS:
    return fn(*arrays)
  split = lambda x: x.reshape(b // _SELECT_ROWS, _SELECT_ROWS, *x.shape[1:])
  out = lax.map(lambda xs: fn(*xs), tuple(split(x) for x in arrays))
  return jax.tree.map(lambda y: y.reshape(b, *y.shape[2:]), out)


def top_groups(vals: jax.Array, k: int,
               valid: Optional[jax.Array] = None) -> tuple[jax.Array, Optional[jax.Array]]:
  """(groups, lower): the groups of float32 vals [B, G, g] whose maxima reach a threshold
  that >= k and <= slots(k) of them reach, [B, slots(k), g] in index order (-inf filled);
  they hold the k largest entries of each row (module doc). Where ties at the k-th largest
  maximum exceed the slots, exactly k are kept in index order. lower [B]: that threshold key
  (>= k kept entries are >= it); all groups and None if G <= slots(k). valid [G, g] bool
  (optional, the same for every row): entries where it is False count as -inf."""
  return _by_rows(lambda v: _top_groups_rows(v, k, valid), vals)


def order_stats(cand: jax.Array, ks: tuple[int, ...], lower: Optional[jax.Array] = None,
                sums: bool = True) -> tuple[jax.Array, Optional[jax.Array]]:
  """(k-th largest value [B, m] float32, sum of the k largest [B, m] in float64 under x64
  (else float32), or None without `sums`) of the float32 candidates [B, M] of each row, for
  every k in ks (M >= max(ks); lower: optional keys [B] with >= max(ks) entries at or above
  them). The largest k is searched first; its k-th largest bounds the search of each smaller
  k."""
  if lower is None:
    return _by_rows(lambda c: _order_stats_rows(c, ks, None, sums), cand)
  return _by_rows(lambda c, low: _order_stats_rows(c, ks, low, sums), cand, lower)


def group_order_stats(groups_lower, ks: tuple[int, ...], sums: bool = True):
  """order_stats of the entries of top_groups' (groups, lower)."""
  groups, lower = groups_lower
  return order_stats(groups.reshape(groups.shape[0], -1), ks, lower, sums)


def grouped_order_stats(vals: jax.Array, ks: tuple[int, ...], valid: Optional[jax.Array] = None,
                        sums: bool = True) -> tuple[jax.Array, Optional[jax.Array]]:
  """group_order_stats(top_groups(vals, max(ks), valid), ks, sums), the same values, with each
  block of rows searched where its candidate groups are made: they are not stacked into one
  [B, slots, g] array first (a copy of every block's candidates)."""
  def rows(v):
    groups, lower = _top_groups_rows(v, max(ks), valid)
    return _order_stats_rows(groups.reshape(groups.shape[0], -1), ks, lower, sums)
  return _by_rows(rows, vals)


def row_order_stats(s, ks: tuple[int, ...]) -> tuple[jax.Array, jax.Array]:
  """(k-th largest [B, m], top-k sum [B, m]) of each row of s [B, n] for every k in ks (exact,
  by the grouped selection; -inf counts as a value) for scores already in memory."""
  s = jnp.asarray(s, jnp.float32)
  b, n = s.shape
  g = group_size(n, max(ks))
  s = jnp.pad(s, ((0, 0), (0, (-n) % g)), constant_values=-jnp.inf)
  return grouped_order_stats(s.reshape(b, -1, g), ks)


def _total_key32(x):
  """int32 keys in lax.top_k's order of float32 values: as order_key, but -0.0 below +0.0."""
  b = lax.bitcast_convert_type(jnp.asarray(x, jnp.float32), jnp.int32)
  return b ^ ((b >> 31) & jnp.iinfo(jnp.int32).max)


def _top_k_mask_rows(x, k: int):
  keys = lax.optimization_barrier(_total_key32(x))
  t, _ = _threshold(keys, k)
  kth = jnp.min(jnp.where(keys >= t[:, None], keys, jnp.iinfo(jnp.int32).max), axis=1)
  above, at = keys > kth[:, None], keys == kth[:, None]
  # ties at the k-th largest beyond the room left: the first of them (index order)
  tied_over = jnp.sum(above | at, axis=1, dtype=jnp.int32) > k
  return lax.cond(jnp.any(tied_over), lambda: _first_k(above, at, k), lambda: above | at)


def top_k_mask(x: jax.Array, k: int) -> jax.Array:
  """[B, n] bool: the k largest entries of each row of float32 x [B, n] (k <= n), the entries
  lax.top_k(x, k) picks: its order (-0.0 below +0.0) and, among equal values, the lowest
  indices. Sort-free (the same threshold search as the rest of this module): XLA's CPU TopK
  takes several times longer."""
  return _by_rows(lambda v: _top_k_mask_rows(v, k), x)


def top_k_indices(x: jax.Array, k: int) -> jax.Array:
  """[B, k] int32: the column indices of lax.top_k(x, k)'s entries in index order (not in
  value order) (top_k_mask, kept_indices)."""
  return kept_indices(top_k_mask(x, k), k)


def reference_top_k(s, ks: tuple[int, ...]) -> tuple[jax.Array, jax.Array]:
  """row_order_stats computed with lax.top_k (a sort): the oracle of the tests."""
  s = jnp.asarray(s, jnp.float32)
  top, _ = lax.top_k(s, max(ks))
  kth = jnp.stack([top[:, k - 1] for k in ks], axis=1)
  total = jnp.cumsum(_wide(top), axis=1)
  return kth, jnp.stack([total[:, k - 1] for k in ks], axis=1)
