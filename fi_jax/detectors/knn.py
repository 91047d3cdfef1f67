"""Nearest-neighbour scores: KNN, NNGuide, Relation, CombOOD, CFOOD and GROOD
(docs/detectors.md#nearest-neighbour-scores),
exact, blockwise, optionally sharded.

Both scores need only order statistics of each query's similarities to the bank: KNN the k-th
largest, NNGuide the sum of the k largest. Similarities are float32 inner products at HIGHEST
precision (as faiss IndexFlatIP/L2), computed block by block: query blocks of `query_block` rows
against bank blocks of about `bank_block` rows, so N_test x N_bank never exists whole.

The selection is exact and sort-free (fi_jax.detectors.selection): each bank block's similarities are cut
into groups and only the groups that can hold a query's k largest are kept (`top_groups`);
the candidates of the next block are merged with them by the same selection, and one search
over the final candidates gives every requested k (`group_order_stats`). With one bank block
(the default for banks up to 131,072 rows) each block of rows is searched right after its
groups are selected (`grouped_order_stats`).
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
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from fi_jax.detectors import distance, selection, shared, stats
from fi_jax.detectors.core import (
  HIGHEST,
  Detector,
  Outputs,
  cdtype,
  check_number,
  check_seed,
  energy,
  fc,
  l2_normalize,
  matmul,
  require,
  selection_jit,
)

_AXIS = "bank"
_ROW_ALIGN = selection.MAX_GROUP   # bank rows per shard are a multiple of every group size


# ----------------------------------------------------------------------------- blockwise search

def _bank_blocks(q, bank, n_valid, offset, k: int, bank_block: int):
  """(number of bank blocks, block(i) -> (similarities [Bq, G, g] float32 of queries q [Bq, D]
  to the i-th bank block cut into groups of g, valid [G, g]: rows with global index offset + r
  < n_valid not seen in an earlier block)). The bank's row count is a multiple of 64 (so of
  g). Balanced blocks of > selection.slots(k) groups each; the last block is clamped to the end
  of the bank and its rows already seen are masked (no padding copy of the bank)."""
  nl = bank.shape[0]
  nblocks = max(1, math.ceil(nl / bank_block))
  g = selection.group_size(math.ceil(nl / nblocks), k)
  nb = min(nl, max(g * math.ceil(nl / nblocks / g), g * (selection.slots(k) + 1)))

  def block(i):
    start = jnp.minimum(i * nb, nl - nb)
    blk = lax.dynamic_slice_in_dim(bank, start, nb, axis=0)
    s = lax.dot_general(q, blk, (((1,), (1,)), ((), ())), precision=HIGHEST,
                        preferred_element_type=jnp.float32)
    rows = start + jnp.arange(nb)
    ok = (rows >= i * nb) & (offset + rows < n_valid)
    return s.reshape(q.shape[0], nb // g, g), ok.reshape(nb // g, g)
  return math.ceil(nl / nb), block


def _local_candidates(q, bank, n_valid, offset, k: int, bank_block: int):
  """(groups [Bq, K, g] float32, lower): candidate groups holding the k largest similarities
  of queries q [Bq, D] to the bank rows with global index offset + r < n_valid (see
  selection.top_groups), the candidates of each bank block (`_bank_blocks`) merged with the
  next block's by the same selection."""
  return _merged_candidates(*_bank_blocks(q, bank, n_valid, offset, k, bank_block), k)


def _merged_candidates(nblocks: int, block, k: int):
  """`_local_candidates` of the bank blocks `_bank_blocks` returned."""
  def select(i):
    vals, valid = block(i)
    return selection.top_groups(vals, k, valid)

  if nblocks == 1:
    return select(0)
  return lax.fori_loop(
      1, nblocks,
      lambda i, c: selection.top_groups(jnp.concatenate([c[0], select(i)[0]], axis=1), k),
      select(0))


def _local_order_stats(q, bank, n_valid, ks: tuple[int, ...], bank_block: int, sums: bool):
  """knn_order_stats of queries q [Bq, D] on one device. With one bank block the candidates
  are searched row block by row block where they are made (selection.grouped_order_stats)."""
  nblocks, block = _bank_blocks(q, bank, n_valid, 0, max(ks), bank_block)
  if nblocks == 1:
    vals, valid = block(0)
    return selection.grouped_order_stats(vals, ks, valid, sums)
  return selection.group_order_stats(_merged_candidates(nblocks, block, max(ks)), ks, sums)


def knn_order_stats(queries, bank, n_valid, *, ks: tuple[int, ...], query_block: int,
                    bank_block: int, mesh=None, sums: bool = True):
  """For every k in ks: the k-th largest inner product [N, m] (float32) of each float32 query
  with the first n_valid bank rows, and the sum of the k largest [N, m] (compute dtype; None
  without `sums`). Jitted with `compile_options.selection_step()` (a call inside another
  jitted function is traced into it)."""
  return _search(queries, bank, n_valid, ks=tuple(ks), query_block=query_block,
                 bank_block=bank_block, mesh=mesh, sums=sums)


