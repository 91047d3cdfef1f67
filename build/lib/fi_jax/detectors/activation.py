"""Feature-shaping energy scores: ReAct, ASH-P/-B/-S, SCALE, DICE
(docs/detectors.md#feature-shaping-energy-scores).

Each reshapes the penultimate features (or the head's weights) and returns the energy
logsumexp(W h' + b) of the recomputed logits (head matmul in float32 at HIGHEST precision, the
logsumexp in the compute dtype). They assume non-negative (post-ReLU) features
(docs/detectors.md#pitfalls); on
signed features the formulas are applied unchanged (ASH-S/SCALE's exp(s1/s2) can overflow).
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from fi_jax.detectors import shared, stats
from fi_jax.detectors.core import Detector, cdtype, fc, head_logits, head_state, require


def _energy_of(h, state):
  return jax.nn.logsumexp(head_logits(h, state["w"], state["b"]), axis=-1)


def _check_percentile(name, hp):
  require(0 <= hp["percentile"] <= 100, f"{name}: percentile must be in [0, 100].")


class ReAct(Detector):
  """Energy of the logits of min(h, c) (Sun et al.); c = the `percentile`-th percentile
  (numpy 'linear') of *all entries* of the fit features. OpenOOD: percentile 90 of val5k
  activations; NINCO: quantile 0.99 of train. The percentile is exact over the fit features
  when the fit set has <= `max_rows` rows, else over all entries of a seeded uniform subset of
  `max_rows` rows (stats.RowSample; docs/detectors.md#react)."""
  name, needs = "react", frozenset({"features", "head"})
  fit_needs = frozenset({"features"})
  defaults = {"percentile": 90.0, "max_rows": 50_000, "seed": 0}
  presets = {"ninco": {"percentile": 99.0}, "openood": {"percentile": 90.0}}

  @classmethod
  def validate(cls, hp):
    _check_percentile("react", hp)
    require(int(hp["max_rows"]) >= 1, "react: max_rows must be >= 1.")

  def _fit(self, train, head):
    def sample_rows():
      sample = stats.RowSample(self.hparams["max_rows"], self.hparams["seed"], ("features",))
      for start, chunk in stats.chunks(train):
        require(chunk.features is not None, "react needs fit Outputs with features.")
        sample.add(start, chunk)
      return sample.result()["features"].reshape(-1)
    # the same rows for every percentile: shared inside detectors.shared()
    feats = shared.memo((train,), ("react_rows", self.hparams["max_rows"], self.hparams["seed"]),
                        sample_rows)
    clip = np.percentile(feats, self.hparams["percentile"])
    return {**head_state(head), "clip": jnp.asarray(clip, jnp.float32)}

  def _score(self, state, features, logits):
    return _energy_of(jnp.minimum(jnp.asarray(features, jnp.float32), state["clip"]), state)


def _ash_keep(d: int, percentile: float) -> int:
  """Entries kept per sample: D - round(D * p / 100) (numpy's round-half-even, as OpenOOD)."""
  return d - int(np.round(d * percentile / 100.0))


@functools.partial(jax.jit, static_argnames=("k",))
def _prune(h, k: int):
  """(mask of the k largest entries per row (lax.top_k's choice among ties), s1 = sum h,
  s2 = sum of the kept entries)."""
  h = jnp.asarray(h, jnp.float32)
  _, idx = jax.lax.top_k(h, k)
  mask = jnp.zeros(h.shape, bool).at[jnp.arange(h.shape[0])[:, None], idx].set(True)
  s1 = jnp.sum(fc(h), -1)
  s2 = jnp.sum(jnp.where(mask, fc(h), 0.0), -1)
  return mask, s1, s2


def _pruned_args(det, outputs) -> tuple:
  """(features, (mask, s1, s2)); the pruning is shared inside `detectors.shared()` by every
  detector that keeps the same k of the same features."""
  d = np.shape(outputs.features)[-1]
  k = _ash_keep(d, det.hparams["percentile"])
  if k <= 0:
    raise ValueError(f"{det.name}: percentile {det.hparams['percentile']} keeps no feature of "
                     f"{d}.")
  return outputs.features, shared.memo((outputs.features,), ("ash_prune", k),
                                       lambda: _prune(outputs.features, k))


class _ASH(Detector):
  """Activation shaping (Djurisic et al.): keep the k = D - round(D p / 100) largest entries
  per sample (exactly k, by top-k index), then ASH-P: zero the rest; ASH-B: kept entries set to
  s1 / k; ASH-S: pruned vector times exp(s1 / s2). s1 = original sum, s2 = sum after pruning.
  OpenOOD ships ASH-B only, p = 90; p = 90 is the default of all three variants here."""
  needs = frozenset({"features", "head"})
  defaults = {"percentile": 90.0}
  mode = "p"

  @classmethod
  def validate(cls, hp):
    _check_percentile(cls.name, hp)

  def _fit(self, train, head):
    return head_state(head)

  def _score_args(self, state, outputs):
    return _pruned_args(self, outputs)

  def _score(self, state, features, pruned):
    mask, s1, s2 = pruned
    h = jnp.asarray(features, jnp.float32)
    k = _ash_keep(h.shape[-1], self.hparams["percentile"])
    if self.mode == "p":
      shaped = jnp.where(mask, h, 0.0)
    elif self.mode == "b":
      shaped = jnp.where(mask, (s1 / k)[:, None], 0.0)
    else:
      shaped = fc(jnp.where(mask, h, 0.0)) * jnp.exp(s1 / s2)[:, None]
    return _energy_of(shaped, state)


class ASHP(_ASH):
  name, mode = "ash_p", "p"


class ASHB(_ASH):
  name, mode = "ash_b", "b"


class ASHS(_ASH):
  name, mode = "ash_s", "s"


class SCALE(Detector):
  """SCALE (Xu et al. ICLR'24): energy of W (r h) + b with r = exp(s1 / s2) from ASH's top-k
  pruning (the *unpruned* h is scaled). p = 85 (OpenOOD default)."""
  name, needs = "scale", frozenset({"features", "head"})
  defaults = {"percentile": 85.0}

  @classmethod
  def validate(cls, hp):
    _check_percentile("scale", hp)

  def _fit(self, train, head):
    return head_state(head)

  def _score_args(self, state, outputs):
    return _pruned_args(self, outputs)

  def _score(self, state, features, pruned):
    _, s1, s2 = pruned
    h = jnp.asarray(features, jnp.float32)
    z = head_logits(h, state["w"], 0.0) * jnp.exp(s1 / s2)[:, None] + fc(state["b"])
    return jax.nn.logsumexp(z, axis=-1)


class DICE(Detector):
  """DICE (Sun & Li): m = mean fit feature; V[j, c] = w[j, c] m_j; tau = the p-th percentile
  of all D*C entries of V; w' = w * (V > tau); energy of h w' + b. OpenOOD: p = 90."""
  name, needs = "dice", frozenset({"features", "head"})
  fit_needs = frozenset({"features"})
  defaults = {"percentile": 90.0}

  @classmethod
  def validate(cls, hp):
    _check_percentile("dice", hp)

  def _fit(self, train, head):
    st = stats.moments(train)
    mean = st["sum"] / st["n"]
    w = np.asarray(head.w, np.float64)
    contrib = w * mean[:, None]
    tau = np.percentile(contrib.reshape(-1), self.hparams["percentile"])
    return {"w": jnp.asarray(np.where(contrib > tau, w, 0.0), jnp.float32),
            "b": jnp.asarray(head.b, jnp.float32)}

  def _score(self, state, features, logits):
    return _energy_of(features, state)
