"""Gradient-based scores: ODIN, i-ODIN and AdaSCALE-A/-L (input perturbation, need the model)
and GradNorm (closed form) (docs/detectors.md#gradient-scores)."""
from __future__ import annotations

import functools
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from fi_jax.detectors import stats
from fi_jax.detectors.core import (
  Detector,
  cdtype,
  check_number,
  fc,
  head_state,
  log_max_softmax,
  matmul,
  require,
)

IMAGENET_STD = (0.229, 0.224, 0.225)


def _largest_entry_mask(g):
  """1 at each image's input entry of largest |g| (the first in NCHW order, as OpenOOD's argmax
  over the flattened NCHW gradient), 0 elsewhere; NHWC in and out."""
  b = g.shape[0]
  flat = jnp.abs(jnp.transpose(g, (0, 3, 1, 2))).reshape(b, -1)
  mask = jax.nn.one_hot(jnp.argmax(flat, axis=1), flat.shape[1], dtype=g.dtype)
  return jnp.transpose(mask.reshape((b,) + (g.shape[3], g.shape[1], g.shape[2])), (0, 2, 3, 1))


def odin_scores(logits_fn: Callable, images, std, *, temperature: float, epsilon: float,
                single_entry: bool = False):
  """log max_c softmax(z(x~) / T)_c with x~ = x - eps * sign+(grad_x L) / std,
  L = -log softmax(z(x) / T)_yhat, yhat = argmax z(x), sign+(g) = +1 if g >= 0 else -1.
  `single_entry` (i-ODIN): only each image's input entry of largest |grad_x L| moves."""
  x = jnp.asarray(images, jnp.float32)

  def loss(x):
    z = logits_fn(x).astype(jnp.float32)
    yhat = jax.lax.stop_gradient(jnp.argmax(z, -1))
    logp = jax.nn.log_softmax(z / temperature, axis=-1)
    return -jnp.sum(jnp.take_along_axis(logp, yhat[:, None], axis=1))

  g = jax.grad(loss)(x)
  step = jnp.where(g >= 0, 1.0, -1.0) / jnp.asarray(std, jnp.float32)
  if single_entry:
    step = step * _largest_entry_mask(g)
  x_tilde = x - epsilon * step
  return log_max_softmax(fc(logits_fn(x_tilde)) / temperature)


class ODIN(Detector):
  """ODIN (Liang et al.): needs the model, so it scores images during extraction via
  `score_inputs(state, logits_fn, images, input_std=...)`; `fit` returns {}. The step is
  eps / std per channel (NHWC, last axis) so that eps is in [0, 1] pixel units, as OpenOOD.
  T = 1000, eps = 0.0014 (OpenOOD and the paper's ImageNet setting)."""
  name, needs = "odin", frozenset({"inputs"})
  defaults = {"temperature": 1000.0, "epsilon": 0.0014}
  single_entry = False

  @classmethod
  def validate(cls, hp):
    check_number(cls.name, hp, "temperature", lo=0, lo_open=True)
    check_number(cls.name, hp, "epsilon", lo=0)

  def score_inputs(self, state: dict, logits_fn: Callable, images,
                   *, input_std: Sequence[float] = IMAGENET_STD) -> jax.Array:
    """Scores [B] for NHWC float32 `images` (already normalised as the model expects);
    `logits_fn(images) -> logits` must be jittable and differentiable."""
    del state
    require(jnp.ndim(images) == 4,
            f"{self.name}: images must be NHWC, got shape {jnp.shape(images)}.")
    std = jnp.broadcast_to(jnp.asarray(input_std, jnp.float32), (jnp.shape(images)[-1],))
    fn = functools.partial(odin_scores, logits_fn, temperature=float(self.hparams["temperature"]),
                           epsilon=float(self.hparams["epsilon"]), single_entry=self.single_entry)
    if not isinstance(images, jax.core.Tracer):   # inside the caller's jit it is traced as is
      fn = jax.jit(fn)
    return fn(images, std)

  def score(self, state, outputs):
    raise ValueError(f"{self.name} perturbs the input images: use det.score_inputs(state, "
                     "logits_fn, images) during extraction; score(state, outputs) cannot "
                     "compute it.")

  def _score(self, state, features, logits):
    raise ValueError(f"{self.name}: use score_inputs.")


