"""The predictor contract between a model family and extraction.

A model family gives `predict(params, images) -> (logits, features)` and the classifier `Head`
(`fi_jax.common.outputs.Head`). For the layer detectors a predictor may carry a variant that
also returns the model's `out` dict (`predict_out(params, images) -> (logits, features, out)`),
attached with `with_out` and read back with `out_variant` by the extraction stage
(`fi_jax.extract.layer_columns`).
"""
from __future__ import annotations

from typing import Callable

import jax.numpy as jnp

from fi_jax.common.outputs import Head


def with_out(predict: Callable, predict_out: Callable) -> Callable:
  """`predict(params, images) -> (logits, features)` carrying its layers-capable variant
  `predict_out(params, images) -> (logits, features, out)` (read by `out_variant`), so that a
  model factory keeps returning (predict_fn, head)."""
  predict.with_out = predict_out
  return predict


def out_variant(predict: Callable):
  """The variant of `predict` that also returns the model's `out` (None if it has none)."""
  return getattr(predict, "with_out", None)


def default_predictor(model, params, config):
  """Classifier models: logits from the model, features = out['pre_logits'], its linear head."""

  def predict(p, images):
    logits, out = model.apply({"params": p}, images)
    return logits, out["pre_logits"]

  def predict_out(p, images):   # for layer detectors (fi_jax.extract.layer_columns): also the model's out
    logits, out = model.apply({"params": p}, images)
    return logits, out["pre_logits"], out
  predict = with_out(predict, predict_out)
  if "head" not in params:
    raise ValueError("The model has no classifier head ('head' params); set model.num_classes, "
                     "or use a model family that provides a zero-shot head.")
  head = Head(jnp.asarray(params["head"]["kernel"]), jnp.asarray(params["head"]["bias"]))
  return predict, head