def _knn_order_stats(queries, bank, n_valid, *, ks, query_block, bank_block, mesh, sums):
  n, d = queries.shape
  k = max(ks)
  qb = max(1, min(query_block, n))
  nq = math.ceil(n / qb)
  qs = jnp.pad(queries, ((0, nq * qb - n), (0, 0))).reshape(nq, qb, d)

  if mesh is None:
    def run(qs, bank, n_valid):
      return lax.map(lambda qq: _local_order_stats(qq, bank, n_valid, ks, bank_block, sums), qs)
  else:
    def shard(qs, bank, n_valid):
      offset = lax.axis_index(_AXIS) * bank.shape[0]

      def one(qq):
        local, _ = _local_candidates(qq, bank, n_valid, offset, k, bank_block)
        every = lax.all_gather(local, _AXIS, axis=1, tiled=True)
        return selection.group_order_stats(selection.top_groups(every, k), ks, sums)
      return lax.map(one, qs)
    # the merge is computed identically on every device from the all-gathered candidates
    run = jax.shard_map(shard, mesh=mesh, in_specs=(P(), P(_AXIS), P()), out_specs=P(),
                        check_vma=False)
  kth, top_sum = run(qs, bank, n_valid)
  unpad = lambda x: None if x is None else x.reshape(nq * qb, -1)[:n]
  return unpad(kth), unpad(top_sum)


_SEARCH_STATIC = ("ks", "query_block", "bank_block", "mesh", "sums")
_search = selection_jit(_knn_order_stats, static_argnames=_SEARCH_STATIC)


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
    for key in ("k", "query_block", "bank_block"):
      check_number(cls.name, hp, key, lo=1, integer=True)

  def _k(self, state) -> int:
    n = int(state["n"])
    require(n >= 1, f"{self.name}: the bank is empty.")
    if self.hparams["k"] > n:
      logging.warning("%s: k=%d > bank size %d; using k=%d.", self.name, self.hparams["k"], n, n)
    return min(int(self.hparams["k"]), n)

  uses_top_sum = True                      # NNGuide: the mean of the top k; KNN: not needed
  ks_with: tuple[str, ...] = ()            # detectors whose announced k one search also serves

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
      announced = set(shared.ks(self.name)).union(*(shared.ks(m) for m in self.ks_with))
      ks = tuple(sorted({k} | {min(j, n) for j in announced}))
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
  ks_with = ("combood",)

  def _fit(self, train, head):
    def build():
      parts = []
      for _, chunk in stats.chunks(train):
        require(chunk.features is not None, "knn needs fit Outputs with features.")
        parts.append(np.asarray(_normalize32(chunk.features)))
      require(bool(parts), "knn: the fit set is empty.")
      return place_bank(parts)
    return dict(shared.memo((train,), ("normalized_bank",), build))    # also CombOOD's bank

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
    check_number("nnguide", hp, "alpha", lo=0, hi=1, lo_open=True)
    check_seed("nnguide", hp)

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


# ----------------------------------------------------------------------------- Relation

_U32 = 2.0 ** -24            # float32 unit roundoff
_FIX_CAPS = (512, 8192)      # pairs recomputed in float64 by gathering, per block pair


def _gamma32(n: int) -> float:
  """gamma_n = n u / (1 - n u), u = 2^-24: the classic bound on the relative error of n float32
  operations in sequence (a dot product of length n - 1 in any summation order)."""
  return n * _U32 / (1 - n * _U32)


def _by_pair_count(count, caps: tuple[int, ...], none, gathered, dense):
  """none() when count is 0, gathered(cap) for the smallest cap >= count, dense() past the
  last: the float64 re-check of a block's undecided pairs (Relation, CFOOD)."""
  branch = jnp.sum(count > jnp.asarray((0,) + caps))
  return lax.switch(branch, [none, *[functools.partial(gathered, cap) for cap in caps], dense])


def relation_band(d: int, c: int) -> tuple[float, float]:
  """(k1, k2): a rigorous bound |r - r32| <= k1 pp32 + k2 r32 on the error of r32 =
  fl32(max(s32, 0) pp32), s32 and pp32 the float32 dot products (any summation order) of the
  float32-rounded float64 unit features (width d) and softmaxes (width c), r the exact r_ij.

  With gamma_n = n u / (1 - n u) (u = 2^-24): |s32 - s| <= gamma_{d+2} sum|f_i g_i| <=
  gamma_{d+2} (Cauchy-Schwarz; +2: the rounding of both inputs), and, all terms >= 0,
  |pp32 - pp| <= gamma_{c+2} pp, pp <= pp32 / (1 - gamma_{c+2}); so |r - a' b'| <= |s - s32| pp
  + a' |pp - pp32| (a' = max(s32, 0)) and the product adds u r32. Both factors carry 2^-10 of
  safety for evaluating the band in float32."""
  gc = _gamma32(c + 2)
  k1 = _gamma32(d + 2) * (1 + 4 * _U32) / (1 - gc)
  k2 = (gc / (1 - gc) + _U32) / (1 - _U32)
  return k1 * (1 + 2.0 ** -10), k2 * (1 + 2.0 ** -10)


def _dot64(a, b):
  return jnp.matmul(a, b.T, precision=HIGHEST)