class IODIN(ODIN):
  """i-ODIN (OpenOOD v1.5's iodin postprocessor): ODIN whose step moves only each image's one
  input entry of largest |grad_x L| (the first in NCHW order on ties); T = 1000, eps = 0.0014
  (OpenOOD's config; its APS sweeps T in {1, 10, 100, 1000}, eps in {0.0014, 0.0028})."""
  name, single_entry = "iodin", True


class GradNorm(Detector):
  """GradNorm (Huang et al.), closed form of OpenOOD's |dL/dW|_1 with L = sum_c -log p_c:
  s = |h|_1 * sum_c |C p_c - 1| (bias gradient excluded; the paper's KL(u || p) form differs by
  the constant 1/C)."""
  name, needs = "gradnorm", frozenset({"features", "logits"})

  def _score(self, state, features, logits):
    z = fc(logits)
    p = jax.nn.softmax(z, axis=-1)
    return jnp.sum(jnp.abs(fc(features)), -1) * jnp.sum(jnp.abs(z.shape[-1] * p - 1.0), -1)


# ----------------------------------------------------------------------------- AdaSCALE

def _topk_sum(order_by, values, k: int):
  """sum of `values` at the k largest entries of `order_by` per row (lax.top_k's ties)."""
  if k <= 0:
    return jnp.zeros(values.shape[:1], values.dtype)
  _, idx = jax.lax.top_k(order_by, k)
  return jnp.sum(jnp.take_along_axis(values, idx, axis=1), -1)


def adascale_stats(predict_fn: Callable, images, step, *, k1: float, k2: float, lmbda: float,
                   o: float):
  """Q' = sum_{top-k1 of h} relu(h~) + lmbda sum_{top-k2 of h} |h - h~| per image, where
  h~ = features of x~ = x + step sign(g) [g among the round-down(o N) smallest |g|],
  g = d z_yhat / dx (N = H W C entries per image; k1, k2 in percent of D, rounded down)."""
  x = jnp.asarray(images, jnp.float32)

  def top_logit(x):
    z, h = predict_fn(x)
    yhat = jax.lax.stop_gradient(jnp.argmax(z, -1))
    return jnp.sum(jnp.take_along_axis(z.astype(jnp.float32), yhat[:, None], 1)), h

  g, h = jax.grad(top_logit, has_aux=True)(x)
  b = x.shape[0]
  flat = jnp.abs(g).reshape(b, -1)
  n_pix = int(flat.shape[1] * o)
  mask = jnp.zeros(flat.shape, bool)
  if n_pix > 0:
    _, idx = jax.lax.top_k(-flat, n_pix)
    mask = mask.at[jnp.arange(b)[:, None], idx].set(True)
  x_tilde = x + jnp.sign(g) * mask.reshape(x.shape) * step
  _, h_tilde = predict_fn(x_tilde)
  h, h_tilde = fc(h), fc(h_tilde)
  d = h.shape[-1]
  return (_topk_sum(h, jax.nn.relu(h_tilde), int(d * k1 / 100))
          + lmbda * _topk_sum(h, jnp.abs(h - h_tilde), int(d * k2 / 100)))


