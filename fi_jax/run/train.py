"""A small seeded classifier trainer (optax), used by the embedded demo.

Real benchmarks load released checkpoints; this exists so that the demo can train fi_jax's own
ViT from scratch on an in-memory set in seconds on two CPU cores. The batches (indices and
shift augmentation, numpy-seeded) are drawn on the host a chunk of steps at a time; the chunk
runs as one jitted `fori_loop` on the device, so there is no per-step dispatch, and the next
chunk is drawn while the device trains on the current one.
"""
from __future__ import annotations

import time
from typing import Callable, Optional

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax import lax

_LOG_EVERY = 5            # progress lines per run
_CHUNK_BYTES = 64 << 20   # host batches prepared per jitted call (bounds host and device memory)


def train_classifier(model, params, images: np.ndarray, labels: np.ndarray, *, steps: int,
                     batch_size: int, lr: float, weight_decay: float = 1e-4,
                     warmup_steps: int = 0, label_smoothing: float = 0.0,
                     augment_shift: int = 0, seed: int = 0,
                     log: Callable[[str], None] = lambda s: None,
                     on_traced: Optional[Callable[[], None]] = None):
  """Trains `model` with AdamW + cosine decay on (images, labels); returns the new params.

  Step i trains on `batch_size` examples drawn uniformly with replacement by
  `np.random.default_rng(seed)`, each shifted by up to `augment_shift` pixels (from the same
  generator), with dropout key `fold_in(PRNGKey(seed), i)`. `on_traced()` is called once the
  training step is traced: what remains before the steps run, XLA's compilation, releases the
  GIL (what waits for that to use Python, fi_jax.run.compile_ahead, can start).
  """
  num_classes = int(labels.max()) + 1
  warmup_steps = min(warmup_steps, steps // 2)   # short runs (tests) keep a decay phase
  sched = optax.warmup_cosine_decay_schedule(0., lr, max(warmup_steps, 1), max(steps, 2))
  tx = optax.adamw(sched, weight_decay=weight_decay)
  opt_state = jax.jit(tx.init)(params)   # one compilation, not one per parameter shape
  key = jax.random.PRNGKey(seed)

  def loss_fn(p, x, y, rng):
    logits, _ = model.apply({"params": p}, x, train=True, rngs={"dropout": rng})
    onehot = optax.smooth_labels(jax.nn.one_hot(y, num_classes), label_smoothing)
    return optax.softmax_cross_entropy(logits, onehot).mean()

  @jax.jit
  def run_steps(p, o, first, count, xs, ys):
    # steps first .. first + count - 1 on xs[:count] / ys[:count]; count is traced, so a
    # shorter last chunk (padded) runs the same compiled program
    def body(j, state):
      p, o, _ = state
      rng = jax.random.fold_in(key, first + j)
      loss, grads = jax.value_and_grad(loss_fn)(p, xs[j], ys[j], rng)
      updates, o = tx.update(grads, o, p)
      return optax.apply_updates(p, updates), o, loss.astype(jnp.float32)
    return lax.fori_loop(0, count, body, (p, o, jnp.zeros((), jnp.float32)))

  rng = np.random.default_rng(seed)
  every = max(1, steps // _LOG_EVERY)
  chunk = max(1, min(every, _CHUNK_BYTES // max(1, batch_size * images[0].nbytes)))

  def draw(count):   # the next `count` batches, padded to `chunk` (padding is never trained on)
    xs = np.zeros((chunk, batch_size) + images.shape[1:], images.dtype)
    ys = np.zeros((chunk, batch_size), labels.dtype)
    for j in range(count):
      idx = rng.integers(0, len(labels), batch_size)
      xs[j], ys[j] = images[idx], labels[idx]
      if augment_shift:  # random translation by up to `augment_shift` pixels (zero fill)
        xs[j] = _random_shift(xs[j], augment_shift, rng)
    return xs, ys

  t0 = time.time()
  start = 0
  batches = draw(min(chunk, steps)) if steps > 0 else None
  if steps > 0:   # traced here, so that `on_traced` can say so before XLA compiles it
    lowered = run_steps.lower(params, opt_state, start, min(chunk, steps), *batches)
    if on_traced is not None:
      on_traced()
    run_steps = lowered.compile()
  while start < steps:
    count = min(chunk, steps - start)
    params, opt_state, loss = run_steps(params, opt_state, start, count, *batches)
    if start + count < steps:   # drawn while the device runs the dispatched chunk
      batches = draw(min(chunk, steps - start - count))
    start += count
    if start // every > (start - count) // every or start == steps:
      log(f"  train step {start}/{steps}: loss {float(loss):.4f} ({time.time() - t0:.0f} s)")
  return params


def _random_shift(x: np.ndarray, pad: int, rng: np.random.Generator) -> np.ndarray:
  n, h, w, _ = x.shape
  padded = np.pad(x, ((0, 0), (pad, pad), (pad, pad), (0, 0)), constant_values=x.min())
  dy, dx = rng.integers(0, 2 * pad + 1, (2, n))
  return np.stack([padded[i, dy[i]:dy[i] + h, dx[i]:dx[i] + w] for i in range(n)])