@functools.partial(jax.jit, static_argnames=("power", "query_block", "bank_block"))
def relation_sums(feats, probs, bank, prob_bank, n_valid, thres, *,
                  power: int, query_block: int, bank_block: int):
  """sum_j [r_ij > thres] r_ij^power, r_ij = max(<f_i, b_j>, 0) <p_i, q_j>, over the first
  n_valid bank rows, as computed in the compute dtype (bank blocks of `bank_block` rows, query
  blocks of `query_block` rows: the [N, N_bank] kernel never exists whole).

  Under x64 both kernels are float32 matmuls (of the float64 bank and queries rounded to
  float32; about twice as fast as float64). `relation_band` bounds each r32's error, and the
  pairs whose r32 lies within it of thres are recomputed in float64 from the float64 rows
  (gathered, up to _FIX_CAPS[-1] pairs a block pair; past that the block pair is recomputed
  densely in float64), so every cut-off decision is the float64 one. The other accepted pairs
  add their float32 r in float64: a float32 rounding of each term, ~1e-7 relative to the sum
  (the tests ask 1e-6), where a flipped decision would move it by thres."""
  cd = fc(0.0).dtype
  n, d = feats.shape
  c = probs.shape[1]
  qb = max(1, min(query_block, n))
  nq = math.ceil(n / qb)
  pad = lambda x: jnp.pad(x, ((0, nq * qb - n), (0, 0))).reshape(nq, qb, x.shape[1])
  nbank = bank.shape[0]
  bb = max(1, min(bank_block, nbank))
  nblocks = math.ceil(nbank / bb)
  thres = jnp.asarray(thres, cd)
  fast = cd == jnp.float64
  if fast:
    bank32, prob_bank32 = bank.astype(jnp.float32), prob_bank.astype(jnp.float32)
    k1, k2 = relation_band(d, c)
    t32 = thres.astype(jnp.float32)
    slack = (thres * 2.0 ** -20 + 2.0 ** -100).astype(jnp.float32)   # t32's and lo/hi's rounding

  def dense64(f, p, start, ok):
    fb = lax.dynamic_slice_in_dim(bank, start, bb, axis=0).astype(cd)
    pb = lax.dynamic_slice_in_dim(prob_bank, start, bb, axis=0).astype(cd)
    r = jnp.maximum(_dot64(f, fb), 0.0) * _dot64(p, pb)
    return jnp.sum(jnp.where((r > thres) & ok[None, :], r ** power, 0.0), -1)

  def fix64(cap, f, p, start, unsure, acc):
    """acc + the float64 contributions of the unsure pairs (at most cap of them)."""
    idx = selection.kept_indices(unsure.reshape(1, -1), cap)[0]
    live = idx < unsure.size
    qi, col = jnp.minimum(idx // bb, qb - 1), start + idx % bb
    r = (jnp.maximum(jnp.sum(f[qi] * bank[col].astype(cd), -1), 0.0)
         * jnp.sum(p[qi] * prob_bank[col].astype(cd), -1))
    return acc.at[qi].add(jnp.where(live & (r > thres), r ** power, 0.0))

  def one(args):
    f, p, f32, p32 = args

    def block(i, acc):
      start = jnp.minimum(i * bb, nbank - bb)
      rows = start + jnp.arange(bb)
      ok = (rows >= i * bb) & (rows < n_valid)
      if not fast:
        return acc + dense64(f, p, start, ok)
      fb = lax.dynamic_slice_in_dim(bank32, start, bb, axis=0)
      pb = lax.dynamic_slice_in_dim(prob_bank32, start, bb, axis=0)
      s = lax.dot_general(f32, fb, (((1,), (1,)), ((), ())), precision=HIGHEST,
                          preferred_element_type=jnp.float32)
      pp = lax.dot_general(p32, pb, (((1,), (1,)), ((), ())), precision=HIGHEST,
                           preferred_element_type=jnp.float32)
      a = jnp.maximum(s, 0.0)
      r = a * pp
      w = k1 * pp + k2 * r + slack
      sure = ok[None, :] & (r > t32 + w)
      unsure = ok[None, :] & ~(r > t32 + w) & ~(r < t32 - w)    # NaN too
      part = jnp.sum(jnp.where(sure, (a.astype(cd) * pp.astype(cd)) ** power, 0.0), -1)
      count = jnp.sum(unsure, dtype=jnp.int32)
      return acc + _by_pair_count(
          count, _FIX_CAPS, lambda: part,
          lambda cap: fix64(cap, f, p, start, unsure, part), lambda: dense64(f, p, start, ok))
    return lax.fori_loop(0, nblocks, block, jnp.zeros((f.shape[0],), cd))

  f, p = feats.astype(cd), probs.astype(cd)
  out = lax.map(one, (pad(f), pad(p), pad(f.astype(jnp.float32)), pad(p.astype(jnp.float32))))
  return out.reshape(-1)[:n]


@jax.jit
def _unit(h):
  """Unit rows in the compute dtype."""
  return l2_normalize(fc(h))


@jax.jit
def _softmax(logits):
  return jax.nn.softmax(fc(logits), -1)


class Relation(Detector):
  """Relation (Kim et al. NeurIPS 2023, as OpenOOD's `relation` postprocessor): with f = h / |h|
  and p = softmax(z), s = sum_j [r_j > thres] r_j^pow over all fit rows j,
  r_j = max(<f, f_j>, 0) <p, p_j>. pow = 1 (OpenOOD), thres = 0.03 (official code). The bank
  (unit fit features and fit softmaxes) is kept in the compute dtype (float64 under x64): the
  kernels are float32 matmuls, but which r_j pass the cut-off is decided in float64 (pairs
  within float32's error bound of it are recomputed from the float64 bank; `relation_sums`): a
  float32 kernel alone moves r_j by ~1e-8 and flips the pairs that close to 0.03 (1.7e-5
  relative at 100k x 50k). It is therefore not knn's float32 bank."""
  name, needs = "relation", frozenset({"features", "logits"})
  fit_needs = frozenset({"features", "logits"})
  defaults = {"pow": 1, "thres": 0.03, "query_block": 512, "bank_block": 8192}
  presets = {"openood": {"pow": 1}}
  score_only = frozenset({"pow", "thres", "query_block", "bank_block"})

  @classmethod
  def validate(cls, hp):
    require(isinstance(hp["pow"], (int, np.integer)) and hp["pow"] >= 1,
            "relation: pow must be an int >= 1.")
    require(hp["thres"] >= 0, "relation: thres must be >= 0.")
    require(int(hp["query_block"]) >= 1 and int(hp["bank_block"]) >= 1,
            "relation: query_block and bank_block must be >= 1.")

  def _fit(self, train, head):
    feats, probs = [], []
    for _, chunk in stats.chunks(train):
      require(chunk.features is not None and chunk.logits is not None,
              "relation needs fit Outputs with features and logits.")
      feats.append(np.asarray(_unit(chunk.features)))
      probs.append(np.asarray(_softmax(chunk.logits)))
    require(bool(feats), "relation: the fit set is empty.")
    return {"bank": jnp.asarray(np.concatenate(feats)), "prob_bank": jnp.asarray(
        np.concatenate(probs)), "n": jnp.asarray(sum(len(f) for f in feats), jnp.int32)}

  def _score(self, state, features, logits):
    return relation_sums(_unit(features), _softmax(logits), state["bank"],
                         state["prob_bank"], state["n"], self.hparams["thres"],
                         power=int(self.hparams["pow"]),
                         query_block=int(self.hparams["query_block"]),
                         bank_block=int(self.hparams["bank_block"]))


# ----------------------------------------------------------------------------- CombOOD

@jax.jit
def _combood_projection(corr, sd, reg):
  """P with |z P|^2 = z^T (corr + reg I)^-1 z for z = (h_hat - mu) / sd, as a projection of
  h_hat - mu: V diag(1 / sqrt(lam + reg)) scaled by 1 / sd per row (corr = V diag(lam) V^T;
  one program, not six eager ones)."""
  lam, vec = jnp.linalg.eigh(corr)
  return vec / jnp.sqrt(lam + reg)[None, :] / sd[:, None]


class CombOOD(_BankDetector):
  """CombOOD (Rajasekaran et al., SDM 2024; the authors' code, rmagesh148/combood): the
  nearest-neighbour and Mahalanobis signals combined as the published ImageNet entry does
  ("square log probability"): s = -sqrt(D) log d_K^2 - M^2, with d_K^2 = 2 - 2 cos_K the squared
  L2 distance of h_hat to its K-th nearest unit fit feature (knn's search and bank) and
  M^2 = z^T (C + reg I)^-1 z, z = (h_hat - mu) / sigma the standardised unit features (mean and
  population std of the unit fit features; sigma = 0 -> 1) and C = cov(z) with ddof 1 (one
  class-agnostic Gaussian, mean 0). K = 50, reg = 1 (the authors' code; also the preset
  'openood'). Differences from the published run: its Mahalanobis input is XOOD's per-layer
  extremes (needs every activation layer) and passes a Yeo-Johnson power transform first; here
  it reads the unit penultimate features (the code's `extreme=False` variant) without the power
  transform (docs/detectors.md#combood)."""
  name, needs = "combood", frozenset({"features"})
  fit_needs = frozenset({"features"})
  defaults = {"k": 50, "reg": 1.0, **_BankDetector.defaults}
  presets = {"openood": {"k": 50, "reg": 1.0}}
  score_only = frozenset({"k", "query_block", "bank_block"})
  uses_top_sum = False
  ks_with = ("knn",)

  @classmethod
  def validate(cls, hp):
    super().validate(hp)
    check_number("combood", hp, "reg", lo=0, lo_open=True)

  def _fit(self, train, head):
    if stats.is_reiterable(train):
      state = KNN._fit(self, train, head)                # knn's bank (shared in a suite)
      st = stats.moments(distance.normalized_fit_set(train), scatter=True)
    else:                                                # a one-shot iterator: one pass
      parts = []
      st = stats.moments(_UnitWithBank(train, parts), scatter=True)
      state = place_bank(parts)
    require(st["n"] >= 2, "combood: the fit set needs at least 2 rows (covariance, ddof 1).")
    n = st["n"]
    mean = st["sum"] / n
    d = mean - st["shift"]
    cov = st["scatter"] / n - np.outer(d, d)                         # population (ddof 0)
    sd = np.sqrt(np.maximum(np.diag(cov), 0.0))
    sd = np.where(sd > 0, sd, 1.0)
    corr = cov / np.outer(sd, sd) * (n / (n - 1.0))                  # cov(z), ddof 1
    cd = cdtype()
    proj = _combood_projection(jnp.asarray(0.5 * (corr + corr.T), cd), jnp.asarray(sd, cd),
                               jnp.asarray(float(self.hparams["reg"]), cd))
    return {**state, "mean": jnp.asarray(mean, cd), "proj": proj}

  def _score_args(self, state, outputs):
    kth, _ = self._features_stats(state, outputs.features)
    return kth, outputs.features

  def _score(self, state, kth, features):
    a = matmul(l2_normalize(fc(features)) - state["mean"], state["proj"])
    d2 = 2.0 - 2.0 * fc(kth)
    return -math.sqrt(state["proj"].shape[0]) * jnp.log(jnp.maximum(d2, 0.0)) - jnp.sum(a * a, -1)


class _UnitWithBank:
  """The fit set's chunks with unit feature rows (compute dtype), collecting knn's float32 bank
  rows from the same chunks on the way (one pass over a one-shot fit iterator)."""

  def __init__(self, train, parts: list):
    self.train, self.parts = train, parts

  def __iter__(self):
    for _, chunk in stats.chunks(self.train):
      require(chunk.features is not None, "combood needs fit Outputs with features.")
      self.parts.append(np.asarray(_normalize32(chunk.features)))
      yield Outputs(_unit(chunk.features), None, None)


# ----------------------------------------------------------------------------- CFOOD

# The official grid of neighbourhood fractions kappa (OpenOOD cfood_postprocessor.py).
CFOOD_KAPPAS = np.concatenate((np.linspace(0.001, 0.1, 100), np.linspace(0.105, 0.5, 81),
                               np.linspace(0.51, 0.99, 49)))


def cfood_grid(n: int) -> tuple[np.ndarray, np.ndarray]:
  """(kappas, positions) for a reference set of n rows: position int(kappa n - 1) (truncated,
  as the official `np.array(kval * n - 1, dtype=int)`), keeping a kappa only where its position
  is above the previous kept one."""
  pos = np.array(CFOOD_KAPPAS * n - 1, dtype=int)
  keep = np.concatenate(([True], pos[:-1] < pos[1:]))
  return CFOOD_KAPPAS[keep], pos[keep]


def cfood_count_threshold(n: int, k: float) -> int:
  """The smallest count M with float32(M) / float32(n) >= float32(k): the official test
  `count / n >= k` on float32 counts."""
  frac = np.arange(n + 1, dtype=np.float32) / np.float32(n)
  return int(np.argmax(frac >= np.float32(k)))


@jax.jit
def _unit_eps(h):
  """h / (|h| + 1e-10) in the compute dtype (the official normalisation)."""
  h = fc(h)
  return h / (jnp.linalg.norm(h, axis=-1, keepdims=True) + 1e-10)


def _sq_dists(a, b, b_sq):
  """|a_i - b_j|^2 [Na, Nb] in the compute dtype (a, b unit rows: no harmful cancellation)."""
  return jnp.sum(a * a, -1, keepdims=True) + b_sq[None, :] - 2.0 * matmul(a, b.T)


@jax.jit
def _cfood_block_sorted(block, ref, ref_sq, positions):
  return jnp.sort(_sq_dists(block, ref, ref_sq), axis=-1)[:, positions + 1]


def _cfood_self_knn(ref, positions: np.ndarray) -> np.ndarray:
  """For every reference row, its sorted squared distances to all reference rows (itself
  included, at the front) taken at `positions` + 1: [len(positions), n] float64. Row blocks of
  ~2^24 distances. On an accelerator `_sq_dists` and `jnp.sort` there; when JAX runs on the CPU
  the same expression and the sort by numpy on the host (OpenBLAS's float64 product and
  numpy's sort are much faster than XLA:CPU's: docs/performance.md). The sort is exact; the
  products differ from XLA's in the last bits, as XLA's own do between block shapes."""
  n = ref.shape[0]
  rows = max(1, min(n, (1 << 24) // n))
  on_cpu = jax.default_backend() == "cpu"
  if on_cpu:
    ref = np.asarray(ref)
    sq = np.sum(ref * ref, -1)
  else:
    sq = jnp.sum(ref * ref, -1)
  out = np.empty((len(positions), n))
  for start in range(0, n, rows):
    # the last block is clamped to the end (one compiled shape); its rows seen before are rewritten
    lo = min(start, n - rows)
    blk = ref[lo:lo + rows]
    if on_cpu:
      prod = blk @ ref.T
      prod *= 2.0                                             # exact
      d = np.add.outer(sq[lo:lo + rows], sq)
      d -= prod                                               # (|a|^2 + |b|^2) - 2 a.b
      d.sort(axis=1)
      part = d[:, positions + 1]
    else:
      part = np.asarray(_cfood_block_sorted(blk, ref, sq, jnp.asarray(positions)))
    out[:, lo:lo + rows] = part.T
  return out


class CFOOD(Detector):
  """CFOOD (OpenOOD `CFOODPostprocessor`, openood/postprocessors/cfood_postprocessor.py @
  a3eb335eb23bf944224f2f635983f31c3fac281d, configs/postprocessors/cfood.yml @ 84ab0ae): a
  reference set R of n unit fit features h / (|h| + 1e-10) (a seeded alpha fraction of the fit
  rows), and for every r_i its squared L2 distance rho_i(kappa) to its (int(kappa n - 1) + 1)-th
  nearest other reference row, for kappa on a fixed grid of 230 fractions in [0.001, 0.99]
  (`CFOOD_KAPPAS`; repeated positions dropped). A test row v at squared distance d_i to r_i is
  inside r_i's kappa-neighbourhood when rho_i(kappa) >= d_i; kappa(v) is the smallest grid
  kappa for which at least a fraction k of the reference rows hold v in theirs (1 if none) and
  s = -kappa(v). alpha = 0.1, k = 0.01 (the OpenOOD config). Differences: the official subset
  is int(alpha N) rows of an unseeded `torch.randperm`; here each fit row is kept with
  probability alpha by a hash of its row index and `seed` (reproducible, independent of
  batching; alpha = 1 keeps every row). Distances are float64 (the official code's float32),
  the fraction test `count / n >= k` is the official float32 one. Scores take at most 231
  values (docs/detectors.md#cfood)."""
  name, needs = "cfood", frozenset({"features"})
  fit_needs = frozenset({"features"})
  defaults = {"alpha": 0.1, "k": 0.01, "seed": 0, "query_block": 128}
  selection_program = True     # the search's counts: one reduction a pass (~20% faster)
  score_only = frozenset({"k", "query_block"})

  @classmethod
  def validate(cls, hp):
    check_number("cfood", hp, "alpha", lo=0, hi=1, lo_open=True)
    check_number("cfood", hp, "k", lo=0, hi=1, lo_open=True)
    check_seed("cfood", hp)
    check_number("cfood", hp, "query_block", lo=1, integer=True)

  def _fit(self, train, head):
    alpha, parts = float(self.hparams["alpha"]), []
    for start, chunk in stats.chunks(train):
      require(chunk.features is not None, "cfood needs fit Outputs with features.")
      h = np.asarray(_unit_eps(chunk.features))
      if alpha < 1.0:
        h = h[stats.bernoulli_mask(self.hparams["seed"], start, len(h), alpha)]
      parts.append(h)
    ref = np.concatenate(parts) if parts else np.zeros((0, 0))
    n = len(ref)
    require(n >= 2, f"cfood: the reference set (alpha={alpha} of the fit rows) has {n} rows; it "
            "needs at least 2: use a larger fit set or alpha.")
    kappas, positions = cfood_grid(n)
    ref = jnp.asarray(ref, cdtype())
    return {"ref": ref, "ref_sq": jnp.sum(ref * ref, -1),
            "knn_dist": jnp.asarray(_cfood_self_knn(ref, positions), cdtype()),
            "kappas": jnp.asarray(kappas, cdtype()),
            "count": jnp.asarray(cfood_count_threshold(n, float(self.hparams["k"])), jnp.int32)}

  def _score(self, state, features, logits):
    qb = max(1, min(int(self.hparams["query_block"]), features.shape[0]))
    level = cfood_levels(_unit_eps(features), state["ref"], state["ref_sq"], state["knn_dist"],
                         state["count"], query_block=qb)
    kappas, nk = state["kappas"], state["knn_dist"].shape[0]
    return -jnp.where(level < nk, kappas[jnp.minimum(level, nk - 1)], 1.0)


_CFOOD_FIX_CAPS = (512, 2048, 8192, 32768)   # pairs recomputed in float64 by gathering, per query block


def cfood_band(d: int) -> float:
  """A rigorous bound on |d32 - d| + |rho32 - rho| + the rounding of d32 -/+ band, where d is
  the squared distance |v - r|^2 = |v|^2 + |r|^2 - 2 v.r of two float64 rows of norm <= 1 as
  computed in float64, d32 the same expression evaluated in float32 (any summation order) on the
  rows rounded to float32, and rho32 a float64 rho <= 4 rounded to float32. With
  gamma_n = n u / (1 - n u) (u = 2^-24): rounding the inputs moves each of the three terms by
  <= (2u + u^2) (their magnitudes are <= 1), the three float32 reductions add <= gamma_{d+2} each
  (the dot twice, by its factor 2), the two additions <= 4u each, the float64 evaluation of d
  and the roundings of rho and d32 -/+ band <= 4u + 8u; 2^-10 of safety on top."""
  return (4 * _gamma32(d + 2) + 3 * (2 * _U32 + _U32 ** 2) + 24 * _U32) * (1 + 2.0 ** -10)


@functools.partial(jax.jit, static_argnames=("query_block",))
def cfood_levels(v, ref, ref_sq, rho, need, *, query_block: int):
  """CFOOD's neighbourhood level of every query row v (unit rows, compute dtype): the smallest j
  with #{i : rho[j, i] >= d_i} >= need (rho.shape[0] when there is none), d_i = |v - r_i|^2
  (`_sq_dists`, compute dtype). The count is non-decreasing in j (each rho[:, i] is): a binary
  search over j, in query blocks of `query_block` rows.

  Under x64 the distances are float32 products of the rows rounded to float32 (~2x faster than
  float64): `cfood_band` bounds the error of each decision rho >= d made on them, two searches
  find the smallest j where the surely-inside count reaches need and the smallest where the
  possibly-inside count does, and where they differ the pairs undecided between them are
  recomputed in float64 (gathered, up to _CFOOD_FIX_CAPS[-1] pairs a block; past that the block
  is recomputed densely) and searched again: every decision is the float64 one."""
  cd = v.dtype
  nk, n = rho.shape
  qb = query_block
  nq = math.ceil(v.shape[0] / qb)
  vs = jnp.pad(v, ((0, nq * qb - v.shape[0]), (0, 0))).reshape(nq, qb, -1)
  steps = max(1, int(nk).bit_length())

  def search(lo, hi, count):
    """Smallest j in [lo, hi] with count(j) >= need (hi if none below it), per row."""
    for _ in range(steps):
      active, mid = lo < hi, (lo + hi) // 2             # active: mid < hi <= nk
      ok = count(jnp.minimum(mid, nk - 1)) >= need
      lo, hi = jnp.where(active & ~ok, mid + 1, lo), jnp.where(active & ok, mid, hi)
    return lo

  def dense(q):
    d = _sq_dists(q, ref, ref_sq)
    return search(jnp.zeros(qb, jnp.int32), jnp.full(qb, nk, jnp.int32),
                  lambda j: jnp.sum(rho[j] >= d, -1))

  if cd != jnp.float64:
    return lax.map(dense, vs).reshape(-1)[:v.shape[0]]

  band = jnp.float32(cfood_band(v.shape[1]))
  ref32, rho32 = ref.astype(jnp.float32), rho.astype(jnp.float32)
  ref_sq32 = jnp.sum(ref32 * ref32, -1)

  def fix(cap, q, d32, j_lo, j_hi, unsure):
    idx = selection.kept_indices(unsure.reshape(1, -1), cap)[0]
    live = idx < unsure.size
    qi, col = jnp.minimum(idx // n, qb - 1), idx % n
    d64 = (jnp.sum(q[qi] * q[qi], -1) + ref_sq[col]
           - 2.0 * jnp.sum(q[qi] * ref[col], -1))
    # inside at every j >= j_lo: surely inside at j_lo; the other pairs not undecided are
    # outside at every j < j_hi
    base = jnp.sum(rho32[jnp.minimum(j_lo, nk - 1)] >= d32 + band, -1)

    def count(j):
      inside = live & (rho[j[qi], col] >= d64)
      return base + jax.ops.segment_sum(inside.astype(jnp.int32), qi, qb)
    return search(j_lo, j_hi, count)

  def one(q):
    q32 = q.astype(jnp.float32)
    d32 = (jnp.sum(q32 * q32, -1, keepdims=True) + ref_sq32[None, :]
           - 2.0 * lax.dot_general(q32, ref32, (((1,), (1,)), ((), ())), precision=HIGHEST,
                                   preferred_element_type=jnp.float32))
    lo_edge, hi_edge = d32 - band, d32 + band
    start, end = jnp.zeros(qb, jnp.int32), jnp.full(qb, nk, jnp.int32)
    j_hi = search(start, end, lambda j: jnp.sum(rho32[j] >= hi_edge, -1))   # surely inside
    j_lo = search(start, j_hi, lambda j: jnp.sum(rho32[j] >= lo_edge, -1))  # possibly inside
    top = jnp.maximum(j_hi - 1, 0)
    unsure = ((j_lo < j_hi)[:, None] & (rho32[top] >= lo_edge)
              & ~(rho32[jnp.minimum(j_lo, nk - 1)] >= hi_edge))
    total = jnp.sum(unsure, dtype=jnp.int32)
    return _by_pair_count(total, _CFOOD_FIX_CAPS, lambda: j_lo,
                          lambda cap: fix(cap, q, d32, j_lo, j_hi, unsure), lambda: dense(q))
  return lax.map(one, vs).reshape(-1)[:v.shape[0]]


# ----------------------------------------------------------------------------- GROOD

@jax.jit
def grood_gradients(features, protos, valid, noise):
  """GROOD's gradient of the nearest-class-centroid cross-entropy with respect to the noise
  prototype n, in the compute dtype: with scores s_c = -|h - P_c| over the non-empty classes
  and s_n = -|h - n|, the loss -s_yhat + LSE(s) has d/dn = softmax(s)_n (h - n) / |h - n|
  (whatever the pseudo-label yhat, a class). |h - n| < 1e-12 divides by 1e-12
  (torch F.normalize)."""
  h = fc(features)
  d_c = jnp.sqrt(jnp.maximum(jnp.sum(h * h, -1, keepdims=True) + jnp.sum(protos * protos, -1)
                             - 2.0 * matmul(h, protos.T), 0.0))
  diff = h - noise
  d_n = jnp.linalg.norm(diff, axis=-1)
  s = jnp.concatenate([jnp.where(valid[None, :], -d_c, -jnp.inf), -d_n[:, None]], -1)
  p_noise = jnp.exp(-d_n - jax.nn.logsumexp(s, -1))
  return (p_noise / jnp.maximum(d_n, 1e-12))[:, None] * diff


@functools.partial(jax.jit, static_argnames=("query_block", "bank_block"))
def nearest_sq_dist(queries, bank, n_valid, *, query_block: int, bank_block: int):
  """min_j |q - b_j|^2 over the first n_valid bank rows, for every query row (compute dtype):
  the nearest bank row is chosen on
  float32 distances |b_j|^2 - 2 q.b_j at HIGHEST precision (as faiss IndexFlatL2, first index
  on ties), and its distance recomputed in the compute dtype from the float32 row. Bank blocks
  of bank_block rows (the last one clamped to the end of the bank, its rows already seen
  masked), query blocks of query_block rows."""
  n, nl = queries.shape[0], bank.shape[0]
  qb = max(1, min(query_block, n))
  nq = math.ceil(n / qb)
  qs = jnp.pad(fc(queries), ((0, nq * qb - n), (0, 0))).reshape(nq, qb, -1)
  bb = max(1, min(bank_block, nl))
  nb = (jnp.asarray(n_valid, jnp.int32) + bb - 1) // bb   # blocks holding valid rows only
  bank_sq = jnp.sum(bank * bank, -1)

  def one(q):
    q32 = q.astype(jnp.float32)

    def block(i, best):
      start = jnp.minimum(i * bb, nl - bb)
      blk = lax.dynamic_slice_in_dim(bank, start, bb, axis=0)
      sq = lax.dynamic_slice_in_dim(bank_sq, start, bb, axis=0)
      d = sq[None, :] - 2.0 * lax.dot_general(q32, blk, (((1,), (1,)), ((), ())),
                                              precision=HIGHEST,
                                              preferred_element_type=jnp.float32)
      rows = start + jnp.arange(bb)
      d = jnp.where(((rows >= i * bb) & (rows < n_valid))[None, :], d, jnp.inf)
      j = jnp.argmin(d, -1)
      dj = jnp.take_along_axis(d, j[:, None], -1)[:, 0]
      better = dj < best[0]
      return (jnp.where(better, dj, best[0]),
              jnp.where(better, (start + j).astype(jnp.int32), best[1]))
    init = (jnp.full(qb, jnp.inf, jnp.float32), jnp.zeros(qb, jnp.int32))
    _, idx = lax.fori_loop(0, nb, block, init)
    diff = q - fc(bank[idx])
    return jnp.sum(diff * diff, -1)
  return lax.map(one, qs).reshape(-1)[:n]


class GROOD(Detector):
  """GROOD, gradient-aware OOD detection (ElAraby et al.; OpenOOD `GrOODPostprocessor`,
  openood/postprocessors/grood.py @ 539b8054d66345401a9a21bc4f565722ce36f485,
  configs/postprocessors/grood.yaml @ 3c35632ee91b54b09d1f085d04f94744cece7d0b), its
  feature-only variant: class prototypes P_c = the mean fit feature of class c (true labels),
  the OOD ("noise") prototype n = the mean of the prototypes (the official `use_proto_mean`
  option), and for every row the gradient g(h) of its nearest-centroid cross-entropy with
  respect to n (`grood_gradients`); the bank holds g of the fit rows the model classifies
  correctly (label = argmax z), as float32 rows (the official faiss index; zero rows pad the bank
  to the fit set's row count, never searched past the last correct row's block); s = -min_j
  |g(h) - g_j|^2 (faiss's squared L2 to the nearest bank row). Differences: the OpenOOD default
  builds n from OOD validation images (`use_val_ood`), the other options from generated noise
  or mixed images passed through the network: none of them is available to a post-hoc detector
  on an ID fit set. The official index is an approximate IndexIVFFlat (nprobe 4); here the
  search is exact. Empty fit classes are left out of the prototypes, their mean and the
  softmax (the official zero prototypes take part in both) (docs/detectors.md#grood)."""
  name, needs = "grood", frozenset({"features"})
  fit_needs = frozenset({"features", "logits", "labels"})
  defaults = {"query_block": 512, "bank_block": 2048}
  score_only = frozenset({"query_block", "bank_block"})

  @classmethod
  def validate(cls, hp):
    for key in ("query_block", "bank_block"):
      check_number("grood", hp, key, lo=1, integer=True)

  def _fit(self, train, head):
    c, train = distance._peek_classes(train, head)
    if not stats.is_reiterable(train):                  # two passes: keep the one-shot chunks
      train = [chunk for _, chunk in stats.chunks(train)]
    st = stats.moments(train, num_classes=c, group="label")
    means, valid = stats.class_means(st)
    cd = cdtype()
    protos = jnp.asarray(np.where(valid[:, None], means, 0.0), cd)
    noise = jnp.asarray(np.asarray(means, np.float64)[valid].mean(0), cd)
    ok = jnp.asarray(valid)
    parts, total = [], 0
    for _, chunk in stats.chunks(train):
      total += stats.num_rows(chunk)
      require(chunk.logits is not None and chunk.labels is not None,
              "grood needs fit Outputs with features, logits and labels.")
      idx = np.nonzero(np.asarray(chunk.labels) == np.asarray(chunk.logits).argmax(-1))[0]
      if len(idx):      # only the correct rows, padded to a power of two (few compilations)
        rows = np.asarray(chunk.features)[np.resize(idx, max(64, 1 << (len(idx) - 1).bit_length()))]
        g = np.asarray(grood_gradients(rows, protos, ok, noise), np.float32)
        parts.append(g[:len(idx)])
    require(bool(parts), "grood: no fit row is classified correctly (label = argmax of the "
            "logits), so the gradient bank is empty.")
    # zero rows up to the fit set's row count (a multiple of 64): the bank's shape, so the
    # score's compilation, depends on the fit set's size only, not on how many rows are
    # correct; the search stops at the block holding the last correct row
    bank = np.concatenate(parts)
    padded = np.zeros((total + (-total) % 64, bank.shape[1]), np.float32)
    padded[:len(bank)] = bank
    return {"protos": protos, "valid": ok, "noise": noise, "bank": jnp.asarray(padded),
            "n": jnp.asarray(len(bank), jnp.int32)}

  def _score(self, state, features, logits):
    g = grood_gradients(features, state["protos"], state["valid"], state["noise"])
    return -nearest_sq_dist(g, state["bank"], state["n"],
                            query_block=int(self.hparams["query_block"]),
                            bank_block=int(self.hparams["bank_block"]))
