"""The detector contract (Outputs, Head, Detector) and the numerics every family shares.

Conventions (docs/detectors.md#conventions):
* every score is oriented higher = more in-distribution (distances and KLs are negated);
* scores are float64 when `jax_enable_x64` is on (float32 otherwise), whatever the input dtype;
* scores that are a max softmax probability (MSP, TempScale, ODIN, relative cosine, MCM) are
  returned as its *logarithm*, computed as -log1p(sum_{c != argmax} exp(z_c - z_max)): the same
  ranking as the probability, but no float saturation at exactly 1.0 (docs/detectors.md#pitfalls);
* matmuls with the model's float32 features/weights use `Precision.HIGHEST` (no TF32 on GPUs);
  covariances, eigh, pseudo-inverses and quadratic forms use the float64 compute dtype.
"""
from __future__ import annotations

import abc
from typing import ClassVar, Optional

import jax
import jax.numpy as jnp
import numpy as np

from fi_jax.detectors import shared
from fi_jax.outputs import Head, Outputs  # re-exported: detectors.core.Head / .Outputs

HIGHEST = jax.lax.Precision.HIGHEST
# Rows per call of a detector's jitted score: every set is scored in blocks of this many rows
# (the last one padded), so one compilation serves every set size. None scores a set in one call.
SCORE_BLOCK: Optional[int] = 4096
NEEDS = frozenset({"features", "logits", "labels", "head", "inputs"})


# ----------------------------------------------------------------------------- numerics

def cdtype():
  """The compute dtype: float64 when x64 is enabled, else float32 (read at call time)."""
  return jnp.float64 if jax.config.jax_enable_x64 else jnp.float32


def fc(x) -> jax.Array:
  """`x` in the compute dtype."""
  return jnp.asarray(x).astype(cdtype())


def matmul(a, b) -> jax.Array:
  """a @ b at full precision, in the promoted dtype of the operands."""
  return jnp.matmul(a, b, precision=HIGHEST)


def head_logits(h, w, b) -> jax.Array:
  """Logits of a linear head for (possibly reshaped) float32 features, in the compute dtype."""
  return fc(matmul(jnp.asarray(h, jnp.float32), jnp.asarray(w, jnp.float32))) + fc(b)


def energy(z, temperature: float = 1.0) -> jax.Array:
  """T * logsumexp(z / T) in the compute dtype."""
  z = fc(z)
  return temperature * jax.nn.logsumexp(z / temperature, axis=-1)


def _rest_mass(z):
  """(z_max, sum_{c != argmax} exp(z_c - z_max)); exactly one arg-max entry is left out."""
  zmax = jnp.max(z, axis=-1, keepdims=True)
  top = jax.nn.one_hot(jnp.argmax(z, axis=-1), z.shape[-1], dtype=bool)
  rest = jnp.sum(jnp.where(top, 0.0, jnp.exp(z - zmax)), axis=-1, keepdims=True)
  return zmax, rest


def log_softmax(z) -> jax.Array:
  """log softmax with an accurate arg-max entry (-log1p(rest) instead of 0 - log(1 + rest))."""
  z = fc(z)
  zmax, rest = _rest_mass(z)
  return (z - zmax) - jnp.log1p(rest)


def log_max_softmax(z) -> jax.Array:
  """log max_c softmax(z)_c = -log1p(sum_{c != argmax} exp(z_c - z_max)); never rounds to 0
  before the true value is below the dtype's tiniest normal number."""
  _, rest = _rest_mass(fc(z))
  return -jnp.log1p(rest[..., 0])


def l2_normalize(x, axis: int = -1, eps: float = 1e-12) -> jax.Array:
  n = jnp.linalg.norm(x, axis=axis, keepdims=True)
  return x / jnp.maximum(n, eps)


# ----------------------------------------------------------------------------- contract

