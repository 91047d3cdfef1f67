"""Layer scores: detectors that read intermediate blocks, not only the penultimate features
(docs/detectors.md#layer-scores): mdsens (multi-layer Mahalanobis), gram (Gram-matrix
deviations).

They declare "layers" in `needs` and the reducers they read in `layer_reducers`; the pipeline
then extracts every block's reduced output (fi_jax/extract/layer_columns.py) as the `layer/<reducer>/<block>`
columns of each set and hands them over as `Outputs.extras` (features and logits as usual).
A block is chosen with the hyper-parameter `layers`: "all", "first", "last" or a comma-separated
list of block names ("stem,stage1"; names as fi_jax.extract.layer_columns gives them).
"""
from __future__ import annotations

import functools
import re
from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from fi_jax.detectors import distance, shared, stats
from fi_jax.detectors.core import (
  Detector,
  Outputs,
  all_finite,
  cdtype,
  check_bool,
  check_choice,
  check_number,
  check_seed,
  fc,
  log_max_softmax,
)
from fi_jax.extract import layer_columns as layer_lib

_LAYER_NAMES = re.compile(r"[A-Za-z0-9_]+(,[A-Za-z0-9_]+)*")


class _Layers(Detector):
  """Shared by the layer detectors: block selection and the columns of `Outputs.extras`."""
  reducer: ClassVar[str] = ""          # the reducer whose columns the detector reads

  @classmethod
  def _check_layers(cls, hp: dict) -> None:
    v = hp["layers"]
    if not (isinstance(v, str) and _LAYER_NAMES.fullmatch(v)):
      raise ValueError(f"{cls.name}: hyper-parameter layers={v!r} is invalid; valid: 'all', "
                       f"'first', 'last' or comma-separated block names such as 'stem,stage1'.")

  def _columns(self, outputs: Outputs, where: str) -> dict:
    """{block: array} of the detector's reducer in `outputs.extras`, in forward order."""
    cols = layer_lib.block_columns(outputs.extras, self.reducer)
    if not cols:
      have = sorted(outputs.extras or {}) or "none"
      raise ValueError(
          f"{self.name} needs the layer activations '{layer_lib.PREFIX}/{self.reducer}/<block>' "
          f"in {where} Outputs.extras (extras: {have}): the set has no per-block outputs (the "
          f"model's predict function gave none, or the set was read from feature files). "
          f"Layer detectors support the families {', '.join(layer_lib.FAMILIES)}.")
    return cols

  def _select(self, cols: dict) -> list[str]:
    names, v = list(cols), self.hparams["layers"]
    if v == "all":
      return names
    if v in ("first", "last"):
      return [names[0] if v == "first" else names[-1]]
    want = v.split(",")
    missing = [b for b in want if b not in cols]
    if missing:
      raise ValueError(f"{self.name}: layers={v!r} names block(s) {missing} the model does not "
                       f"have; its blocks: {names}.")
    return layer_lib.order(want)

  def _score_args(self, state, outputs):
    cols = self._columns(outputs, "the scored")
    missing = [b for b in state["blocks"] if b not in cols]
    if missing:
      raise ValueError(f"{self.name}: the scored Outputs lack the block(s) {missing} the "
                       f"detector was fitted on (they have {list(cols)}).")
    return {b: cols[b] for b in state["blocks"]}, (
        outputs.logits if "logits" in self.needs else None)


def _fit_batches(train):
  """The fit set as something that can be iterated more than once (a one-shot iterator is
  read into a list)."""
  return train if stats.is_reiterable(train) else list(train)


class _Column:
  """The fit set with one layer column as `features` (so that stats.moments streams it)."""

  def __init__(self, train, col: str, owner: str):
    self.train, self.col, self.owner = train, col, owner

  def __iter__(self):
    for b in stats.chunks(self.train):
      x = b[1].extras[self.col]
      if not all_finite(x):
        raise ValueError(f"{self.owner}: the fit set's {self.col} has NaN or inf entries; check "
                         f"the model's outputs.")
      yield Outputs(x, b[1].logits, b[1].labels)


# ----------------------------------------------------------------------------- mdsens

