"""Nearest-neighbour scores: KNN and NNGuide (spec §1.4), exact, blockwise, optionally sharded.

Similarities are float32 inner products at HIGHEST precision (as faiss IndexFlatIP/L2), computed
block by block: query blocks of `query_block` rows against bank blocks of about `bank_block`
rows, an exact top-k per block and a `lax.top_k` merge of the running top-k, so N_test x N_bank
is never materialised. With several local devices the bank is sharded along its rows
(NamedSharding over a 1-D 'bank' mesh); each device computes the exact top-k over its shard and
the per-device candidates are all-gathered and merged with `lax.top_k` (same values as one
device).

Per-block exact top-k (`topk_values`): when the block is long compared with k, the row is cut
into groups of g entries, the k groups with the largest maxima are kept and the top-k is taken
over their k*g entries. This is exact: every entry larger than the k-th largest group maximum u
lies in a kept group, the kept groups hold >= k entries >= u, and the true k-th largest value is
>= u, so the multiset of the k largest values is unchanged (ties included).
"""
from __future__ import annotations

import functools
import logging
import math
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from fi_jax.detectors import shared, stats
from fi_jax.detectors.core import HIGHEST, Detector, energy, fc, l2_normalize, require

_AXIS = "bank"


def topk_values(s, k: int):
  """The k largest values of each row of s [B, n], descending (exact; -inf padded if n < k)."""
  b, n = s.shape
  if n <= k:
    vals = lax.top_k(s, n)[0]
    return jnp.pad(vals, ((0, 0), (0, k - n)), constant_values=-jnp.inf)
  for g in (32, 16):
    if n // g >= 4 * k and 8 * k * g <= n:
      ng = n // g
      body = s[:, :ng * g].reshape(b, ng, g)
      _, gi = lax.top_k(jnp.max(body, axis=-1), k)
      cand = jnp.take_along_axis(body, gi[:, :, None], axis=1).reshape(b, k * g)
      return lax.top_k(jnp.concatenate([cand, s[:, ng * g:]], axis=1), k)[0]
  return lax.top_k(s, k)[0]


def _local_topk(q, bank, n_valid, offset, k: int, bank_block: int):
  """Top-k similarities [Bq, k] of queries q [Bq, D] over bank rows with global index
  offset + r < n_valid. Balanced blocks; the last block is clamped to the end of the bank and
  its rows already seen are masked (no padding copy of the bank)."""
  nl = bank.shape[0]
  nblocks = max(1, math.ceil(nl / bank_block))
  nb = math.ceil(nl / nblocks)

  def block_top(i):
    start = jnp.minimum(i * nb, nl - nb)
    blk = lax.dynamic_slice_in_dim(bank, start, nb, axis=0)
    s = lax.dot_general(q, blk, (((1,), (1,)), ((), ())), precision=HIGHEST,
                        preferred_element_type=jnp.float32)
    rows = start + jnp.arange(nb)
    ok = (rows >= i * nb) & (offset + rows < n_valid)
    return topk_values(jnp.where(ok[None, :], s, -jnp.inf), k)

  def body(i, vals):
    return lax.top_k(jnp.concatenate([vals, block_top(i)], axis=1), k)[0]
  return lax.fori_loop(1, nblocks, body, block_top(0))


@functools.partial(jax.jit, static_argnames=("k", "query_block", "bank_block", "mesh"))
def knn_topk(queries, bank, n_valid, *, k: int, query_block: int, bank_block: int,
             mesh=None):
  """Exact top-k inner products [N, k] (descending) of float32 queries against the bank."""
  n, d = queries.shape
  qb = max(1, min(query_block, n))
  nq = math.ceil(n / qb)
  qs = jnp.pad(queries, ((0, nq * qb - n), (0, 0))).reshape(nq, qb, d)

  if mesh is None:
    def run(qs, bank, n_valid):
      return lax.map(lambda qq: _local_topk(qq, bank, n_valid, 0, k, bank_block), qs)
  else:
    def shard(qs, bank, n_valid):
      offset = lax.axis_index(_AXIS) * bank.shape[0]

      def one(qq):
        local = _local_topk(qq, bank, n_valid, offset, k, bank_block)
        every = lax.all_gather(local, _AXIS, axis=1, tiled=True)
        return lax.top_k(every, k)[0]
      return lax.map(one, qs)
    # the merged top-k is computed identically on every device from the all-gathered candidates
    run = jax.shard_map(shard, mesh=mesh, in_specs=(P(), P(_AXIS), P()), out_specs=P(),
                        check_vma=False)
  out = run(qs, bank, n_valid)
  return out.reshape(nq * qb, k)[:n]


