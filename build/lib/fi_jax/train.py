"""A small seeded classifier trainer (optax), used by the embedded demo.

Real benchmarks load released checkpoints; this exists so that the demo can train fi_jax's own
ViT from scratch on an in-memory set in about a minute on two CPU cores.
"""
from __future__ import annotations

import time
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax


def train_classifier(model, params, images: np.ndarray, labels: np.ndarray, *, steps: int,
                     batch_size: int, lr: float, weight_decay: float = 1e-4,
                     warmup_steps: int = 0, label_smoothing: float = 0.0,
                     augment_shift: int = 0, seed: int = 0,
                     log: Callable[[str], None] = lambda s: None):
  """Trains `model` with AdamW + cosine decay on (images, labels); returns the new params."""
  num_classes = int(labels.max()) + 1
  warmup_steps = min(warmup_steps, steps // 2)   # short runs (tests) keep a decay phase
  sched = optax.warmup_cosine_decay_schedule(0., lr, max(warmup_steps, 1), max(steps, 2))
  tx = optax.adamw(sched, weight_decay=weight_decay)
  opt_state = tx.init(params)

  def loss_fn(p, x, y, rng):
    logits, _ = model.apply({"params": p}, x, train=True, rngs={"dropout": rng})
    onehot = optax.smooth_labels(jax.nn.one_hot(y, num_classes), label_smoothing)
    return optax.softmax_cross_entropy(logits, onehot).mean()

  @jax.jit
  def step(p, o, x, y, rng):
    loss, grads = jax.value_and_grad(loss_fn)(p, x, y, rng)
    updates, o = tx.update(grads, o, p)
    return optax.apply_updates(p, updates), o, loss

  rng = np.random.default_rng(seed)
  key = jax.random.PRNGKey(seed)
  t0 = time.time()
  for i in range(steps):
    idx = rng.integers(0, len(labels), batch_size)
    x = images[idx]
    if augment_shift:  # random translation by up to `augment_shift` pixels (zero fill)
      x = _random_shift(x, augment_shift, rng)
    key, sub = jax.random.split(key)
    params, opt_state, loss = step(params, opt_state, x, labels[idx], sub)
    if (i + 1) % max(1, steps // 5) == 0 or i == steps - 1:
      log(f"  train step {i + 1}/{steps}: loss {float(loss):.4f} ({time.time() - t0:.0f} s)")
  return params


def _random_shift(x: np.ndarray, pad: int, rng: np.random.Generator) -> np.ndarray:
  n, h, w, _ = x.shape
  padded = np.pad(x, ((0, 0), (pad, pad), (pad, pad), (0, 0)), constant_values=x.min())
  dy, dx = rng.integers(0, 2 * pad + 1, (2, n))
  return np.stack([padded[i, dy[i]:dy[i] + h, dx[i]:dx[i] + w] for i in range(n)])
