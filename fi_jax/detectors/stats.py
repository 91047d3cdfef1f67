"""Streaming fit: fixed-boundary chunks, float64 sufficient statistics, seeded row samples.

A fit set is an `Outputs` or any iterable of `Outputs` batches. Whatever the batching, it is cut
into the same chunks of `CHUNK_ROWS` consecutive rows ([0, R), [R, 2R), ...), and every
statistic is a float64 host-side sum of one jitted per-chunk computation. Hence fitting on
batches gives *bit-identical* states to fitting on the concatenated set, and memory is bounded
by one chunk plus the statistics (per-class sums [C, D], scatter matrices [D, D]).

Scatter matrices are accumulated about a fixed shift K (the first chunk's mean, or a given
centre such as ViM's u) and corrected at the end: sum_i (h_i - m)(h_i - m)^T =
S_K - n (m - K)(m - K)^T; within-class scatter = S_K - sum_c n_c (mu_c - K)(mu_c - K)^T.

A pass with a group in which every row has a class also serves a plain scatter request about
the same shift (inside `detectors.shared()`): MDS's pass serves SSD, NECO, Residual and ViM.

Sampling (quantiles, TempScale, ViM's alpha from a one-shot iterator, NNGuide's bank) uses a
seeded hash of the *global row index* (splitmix64), so the sample does not depend on batching:
* `RowSample(max_rows)`: the `max_rows` rows with the smallest keys (a uniform random subset
  without replacement; all rows when the set is smaller);
* `bernoulli_rows(fraction)`: each row independently with probability `fraction`.
"""
from __future__ import annotations

import functools
import itertools
from typing import Iterator, Optional

import jax
import jax.numpy as jnp
import numpy as np

from fi_jax.detectors import shared
from fi_jax.detectors.core import HIGHEST, Outputs, cdtype

CHUNK_ROWS = 16384


def num_rows(out: Outputs) -> int:
  x = out.features if out.features is not None else out.logits
  if x is None:
    raise ValueError("An Outputs batch has neither features nor logits.")
  return int(np.shape(x)[0])


def _map_arrays(out: Outputs, fn) -> Outputs:
  """`out` with fn applied to each of its arrays (None fields stay None)."""
  f = lambda x: None if x is None else fn(x)
  extras = None if out.extras is None else {k: f(v) for k, v in out.extras.items()}
  return Outputs(f(out.features), f(out.logits), f(out.labels), extras)


def _slice(out: Outputs, lo: int, hi: int) -> Outputs:
  return _map_arrays(out, lambda x: x[lo:hi])


def _host_view(x):
  """x itself, or for a JAX array held whole by one CPU device its zero-copy numpy view:
  slicing the view is free, slicing the JAX array dispatches a copy of every chunk
  (docs/performance.md). Arrays on an accelerator, or sharded, stay as they are."""
  if not isinstance(x, jax.Array) or not x.is_fully_addressable:
    return x
  devices = x.sharding.device_set
  if len(devices) != 1 or next(iter(devices)).platform != "cpu":
    return x
  return np.asarray(x)


def _concat(parts: list[Outputs]) -> Outputs:
  def cat(field):
    xs = [getattr(p, field) for p in parts]
    return None if xs[0] is None else np.concatenate([np.asarray(x) for x in xs])
  extras = None if parts[0].extras is None else {
      k: np.concatenate([np.asarray(p.extras[k]) for p in parts]) for k in parts[0].extras}
  return Outputs(cat("features"), cat("logits"), cat("labels"), extras)


def is_reiterable(train) -> bool:
  """True if iterating `train` twice gives the data twice (Outputs, list, tuple, ...)."""
  return isinstance(train, Outputs) or iter(train) is not train


def _batches(train) -> Iterator[Outputs]:
  if isinstance(train, Outputs):
    yield train
    return
  try:
    it = iter(train)
  except TypeError:
    raise ValueError(f"The fit set must be an Outputs or an iterable of Outputs, got "
                     f"{type(train).__name__}.") from None
  sig = None
  for b in it:
    if not isinstance(b, Outputs):
      raise ValueError(f"The fit set's batches must be Outputs, got {type(b).__name__}.")
    s = tuple(None if x is None else np.shape(x)[1:] for x in (b.features, b.logits)) + (
        b.labels is None,)
    if sig is not None and s != sig:
      raise ValueError(f"Fit batches disagree in shape/fields: {s} vs {sig}.")
    sig = s
    yield b


