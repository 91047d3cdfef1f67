"""Config validation before any compute: every bad value is one clear error within seconds.

`validate_config(config, workdir)` is called by main.py (before JAX is initialised) and by
`fi_jax.run.run`; it raises one ValueError naming the field, the value and what is allowed, so
that a typo costs seconds rather than an extraction (or, worse, a plausible number: a negative
number of training steps used to give AUROC 50.00). Nothing here starts JAX's backend: the
model's architecture is checked on its family's `Model(**config.model)` object (a dataclass),
never traced.
"""
from __future__ import annotations

import dataclasses
import math
import numbers
import os
import tempfile
from typing import Any, Mapping, Optional

import flax.linen as nn

from fi_jax import detectors, pipeline
from fi_jax.data import class_subsets
from fi_jax.run import model as run_model

NONFINITE_MODES = pipeline.NONFINITE_MODES
MAX_BATCH = 1 << 16           # images per global batch (65536: ~39 GB of 224 px float32 input)
MAX_SEED = (1 << 63) - 1      # jax.random.PRNGKey takes a seed up to int64's largest value
# Architecture sizes that must be positive integers wherever a model (or one of its towers)
# has them (a tuple: every entry); num_classes may be 0 (no head: a features-only model).
_POSITIVE = ("width", "hidden_size", "embed_dim", "depth", "depths", "num_heads", "mlp_dim",
             "patch_size", "widths", "group_widths", "dims")


def _get(config, path: str, default: Any = None) -> Any:
  node = config
  for part in path.split("."):
    if node is None or not hasattr(node, "get"):
      return default
    node = node.get(part, None)
  return default if node is None else node


def _int(config, path: str, minimum: int, *, default: Any = None,
         maximum: Optional[int] = None, why: str = "", why_max: str = "") -> None:
  """config.<path> is an integer in [minimum, maximum]; `why` (both bounds) and `why_max`
  (the maximum) say why in the error."""
  v = _get(config, path, default)
  if v is None:
    return
  if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < minimum:
    raise ValueError(f"config.{path} must be an integer >= {minimum}{why}, got {v!r}.")
  if maximum is not None and v > maximum:
    raise ValueError(f"config.{path} must be at most {maximum}{why or why_max}, got {v!r}.")


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


def _fields(node) -> Optional[dict]:
  """A model's (or tower's) fields: a Flax module's dataclass fields, or a tower's kwargs."""
  if isinstance(node, nn.Module):
    return {f.name: getattr(node, f.name) for f in dataclasses.fields(node)
            if f.name not in ("parent", "name")}
  if isinstance(node, Mapping):
    return dict(node)
  return None


def _tower(family: Any, kwargs: Mapping) -> Any:
  """The `Model(**kwargs)` of tower family `family` (its variant resolved), or the kwargs
  themselves when that family is not a module of fi_jax.models (e.g. the text towers)."""
  try:
    return run_model.model_module(family).Model(**dict(kwargs))
  except Exception:  # not a family fi_jax can build here: its given values are still checked
    return kwargs


def _architecture(node, where: str) -> None:
  """Sizes that must be positive integers, and attention widths that must split into equal
  heads (ViT-like: width % num_heads; Swin: every stage's embed_dim * 2**i % num_heads[i];
  RegNet: every stage's width % its group width), in `node` and its towers."""
  fields = _fields(node)
  if fields is None:
    return
  is_int = lambda x: isinstance(x, numbers.Integral) and not isinstance(x, bool)
  for key in _POSITIVE:
    v = fields.get(key)
    values = tuple(v) if isinstance(v, (tuple, list)) else (v,)
    if any(is_int(x) and x < 1 for x in values):
      raise ValueError(f"{where}.{key} must be a positive integer (or a tuple of them), got "
                       f"{v!r}.")
  classes = fields.get("num_classes")
  if is_int(classes) and classes < 0:
    raise ValueError(f"{where}.num_classes must be an integer >= 0 (0: no classifier head), "
                     f"got {classes!r}.")
  width = fields.get("width", fields.get("hidden_size"))
  heads = fields.get("num_heads")
  if is_int(width) and is_int(heads) and width % heads:
    raise ValueError(f"{where}: the width {width} does not split into num_heads={heads} equal "
                     f"attention heads (width % num_heads = {width % heads}); choose a "
                     f"num_heads that divides the width (config.model's or its variant's).")
  embed = fields.get("embed_dim")
  if is_int(embed) and isinstance(heads, (tuple, list)):
    for i, h in enumerate(heads):
      if is_int(h) and (embed << i) % h:
        raise ValueError(f"{where}: stage {i}'s width embed_dim * 2**{i} = {embed << i} does "
                         f"not split into num_heads[{i}]={h} equal attention heads; choose "
                         "num_heads that divide every stage's width.")
  widths, groups = fields.get("widths"), fields.get("group_widths")
  if (isinstance(widths, (tuple, list)) and isinstance(groups, (tuple, list))
      and fields.get("bottleneck_multiplier", 1.0) == 1.0):
    for i, (w, g) in enumerate(zip(widths, groups)):
      if is_int(w) and is_int(g) and w % g:
        raise ValueError(f"{where}: stage {i}'s width {w} does not split into groups of "
                         f"group_widths[{i}]={g}; choose group widths that divide the widths.")
  for key, v in fields.items():
    if isinstance(v, Mapping) and isinstance(fields.get(f"{key}_model"), str):
      v = _tower(fields[f"{key}_model"], v)   # a two-tower model's image / text tower
    if isinstance(v, (nn.Module, Mapping)):
      _architecture(v, f"{where}.{key}")


