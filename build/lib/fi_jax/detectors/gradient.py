"""Gradient-based scores: ODIN (input perturbation, needs the model) and GradNorm (closed form)
(docs/detectors.md#gradient-scores)."""
from __future__ import annotations

import functools
from typing import Callable, Sequence

import jax
import jax.numpy as jnp

from fi_jax.detectors.core import Detector, fc, log_max_softmax, require

IMAGENET_STD = (0.229, 0.224, 0.225)


def odin_scores(logits_fn: Callable, images, std, *, temperature: float, epsilon: float):
  """log max_c softmax(z(x~) / T)_c with x~ = x - eps * sign+(grad_x L) / std,
  L = -log softmax(z(x) / T)_yhat, yhat = argmax z(x), sign+(g) = +1 if g >= 0 else -1."""
  x = jnp.asarray(images, jnp.float32)

  def loss(x):
    z = logits_fn(x).astype(jnp.float32)
    yhat = jax.lax.stop_gradient(jnp.argmax(z, -1))
    logp = jax.nn.log_softmax(z / temperature, axis=-1)
    return -jnp.sum(jnp.take_along_axis(logp, yhat[:, None], axis=1))

  g = jax.grad(loss)(x)
  step = jnp.where(g >= 0, 1.0, -1.0) / jnp.asarray(std, jnp.float32)
  x_tilde = x - epsilon * step
  return log_max_softmax(fc(logits_fn(x_tilde)) / temperature)


class ODIN(Detector):
  """ODIN (Liang et al.): needs the model, so it scores images during extraction via
  `score_inputs(state, logits_fn, images, input_std=...)`; `fit` returns {}. The step is
  eps / std per channel (NHWC, last axis) so that eps is in [0, 1] pixel units, as OpenOOD.
  T = 1000, eps = 0.0014 (OpenOOD and the paper's ImageNet setting)."""
  name, needs = "odin", frozenset({"inputs"})
  defaults = {"temperature": 1000.0, "epsilon": 0.0014}

  @classmethod
  def validate(cls, hp):
    require(hp["temperature"] > 0, "odin: temperature must be > 0.")
    require(hp["epsilon"] >= 0, "odin: epsilon must be >= 0.")

  def score_inputs(self, state: dict, logits_fn: Callable, images,
                   *, input_std: Sequence[float] = IMAGENET_STD) -> jax.Array:
    """Scores [B] for NHWC float32 `images` (already normalised as the model expects);
    `logits_fn(images) -> logits` must be jittable and differentiable."""
    del state
    require(jnp.ndim(images) == 4, f"odin: images must be NHWC, got shape {jnp.shape(images)}.")
    std = jnp.broadcast_to(jnp.asarray(input_std, jnp.float32), (jnp.shape(images)[-1],))
    fn = functools.partial(odin_scores, logits_fn, temperature=float(self.hparams["temperature"]),
                           epsilon=float(self.hparams["epsilon"]))
    if not isinstance(images, jax.core.Tracer):   # inside the caller's jit it is traced as is
      fn = jax.jit(fn)
    return fn(images, std)

  def score(self, state, outputs):
    raise ValueError("odin perturbs the input images: use det.score_inputs(state, logits_fn, "
                     "images) during extraction; score(state, outputs) cannot compute it.")

  def _score(self, state, features, logits):
    raise ValueError("odin: use score_inputs.")


class GradNorm(Detector):
  """GradNorm (Huang et al.), closed form of OpenOOD's |dL/dW|_1 with L = sum_c -log p_c:
  s = |h|_1 * sum_c |C p_c - 1| (bias gradient excluded; the paper's KL(u || p) form differs by
  the constant 1/C)."""
  name, needs = "gradnorm", frozenset({"features", "logits"})

  def _score(self, state, features, logits):
    z = fc(logits)
    p = jax.nn.softmax(z, axis=-1)
    return jnp.sum(jnp.abs(fc(features)), -1) * jnp.sum(jnp.abs(z.shape[-1] * p - 1.0), -1)
