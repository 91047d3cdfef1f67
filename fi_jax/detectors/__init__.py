"""Stage 4, detectors: post-hoc OOD detectors, jitted, equal to their references
(docs/detectors.md).

    det = detectors.build("vim", preset="ninco")          # or preset="openood" / None, **hparams
    state = det.fit(fit_outputs, head)                    # Outputs or an iterable of Outputs
    scores = det.score(state, test_outputs)               # [N], higher = more ID
    odin = detectors.build("odin"); odin.score_inputs({}, logits_fn, images)
    ada = detectors.build("adascale_a"); stat = ada.score_inputs({}, predict_fn, images)["stat"]
    rf = detectors.build("rankfeat"); rf.score_inputs({}, logits_fn, images)   # Flax model

Presets select each source's ImageNet defaults: 'ninco' (NINCO repo; detectors NINCO does not
evaluate keep their paper default), 'openood' (OpenOOD v1.5 defaults); None = the paper default
(each detector's `defaults`, documented in its docstring). `state` is a dict of arrays
(`save_state` / `load_state`: npz, '/'-joined keys, no pickle).

Families: logit.py (msp, maxlogit, energy, tempscale, gen, klm), activation.py (react, vra,
ash_p, ash_b, ash_s, scale, dice, bats, optfs, line), distance.py (mds, rmds, mds_pp, rmds_pp,
ssd, residual, vim, neco, she, cosine, relative_cosine, fdbd, nci, ora), knn.py (knn, nnguide,
relation, combood, cfood, grood), openmax.py (openmax), gradient.py (odin, iodin, gradnorm,
adascale_a, adascale_l), rankfeat.py (rankfeat: ResNet, BiT ResNetV2 and ViT-encoder models),
vision_language.py (mcm), weiper.py (weiper, weiper_kld), intermediate.py (mdsens, gram:
intermediate blocks, fi_jax/extract/layer_columns.py); stats.py holds the streaming statistics every fit uses.

A suite: `with detectors.shared(dets): ...` makes detectors that repeat work on the same
arrays do it once (class moments, KNN's search for every k, identical preset pairs); the
scores are identical to unshared calls (shared.py).

The contract (core.py `Detector`) declares everything the pipeline reads from a detector:
`needs`, `fit_needs`, `fit_inputs`, `layer_reducers`, `model_families`, `score_inputs`;
`selection.py` is the KNN order-statistic selection the metrics share.

May import: fi_jax.common, fi_jax.data, fi_jax.models, fi_jax.extract.
"""
from __future__ import annotations

import os
from typing import Mapping, Optional, Sequence

import jax.numpy as jnp
import numpy as np

from fi_jax.detectors import (
  activation,
  distance,
  gradient,
  intermediate,
  knn,
  logit,
  openmax,
  rankfeat,
  vision_language,
  weiper,
)
from fi_jax.detectors.core import Detector, Head, Outputs, scoring_rows
from fi_jax.detectors.shared import active as shared_active
from fi_jax.detectors.shared import shared
from fi_jax.detectors.stats import num_rows

PRESETS = ("ninco", "openood")

_CLASSES = (
    logit.MSP, logit.MaxLogit, logit.Energy, logit.TempScale, gradient.ODIN, logit.GEN,
    logit.KLMatching, activation.ReAct, activation.ASHP, activation.ASHB, activation.ASHS,
    activation.SCALE, distance.SHE, activation.DICE, distance.MDS, distance.RMDS,
    distance.Residual, distance.ViM, knn.KNN, knn.NNGuide, distance.FDBD, distance.NCI,
    gradient.GradNorm, distance.Cosine, distance.RelativeCosine, vision_language.MCM,
    vision_language.NegLabel, vision_language.CSP, vision_language.GLMCM,
    weiper.WeiPerKLD, weiper.WeiPer, activation.OptFS, activation.BATS, activation.LINe,
    distance.MDSpp, distance.RMDSpp, distance.SSD, distance.NECO, knn.Relation, openmax.OpenMax,
    activation.VRA, gradient.AdaSCALEA, gradient.AdaSCALEL, knn.CombOOD, rankfeat.RankFeat,
    gradient.IODIN, intermediate.MDSEnsemble, intermediate.Gram,
    distance.ORA, knn.CFOOD, knn.GROOD,
)
REGISTRY: dict[str, type[Detector]] = {c.name: c for c in _CLASSES}