def _model(config) -> None:
  """The model family `config.model_name` builds `Model(**config.model)` (its variant and
  keywords resolved), and that architecture is consistent (`_architecture`). Skipped when
  every set is read from feature files (no model)."""
  specs = [_get(config, "id_fit", {}), _get(config, "id_test", {})]
  specs += list((_get(config, "ood", {}) or {}).values())
  specs += list((_get(config, "csid", {}) or {}).values())
  name = _get(config, "model_name", "")
  if not name or all(dict(s).get("source") == "features" for s in specs):
    return
  mod = run_model.model_module(name)
  model_cfg = _get(config, "model", {})
  model_cfg = model_cfg.to_dict() if hasattr(model_cfg, "to_dict") else dict(model_cfg)
  try:
    model = mod.Model(**model_cfg)
  except (TypeError, ValueError) as e:
    raise ValueError(f"config.model does not build a {name} model: "
                     f"{' '.join(str(e).split())}") from None
  _architecture(model, "config.model")


def _csid(csid) -> None:
  """config.csid: {name: set spec} of covariate-shifted ID sets, each spec's `class_subset`
  (if any) a known subset name or a list of label indices, its `restrict_logits` (if any) a
  bool that is True only with a `class_subset`."""
  if csid is None:
    return
  if not isinstance(csid, Mapping) and not hasattr(csid, "items"):
    raise ValueError(f"config.csid must map set names to set specs, got {csid!r}.")
  for name, spec in csid.items():
    if not hasattr(spec, "get"):
      raise ValueError(f"config.csid.{name} must be a set spec (a dict with a source), got "
                       f"{spec!r}.")
    subset = spec.get("class_subset")
    if isinstance(subset, str):
      if subset not in class_subsets.SUBSETS:
        raise ValueError(f"config.csid.{name}.class_subset {subset!r} is unknown; known: "
                         f"{sorted(class_subsets.SUBSETS)}, or a list of label indices.")
    elif subset is not None:
      try:
        class_subsets.subset_indices(subset)
      except (TypeError, ValueError) as e:
        raise ValueError(f"config.csid.{name}.class_subset: {e}") from None
    restrict = spec.get("restrict_logits")
    if restrict is not None and not isinstance(restrict, bool):
      raise ValueError(f"config.csid.{name}.restrict_logits must be True or False, got "
                       f"{restrict!r}.")
    if restrict and subset is None:
      raise ValueError(f"config.csid.{name}.restrict_logits is True but the set names no "
                       "class_subset: set class_subset (a subset name or label indices) or "
                       "drop restrict_logits.")


def validate_config(config, workdir: str) -> None:
  """Raises one ValueError for the first invalid value of `config` (or the workdir).

  Checks: sizes (batch_size and train.batch_size in [1, MAX_BATCH], cache_shard_size >= 1,
  metrics.n_bootstrap >= 0), the seed in [0, MAX_SEED], metrics.tpr in (0, 1); when training
  train.steps >= 1, train.lr > 0, train.warmup_steps and train.augment_shift >= 0,
  train.weight_decay >= 0 and train.label_smoothing in [0, 1); `nonfinite`; at least one
  detector and one OOD set; every detector's name and hyper-parameter values (via
  `fi_jax.detectors.build`, which runs each detector's `validate`); the model's architecture
  (`_model`: the family builds it, sizes are positive, widths split into their heads); and
  that the workdir can be created and written to (last: it is the only check that touches
  the disk).
  """
  batch = " (a bigger global batch of images does not fit in memory)"
  _int(config, "batch_size", 1, default=None, maximum=MAX_BATCH, why_max=batch)
  _int(config, "cache_shard_size", 1)
  _int(config, "seed", 0, maximum=MAX_SEED,
       why=" (what jax.random.PRNGKey takes: 0 to 2**63 - 1)")
  metrics = _get(config, "metrics")
  if metrics is not None:
    _float(config, "metrics.tpr", 0.0, 1.0)
    _int(config, "metrics.n_bootstrap", 0)
  if _get(config, "train"):
    _int(config, "train.steps", 1, default=0)
    _int(config, "train.batch_size", 1, maximum=MAX_BATCH, why_max=batch)
    _float(config, "train.lr", 0.0, math.inf)
    _int(config, "train.warmup_steps", 0)
    _int(config, "train.augment_shift", 0, why=" (pixels of random shift; 0 = none)")
    _float(config, "train.weight_decay", 0.0, math.inf, open_lo=False)
    _float(config, "train.label_smoothing", 0.0, 1.0, open_lo=False)
  mode = _get(config, "nonfinite", "error")
  if mode not in NONFINITE_MODES:
    raise ValueError(f"config.nonfinite must be one of {list(NONFINITE_MODES)}, got {mode!r}.")
  names = _get(config, "detectors", ())
  if isinstance(names, str) or not all(isinstance(n, str) for n in names):
    raise ValueError(f"config.detectors must be a tuple of detector names, got {names!r}.")
  if not names:
    raise ValueError("config.detectors is empty: a run needs at least one detector "
                     "(fi_jax.detectors.names() lists them; e.g. --config.detectors=\"('msp',)\").")
  ood = _get(config, "ood", None)
  if ood is not None and not len(ood):
    raise ValueError("config.ood names no OOD set: a run needs at least one (configs/features.py: "
                     "one file per OOD set in dir, or ood=a+b; the ImageNet configs: ood=a+b).")
  _csid(_get(config, "csid", None))
  hparams = _get(config, "detector_hparams", {})
  hparams = hparams.to_dict() if hasattr(hparams, "to_dict") else dict(hparams)
  detectors.build_suite(names, _get(config, "detector_preset") or None, hparams)
  _model(config)
  _workdir(workdir)