class Detector(abc.ABC):
  """Base class: hyper-parameters are static (they stay on the detector), `state` is a dict of
  arrays. Subclasses set `name`, `needs`, `defaults` (the paper default = preset None),
  `presets` (overrides per preset) and implement `_fit` (optional) and `_score`."""

  name: ClassVar[str] = ""
  needs: ClassVar[frozenset] = frozenset()
  defaults: ClassVar[dict] = {}
  presets: ClassVar[dict] = {}
  fit_needs: ClassVar[frozenset] = frozenset()   # what `fit` reads from the fit set
  # for sharing fits inside `detectors.shared()`: hyper-parameters that do not change the fit,
  # and the class whose fit this one equals (None: its own)
  score_only: ClassVar[frozenset] = frozenset()
  fit_family: ClassVar[Optional[type]] = None

  _jit_cache: ClassVar[dict] = {}

  def __init__(self, **hparams):
    self.hparams = dict(hparams)
    self.validate(self.hparams)
    # detectors of one class with equal hyper-parameters share one jitted (compiled) score
    key = (type(self), tuple(sorted(self.hparams.items())))
    self._hp_key = key[1]
    try:
      hash(key)
    except TypeError:
      raise ValueError(f"{self.name}: hyper-parameters must be scalars (int, float, bool, str, "
                       f"None); got {self.hparams}.") from None
    if key not in Detector._jit_cache:
      Detector._jit_cache[key] = jax.jit(self._score)
    self._score_jit = Detector._jit_cache[key]

  @classmethod
  def validate(cls, hp: dict) -> None:
    """Raises ValueError on an invalid hyper-parameter value (override per detector)."""

  def __repr__(self) -> str:
    return f"{type(self).__name__}({self.name!r}, {self.hparams})"

  # -- fitting
  def fit(self, train, head: Optional[Head] = None) -> dict:
    """Fits the detector on an `Outputs` or an iterable of `Outputs` batches; returns a dict
    of arrays ({} when there is nothing to fit)."""
    if "head" in self.needs:
      check_head(head, self.name)
    if not self.fit_needs:
      train = None
    fit_hp = tuple(sorted((k, v) for k, v in self.hparams.items() if k not in self.score_only))
    return shared.memo((train, head), ("fit", self.fit_family or type(self), fit_hp),
                       lambda: self._fit(train, head))

  def _fit(self, train, head) -> dict:
    del train, head
    return {}

  # -- scoring
  def score(self, state: dict, outputs: Outputs) -> jax.Array:
    """Scores [N] (higher = more ID), float64 when x64 is on.

    The rows go through `_score_args` and the jitted `_score` in blocks of `SCORE_BLOCK` rows
    (the last block padded by repeating its last row; padded scores are dropped), so every
    set reuses one compilation. Scores are row-wise, so this gives the same values as one call
    on the whole set.
    """
    check_outputs(outputs, self.needs - {"labels", "head", "inputs"}, self.name)
    return shared.memo((state, outputs), ("score", type(self), self._hp_key),
                       lambda: self._score_blocked(state, outputs))

  def _score_blocked(self, state, outputs: Outputs) -> jax.Array:
    n, blocks = score_blocks(outputs, SCORE_BLOCK)
    if blocks is None:
      return self._score_jit(state, *self._score_args(state, outputs))
    parts = [np.asarray(self._score_jit(state, *self._score_args(state, b))) for b in blocks]
    return jax.device_put(np.concatenate(parts)[:n])

  def _score_args(self, state, outputs) -> tuple:
    """The two arrays `_score` receives after the state: (features, logits) by default (None
    where not needed); a detector with a costly shared intermediate computes it here, outside
    the jitted score, so that `detectors.shared()` can memoise it."""
    del state
    return (outputs.features if "features" in self.needs else None,
            outputs.logits if "logits" in self.needs else None)

  @abc.abstractmethod
  def _score(self, state, features, logits):
    """The jitted score of (state, features or None, logits or None)."""


def score_blocks(outputs: Outputs, block: Optional[int]) -> tuple[int, Optional[list]]:
  """(N, [Outputs of `block` rows each]) covering the N rows of `outputs`, the last one padded
  by repeating its last row; (N, None) when `block` is None or there are no rows. Inside
  `detectors.shared()` the blocks of one `Outputs` are made once, so that work memoised by
  array identity (class Gaussians, neighbour searches) is still shared between detectors."""
  n = next(np.shape(x)[0] for x in (outputs.features, outputs.logits, outputs.labels)
           if x is not None)
  if not block or not n:
    return n, None

  def make():
    host = [None if x is None else np.asarray(x)
            for x in (outputs.features, outputs.logits, outputs.labels)]

    def part(x, start):
      if x is None:
        return None
      x = x[start:start + block]
      pad = block - len(x)
      # device_put, not jnp.asarray: no per-shape staging compilation
      return jax.device_put(np.concatenate([x, np.repeat(x[-1:], pad, axis=0)]) if pad else x)
    return [Outputs(*(part(x, start) for x in host)) for start in range(0, n, block)]
  return n, shared.memo((outputs,), ("score_blocks", block), make)


def check_outputs(outputs, needs, name: str) -> None:
  if not isinstance(outputs, Outputs):
    raise ValueError(f"{name}: expected fi_jax.detectors.Outputs, got {type(outputs).__name__}.")
  n = None
  for field in ("features", "logits"):
    x = getattr(outputs, field)
    if field in needs and x is None:
      raise ValueError(f"{name} needs Outputs.{field}, which is None.")
    if x is not None:
      if np.ndim(x) != 2:
        raise ValueError(f"{name}: Outputs.{field} must be 2-D [N, ...], got shape {np.shape(x)}.")
      if n is not None and np.shape(x)[0] != n:
        raise ValueError(f"{name}: Outputs.features and .logits have different N "
                         f"({n} vs {np.shape(x)[0]}).")
      n = np.shape(x)[0]
  if outputs.labels is not None and np.shape(outputs.labels) != (n,):
    raise ValueError(f"{name}: Outputs.labels must have shape [{n}], got {np.shape(outputs.labels)}.")


def check_head(head, name: str, dim: Optional[int] = None) -> None:
  if not isinstance(head, Head):
    raise ValueError(f"{name} needs the classifier head: pass fit(train, head=Head(w, b)).")
  if np.ndim(head.w) != 2 or np.shape(head.b) != (np.shape(head.w)[1],):
    raise ValueError(f"{name}: Head.w must be [D, C] and Head.b [C]; got {np.shape(head.w)} and "
                     f"{np.shape(head.b)}.")
  if dim is not None and np.shape(head.w)[0] != dim:
    raise ValueError(f"{name}: Head.w has {np.shape(head.w)[0]} input features but the features "
                     f"have {dim}.")


def head_state(head: Head) -> dict:
  """The head as state arrays (float32, as the model computes)."""
  return {"w": jnp.asarray(head.w, jnp.float32), "b": jnp.asarray(head.b, jnp.float32)}


def require(cond: bool, msg: str) -> None:
  if not cond:
    raise ValueError(msg)
