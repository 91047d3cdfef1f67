"""A random-weight model with wide features for bench/multihost_memory.py (not a real model).

features = tanh(flattened image @ W) of `width` floats, logits = a linear head on them; with
`model_name="bench.multihost_memory_model"` fi_jax.run builds it like any model family.
"""
from __future__ import annotations

import flax.linen as nn
import jax.numpy as jnp


class Model(nn.Module):
  width: int = 4096
  num_classes: int = 10

  @nn.compact
  def __call__(self, images, train: bool = False):
    del train
    x = jnp.reshape(images, (images.shape[0], -1))
    features = jnp.tanh(nn.Dense(self.width, name="embed")(x))
    return nn.Dense(self.num_classes, name="head")(features), {"pre_logits": features}


def load(params, path, model_cfg, **kw):
  raise ValueError("bench.multihost_memory_model has random weights only (no checkpoint).")
