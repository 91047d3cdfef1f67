"""Compile ahead: while the model trains, compile what the run will compile after it.

A small run's wall time is mostly XLA compilation: the forward steps, every detector's fit
and score, the metrics (the demo: ~220 compilations, ~30 s of CPU). None of them depends on
the parameter values, only on shapes, and training leaves a core idle (the demo's tiny ViT
keeps ~1.2 of 2 cores busy). `CompileAhead.start` runs in a background thread:

1. each set's Forward (the very objects `pipeline.extract_sets` will use, shared through the
   `forwards` dict) starts compiling its step for the set's first real batch
   (`extract.Forward.warm`), and `jax.eval_shape` of that step gives every output column's
   shape and dtype;
2. with the sets small enough (`MAX_ROWS` rows in all), each set is made up of synthetic rows
   of exactly those shapes and dtypes and the set's real size (labels cover every class,
   OOD group ids repeat the first batch's), and every detector is fitted and scored on them,
   then the metrics run once: each jitted function compiles for the shapes the real stage
   will call it with.

Nothing computed here is kept except compilations (and JAX's persistent compilation cache,
when on), so the results are bit-identical to a run without it; a detector that fails on the
synthetic rows just compiles later. `finish` (before the real detector stage) stops the thread
after the detector it is on: the two never run detectors at the same time.
"""
from __future__ import annotations

import threading
from typing import Any, Callable, Mapping, Optional, Sequence

import jax
import numpy as np

from fi_jax import data, detectors, distributed, pipeline

MAX_ROWS = 50_000   # above this the synthetic sets cost real work: forwards only


def synthetic_set(shapes: Mapping[str, Any], first: Mapping[str, np.ndarray], n: int,
                  num_classes: int, seed: int = 0) -> dict[str, np.ndarray]:
  """n rows with a step's output columns (`shapes`: {column: ShapeDtypeStruct [B, ...]}):
  standard normal floats; `label` every class in turn when the first batch has labels (else
  -1); `group` the first batch's group ids repeated; other integer columns zero."""
  rng = np.random.default_rng(seed)
  keep = np.asarray(first["_mask"], bool)
  out = {}
  for col, s in shapes.items():
    if col in ("_id", "_mask"):
      continue
    shape, dtype = (n, *s.shape[1:]), np.dtype(s.dtype)
    if col == "label":
      has = (np.asarray(first["label"])[keep] >= 0).any()
      out[col] = (np.arange(n) % num_classes if has else np.full(n, -1)).astype(dtype)
    elif col == "group":
      out[col] = np.resize(np.asarray(first["group"])[keep], n).astype(dtype)
    elif np.issubdtype(dtype, np.floating):
      out[col] = rng.standard_normal(shape).astype(dtype)
    else:
      out[col] = np.zeros(shape, dtype)
  return out


def compile_ahead(specs: Mapping[str, dict], dets: Mapping[str, Any], predict, params,
                  head: detectors.Head, forwards: dict, *, pp_fn: Callable, batch_size: int,
                  mesh, input_std: Sequence[float], metric_kw: Mapping[str, Any],
                  nonfinite: str = "error", stop: Optional[threading.Event] = None,
                  max_rows: int = MAX_ROWS) -> list[str]:
  """Compiles the forwards, detectors and metrics of a run for its sets' shapes (see the
  module docstring), one after the other; returns the detectors it fitted and scored.
  `params` / `head`: any values with the trained ones' structure, shapes and dtypes (e.g.
  zeros); `forwards`: the dict `pipeline.extract_sets` gets."""
  stop = stop or threading.Event()
  set_forwards = pipeline.plan_forwards(list(specs), dets, predict, mesh, input_std, forwards)
  fake, rows = {}, 0
  for name, spec in specs.items():
    if stop.is_set():
      return []
    it, _, info = data.batches(spec, pp_fn, batch_size)
    first = next(it)
    del it
    fwd = set_forwards[name]
    placed = fwd.put_params(params)
    batch = distributed.global_batch(mesh, first)
    fwd.warm(placed, batch, wait=True)   # one compilation at a time: training needs the cores
    rows += info.num_examples
    if rows <= max_rows:
      shapes = jax.eval_shape(fwd.step, placed, batch)
      fake[name] = synthetic_set(shapes, first, info.num_examples, int(head.b.shape[0]),
                                 seed=len(fake))
  if rows > max_rows or stop.is_set():
    return []
  # the metrics first (float64 scores of the sets' sizes: one detector's rows compile them
  # for every detector), then the detectors in the run's order
  rng = np.random.default_rng(len(fake))
  pipeline.metric_rows({"": {s: rng.standard_normal(len(a["logits"])) for s, a in fake.items()
                             if s != "id_fit"}}, fake, **metric_kw)
  pipeline.id_accuracy(fake["id_test"])
  head = detectors.Head(*(jax.numpy.asarray(np.asarray(a)) for a in (head.w, head.b)))
  scores, _ = pipeline.score_sets(dets, fake, head, keep_going=True, nonfinite=nonfinite,
                                  stop=stop)
  return list(scores)


class CompileAhead:
  """`compile_ahead` in a daemon thread: `start(...)` (same arguments), then `finish()` before
  the run's own detector stage. Any error in the thread is ignored (the run compiles what it
  needs itself)."""

  def __init__(self):
    self._stop = threading.Event()
    self._thread: Optional[threading.Thread] = None
    self.ran: list[str] = []
    self.error: Optional[str] = None

  def start(self, specs: Mapping[str, dict], dets: Mapping[str, Any], predict, params,
            head: detectors.Head, forwards: dict, **kwargs) -> None:
    # the Forwards exist before the thread does: extraction can never make its own
    pipeline.plan_forwards(list(specs), dets, predict, kwargs["mesh"], kwargs["input_std"],
                           forwards)

    def body():
      try:
        self.ran = compile_ahead(specs, dets, predict, params, head, forwards,
                                 stop=self._stop, **kwargs)
      except Exception as e:  # pylint: disable=broad-except  (only a head start is lost)
        self.error = f"{type(e).__name__}: {e}"
    self._thread = threading.Thread(target=body, name="fi_jax-ahead", daemon=True)
    self._thread.start()

  def finish(self) -> None:
    """Stops after the detector in progress and waits for it."""
    self._stop.set()
    if self._thread is not None:
      self._thread.join()
      self._thread = None
