"""Jitted, sharded forward passes over a set: images -> features, logits (+ input-based scores).

The batch is sharded along the mesh's data axis, parameters are replicated, and the outputs
are gathered (replicated) so that every process holds the whole set's arrays; padding rows
(``_mask`` False) are dropped and rows are put back into set order by ``_id``.
"""
from __future__ import annotations

import time
from typing import Callable, Iterable, Iterator, Optional, Sequence

import jax
import numpy as np

from fi_jax import distributed

# predict_fn(params, images) -> (logits [B, C], features [B, D])
PredictFn = Callable[[object, jax.Array], tuple[jax.Array, jax.Array]]
# input scorer: (params, images) -> scores [B] or {column: [B]}; e.g. ODIN, which needs gradients
# w.r.t. inputs
InputScorer = Callable[[object, jax.Array], object]


def extract_chunks(predict_fn: PredictFn, params, batches: Iterable[dict[str, np.ndarray]],
                   mesh, *, input_scorers: Optional[dict[str, InputScorer]] = None,
                   steps: Optional[int] = None, log: Callable[[str], None] = lambda s: None,
                   ) -> Iterator[dict[str, np.ndarray]]:
  """Runs the model over every batch; yields each batch's rows (padding dropped) as
  {features, logits, label, group, _id, score/<name>...}, in the order of `batches`."""
  input_scorers = dict(input_scorers or {})
  repl = distributed.replicated(mesh)

  def step(params, batch):
    logits, features = predict_fn(params, batch["image"])
    out = {"logits": logits, "features": features,
           **{k: batch[k] for k in ("label", "group", "_id", "_mask")}}
    for name, scorer in input_scorers.items():
      res = scorer(params, batch["image"])
      # a scorer returns scores [B], or {column: [B]} (AdaSCALE's {"stat": ...}) -> column/<name>
      for col, v in (res.items() if isinstance(res, dict) else [("score", res)]):
        out[f"{col}/{name}"] = v
    return out

  step = jax.jit(step, out_shardings=repl)
  params = jax.device_put(params, repl)
  t0, last = time.time(), time.time()
  for i, local in enumerate(batches):
    out = step(params, distributed.global_batch(mesh, local))
    out = jax.device_get(out)
    keep = out.pop("_mask").astype(bool)
    yield {k: np.asarray(v)[keep] for k, v in out.items()}
    if time.time() - last > 30:
      last = time.time()
      log(f"  batch {i + 1}/{steps or '?'} ({time.time() - t0:.0f} s)")


def in_set_order(chunks: Sequence[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
  """Concatenates chunks of rows and puts them into set order by `_id` (which is dropped)."""
  if not chunks:
    raise ValueError("The set produced no batches.")
  arrays = {k: np.concatenate([c[k] for c in chunks]) for k in chunks[0]}
  order = np.argsort(arrays.pop("_id"), kind="stable")
  return {k: v[order] for k, v in arrays.items()}


def extract(predict_fn: PredictFn, params, batches: Iterable[dict[str, np.ndarray]], mesh,
            *, input_scorers: Optional[dict[str, InputScorer]] = None,
            steps: Optional[int] = None, log: Callable[[str], None] = lambda s: None,
            ) -> dict[str, np.ndarray]:
  """Runs the model over every batch; returns {features, logits, label, group, score/<name>...}."""
  return in_set_order(list(extract_chunks(predict_fn, params, batches, mesh,
                                          input_scorers=input_scorers, steps=steps, log=log)))
