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
import contextlib
import logging
import math
import numbers
import threading
from typing import Callable, ClassVar, Iterator, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from fi_jax.common import compile_options
from fi_jax.common.outputs import Head, Outputs
from fi_jax.detectors import shared

HIGHEST = jax.lax.Precision.HIGHEST
# Rows per call of a detector's jitted score: every set is scored in blocks of this many rows
# (the last one padded), so one compilation serves every set size. None scores a set in one call.
# Inside `scoring_rows(n)` (fi_jax.pipeline.score_sets) blocks are smaller when every set is.
SCORE_BLOCK: Optional[int] = 4096
MIN_SCORE_BLOCK = 64
_scoring = threading.local()
NEEDS = frozenset({"features", "logits", "labels", "head", "inputs", "layers"})


def score_block() -> Optional[int]:
  """Rows per scoring block in this thread: `SCORE_BLOCK`, or less inside `scoring_rows`."""
  rows = getattr(_scoring, "rows", None)
  return SCORE_BLOCK if rows is None or SCORE_BLOCK is None else min(rows, SCORE_BLOCK)


@contextlib.contextmanager
def scoring_rows(n: int) -> Iterator[None]:
  """Within it (this thread), detectors score in blocks of the smallest power of two >= n rows
  (at least MIN_SCORE_BLOCK) where that is below SCORE_BLOCK: when every set of a run has at
  most n rows, each is padded to that, not to SCORE_BLOCK (the demo's sets of a few hundred
  rows: 512, 8x less work per score), and every set still shares one compilation."""
  prev = getattr(_scoring, "rows", None)
  _scoring.rows = max(MIN_SCORE_BLOCK, 1 << max(0, int(n) - 1).bit_length())
  try:
    yield
  finally:
    _scoring.rows = prev


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


# l2_normalize as one program, for the eager calls of a fit (three eager ops compile three)
l2_normalize_jit = jax.jit(l2_normalize, static_argnames=("axis", "eps"))


def _bin_guess(x, lo, scale, nb: int):
  """floor((x - lo) scale) clipped to [0, nb - 1] (NaN -> 0): non-decreasing in x."""
  t = (x - lo) * scale
  t = jnp.where(t >= 0, t, 0.0)
  return jnp.minimum(t, nb - 1).astype(jnp.int32)


def _guess_within_one_bin(edges, lo, scale):
  """True when, for every x, _bin_guess is within one of searchsorted(edges, x, "right") - 1
  (-1 below edges[0], nb from edges[-1] on). The guess is non-decreasing in x, so checking
  it at both ends of every non-empty bin (and just below / at the outer edges) covers all x.
  False only for nearly degenerate edges (a range of a few ulps of its magnitude)."""
  nb = edges.shape[0] - 1
  i = jnp.arange(nb)
  first = _bin_guess(edges[:-1], lo, scale, nb)
  last = _bin_guess(jnp.nextafter(edges[1:], -jnp.inf), lo, scale, nb)
  bins_ok = (edges[:-1] >= edges[1:]) | ((first >= i - 1) & (last <= i + 1))
  below = _bin_guess(jnp.nextafter(edges[0], -jnp.inf), lo, scale, nb) == 0
  above = _bin_guess(edges[-1], lo, scale, nb) == nb - 1
  return jnp.all(bins_ok) & below & above & jnp.all(jnp.isfinite(edges))


def bin_index(x, edges) -> jax.Array:
  """searchsorted(edges, x, side="right") - 1 where that is in [0, nb), else nb (outside
  [edges[0], edges[-1]) and NaN). For equal-width edges (np.linspace) the bin is guessed
  arithmetically and moved by at most one against the exact edges: the same index as the
  binary search, bit for bit, at the cost of two gathers (the binary search is kept for edges
  where the guess could be off by more)."""
  edges = jnp.asarray(edges)
  nb = edges.shape[0] - 1
  lo, scale = edges[0], nb / (edges[-1] - edges[0])

  def guessed(x):
    k = _bin_guess(x, lo, scale, nb)
    k = k - (x < edges[k]) + (x >= edges[k + 1])
    return jnp.where((k >= 0) & (k < nb) & ~jnp.isnan(x), k, nb)

  def searched(x):
    k = jnp.searchsorted(edges, x, side="right") - 1
    return jnp.where((k >= 0) & (k < nb), k, nb)
  return jax.lax.cond(_guess_within_one_bin(edges, lo, scale), guessed, searched, x)


# ----------------------------------------------------------------------------- contract

