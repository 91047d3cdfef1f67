"""The demo trainer: chunked jitted steps equal a plain per-step loop on the same batches."""
from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fi_jax.run import train


class _Tiny(nn.Module):
  """Flatten -> Dense, with the (logits, outputs) return of fi_jax's models."""

  @nn.compact
  def __call__(self, x, train: bool = False):
    del train
    return nn.Dense(3)(x.reshape(x.shape[0], -1)), {}


def _reference(model, params, images, labels, *, steps, batch_size, lr, warmup_steps,
               augment_shift, seed):
  """One jitted step per Python iteration, batches from the same numpy stream."""
  sched = optax.warmup_cosine_decay_schedule(0., lr, max(warmup_steps, 1), max(steps, 2))
  tx = optax.adamw(sched, weight_decay=1e-4)
  opt = tx.init(params)

  @jax.jit
  def step(p, o, x, y):
    def loss_fn(p):
      logits, _ = model.apply({"params": p}, x, train=True)
      return optax.softmax_cross_entropy(logits, jax.nn.one_hot(y, 3)).mean()
    grads = jax.grad(loss_fn)(p)
    updates, o = tx.update(grads, o, p)
    return optax.apply_updates(p, updates), o

  rng = np.random.default_rng(seed)
  for _ in range(steps):
    idx = rng.integers(0, len(labels), batch_size)
    x = images[idx]
    if augment_shift:
      x = train._random_shift(x, augment_shift, rng)
    params, opt = step(params, opt, x, labels[idx])
  return params


@pytest.mark.parametrize("chunk_bytes", [None, 512])   # 512: one step per jitted call
def test_chunked_training_equals_per_step_loop(chunk_bytes, monkeypatch):
  if chunk_bytes:
    monkeypatch.setattr(train, "_CHUNK_BYTES", chunk_bytes)
  rng = np.random.default_rng(1)
  images = rng.normal(size=(40, 4, 4, 1)).astype(np.float32)
  labels = rng.integers(0, 3, 40)
  model = _Tiny()
  params = model.init(jax.random.PRNGKey(0), jnp.zeros((1, 4, 4, 1)))["params"]
  kw = dict(steps=13, batch_size=8, lr=1e-2, warmup_steps=3, augment_shift=1, seed=5)
  lines = []
  got = train.train_classifier(model, params, images, labels, log=lines.append, **kw)
  want = _reference(model, params, images, labels, **kw)
  # 13 steps in chunks of 2 (the last one padded, running 1 step) or of 1; a line every 2 steps
  assert [l.split(":")[0] for l in lines] == [f"  train step {s}/13" for s in
                                              (2, 4, 6, 8, 10, 12, 13)]
  for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)


def test_on_traced_is_called_once_before_the_step_compiles():
  """train_classifier(on_traced=f): f runs once, after the training step is traced and before
  XLA compiles it (fi_jax.run.compile_ahead then starts its own tracing)."""
  events = []

  def listener(event, duration, **kw):
    del duration
    if (event == "/jax/core/compile/backend_compile_duration"
        and kw.get("fun_name") == "jit(run_steps)"):
      events.append("compiled")
  model = _Tiny()
  params = model.init(jax.random.PRNGKey(0), jnp.zeros((1, 4, 4, 1)))["params"]
  rng = np.random.default_rng(0)
  images = rng.normal(size=(20, 4, 4, 1)).astype(np.float32)
  labels = np.arange(20) % 3
  jax.monitoring.register_event_duration_secs_listener(listener)
  try:
    train.train_classifier(model, params, images, labels, steps=7, batch_size=4, lr=1e-2,
                           seed=3, on_traced=lambda: events.append("traced"))
  finally:
    jax.monitoring.unregister_event_duration_listener(listener)
  assert events in (["traced", "compiled"], ["traced"]), events   # (a cache hit: no compile)


def test_the_init_options_give_the_default_initial_values():
  """run_model._init_compiler_options (LLVM -O1 on CPU, for a faster compile) leaves the demo ViT's
  initial parameters bit-identical."""
  from configs import demo
  from fi_jax.models import vit
  from fi_jax.run import model as run_model
  c = demo.get_config()
  model = vit.Model(**c.model.to_dict())
  init = lambda: model.init(jax.random.PRNGKey(c.seed), jnp.zeros(c.init_shape))["params"]
  options = run_model._init_compiler_options()
  fast = jax.jit(init, compiler_options=options)()
  plain = jax.jit(init)()
  for a, b in zip(jax.tree.leaves(fast), jax.tree.leaves(plain), strict=True):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
