"""Jitted, sharded forward passes over a set: images -> features, logits (+ input-based scores).

The batch is sharded along the mesh's data axis and parameters are replicated. The outputs stay
sharded the same way: each process fetches only its addressable shards, i.e. the rows of its own
part of the set (nothing is gathered across processes, so no process holds more than its share);
padding rows (``_mask`` False) are dropped and rows are put into set order by ``_id``. With one
process that is the whole set; with several, `fi_jax.pipeline` decides who reads what.

API (what `fi_jax.pipeline` and the big_vision evaluator build on):

  fwd = Forward(predict_fn, mesh, input_scorers={...})   # builds the jitted step once
  for rows in fwd.chunks(params, batches): ...          # rows of each batch, padding dropped
  arrays = fwd.extract(params, batches)                  # the set in order (this process's rows)

A `Forward` holds one `jax.jit` step (compiled with `fi_jax.common.compile_options.model_step()`:
XLA's default code generation where the CLI chose the quick CPU pipeline for everything else);
XLA compiles it once per (parameter structure, per-device
batch shape), so every set that goes through the same `Forward` with the same global batch
size (sets are padded to it) reuses one compilation. Input scorers (ODIN) are part of the
step, with flags passed with the batch: `chunks(..., scorers=names)` keeps only the named
ones' columns, and the scorers given as `optional` run under one
`lax.cond` that skips them on the device when none of them is named (the fit set, which no
detector scores, runs none of them; AdaSCALE's, which it needs, are not optional). So one
compiled step serves every set of a run. `chunks` keeps up to `depth` steps in flight: step i+1
is dispatched (and its outputs start copying to the host) before step i's outputs are fetched,
so host input and device compute overlap. Features and logits come out at least float32
whatever dtype the model computes in (bfloat16 outputs are cast; float32 ones are untouched).

Layer detectors (`fi_jax.extract.layer_columns`): `Forward(..., layers=("gram", "mean"), predict_out=f)` calls
`f(params, images) -> (logits, features, out)` instead of `predict_fn` and adds the reduced
block outputs of `out` as `layer/<reducer>/<block>` columns, computed inside the same step
(a model whose `out` has no blocks gets no columns; the layer detectors then say so). Without
`layers` the step is the plain one.

`chunks(..., warm=(other,))` compiles the other Forwards' steps for the same batch shapes in a
background thread as soon as the first batch exists (XLA compiles outside the GIL); the other
Forward's first step waits for it. `warm` alone starts a step's compilation in the background
(what `fi_jax.run.compile_ahead` does while the demo model trains).

`extract_chunks` / `extract` are one-call wrappers that build a fresh `Forward` (one compile
per call); keep a `Forward` to reuse the compiled step across sets.
"""
from __future__ import annotations

import collections
import concurrent.futures
import functools
import time
from typing import Callable, Iterable, Iterator, Mapping, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from fi_jax.common import columns as columns_lib
from fi_jax.common import compile_options, distributed
from fi_jax.extract import layer_columns as layer_lib

# predict_fn(params, images) -> (logits [B, C], features [B, D])
PredictFn = Callable[[object, jax.Array], tuple[jax.Array, jax.Array]]
# input scorer: (params, images) -> scores [B] or {column: [B]}; e.g. ODIN, which needs gradients
# w.r.t. inputs; AdaSCALE returns {"stat": [B]} (stored as stat/<name>)
InputScorer = Callable[[object, jax.Array], object]
# predict_out(params, images) -> (logits [B, C], features [B, D], the model's `out` dict)
PredictOutFn = Callable[[object, jax.Array], tuple[jax.Array, jax.Array, object]]
_PASS_THROUGH = columns_lib.PASS_THROUGH
_COMPILER = concurrent.futures.ThreadPoolExecutor(2, "fi_jax-compile")   # background compiles