def selection_jit(fn: Callable, **jit_kwargs) -> Callable:
  """fn jitted (with jax.jit's keyword arguments) under `compile_options.selection_step()`,
  built at its first call: the options read the backend, and building a detector or importing
  a module must not start it (the run layer sets XLA's flags after the config's detectors are
  built; a backend started before keeps XLA's defaults for the whole run)."""
  jitted = None

  def call(*args, **kwargs):
    nonlocal jitted
    if jitted is None:
      jitted = jax.jit(fn, compiler_options=compile_options.selection_step(), **jit_kwargs)
    return jitted(*args, **kwargs)
  return call


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
  # What the pipeline reads from a detector (declared here with defaults; the stages upstream
  # read these attributes and nothing else):
  # - "inputs" in `needs`: the detector scores the images during extraction (`score_inputs`);
  #   with `fit_inputs` it also runs on the fit set and fits on what it computed there
  #   (AdaSCALE: `predict_fn` instead of `logits_fn`), else the fit set skips it;
  # - "layers" in `needs`: the reducers (`fi_jax.extract.layer_columns.REDUCERS`) whose
  #   `layer/<reducer>/<block>` columns every set must carry;
  # - `model_families`: the fi_jax model families (`config.model_name`) it works on; None: any;
  # - `text_bank`: the two-tower text bank (fi_jax.models.zero_shot_head.TEXT_BANKS) it reads
  #   from `Head.texts`; the runner has the model embed it once per run; None: none.
  fit_inputs: ClassVar[bool] = False
  layer_reducers: ClassVar[tuple[str, ...]] = ()
  model_families: ClassVar[Optional[tuple[str, ...]]] = None
  text_bank: ClassVar[Optional[str]] = None

  # the jitted score is compiled with `compile_options.selection_step()` (its long reductions
  # are counts and extrema, exact in any order; CFOOD's search)
  selection_program: ClassVar[bool] = False

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
      Detector._jit_cache[key] = (selection_jit(self._score) if self.selection_program
                                  else jax.jit(self._score))
    self._score_jit = Detector._jit_cache[key]

  @classmethod
  def validate(cls, hp: dict) -> None:
    """Raises ValueError on an invalid hyper-parameter value (override per detector)."""

  def __repr__(self) -> str:
    return f"{type(self).__name__}({self.name!r}, {self.hparams})"

  def score_inputs(self, state: dict, fn: Callable, images, *,
                   input_std: Sequence[float] = (0.5, 0.5, 0.5)):
    """Detectors with "inputs" in `needs` score the images inside the extraction step: `fn` is
    the model's `logits_fn(images)` (or, with `fit_inputs`, `predict_fn(images) -> (logits,
    features)`), `images` NHWC as the model expects them, `input_std` the per-channel std of
    that input in [0, 1] pixel units. Returns [B] scores, or a dict of per-image arrays that
    `fit`/`score` read back (`fit_inputs`). The others have nothing to compute here."""
    del state, fn, images, input_std
    raise TypeError(f"{self.name} does not score images ('inputs' is not in its needs); the "
                    "pipeline calls score_inputs only for detectors that declare it.")

  # -- fitting
  def fit(self, train, head: Optional[Head] = None, *, nonfinite: str = "error") -> dict:
    """Fits the detector on an `Outputs` or an iterable of `Outputs` batches; returns a dict
    of arrays ({} when there is nothing to fit).

    The fit set is validated first (docs/detectors.md#input-checks): the fields the detector
    reads must be present, 2-D (labels 1-D) with one row count, agree with the head's shape,
    and labels must be integers in [0, C) or -1 (unknown). A row with a NaN or inf in a field
    the detector reads is an error (`nonfinite="error"`, the default) or is left out of the
    fit with a warning (`nonfinite="drop"`)."""
    if nonfinite not in NONFINITE:
      raise ValueError(f"{self.name}: nonfinite must be one of {list(NONFINITE)}, got "
                       f"{nonfinite!r}.")
    if "head" in self.needs or isinstance(head, Head):
      check_head(head, self.name)
    hdims = head_dims(head)
    checked = None
    if self.fit_needs:
      fields = tuple(f for f in ("features", "logits", "labels") if f in self.fit_needs)
      checked = shared.memo((train,), ("fit_set", fields, hdims, nonfinite),
                            lambda: FitSet(train, fields, hdims, nonfinite, self.name))
      checked.owner = self.name
    fit_hp = tuple(sorted((k, v) for k, v in self.hparams.items() if k not in self.score_only))

    def compute():
      state = self._fit(None if checked is None else checked.data, head)
      dims = hdims if checked is None else checked.dims
      if dims == (None, None) or not isinstance(state, dict):
        return state
      return {**state, DIMS_KEY: np.asarray([-1 if v is None else v for v in dims], np.int32)}
    return shared.memo((train, head), ("fit", self.fit_family or type(self), fit_hp, nonfinite),
                       compute)

  def _fit(self, train, head) -> dict:
    del train, head
    return {}

  # -- scoring
  def score(self, state: dict, outputs: Outputs) -> jax.Array:
    """Scores [N] (higher = more ID), float64 when x64 is on. `outputs` must match the shapes
    the detector was fitted on (feature dimension, number of classes).

    The rows go through `_score_args` and the jitted `_score` in blocks of `score_block()` rows
    (`SCORE_BLOCK`, less inside `scoring_rows`; the last block padded by repeating its last
    row; padded scores are dropped), so every
    set reuses one compilation. Scores are row-wise, so this gives the same values as one call
    on the whole set (up to the last bit: XLA may vectorise a different row count differently).
    """
    check_outputs(outputs, self.needs - {"labels", "head", "inputs"}, self.name)
    core = check_state(state, outputs, self.needs, self.name)
    return shared.memo((state, outputs), ("score", type(self), self._hp_key),
                       lambda: self._score_blocked(core, outputs))

  def _score_blocked(self, state, outputs: Outputs) -> jax.Array:
    n, blocks = score_blocks(outputs, score_block())
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


