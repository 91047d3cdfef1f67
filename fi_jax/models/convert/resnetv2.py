"""timm ResNetV2 (BiT and the plain pre-activation ResNets) state dicts ->
fi_jax.models.resnetv2 params.

timm names: `stem.conv` (the 'deep' stem: `stem.{conv,norm}{1,2}`, `stem.conv3`), `stages.{s}.blocks.{b}.{norm1,conv1,norm2,conv2,norm3,conv3}`,
`stages.{s}.blocks.{b}.downsample.conv`, `norm`, `head.fc` (a 1x1 conv with bias [C, D, 1, 1]
-> the Dense "head" [D, C]). Flax: stem_conv (stem_{conv,norm}{1,2}, stem_conv3),
stage{s}_{b}/..., norm, head. Leaves as in convert.resnet.torch_leaf (GroupNorm / BatchNorm
weight -> scale; BatchNorm running stats -> mean / var).
"""
from __future__ import annotations

import re
from typing import Mapping, Optional

import numpy as np

from fi_jax.models.convert import resnet as convert_resnet

_BLOCK = ("norm1", "conv1", "norm2", "conv2", "norm3", "conv3")


def _module(module: str, leaf: str, v: np.ndarray) -> Optional[str]:
  del leaf, v
  fixed = {"stem.conv": "stem_conv", "norm": "norm", "head.fc": "head"}
  if module in fixed:
    return fixed[module]
  if m := re.fullmatch(r"stem\.((?:conv|norm)[1-3])", module):   # the 'deep' stem
    return f"stem_{m[1]}"
  m = re.fullmatch(r"stages\.(\d)\.blocks\.(\d+)\.(.+)", module)
  if not m:
    return None
  if m[3] in _BLOCK:
    return f"stage{m[1]}_{m[2]}/{m[3]}"
  if m[3] == "downsample.conv":
    return f"stage{m[1]}_{m[2]}/downsample_conv"
  return None


def convert(sd: Mapping[str, np.ndarray], source: str = "checkpoint",
            hint: str = "", where: Optional[dict[str, str]] = None) -> dict[str, np.ndarray]:
  """timm ResNetV2 state dict -> flat {flax path: array}."""
  flat = convert_resnet.convert_with(sd, _module, "timm ResNetV2", source, hint,
                                     where)
  head = flat.get("head/kernel")
  if head is not None and head.ndim == 4:   # the 1x1 conv head, (1, 1, D, C) -> (D, C)
    flat["head/kernel"] = head.reshape(head.shape[2:])
  return flat


def torch_module(module: str) -> Optional[str]:
  """flax module -> timm name ('stage1_0/conv2' -> 'stages.1.blocks.0.conv2')."""
  fixed = {"stem_conv": "stem.conv", "norm": "norm", "head": "head.fc"}
  if module in fixed:
    return fixed[module]
  if m := re.fullmatch(r"stem_((?:conv|norm)[1-3])", module):
    return f"stem.{m[1]}"
  if m := re.fullmatch(r"stage(\d)_(\d+)/(.+)", module):
    sub = "downsample.conv" if m[3] == "downsample_conv" else m[3]
    return f"stages.{m[1]}.blocks.{m[2]}.{sub}"
  return None