class Forward:
  """The compiled forward step of one model (and its input scorers) on one mesh.

  `step(params, global_batch, active)` -> {logits, features, label, group, _id, _mask,
  score/<name>...} as device arrays split along the batch like the input (dispatched
  asynchronously; each process reads its own rows with `host_rows`); `active` is a bool
  [len(scorer_names)] array (`active(names)`). The scorers named in `optional` run together
  under one `lax.cond`: only when at least one of them is active (else their columns are
  zeros and the device does none of their work); the others always run. Together, so that XLA
  shares their common work (every input scorer starts with a forward pass on the same images);
  what XLA cannot share across the cond is the step's own forward pass, so a batch that runs
  them costs one forward pass more than in a step without the cond (~10% with the demo's
  five input scorers, ~25% with ODIN alone): the price of one compiled step for every set.
  `chunks` and `extract` run the step over a set's batches and keep only the columns of the
  scorers named. Reuse one `Forward` for every set: its jitted step compiles once per
  per-device batch shape, whichever scorers a set runs.
  """

  def __init__(self, predict_fn: PredictFn, mesh, *,
               input_scorers: Optional[Mapping[str, InputScorer]] = None,
               optional: Sequence[str] = (),
               layers: Sequence[str] = (), predict_out: Optional[PredictOutFn] = None):
    self.predict_fn, self.mesh = predict_fn, mesh
    self.input_scorers = dict(input_scorers or {})
    self.scorer_names = tuple(self.input_scorers)
    optional = set(optional)
    unknown = sorted(optional - set(self.scorer_names))
    if unknown:
      raise ValueError(f"optional scorers {unknown} are not among the input scorers "
                       f"{list(self.scorer_names)}.")
    self.optional = tuple(n for n in self.scorer_names if n in optional)
    self.layers = layer_lib.check_reducers(layers)
    if self.layers and predict_out is None:
      raise ValueError("Forward(layers=...) needs predict_out(params, images) -> (logits, "
                       "features, out), the predict variant that returns the model's out.")
    self._repl = distributed.replicated(mesh)
    self._split = distributed.rows_sharding(mesh)   # outputs: each process keeps its rows
    scorers, reducers, names = self.input_scorers, self.layers, self.scorer_names
    opt_index = np.array([names.index(n) for n in self.optional], np.int32)

    def run_scorers(params, images, which):
      return {n: scorers[n](params, images) for n in which}

    def step(params, batch, active):
      cols = {}
      if reducers:
        logits, features, model_out = predict_out(params, batch["image"])
        cols = layer_lib.columns(model_out, reducers, strict=False)
      else:
        logits, features = predict_fn(params, batch["image"])
      out = {**cols, "logits": _at_least_f32(logits), "features": _at_least_f32(features),
             **{k: batch[k] for k in _PASS_THROUGH}}
      res = run_scorers(params, batch["image"], [n for n in names if n not in self.optional])
      if self.optional:
        res.update(_when(jnp.any(active[opt_index]), functools.partial(
            run_scorers, params, batch["image"], self.optional)))
      for name in names:
        r = res[name]
        for col, v in (r.items() if isinstance(r, dict) else [("score", r)]):
          out[columns_lib.scorer_column(col, name)] = v
      return out

    self.step = jax.jit(step, out_shardings=self._split,
                        compiler_options=compile_options.model_step())
    self._active: dict[tuple[str, ...], jax.Array] = {}
    self._warming: Optional[concurrent.futures.Future] = None

  def active(self, names: Optional[Sequence[str]] = None) -> jax.Array:
    """The step's `active` flags (replicated on the mesh) for the scorers `names` (None: all)."""
    names = self.scorer_names if names is None else tuple(names)
    unknown = sorted(set(names) - set(self.scorer_names))
    if unknown:
      raise ValueError(f"input scorers {unknown} are not in this Forward's "
                       f"{list(self.scorer_names)}.")
    if names not in self._active:
      flags = np.array([n in names for n in self.scorer_names], bool)
      self._active[names] = jax.device_put(flags, self._repl)
    return self._active[names]

  def own_columns(self, out: Mapping[str, object], scorers: Optional[Sequence[str]] = None
                  ) -> dict[str, object]:
    """`out` (a step's outputs, or their shapes) without the columns of the input scorers not
    in `scorers` (None: every column)."""
    if scorers is None:
      return dict(out)
    skipped = set(self.scorer_names) - set(scorers)
    return {k: v for k, v in out.items() if columns_lib.scorer_of(k) not in skipped}

  def warm(self, params, batch, wait: bool = False) -> None:
    """Starts compiling the step for (params, global batch)'s shapes and shardings in the
    background (once); the first step of `chunks` waits for it, so it never compiles twice.
    With `wait`, returns when the compilation is done."""
    if self._warming is None:
      active = self.active()
      self._warming = _COMPILER.submit(lambda: self.step.lower(params, batch, active).compile())
    if wait:
      self._wait_warm()

  def _wait_warm(self) -> None:
    if self._warming is not None:
      try:
        self._warming.result()
      except Exception:  # the step's own call reports it
        pass

  def put_params(self, params):
    """`params` replicated on the mesh (a no-op when they already are)."""
    return jax.device_put(params, self._repl)

  def chunks(self, params, batches: Iterable[dict[str, np.ndarray]], *,
             scorers: Optional[Sequence[str]] = None, steps: Optional[int] = None,
             log: Callable[[str], None] = lambda s: None, depth: int = 2,
             warm: Sequence["Forward"] = ()) -> Iterator[dict[str, np.ndarray]]:
    """Runs the step over every (process-local) batch; yields each batch's rows (padding
    dropped) as {features, logits, label, group, _id, score/<name>...}, in the order of
    `batches`, with up to `depth` steps in flight. Only the input scorers in `scorers` run
    (None: all) and only their columns are yielded. The Forwards in `warm` start compiling
    their steps for the first batch's shapes in the background (see `warm`)."""
    params = self.put_params(params)
    active = self.active(scorers)
    pending: collections.deque = collections.deque()
    t0 = last = time.time()
    self._wait_warm()
    for i, local in enumerate(batches):
      batch = distributed.global_batch(self.mesh, local)
      if i == 0:
        for other in warm:
          if other is not self:
            other.warm(other.put_params(params), batch)
      out = self.own_columns(self.step(params, batch, active), scorers)
      for v in out.values():
        v.copy_to_host_async()   # (this process's shards) as soon as the step is done
      pending.append(out)
      if len(pending) >= max(1, depth):
        yield host_rows(pending.popleft())
      if time.time() - last > 30:
        last = time.time()
        log(f"  batch {i + 1}/{steps or '?'} ({time.time() - t0:.0f} s)")
    while pending:
      yield host_rows(pending.popleft())

  def extract(self, params, batches: Iterable[dict[str, np.ndarray]], *,
              scorers: Optional[Sequence[str]] = None, steps: Optional[int] = None,
              log: Callable[[str], None] = lambda s: None) -> dict[str, np.ndarray]:
    """The set: {features, logits, label, group, score/<name>...} in set order; with several
    processes only this process's rows, with their `_id`."""
    return in_set_order(list(self.chunks(params, batches, scorers=scorers, steps=steps,
                                         log=log)),
                        keep_id=jax.process_count() > 1)


