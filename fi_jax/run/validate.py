"""Config validation before any compute: every bad value is one clear error within seconds.

`validate_config(config, workdir)` is called by main.py (before JAX is initialised) and by
`fi_jax.run.run`; it raises one ValueError naming the field, the value and what is allowed, so
that a typo costs seconds rather than an extraction (or, worse, a plausible number: a negative
number of training steps used to give AUROC 50.00).
"""
from __future__ import annotations

import math
import numbers
import os
import tempfile
from typing import Any

from fi_jax import detectors, pipeline

NONFINITE_MODES = pipeline.NONFINITE_MODES


def _get(config, path: str, default: Any = None) -> Any:
  node = config
  for part in path.split("."):
    if node is None or not hasattr(node, "get"):
      return default
    node = node.get(part, None)
  return default if node is None else node


def _int(config, path: str, minimum: int, *, default: Any = None) -> None:
  v = _get(config, path, default)
  if v is None:
    return
  if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < minimum:
    raise ValueError(f"config.{path} must be an integer >= {minimum}, got {v!r}.")


def _float(config, path: str, lo: float, hi: float, *, open_lo: bool = True,
           open_hi: bool = True) -> None:
  v = _get(config, path)
  if v is None:
    return
  ok = (isinstance(v, numbers.Real) and not isinstance(v, bool) and math.isfinite(v)
        and (v > lo if open_lo else v >= lo) and (v < hi if open_hi else v <= hi))
  if not ok:
    interval = f"{'(' if open_lo else '['}{lo}, {hi}{')' if open_hi else ']'}"
    raise ValueError(f"config.{path} must be a number in {interval}, got {v!r}.")


def _workdir(workdir: str) -> None:
  """The workdir exists (or can be created) and can be written to."""
  if not workdir:
    raise ValueError("--workdir must not be empty.")
  try:
    os.makedirs(workdir, exist_ok=True)
  except OSError as e:
    raise ValueError(f"--workdir={workdir!r} cannot be created ({e.strerror or e}); "
                     "choose a folder path whose parents are folders you can write to.") from None
  if not os.path.isdir(workdir):
    raise ValueError(f"--workdir={workdir!r} is not a folder.")
  try:
    with tempfile.TemporaryFile(dir=workdir):
      pass
  except OSError as e:
    raise ValueError(f"--workdir={workdir!r} is not writable ({e.strerror or e}).") from None


def validate_config(config, workdir: str) -> None:
  """Raises one ValueError for the first invalid value of `config` (or the workdir).

  Checks: sizes (batch_size, cache_shard_size >= 1, metrics.n_bootstrap >= 0), metrics.tpr in
  (0, 1), train.steps / train.batch_size >= 1 and train.lr > 0 when training, `nonfinite`,
  every detector's name and hyper-parameter values (via
  `fi_jax.detectors.build`, which runs each detector's `validate`), and that the workdir can
  be created and written to (last: it is the only check that touches the disk).
  """
  _int(config, "batch_size", 1, default=None)
  _int(config, "cache_shard_size", 1)
  metrics = _get(config, "metrics")
  if metrics is not None:
    _float(config, "metrics.tpr", 0.0, 1.0)
    _int(config, "metrics.n_bootstrap", 0)
  if _get(config, "train"):
    _int(config, "train.steps", 1, default=0)
    _int(config, "train.batch_size", 1)
    _float(config, "train.lr", 0.0, math.inf)
  mode = _get(config, "nonfinite", "error")
  if mode not in NONFINITE_MODES:
    raise ValueError(f"config.nonfinite must be one of {list(NONFINITE_MODES)}, got {mode!r}.")
  names = _get(config, "detectors", ())
  if isinstance(names, str) or not all(isinstance(n, str) for n in names):
    raise ValueError(f"config.detectors must be a tuple of detector names, got {names!r}.")
  hparams = _get(config, "detector_hparams", {})
  hparams = hparams.to_dict() if hasattr(hparams, "to_dict") else dict(hparams)
  detectors.build_suite(names, _get(config, "detector_preset") or None, hparams)
  _workdir(workdir)