class _AdaSCALE(Detector):
  """AdaSCALE (Regmi et al. arXiv 2503.08023; OpenOOD's adascale postprocessor): SCALE with a
  per-image percentile. During extraction (on the fit set too: `fit_inputs`), `score_inputs`
  gives each image's statistic Q' (`adascale_stats`; `step` 0.5 is in ImageNet-normalised input
  units, as OpenOOD, converted to the model's by IMAGENET_STD / input_std); `fit` keeps the fit
  set's Q' (the empirical CDF F); `score` reads Q' from `Outputs.extras["stat"]`:
  p = p_min + (1 - F(Q')) (p_max - p_min), k = D - round(D p / 100), r = sum relu(h) /
  sum of its k largest entries; AdaSCALE-A: LSE(W^T (h e^r) + b), AdaSCALE-L: LSE(r^2 (W^T h + b)).
  OpenOOD v1.5 defaults: p = [75, 85] (its ResNet-50 sweep best: [80, 85]), k1 = 5, k2 = 1,
  lmbda = 10, o = 0.05."""
  needs = frozenset({"inputs", "features", "head"})
  fit_needs = frozenset({"features"})
  fit_inputs = True
  defaults = {"p_min": 75.0, "p_max": 85.0, "k1": 5.0, "k2": 1.0, "lmbda": 10.0, "o": 0.05,
              "step": 0.5}
  score_only = frozenset({"p_min", "p_max"})
  logit_scaling = False

  @classmethod
  def validate(cls, hp):
    require(0 < hp["p_min"] <= hp["p_max"] < 100, f"{cls.name}: need 0 < p_min <= p_max < 100.")
    for k in ("k1", "k2"):
      require(0 < hp[k] <= 100, f"{cls.name}: {k} must be in (0, 100] (percent of D).")
    require(0 <= hp["lmbda"] < np.inf, f"{cls.name}: lmbda must be a finite number >= 0.")
    require(0 <= hp["o"] <= 1, f"{cls.name}: o must be in [0, 1] (fraction of input entries).")
    require(0 <= hp["step"] < np.inf, f"{cls.name}: step must be a finite number >= 0.")

  def score_inputs(self, state: dict, predict_fn: Callable, images,
                   *, input_std: Sequence[float] = IMAGENET_STD) -> dict:
    """{"stat": Q' [B]} for NHWC float32 `images` (normalised as the model expects);
    `predict_fn(images) -> (logits, features)` must be jittable and differentiable."""
    del state
    require(jnp.ndim(images) == 4,
            f"{self.name}: images must be NHWC, got shape {jnp.shape(images)}.")
    c = jnp.shape(images)[-1]
    ref = np.broadcast_to(np.asarray(IMAGENET_STD, np.float64), (c,)) if c == 3 else \
        np.full((c,), np.mean(IMAGENET_STD))
    step = float(self.hparams["step"]) * ref / np.broadcast_to(
        np.asarray(input_std, np.float64), (c,))
    hp = self.hparams
    fn = functools.partial(adascale_stats, predict_fn, k1=float(hp["k1"]), k2=float(hp["k2"]),
                           lmbda=float(hp["lmbda"]), o=float(hp["o"]))
    if not isinstance(images, jax.core.Tracer):
      fn = jax.jit(fn)
    return {"stat": fn(images, jnp.asarray(step, jnp.float32))}

  def _fit(self, train, head):
    parts = []
    for _, chunk in stats.chunks(train):
      require(chunk.extras is not None and "stat" in chunk.extras,
              f"{self.name} fits on the fit set's statistics: pass Outputs(..., extras={{'stat': "
              f"det.score_inputs(...)['stat']}}) (the pipeline does).")
      parts.append(np.asarray(chunk.extras["stat"], np.float64))
    require(parts and sum(len(p) for p in parts) > 0, f"{self.name}: the fit set is empty.")
    return {**head_state(head), "ecdf": jnp.asarray(np.sort(np.concatenate(parts)), cdtype())}

  def _score_args(self, state, outputs):
    require(outputs.extras is not None and "stat" in outputs.extras,
            f"{self.name} needs Outputs.extras['stat'] from score_inputs during extraction.")
    return outputs.features, outputs.extras["stat"]

  def _score(self, state, features, stat):
    hp = self.hparams
    ecdf = state["ecdf"]
    frac = jnp.searchsorted(ecdf, fc(stat), side="right") / ecdf.shape[0]
    p = hp["p_min"] + (1.0 - frac) * (hp["p_max"] - hp["p_min"])
    h = fc(features)
    d = h.shape[-1]
    k = d - jnp.round(d * p / 100.0).astype(jnp.int32)
    x = jax.nn.relu(h)
    csum = jnp.cumsum(-jnp.sort(-x, axis=-1), axis=-1)
    top = jnp.take_along_axis(csum, jnp.clip(k - 1, 0, d - 1)[:, None], 1)[:, 0]
    r = jnp.sum(x, -1) / jnp.where(k > 0, top, 0.0)
    w, b = fc(state["w"]), fc(state["b"])
    if self.logit_scaling:
      z = (matmul(h, w) + b) * (r * r)[:, None]
    else:
      z = matmul(h * jnp.exp(r)[:, None], w) + b
    return jax.nn.logsumexp(z, axis=-1)


class AdaSCALEA(_AdaSCALE):
  __doc__ = _AdaSCALE.__doc__
  name = "adascale_a"


class AdaSCALEL(_AdaSCALE):
  __doc__ = _AdaSCALE.__doc__
  name, logit_scaling = "adascale_l", True