def peek(train) -> tuple[Outputs, object]:
  """(first batch, the fit set): a one-shot iterator is re-chained so nothing is lost."""
  if isinstance(train, Outputs):
    return train, train
  it = _batches(train)
  try:
    first = next(it)
  except StopIteration:
    raise ValueError("The fit set is empty.") from None
  if is_reiterable(train):
    return first, train
  return first, itertools.chain([first], it)


def chunks(train, rows: Optional[int] = None) -> Iterator[tuple[int, Outputs]]:
  """(start row, chunk) for the fixed chunks [k*rows, (k+1)*rows) of the fit set
  (rows = CHUNK_ROWS, read at call time)."""
  rows = int(rows or CHUNK_ROWS)
  start, buf, buffered = 0, [], 0
  for batch in _batches(train):
    batch = _map_arrays(batch, _host_view)
    n, pos = num_rows(batch), 0
    while pos < n:
      if not buf and n - pos >= rows:       # aligned: no copy (accelerator arrays stay there)
        yield start, _slice(batch, pos, pos + rows)
        pos, start = pos + rows, start + rows
        continue
      take = min(rows - buffered, n - pos)
      buf.append(_slice(batch, pos, pos + take))
      pos, buffered = pos + take, buffered + take
      if buffered == rows:
        yield start, _concat(buf)
        start, buf, buffered = start + rows, [], 0
  if buffered:
    yield start, _concat(buf) if len(buf) > 1 else buf[0]


# ----------------------------------------------------------------------------- sampling

_M64 = np.uint64(0xFFFFFFFFFFFFFFFF)


def row_keys(seed: int, start: int, n: int) -> np.ndarray:
  """splitmix64(seed * golden + row index): uniform uint64 keys per global row index."""
  with np.errstate(over="ignore"):
    x = (np.arange(start, start + n, dtype=np.uint64)
         + np.uint64(seed % (1 << 64)) * np.uint64(0x9E3779B97F4A7C15))
    x = x + np.uint64(0x9E3779B97F4A7C15)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def _take(x, idx: np.ndarray) -> np.ndarray:
  # on the host: a jitted gather would compile for every chunk shape
  return np.asarray(x)[idx]


class RowSample:
  """The `max_rows` rows with the smallest seeded keys among the rows offered (bottom-m
  sketch: a uniform subset without replacement, independent of batching)."""

  def __init__(self, max_rows: int, seed: int, fields: tuple[str, ...]):
    self.max_rows, self.seed, self.fields = int(max_rows), int(seed), fields
    self.keys = np.zeros((0,), np.uint64)
    self.rows = np.zeros((0,), np.int64)
    self.data: dict[str, list] = {f: [] for f in fields}
    self.seen = 0

  def add(self, start: int, chunk: Outputs, mask: Optional[np.ndarray] = None) -> None:
    n = num_rows(chunk)
    keys = row_keys(self.seed, start, n)
    ok = np.ones(n, bool) if mask is None else np.asarray(mask, bool)
    self.seen += int(ok.sum())
    if len(self.keys) >= self.max_rows:
      ok &= keys < self.keys.max()
    idx = np.nonzero(ok)[0]
    if not len(idx):
      return
    self.keys = np.concatenate([self.keys, keys[idx]])
    self.rows = np.concatenate([self.rows, start + idx])
    for f in self.fields:
      self.data[f].append(_take(getattr(chunk, f), idx))
    if len(self.keys) > 2 * self.max_rows:
      self._prune()

  def _prune(self) -> None:
    cat = {f: np.concatenate(v) for f, v in self.data.items()}
    if len(self.keys) > self.max_rows:
      keep = np.argpartition(self.keys, self.max_rows - 1)[:self.max_rows]
    else:
      keep = np.arange(len(self.keys))
    keep = keep[np.argsort(self.rows[keep], kind="stable")]
    self.keys, self.rows = self.keys[keep], self.rows[keep]
    self.data = {f: [v[keep]] for f, v in cat.items()}

  def result(self) -> dict[str, np.ndarray]:
    """{field: rows sorted by global row index, 'rows': their indices}."""
    if not len(self.keys):
      raise ValueError("The fit set has no usable rows to sample.")
    self._prune()
    return {"rows": self.rows, **{f: v[0] for f, v in self.data.items()}}


def bernoulli_mask(seed: int, start: int, n: int, fraction: float) -> np.ndarray:
  """Row i is selected iff its key < fraction * 2^64 (probability `fraction`)."""
  thr = np.uint64(min(int(fraction * 2.0 ** 64), (1 << 64) - 1))
  return row_keys(seed, start, n) < thr


# ----------------------------------------------------------------------------- moments