# ----------------------------------------------------------------------------- bank

def bank_mesh():
  """A 1-D mesh over the local devices, or None with a single device."""
  devs = jax.local_devices()
  if len(devs) < 2:
    return None
  return Mesh(np.array(devs), (_AXIS,), axis_types=(jax.sharding.AxisType.Auto,))


def place_bank(rows: np.ndarray) -> dict:
  """{'bank': rows padded to a multiple of the local device count and sharded along its rows
  when there are several devices, 'n': the number of real rows}."""
  rows = np.asarray(rows, np.float32)
  n = rows.shape[0]
  mesh = bank_mesh()
  if mesh is None:
    return {"bank": jnp.asarray(rows), "n": jnp.asarray(n, jnp.int32)}
  ndev = mesh.devices.size
  padded = np.pad(rows, ((0, (-n) % ndev), (0, 0)))
  bank = jax.device_put(padded, NamedSharding(mesh, P(_AXIS)))
  return {"bank": bank, "n": jnp.asarray(n, jnp.int32)}


def _bank_for_scoring(bank):
  """(bank, mesh): sharded over the local devices when there are several and they divide it."""
  mesh = bank_mesh()
  if mesh is None or bank.shape[0] % mesh.devices.size:
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
  """Shared blockwise top-k scoring against state['bank']."""
  defaults = {"query_block": 1024, "bank_block": 131072}
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

  def topk(self, state, queries, k: Optional[int] = None) -> jax.Array:
    """Exact top-k similarities [N, k] (descending) of the normalised queries."""
    bank, mesh = _bank_for_scoring(state["bank"])
    return knn_topk(queries, bank, state["n"], k=k or self._k(state),
                    query_block=int(self.hparams["query_block"]),
                    bank_block=int(self.hparams["bank_block"]), mesh=mesh)

  def _features_topk(self, state, features) -> jax.Array:
    """topk of the features' normalised rows. Inside `detectors.shared()` one search with the
    largest k announced for this detector (`shared(detectors=...)`) serves every smaller k on
    the same bank and features: its leading columns (the top-k values are sorted)."""
    k = self._k(state)
    hit = shared.lookup((state["bank"], features), (),
                        lambda extra, v: extra[0] == "topk" and v.shape[1] >= k)
    if hit is None:
      k_all = min(max({k} | set(shared.ks(self.name))), int(state["n"]))
      hit = self.topk(state, _normalize32(features), k_all)
      shared.store((state["bank"], features), ("topk",), hit)
    return hit[:, :k]

  def _score_args(self, state, outputs):
    return (self._features_topk(state, outputs.features),
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

  def _fit(self, train, head):
    parts = []
    for _, chunk in stats.chunks(train):
      require(chunk.features is not None, "knn needs fit Outputs with features.")
      parts.append(np.asarray(_normalize32(chunk.features)))
    require(bool(parts), "knn: the fit set is empty.")
    return place_bank(np.concatenate(parts))

  def _score(self, state, topk, logits):
    return -(2.0 - 2.0 * fc(topk[:, -1]))


class NNGuide(_BankDetector):
  """NNGuide (Park et al.): guide bank g_i = h_hat_i * LSE(z_i) over a seeded alpha fraction of
  the fit rows (each row kept with probability alpha by a hash of its row index: independent of
  batching; OpenOOD takes the first ~1% of a shuffled loader); s = LSE(z) * mean of the K
  largest <h_hat, g_i>. K = 100, alpha = 0.01 (OpenOOD)."""
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
    return place_bank(np.concatenate(parts))

  def _score(self, state, topk, logits):
    return energy(logits) * jnp.mean(fc(topk), axis=-1)