# ----------------------------------------------------------------------------- input checks

NONFINITE = ("error", "drop")
# state key written by `Detector.fit`: int32 [2] = (feature dimension D, number of classes C)
# the detector was fitted for (-1 = unknown); checked by `score`, never passed to `_score`
DIMS_KEY = "input_dims"


def _shape(x) -> tuple:
  return tuple(np.shape(x))


def head_dims(head) -> tuple[Optional[int], Optional[int]]:
  """(D, C) of a Head, (None, None) for anything else."""
  if not isinstance(head, Head):
    return None, None
  return int(np.shape(head.w)[0]), int(np.shape(head.w)[1])


@jax.jit
def _all_finite(x) -> jax.Array:
  return jnp.all(jnp.isfinite(x))


@jax.jit
def _row_finite(x) -> jax.Array:
  return jnp.all(jnp.isfinite(x), axis=tuple(range(1, x.ndim)))


@jax.jit
def _min_max(y) -> jax.Array:
  return jnp.stack([jnp.min(y), jnp.max(y)])


def all_finite(x) -> bool:
  """True if every entry of x is finite: one reduction (one device->host sync for a jax array),
  memoised per array inside `detectors.shared()`."""
  if not isinstance(x, jax.Array):
    x = np.asarray(x)
    return bool(np.isfinite(x).all()) if x.dtype.kind in "fc" else True
  return bool(shared.memo((x,), ("all_finite",), lambda: bool(_all_finite(x))))


def _row_mask(x) -> np.ndarray:
  """[N] bool: rows of x with only finite entries."""
  if not isinstance(x, jax.Array):
    x = np.asarray(x)
    return np.isfinite(x).reshape(len(x), -1).all(1) if x.dtype.kind in "fc" else np.ones(
        len(x), bool)
  return np.asarray(_row_finite(x))


def _label_range(y) -> tuple[int, int]:
  if not isinstance(y, jax.Array):
    y = np.asarray(y)
    return int(y.min()), int(y.max())
  lo, hi = np.asarray(shared.memo((y,), ("label_range",), lambda: _min_max(y)))
  return int(lo), int(hi)


def _take_rows(x, keep: np.ndarray):
  if x is None:
    return None
  return jnp.asarray(x)[jnp.asarray(keep)] if isinstance(x, jax.Array) else np.asarray(x)[keep]


