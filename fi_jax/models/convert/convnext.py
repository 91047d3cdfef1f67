"""torchvision / timm ConvNeXt state dicts -> fi_jax.models.convnext params.

torchvision: features.0.{0: conv, 1: LayerNorm2d} stem; features.{1,3,5,7}.<j> stage blocks
(block.0 dwconv, block.2 LayerNorm, block.3 / block.5 Linear, layer_scale (C, 1, 1));
features.{2,4,6}.{0: LayerNorm2d, 1: conv} downsampling; classifier.{0: LayerNorm2d, 2: Linear}.
timm: stem.{0,1}; stages.<i>.downsample.{0,1} (i > 0); stages.<i>.blocks.<j>.{conv_dw, norm,
mlp.fc1, mlp.fc2, gamma (C,)}; head.norm, head.fc (norm_pre is an Identity for these models).
"""
from __future__ import annotations

import re
from typing import Any, Mapping, Optional

import numpy as np

from fi_jax.models import _checkpoints as checkpoints
from fi_jax.models.convert import keymap

HINT = ("ConvNeXt weights: torchvision https://download.pytorch.org/models/convnext_<size>-"
        "<hash>.pth or timm https://huggingface.co/timm/convnext_<size>.<tag>")

_LN = {"scale": "weight", "bias": "bias"}


def detect_source(sd: Mapping[str, Any]) -> str:
  """'torchvision' (features.* keys) or 'timm' (stem.* / stages.* keys)."""
  if any(k.startswith("features.") for k in sd):
    return "torchvision"
  if any(k.startswith(("stem.", "stages.")) for k in sd):
    return "timm"
  raise checkpoints.CheckpointError(
      f"Not a ConvNeXt state dict (neither torchvision features.* nor timm stem.*/stages.* keys; "
      f"first keys {sorted(sd)[:4]}). {HINT}.")


def _stages(init_params: Mapping[str, Any]) -> list[int]:
  depths = {}
  for name in init_params:
    if m := re.fullmatch(r"stage(\d+)_block(\d+)", name):
      depths[int(m[1])] = max(depths.get(int(m[1]), 0), int(m[2]) + 1)
  return [depths[i] for i in range(len(depths))]


def _dense_or_1x1(w):
  """Linear (O, I), or the 1x1 conv (O, I, 1, 1) of timm's conv_mlp models (atto..nano: the
  same map per position) -> flax (I, O)."""
  return keymap.dense(w.reshape(w.shape[:2]) if w.ndim == 4 and w.shape[2:] == (1, 1) else w)


def key_map(init_params: Mapping[str, Any], source: str) -> dict[str, tuple[str, Any]]:
  """{flax leaf path: (torch key, transform)} for every leaf of `init_params`."""
  tv = source == "torchvision"
  spec = {}

  def conv(path, key, bias=True):
    spec[f"{path}/kernel"] = (f"{key}.weight", keymap.conv)
    if bias:
      spec[f"{path}/bias"] = (f"{key}.bias", keymap.same)

  def dense(path, key):
    spec[f"{path}/kernel"] = (f"{key}.weight", _dense_or_1x1)
    spec[f"{path}/bias"] = (f"{key}.bias", keymap.same)

  def norm(path, key):
    for f, t in _LN.items():
      spec[f"{path}/{f}"] = (f"{key}.{t}", keymap.same)

  conv("stem", "features.0.0" if tv else "stem.0")
  norm("stem_norm", "features.0.1" if tv else "stem.1")
  for i, depth in enumerate(_stages(init_params)):
    if i > 0:
      down = f"features.{2 * i}" if tv else f"stages.{i}.downsample"
      norm(f"downsample{i}_norm", f"{down}.0")
      conv(f"downsample{i}", f"{down}.1")
    for j in range(depth):
      p = f"stage{i}_block{j}"
      t = f"features.{2 * i + 1}.{j}" if tv else f"stages.{i}.blocks.{j}"
      conv(f"{p}/dwconv", f"{t}.block.0" if tv else f"{t}.conv_dw")
      norm(f"{p}/norm", f"{t}.block.2" if tv else f"{t}.norm")
      dense(f"{p}/fc1", f"{t}.block.3" if tv else f"{t}.mlp.fc1")
      dense(f"{p}/fc2", f"{t}.block.5" if tv else f"{t}.mlp.fc2")
      spec[f"{p}/layer_scale"] = (f"{t}.layer_scale" if tv else f"{t}.gamma", keymap.flat)
  norm("head_norm", "classifier.0" if tv else "head.norm")
  if "head" in init_params:
    dense("head", "classifier.2" if tv else "head.fc")
  return spec


def convert(sd: Mapping[str, np.ndarray], init_params: Mapping[str, Any], *,
            source: Optional[str] = None, file: str = "checkpoint") -> dict:
  """A torchvision or timm ConvNeXt state dict -> params on `init_params`' tree.

  A model built without a head (num_classes=None) drops the file's classifier."""
  source = source or detect_source(sd)
  if source not in ("torchvision", "timm"):
    raise ValueError(f"ConvNeXt source must be 'torchvision' or 'timm', got {source!r}.")
  head = ("classifier.2.weight", "classifier.2.bias") if source == "torchvision" else (
      "head.fc.weight", "head.fc.bias")
  skip = () if "head" in init_params else head
  return keymap.apply(sd, key_map(init_params, source), init_params,
                      source=f"{file} ({source} ConvNeXt)", hint=HINT + ".", skip=skip)