def _when(flag: jax.Array, fn: Callable[[], object]) -> object:
  """fn() where the traced bool `flag` is true, zeros of its outputs' shapes where it is not:
  the branch not taken does no work on the device."""
  shapes = jax.eval_shape(fn)
  return jax.lax.cond(flag, fn, lambda: jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype),
                                                       shapes))


def _at_least_f32(x: jax.Array) -> jax.Array:
  """bfloat16 / float16 model outputs as float32; float32 (and float64) unchanged."""
  return x.astype(jnp.float32) if x.dtype.itemsize < 4 else x


def host_rows(out: Mapping[str, jax.Array]) -> dict[str, np.ndarray]:
  """This process's rows of a step's outputs on the host (its addressable shards only),
  padding rows dropped."""
  out = {k: distributed.local_rows(v) for k, v in out.items()}
  keep = out.pop("_mask").astype(bool)
  return {k: v[keep] for k, v in out.items()}


class RowBuffer:
  """A set's rows (of this process) written in place as chunks arrive: one copy of the set in
  host memory instead of a list of chunks plus their concatenation. `n` is the number of rows
  that will arrive (this process's part of the set)."""

  def __init__(self, n: int):
    self.n, self.size, self.arrays = int(n), 0, None

  def add(self, rows: Mapping[str, np.ndarray]) -> None:
    m = len(rows["_id"])
    if self.arrays is None:
      self.arrays = {k: np.empty((self.n, *np.shape(v)[1:]), np.asarray(v).dtype)
                     for k, v in rows.items()}
    if self.size + m > self.n or set(rows) != set(self.arrays):
      raise ValueError(f"{self.size} + {m} rows with keys {sorted(rows)} do not fit the "
                       f"{self.n} rows with keys {sorted(self.arrays)} expected.")
    for k, v in rows.items():
      self.arrays[k][self.size:self.size + m] = v
    self.size += m

  def view(self, start: int, stop: int) -> dict[str, np.ndarray]:
    """Rows [start, stop) (views, no copy)."""
    return {k: v[start:stop] for k, v in self.arrays.items()}

  def result(self, keep_id: bool = False) -> dict[str, np.ndarray]:
    """The rows in set order (no copy when they arrived in it, as they do from `data`)."""
    if self.arrays is None:
      raise ValueError("The set produced no batches.")
    if self.size != self.n:
      raise ValueError(f"{self.size} rows arrived, {self.n} expected.")
    return in_set_order([self.arrays], keep_id=keep_id)


