"""Compile ahead: while the model trains, compile what the run will compile after it.

A small run's wall time is mostly XLA compilation: the forward steps, every detector's fit
and score, the metrics (the demo: ~155 compilations; docs/performance.md). None of them
depends on the parameter values, only on shapes, and training leaves part of the machine idle
(the demo's tiny ViT does not keep two cores busy).
`CompileAhead.start` runs in a background thread, which first imports TensorFlow (the
training's preprocessing needs it too) and, started with `hold`, then waits until the training
step is traced (`start` returns the function that says so; `fi_jax.run.train` calls it): before
that its own tracing, which holds the GIL, would slow down the preprocessing and the tracing of
the training step, which come first on the critical path (XLA's compilations release it).
Then:

1. each set's Forward (the very objects `pipeline.extract_sets` will use, shared through the
   `forwards` dict) starts compiling its step for the set's first real batch
   (`extract.Forward.warm`), and `jax.eval_shape` of that step gives every output column's
   shape and dtype;
2. with the sets small enough (`MAX_ROWS` rows in all), each set is made up of synthetic rows
   of exactly those shapes and dtypes and the set's real size (labels cover every class,
   OOD group ids repeat the first batch's); the metrics run once on synthetic scores, then
   the detectors are fitted and scored on these sets, from the last one back: each jitted
   function compiles for the shapes the real stage will call it with.

Nothing computed here is kept except compilations (and JAX's persistent compilation cache,
when on), so the results are bit-identical to a run without it; a detector that fails on the
synthetic rows just compiles later. The thread goes on into the run's own detector stage,
taking the detectors from the back while the stage takes them from the front
(`CompileAhead.claim`); each thread has its own `detectors.shared()` scope.
"""
from __future__ import annotations

import threading
from typing import Any, Callable, Mapping, Optional, Sequence

import jax
import numpy as np

from fi_jax import detectors, pipeline
from fi_jax.common import distributed
from fi_jax.data import loader as data
from fi_jax.data import preprocess

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
                  take: Optional[Callable[[str], bool]] = None,
                  max_rows: int = MAX_ROWS) -> list[str]:
  """Compiles the forwards, detectors and metrics of a run for its sets' shapes (see the
  module docstring), one after the other, the detectors from the last one back; returns the
  detectors it fitted and scored. `params` / `head`: any values with the trained ones'
  structure, shapes and dtypes (e.g. zeros); `forwards`: the dict `pipeline.extract_sets`
  gets; `take(name)`: whether to do that detector (`CompileAhead` passes its claim)."""
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
      shapes = fwd.own_columns(jax.eval_shape(fwd.step, placed, batch, fwd.active()),
                               pipeline.input_scorer_names(dets, name))   # the set's columns
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
  backwards = dict(reversed(list(dets.items())))   # the run's own stage starts at the front
  def select(name: str) -> bool:   # nothing more once stopped; else the caller's claim
    return not stop.is_set() and (take is None or take(name))
  scores, _ = pipeline.score_sets(backwards, fake, head, keep_going=True, nonfinite=nonfinite,
                                  take=select)
  return list(scores)


class CompileAhead:
  """`compile_ahead` in a daemon thread, sharing the detectors with the run's own detector
  stage: `start(...)` (same arguments) when training starts; the stage passes `claim` as
  `pipeline.score_sets(take=...)`; `finish()` after it. The thread takes the detectors from
  the last one back, the stage from the first one on, each claiming a detector before it runs
  it: where they meet the thread stops, and a detector the thread is still compiling when the
  stage reaches it is waited for (not compiled twice). Any error in the thread is ignored (the
  run compiles what it needs itself)."""

  def __init__(self):
    self._stop = threading.Event()
    self._go = threading.Event()             # set: the thread may start compiling
    self._thread: Optional[threading.Thread] = None
    self._cond = threading.Condition()
    self._current: Optional[str] = None     # the detector the thread is running
    self._claimed: set[str] = set()         # the detectors the run's stage has reached
    self.ran: list[str] = []
    self.error: Optional[str] = None

  def start(self, specs: Mapping[str, dict], dets: Mapping[str, Any], predict, params,
            head: detectors.Head, forwards: dict, *, hold: bool = False,
            **kwargs) -> Callable[[], None]:
    """Starts the thread; with `hold` it does nothing after the TensorFlow import until the
    returned function is called (e.g. when the training runs). Returns that function."""
    # the Forwards exist before the thread does: extraction can never make its own
    pipeline.plan_forwards(list(specs), dets, predict, kwargs["mesh"], kwargs["input_std"],
                           forwards)
    if not hold:
      self._go.set()

    def body():
      try:
        preprocess.tf_module()
        while not self._go.wait(0.05):
          if self._stop.is_set():
            return
        self.ran = compile_ahead(specs, dets, predict, params, head, forwards,
                                 stop=self._stop, take=self._take, **kwargs)
      except Exception as e:  # only a head start is lost
        self.error = f"{type(e).__name__}: {e}"
      finally:
        self._take(None)   # nothing in progress any more
    self._thread = threading.Thread(target=body, name="fi_jax-ahead", daemon=True)
    self._thread.start()
    return self._go.set

  def _take(self, name: Optional[str]) -> bool:
    """The thread's claim: the previous detector is done; runs `name` unless the stage has
    reached it (then everything before it is the stage's: the thread stops)."""
    with self._cond:
      self._current = None
      self._cond.notify_all()
      if name is None or self._stop.is_set():
        return False
      if name in self._claimed:
        self._stop.set()
        return False
      self._current = name
      return True

  def claim(self, name: str) -> bool:
    """The run's stage reaches detector `name`: the thread will not start it, and if it is
    running it now, this waits until it is done. Always true (the stage runs every one)."""
    with self._cond:
      self._claimed.add(name)
      while self._current == name:
        self._cond.wait()
    return True

  def finish(self, wait: bool = True) -> None:
    """Stops the thread after the detector in progress; with `wait`, waits for it (a run that
    failed or was interrupted does not: the daemon thread ends with the process)."""
    self._stop.set()
    if self._thread is not None and wait:
      self._thread.join()
      self._thread = None