def group_ids(labels, logits, group: str, num_classes: int):
  """Per-row class id for the per-class sums; -1 = row not counted.
  'label': true label; 'pred': argmax logits; 'correct': label if it equals the prediction."""
  if group == "pred":
    return jnp.argmax(logits, axis=-1)
  if labels is None:
    raise ValueError("This detector needs labelled fit data (Outputs.labels), got None.")
  y = jnp.asarray(labels).astype(jnp.int32)
  if group == "correct":
    y = jnp.where(y == jnp.argmax(logits, axis=-1), y, -1)
  return jnp.where((y >= 0) & (y < num_classes), y, -1)


@functools.partial(jax.jit, static_argnames=("num_classes", "group", "scatter", "scatter_rows"))
def _moments_chunk(features, logits, labels, shift, *, num_classes: int, group: Optional[str],
                   scatter: bool, scatter_rows: bool = False) -> dict:
  """One chunk's sums; with `scatter_rows` its 'scatter' entry holds the rows x whose x^T x is
  the scatter matrix ((h - K) times the group mask, m in {0, 1}: m = m^2) instead of x^T x."""
  cd = cdtype()
  h = jnp.asarray(features).astype(cd)
  out = {"n": jnp.asarray(h.shape[0], cd), "sum": jnp.sum(h, 0)}
  m = None
  if group is not None:
    gid = group_ids(labels, logits, group, num_classes)
    seg = jnp.where(gid >= 0, gid, num_classes)
    m = (gid >= 0).astype(cd)
    out["count"] = jax.ops.segment_sum(m, seg, num_classes + 1)[:num_classes]
    out["class_sum"] = jax.ops.segment_sum(h, seg, num_classes + 1)[:num_classes]
    out["n_grp"] = jnp.sum(m)
    out["sum_grp"] = jnp.sum(h * m[:, None], 0)
  if scatter:
    x = h - shift.astype(cd)
    x = x if m is None else x * m[:, None]
    out["scatter"] = x if scatter_rows else gram(x)
  return out


def _chunk_sums(features, logits, labels, shift, *, num_classes: int, group: Optional[str],
                scatter: bool) -> dict:
  """One chunk's sums (`_moments_chunk`). On the CPU backend the scatter matrix is numpy's
  x.T @ x of the jitted rows (OpenBLAS's symmetric rank-k update: ~3x faster than XLA:CPU's
  float64 products at D = 768, docs/performance.md); elsewhere it is part of the jitted chunk."""
  on_host = scatter and jax.default_backend() == "cpu"
  out = _moments_chunk(features, logits, labels, shift, num_classes=num_classes, group=group,
                       scatter=scatter, scatter_rows=on_host)
  if on_host:
    x = np.asarray(out["scatter"])
    out = dict(out, scatter=x.T @ x)
  return out


GRAM_BLOCK = 256


def gram(x) -> jax.Array:
  """x^T x [D, D] (symmetric, exactly): the blocks on and above the diagonal, in column blocks
  of GRAM_BLOCK, the others their transposes (~1/3 fewer flops than the full product at
  D = 768; the scatter matrices are the fit's main cost)."""
  d = x.shape[1]
  cuts = list(range(0, d, GRAM_BLOCK)) + [d]
  if len(cuts) <= 2:
    return jnp.matmul(x.T, x, precision=HIGHEST)
  cols = [x[:, a:b] for a, b in zip(cuts[:-1], cuts[1:])]
  up = {(i, j): jnp.matmul(cols[i].T, cols[j], precision=HIGHEST)
        for i in range(len(cols)) for j in range(i, len(cols))}
  return jnp.block([[up[(i, j)] if i <= j else up[(j, i)].T for j in range(len(cols))]
                    for i in range(len(cols))])


def add_sums(total: Optional[dict], part: dict) -> dict:
  part = {k: np.asarray(v, np.float64) for k, v in part.items()}
  if total is None:
    return part
  return {k: total[k] + part[k] for k in total}


def moments(train, *, num_classes: int = 0, group: Optional[str] = None, scatter: bool = False,
            shift: Optional[np.ndarray] = None, on_chunk=None) -> dict[str, np.ndarray]:
  """Float64 sums over the fit set: n, sum [D]; with `group`: count [C], class_sum [C, D],
  n_grp, sum_grp (rows with a class); with `scatter`: scatter [D, D] = sum (h-K)(h-K)^T over the
  grouped rows (all rows if group is None), K = `shift` or the first chunk's mean (key 'shift').
  `on_chunk(start, chunk)` is called for every chunk (to feed samplers in the same pass).
  Inside `detectors.shared()` (and without on_chunk) a pass is reused by later calls on the
  same fit set that need no more than it computed."""
  if on_chunk is not None or not shared.active():
    return _moments(train, num_classes, group, scatter, shift, on_chunk)
  shift_key = None if shift is None else np.asarray(shift, np.float64).tobytes()

  def serves(extra, value):
    if extra[0] != "moments":
      return False
    _, g, nc, sc, sk = extra
    if group is None and not scatter:
      return True                         # every pass has n and sum over all rows
    if group is None and g is not None and sc and sk == shift_key and value["n_grp"] == value["n"]:
      return True                         # every row has a class: its scatter is the plain one
    return g == group and nc == num_classes and (sc or not scatter) and (
        not scatter or sk == shift_key)
  hit = shared.lookup((train,), (), serves)
  if hit is not None:
    return hit
  out = _moments(train, num_classes, group, scatter, shift, None)
  shared.store((train,), ("moments", group, num_classes, scatter, shift_key), out)
  return out