class MDSEnsemble(_Layers):
  """Multi-layer Mahalanobis (Lee et al. 2018; OpenOOD's MDSEns) without input noise: per
  block l, mu_lc = class means of the block's mean-pooled activations (true labels), tied
  covariance Sigma_l = (1/N) sum_i (a_li - mu_l,y_i)(a_li - mu_l,y_i)^T, P_l = pinvh(Sigma_l)
  (float64); s = sum_l max_c -0.5 (a_l - mu_lc)^T P_l (a_l - mu_lc), i.e. OpenOOD's
  combination with all weights 1. Rows with label -1 are ignored.

  `layers`: "all" (default: every block, equal weights; Lee et al. weight the layers by a
  logistic regression on OOD validation data, which a post-hoc benchmark does not have) or, as
  OpenOOD's ImageNet config (`feature_type_list: [mean]`, `alpha_list: [1]`), "first" (the
  first block: ResNet's stem after the max pool). The input perturbation (noise 0.0014) needs
  one gradient step per block and image and is not part of this detector.
  """
  name, needs = "mdsens", frozenset({"layers", "labels"})
  fit_needs = frozenset({"logits", "labels"})
  layer_reducers, reducer = ("mean",), "mean"
  defaults = {"layers": "all"}
  presets = {"openood": {"layers": "first"}}

  @classmethod
  def validate(cls, hp):
    cls._check_layers(hp)

  def _fit(self, train, head):
    c, train = distance._peek_classes(train, head)
    first, train = stats.peek(train)
    train = _fit_batches(train)
    cols = self._columns(first, "the fit set's")
    blocks = {}
    for b in self._select(cols):
      col = layer_lib.column(self.reducer, b)
      view = shared.memo((train,), ("layer_column", col), lambda col=col: _Column(train, col,
                                                                                  self.name))
      st = stats.moments(view, num_classes=c, group="label", scatter=True)
      # one object per block inside detectors.shared() (MDS's class Gaussian of that column)
      blocks[b] = dict(shared.memo((view,), ("class_gaussian", c), lambda st=st: (
          distance._gaussian_state(*stats.class_means(st),
                                   stats.within_class_cov(st)))))
    return {"blocks": blocks}

  def _score(self, state, acts, logits):
    del logits
    total = jnp.zeros((), cdtype())
    for b, g in state["blocks"].items():
      total = total - 0.5 * distance._min_maha(acts[b], g)
    return total


# ----------------------------------------------------------------------------- gram

@jax.jit
def _deviation(g, mins, maxs):
  """Sum over powers and channels of relu(min - g)/|min + 1e-6| + relu(g - max)/|max + 1e-6|
  (Sastry & Oore's delta) of rows g [N, P, D] against their class's mins / maxs [N, P, D]."""
  g, mins, maxs = fc(g), fc(mins), fc(maxs)
  dev = (jax.nn.relu(mins - g) / jnp.abs(mins + 1e-6)
         + jax.nn.relu(g - maxs) / jnp.abs(maxs + 1e-6))
  return jnp.sum(dev, axis=(1, 2))


@functools.partial(jax.jit, static_argnames=("num_classes",))
def _class_min_max(g, cid, *, num_classes: int):
  """Per-class min and max of rows g [N, P, D] (class ids cid [N], -1 = not counted) and
  the per-class row counts."""
  seg = jnp.where(cid >= 0, cid, num_classes)
  mn = jax.ops.segment_min(g, seg, num_classes + 1)[:num_classes]
  mx = jax.ops.segment_max(g, seg, num_classes + 1)[:num_classes]
  cnt = jax.ops.segment_sum(jnp.ones_like(cid), seg, num_classes + 1)[:num_classes]
  return mn, mx, cnt


@jax.jit
def _confidence(logits):
  return jnp.exp(log_max_softmax(logits))