def names() -> list[str]:
  """Canonical lower-case detector names."""
  return list(REGISTRY)


def hparams_of(name: str, preset: Optional[str] = None) -> dict:
  """The full hyper-parameter dict `build(name, preset=preset)` would use."""
  cls = _lookup(name)
  _check_preset(preset)
  hp = dict(cls.defaults)
  if preset is not None:
    hp.update(cls.presets.get(preset, {}))
  return hp


def build(name: str, *, preset: Optional[str] = None, **hparams) -> Detector:
  """A detector with its defaults (paper for preset=None, else the preset's), overridden by
  `hparams`. Unknown name, preset or hyper-parameter -> ValueError listing the valid ones."""
  cls = _lookup(name)
  hp = hparams_of(name, preset)
  unknown = sorted(set(hparams) - set(hp))
  if unknown:
    raise ValueError(f"Unknown hyper-parameter(s) {unknown} for detector {name!r}; valid: "
                     f"{sorted(hp) or 'none'}.")
  hp.update(hparams)
  return cls(**hp)


def build_suite(names: Sequence[str], preset: Optional[str] = None,
                hparams: Optional[Mapping[str, dict]] = None) -> dict[str, Detector]:
  """{name: detector} for every name, each with `preset` and its own `hparams[name]`
  overrides; fails fast (ValueError) on an unknown name, preset or hyper-parameter."""
  hparams = dict(hparams or {})
  return {name: build(name, preset=preset or None, **hparams.get(name, {})) for name in names}


def _lookup(name: str) -> type[Detector]:
  if name not in REGISTRY:
    raise ValueError(f"Unknown detector {name!r}; valid: {names()}.")
  return REGISTRY[name]


def _check_preset(preset) -> None:
  if preset is not None and preset not in PRESETS:
    raise ValueError(f"Unknown preset {preset!r}; valid: {list(PRESETS)} or None.")


# ----------------------------------------------------------------------------- state files

def _flatten(tree, prefix=""):
  for k, v in tree.items():
    if not isinstance(k, str) or "/" in k or not k:
      raise ValueError(f"State keys must be non-empty strings without '/', got {k!r}.")
    if isinstance(v, dict):
      yield from _flatten(v, prefix + k + "/")
    else:
      yield prefix + k, np.asarray(v)


def save_state(path: str, state: dict) -> None:
  """Writes a (nested) dict of arrays to an .npz file; keys joined with '/'."""
  if not isinstance(state, dict):
    raise ValueError(f"A detector state is a dict of arrays, got {type(state).__name__}.")
  flat = dict(_flatten(state))
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  with open(path, "wb") as f:
    np.savez(f, **flat)


def load_state(path: str) -> dict:
  """Reads a state written by `save_state` (np.load with allow_pickle=False)."""
  if not os.path.exists(path):
    raise FileNotFoundError(f"No detector state at {path!r}.")
  out: dict = {}
  with np.load(path, allow_pickle=False) as z:
    for key in z.files:
      node = out
      *parents, leaf = key.split("/")
      for p in parents:
        node = node.setdefault(p, {})
      node[leaf] = jnp.asarray(z[key])
  return out


__all__ = ["Detector", "Head", "Outputs", "PRESETS", "REGISTRY", "build", "build_suite", "hparams_of",
           "load_state", "names", "num_rows", "save_state", "scoring_rows", "shared",
           "shared_active"]