@jax.jit
def _column_means(x):
  """The mean row of x in the compute dtype (the moments' shift: one program, not three)."""
  return jnp.mean(jnp.asarray(x).astype(cdtype()), 0)


def _moments(train, num_classes, group, scatter, shift, on_chunk) -> dict[str, np.ndarray]:
  total, k = None, None
  for start, chunk in chunks(train):
    if chunk.features is None:
      raise ValueError("This detector needs Outputs.features in the fit set.")
    if group in ("pred", "correct") and chunk.logits is None:
      raise ValueError("This detector needs Outputs.logits in the fit set.")
    if k is None:
      k = (np.asarray(shift, np.float64) if shift is not None
           else np.asarray(_column_means(chunk.features), np.float64))
    total = add_sums(total, _chunk_sums(chunk.features, chunk.logits, chunk.labels,
                                        jnp.asarray(k, cdtype()), num_classes=num_classes,
                                        group=group, scatter=scatter))
    if on_chunk is not None:
      on_chunk(start, chunk)
  if total is None:
    raise ValueError("The fit set is empty.")
  total["shift"] = k
  if group is not None and total["n_grp"] == 0:
    raise ValueError("No fit row has a class for this detector (labels all -1, or no correctly "
                     "classified row).")
  return total


def class_means(st: dict) -> tuple[np.ndarray, np.ndarray]:
  """(means [C, D] with zeros for empty classes, valid [C] bool)."""
  valid = st["count"] > 0
  means = st["class_sum"] / np.maximum(st["count"], 1.0)[:, None]
  return np.where(valid[:, None], means, 0.0), valid


def within_class_cov(st: dict) -> np.ndarray:
  """(1/N) sum_i (h_i - mu_{y_i})(h_i - mu_{y_i})^T over the grouped rows (empty classes skipped)."""
  cnt = st["count"]
  a = st["class_sum"] - cnt[:, None] * st["shift"][None, :]          # n_c (mu_c - K)
  a = a[cnt > 0] / np.sqrt(cnt[cnt > 0])[:, None]
  return (st["scatter"] - a.T @ a) / st["n_grp"]


def second_moment(st: dict, centre: np.ndarray) -> np.ndarray:
  """(1/n) sum_i (h_i - c)(h_i - c)^T over the rows of a plain pass (group None), c = `centre`:
  its scatter about the shift K moved to c (h - c = (h - K) + (K - c)), so that one pass about
  the data's own mean serves any centre (ViM's u) with no cancellation."""
  n = st["n"]
  d = st["shift"] - np.asarray(centre, np.float64)
  s = st["sum"] - n * st["shift"]                                   # sum_i (h_i - K)
  return (st["scatter"] + np.outer(s, d) + np.outer(d, s) + n * np.outer(d, d)) / n


def grouped_cov(st: dict) -> np.ndarray:
  """(1/N) sum_i (h_i - mu)(h_i - mu)^T over the grouped rows, mu their mean."""
  d = st["sum_grp"] / st["n_grp"] - st["shift"]
  return st["scatter"] / st["n_grp"] - np.outer(d, d)


@jax.jit
def whitening(cov) -> jax.Array:
  """L with L L^T = pinvh(cov) (scipy's default cutoff: eigenvalues <= D * eps * max|lambda|
  are dropped, so a rank-deficient covariance gives the pseudo-inverse). float64 under x64."""
  cov = jnp.asarray(cov, cdtype())
  cov = 0.5 * (cov + cov.T)
  lam, v = jnp.linalg.eigh(cov)
  cutoff = cov.shape[0] * jnp.finfo(cov.dtype).eps * jnp.max(jnp.abs(lam))
  keep = lam > cutoff
  inv_sqrt = jnp.where(keep, 1.0 / jnp.sqrt(jnp.where(keep, lam, 1.0)), 0.0)
  return v * inv_sqrt[None, :]