class Gram(_Layers):
  """Gram-matrix deviations (Sastry & Oore, ICML 2020; OpenOOD's GRAM). Per block l and
  power p, g_lp = the Gram row statistic of the block's activations (fi_jax.extract.layer_columns "gram":
  sign(r)|r|^(1/p), r = row sums of (F^p)(F^p)^T). Fit: per class c (`fit_classes`: the
  predicted class as the paper, or the true label as OpenOOD), the elementwise min / max of
  g_lp over the fit rows not held out; a held-out `val_fraction` of the fit rows (seeded,
  independent of batching) gives the per-block normaliser n_l = mean held-out deviation
  (divided by the row's max softmax if `norm_conf`, as the paper's validation deviations)
  + 1e-7. Score, with y = argmax logits and conf = max softmax:
    s = -(sum_l sum_{p <= powers} delta(g_lp; min_lpy, max_lpy) / n_l) / conf,
    delta = sum_d relu(min - g)/|min + 1e-6| + relu(g - max)/|max + 1e-6|.
  A class without fit rows uses the min / max over all classes.

  Defaults (paper): powers 1..10, fit_classes="pred", norm_conf=True; preset "openood":
  powers 1..5, fit_classes="label", norm_conf=False (OpenOOD's gram.yml and postprocessor).
  Both use every block fi_jax.extract.layer_columns gives (the official code records every conv / ReLU
  output, OpenOOD hooks every nn.Conv2d and nn.ReLU module: finer than per block).
  """
  name, needs = "gram", frozenset({"layers", "logits"})
  fit_needs = frozenset({"logits"})
  layer_reducers, reducer = ("gram",), "gram"
  defaults = {"powers": 10, "fit_classes": "pred", "norm_conf": True, "val_fraction": 0.1,
              "seed": 0, "layers": "all"}
  presets = {"openood": {"powers": 5, "fit_classes": "label", "norm_conf": False}}

  @classmethod
  def validate(cls, hp):
    check_number(cls.name, hp, "powers", lo=1, hi=layer_lib.GRAM_POWERS, integer=True)
    check_choice(cls.name, hp, "fit_classes", ("pred", "label"))
    check_bool(cls.name, hp, "norm_conf")
    check_number(cls.name, hp, "val_fraction", lo=0, hi=1, lo_open=True, hi_open=True)
    check_seed(cls.name, hp)
    cls._check_layers(hp)

  def _fit(self, train, head):
    del head
    hp = self.hparams
    p, frac, seed = int(hp["powers"]), float(hp["val_fraction"]), int(hp["seed"])
    first, train = stats.peek(train)
    blocks = self._select(self._columns(first, "the fit set's"))
    cols = {b: layer_lib.column(self.reducer, b) for b in blocks}
    c = int(np.shape(first.logits)[1])
    mins, counts = {}, None
    held = {b: [] for b in blocks}
    held_cls, held_conf = [], []
    n_rows = 0
    for start, chunk in stats.chunks(train):
      n = stats.num_rows(chunk)
      n_rows += n
      cid = np.asarray(stats.group_ids(chunk.labels, chunk.logits,
                                       "pred" if hp["fit_classes"] == "pred" else "label", c))
      val = stats.bernoulli_mask(seed, start, n, frac)
      fit_cid = np.where(val, -1, cid)
      keep = val & (cid >= 0)
      held_cls.append(cid[keep])
      held_conf.append(np.asarray(_confidence(chunk.logits), np.float64)[keep])
      for b, col in cols.items():
        g = chunk.extras[col]
        if not all_finite(g):
          raise ValueError(f"{self.name}: the fit set's {col} has NaN or inf entries; check the "
                           f"model's outputs.")
        g = jnp.asarray(g)[:, :p]
        mn, mx, cnt = (np.asarray(a) for a in _class_min_max(g, jnp.asarray(fit_cid),
                                                             num_classes=c))
        if b in mins:
          mins[b] = (np.minimum(mins[b][0], mn), np.maximum(mins[b][1], mx))
        else:
          mins[b] = (mn, mx)
        if b == blocks[0]:                  # the same rows for every block
          counts = cnt if counts is None else counts + cnt
        held[b].append(np.asarray(g)[keep])
    have = counts > 0
    if not have.any():
      raise ValueError(f"{self.name}: no fit row is left for the class min / max (labels all -1 "
                       f"or every row held out).")
    held_cls, held_conf = np.concatenate(held_cls), np.concatenate(held_conf)
    if not len(held_cls):
      raise ValueError(f"{self.name}: no fit row was held out for the normalisation "
                       f"(val_fraction={frac} of {n_rows} rows); use a larger fit set or a "
                       f"larger val_fraction.")
    state = {}
    for b in blocks:
      mn, mx = mins[b]
      mn = np.where(have[:, None, None], mn, mn[have].min(0)[None])
      mx = np.where(have[:, None, None], mx, mx[have].max(0)[None])
      g = np.concatenate(held[b])
      dev = np.asarray(_deviation(g, mn[held_cls], mx[held_cls]), np.float64)
      if hp["norm_conf"]:
        dev = dev / held_conf
      state[b] = {"mins": jnp.asarray(mn), "maxs": jnp.asarray(mx),
                  "norm": jnp.asarray(dev.mean() + 1e-7, cdtype())}
    return {"blocks": state}

  def _score(self, state, acts, logits):
    p = int(self.hparams["powers"])
    pred = jnp.argmax(logits, axis=-1)
    dev = jnp.zeros((), cdtype())
    for b, st in state["blocks"].items():
      dev = dev + _deviation(acts[b][:, :p], st["mins"][pred], st["maxs"][pred]) / st["norm"]
    return -dev / _confidence(logits)