class FitSet:
  """A validated fit set: `data` is what `_fit` reads (the same object when nothing had to be
  dropped; for an iterable, batches checked as they stream), `dims` the (D, C) it implies."""

  def __init__(self, train, fields: tuple[str, ...], hdims: tuple, nonfinite: str, owner: str):
    self.fields, self.hdims, self.nonfinite, self.owner = fields, hdims, nonfinite, owner
    self.dims = hdims
    if isinstance(train, Outputs):
      self.data = self.check(train, 0)
      return
    try:
      it = iter(train)
    except TypeError:
      raise ValueError(f"{owner}: the fit set must be an Outputs or an iterable of Outputs, got "
                       f"{type(train).__name__}.") from None
    if it is train:                                 # one-shot iterator: stays one-shot
      self.data = self._stream(it)
    else:
      self.data = _Reiterable(lambda: self._stream(iter(train)))

  def _stream(self, it):
    start = 0
    for b in it:
      n = _rows(b)
      yield self.check(b, start)
      start += n

  def check(self, b, start: int) -> Outputs:
    """Batch `b` (rows start.. of the fit set) validated; non-finite rows dropped in 'drop'
    mode (a new Outputs; the same object when nothing is dropped)."""
    name, fields = self.owner, self.fields
    if not isinstance(b, Outputs):
      raise ValueError(f"{name}: the fit set's batches must be Outputs, got {type(b).__name__}.")
    for f in fields:
      if getattr(b, f) is None:
        raise ValueError(f"{name} needs Outputs.{f} in the fit set, which is None.")
    n = None
    for f in fields:
      x = getattr(b, f)
      want = 1 if f == "labels" else 2
      if np.ndim(x) != want:
        raise ValueError(f"{name}: fit Outputs.{f} must be {want}-D "
                         f"{'[N]' if want == 1 else '[N, ...]'}, got shape {_shape(x)}.")
      if n is not None and _shape(x)[0] != n:
        raise ValueError(f"{name}: fit Outputs.{f} has {_shape(x)[0]} rows but "
                         f"Outputs.{fields[0]} has {n} (shapes {_shape(x)} and "
                         f"{_shape(getattr(b, fields[0]))}).")
      n = _shape(x)[0]
    hd, hc = self.hdims
    if "features" in fields:
      d = _shape(b.features)[1]
      if hd is not None and d != hd:
        raise ValueError(f"{name}: fit Outputs.features has shape {_shape(b.features)} but "
                         f"Head.w has shape ({hd}, {hc}): the feature dimensions differ "
                         f"({d} vs {hd}); pass the head of the model that made the features.")
      self.dims = (d, self.dims[1])
    if "logits" in fields:
      c = _shape(b.logits)[1]
      if hc is not None and c != hc:
        raise ValueError(f"{name}: fit Outputs.logits has shape {_shape(b.logits)} but "
                         f"Head.w has shape ({hd}, {hc}): the numbers of classes differ "
                         f"({c} vs {hc}).")
      self.dims = (self.dims[0], c)
    if "labels" in fields:
      num_classes = hc
      if num_classes is None and b.logits is not None and np.ndim(b.logits) == 2:
        num_classes = _shape(b.logits)[1]
      check_labels(b.labels, num_classes, name)
    floats = [f for f in fields if f != "labels"]
    if all(all_finite(getattr(b, f)) for f in floats):
      return b
    keep = np.ones(n, bool)
    for f in floats:
      keep &= _row_mask(getattr(b, f))
    bad, first = int(n - keep.sum()), start + int(np.argmin(keep))
    what = " / ".join(f"Outputs.{f}" for f in floats)
    rows = f"rows {start}..{start + n - 1} of the fit set"
    if self.nonfinite == "error":
      raise ValueError(f"{name}: {bad} of {n} fit rows ({rows}) have NaN or inf in {what} "
                       f"(first: row {first}); fix the model's outputs, or fit with "
                       f"nonfinite='drop' to leave those rows out.")
    if bad == n:
      raise ValueError(f"{name}: all {n} fit rows ({rows}) have NaN or inf in {what}; nothing "
                       f"is left to fit on.")
    logging.warning("%s: leaving out %d of %d fit rows (%s) with NaN or inf in %s (first: "
                    "row %d).", name, bad, n, rows, what, first)
    extras = None if b.extras is None else {k: _take_rows(v, keep) for k, v in b.extras.items()}
    return Outputs(*(_take_rows(getattr(b, f), keep) for f in ("features", "logits", "labels")),
                   extras)


class _Reiterable:
  """An iterable that gives a fresh stream on every `iter` (so it stays re-iterable)."""

  def __init__(self, make):
    self._make = make

  def __iter__(self):
    return self._make()


def _rows(b) -> int:
  if isinstance(b, Outputs):
    for x in (b.features, b.logits, b.labels):
      if x is not None and np.ndim(x) >= 1:
        return int(np.shape(x)[0])
  return 0