def extract_chunks(predict_fn: PredictFn, params, batches: Iterable[dict[str, np.ndarray]],
                   mesh, *, input_scorers: Optional[dict[str, InputScorer]] = None,
                   steps: Optional[int] = None, log: Callable[[str], None] = lambda s: None,
                   ) -> Iterator[dict[str, np.ndarray]]:
  """`Forward(predict_fn, mesh, input_scorers).chunks(...)` (compiles a new step)."""
  return Forward(predict_fn, mesh, input_scorers=input_scorers).chunks(
      params, batches, steps=steps, log=log)


def in_set_order(chunks: Sequence[Mapping[str, np.ndarray]], *, keep_id: bool = False,
                 ) -> dict[str, np.ndarray]:
  """Concatenates chunks of rows and puts them into set order by `_id` (dropped unless
  `keep_id`); rows already in order are not copied again."""
  if not chunks:
    raise ValueError("The set produced no batches.")
  arrays = {k: (np.concatenate([c[k] for c in chunks]) if len(chunks) > 1 else
                np.asarray(chunks[0][k])) for k in chunks[0]}
  ids = arrays["_id"] if keep_id else arrays.pop("_id")
  if len(ids) < 2 or bool(np.all(ids[1:] > ids[:-1])):
    return arrays
  order = np.argsort(ids, kind="stable")
  return {k: v[order] for k, v in arrays.items()}


def extract(predict_fn: PredictFn, params, batches: Iterable[dict[str, np.ndarray]], mesh,
            *, input_scorers: Optional[dict[str, InputScorer]] = None,
            steps: Optional[int] = None, log: Callable[[str], None] = lambda s: None,
            ) -> dict[str, np.ndarray]:
  """Runs the model over every batch; returns {features, logits, label, group, score/<name>...}
  (compiles a new step: keep a `Forward` to reuse it across sets)."""
  return Forward(predict_fn, mesh, input_scorers=input_scorers).extract(
      params, batches, steps=steps, log=log)