def check_labels(labels, num_classes: Optional[int], name: str) -> None:
  """Labels must be integers in [0, num_classes) or -1 (unknown): one min/max reduction."""
  dt = np.dtype(getattr(labels, "dtype", np.asarray(labels).dtype))
  if dt.kind not in "iu":
    raise ValueError(f"{name}: Outputs.labels must be integers (class index, -1 = unknown), got "
                     f"dtype {dt}; convert them (e.g. labels.astype(np.int64)) after checking "
                     f"they are whole numbers.")
  if not np.size(labels):
    return
  lo, hi = _label_range(labels)
  if lo < -1 or (num_classes is not None and hi >= num_classes):
    c = "C" if num_classes is None else str(num_classes)
    hint = (" (1-based labels? subtract 1)" if num_classes is not None and hi == num_classes
            and lo >= 0 else "")
    raise ValueError(f"{name}: Outputs.labels must be in [0, {c}) or -1 (unknown), got values "
                     f"in [{lo}, {hi}]{hint}.")


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
    extras = {k: np.asarray(v) for k, v in (outputs.extras or {}).items()}
    return [Outputs(*(part(x, start) for x in host),
                    {k: part(v, start) for k, v in extras.items()} if outputs.extras else None)
            for start in range(0, n, block)]
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


def check_state(state, outputs: Outputs, needs, name: str) -> dict:
  """The state without its `DIMS_KEY` entry, after checking that the score inputs have the
  feature dimension and number of classes the detector was fitted for."""
  if not isinstance(state, dict):
    raise ValueError(f"{name}: state must be the dict of arrays fit() returned, got "
                     f"{type(state).__name__}.")
  if DIMS_KEY not in state:
    return state
  d, c = (int(v) for v in np.asarray(state[DIMS_KEY]))
  for field, axis_name, want in (("features", "feature dimension", d),
                                 ("logits", "number of classes", c)):
    x = getattr(outputs, field)
    if field in needs and want >= 0 and x is not None and _shape(x)[1] != want:
      raise ValueError(f"{name}: Outputs.{field} has shape {_shape(x)} but the detector was "
                       f"fitted for {want} ({axis_name}; fit / head shape [N, {want}]); "
                       f"score outputs of the model it was fitted on.")
  return {k: v for k, v in state.items() if k != DIMS_KEY}


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


# ----------------------------------------------------------------------------- hyper-parameters

def _num_range(lo, hi, lo_open, hi_open, integer) -> str:
  kind = "an integer" if integer else "a finite number"
  if lo is not None and hi is not None:
    return f"{kind} in {'(' if lo_open else '['}{lo}, {hi}{')' if hi_open else ']'}"
  if lo is not None:
    return f"{kind} {'>' if lo_open else '>='} {lo}"
  if hi is not None:
    return f"{kind} {'<' if hi_open else '<='} {hi}"
  return kind


def check_number(det: str, hp: dict, key: str, *, lo=None, hi=None, lo_open: bool = False,
                 hi_open: bool = False, integer: bool = False, none_ok: bool = False) -> None:
  """hp[key] must be a real number (an integral value if `integer`; None if `none_ok`) in the
  range; else ValueError naming the detector, the hyper-parameter, the value and the range."""
  v = hp[key]
  if v is None and none_ok:
    return
  ok = (isinstance(v, numbers.Real) and not isinstance(v, (bool, np.bool_))
        and math.isfinite(float(v)))
  if ok and integer:
    ok = float(v).is_integer()
  if ok and lo is not None:
    ok = v > lo if lo_open else v >= lo
  if ok and hi is not None:
    ok = v < hi if hi_open else v <= hi
  if not ok:
    valid = _num_range(lo, hi, lo_open, hi_open, integer)
    raise ValueError(f"{det}: hyper-parameter {key}={v!r} is out of range; valid: "
                     f"{'None or ' if none_ok else ''}{valid}.")


def check_choice(det: str, hp: dict, key: str, choices: tuple) -> None:
  """hp[key] must be one of the strings `choices`."""
  v = hp[key]
  if not any(isinstance(v, str) and v == c for c in choices):
    raise ValueError(f"{det}: hyper-parameter {key}={v!r} is invalid; valid: "
                     f"{' or '.join(repr(c) for c in choices)}.")


def check_bool(det: str, hp: dict, key: str) -> None:
  if not isinstance(hp[key], (bool, np.bool_)):
    raise ValueError(f"{det}: hyper-parameter {key}={hp[key]!r} is invalid; valid: True or False.")


def check_percentile(det: str, hp: dict, key: str = "percentile") -> None:
  check_number(det, hp, key, lo=0, hi=100, lo_open=True, hi_open=True)


def check_seed(det: str, hp: dict, key: str = "seed") -> None:
  check_number(det, hp, key, integer=True)
