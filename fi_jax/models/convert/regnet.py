"""torchvision and timm RegNet state dicts -> fi_jax.models.regnet params.

torchvision names: `stem.{0,1}` (conv, BN), `trunk_output.block{s}.block{s}-{i}.` +
`proj.{0,1}` (shortcut conv, BN), `f.{a,b,c}.{0,1}` (conv, BN), `f.se.fc{1,2}` (1x1 convs
with bias), and `fc`. Flax: stem_conv / stem_bn, block{s}_{i}/{proj,a,b,c}_{conv,bn},
block{s}_{i}/se/fc{1,2}, head. Leaves as in convert.resnet.torch_leaf.

timm names (regnetx_* / regnety_* / regnetz_*): `stem.{conv,bn}`, `s{s}.b{i}.` (i from 1) +
`conv{1,2,3}.{conv,bn}` (= a, b, c), `se.fc{1,2}`, `downsample.{conv,bn}` (= proj),
`final_conv.{conv,bn}` and `head.fc`. The pre-activation RegNetV: `stem` (a bare conv),
`s{s}.b{i}.norm{1,2,3}` (= a_bn, b_bn, c_bn: the BN before conv a, b, c), `conv{1,2,3}`, and
`downsample` (or `downsample.1` after its average pool) (= proj_conv).
"""
from __future__ import annotations

import re
from typing import Mapping, Optional

import numpy as np

from fi_jax.models.convert import resnet as convert_resnet

_LAYER = {"0": "conv", "1": "bn"}


def _module(module: str, leaf: str, v: np.ndarray) -> Optional[str]:
  del leaf, v
  if m := re.fullmatch(r"stem\.([01])", module):
    return f"stem_{_LAYER[m[1]]}"
  if module == "fc":
    return "head"
  m = re.fullmatch(r"trunk_output\.block(\d)\.block(\d)-(\d+)\.(.+)", module)
  if not m or m[1] != m[2]:
    return None
  block, sub = f"block{m[1]}_{m[3]}", m[4]
  if s := re.fullmatch(r"(proj|f\.a|f\.b|f\.c)\.([01])", sub):
    return f"{block}/{s[1].removeprefix('f.')}_{_LAYER[s[2]]}"
  if s := re.fullmatch(r"f\.se\.(fc[12])", sub):
    return f"{block}/se/{s[1]}"
  return None


_TIMM_CONV = {"conv1": "a", "conv2": "b", "conv3": "c", "downsample": "proj"}


_PREACT = {"norm1": "a_bn", "norm2": "b_bn", "norm3": "c_bn", "conv1": "a_conv",
           "conv2": "b_conv", "conv3": "c_conv", "downsample": "proj_conv",
           "downsample.1": "proj_conv"}


def _timm_module(module: str, leaf: str, v: np.ndarray) -> Optional[str]:
  del leaf, v
  if m := re.fullmatch(r"(stem|final)(?:_conv)?\.(conv|bn)", module):
    return f"{m[1]}_{m[2]}"
  if module == "stem":
    return "stem_conv"
  if module == "head.fc":
    return "head"
  m = re.fullmatch(r"s(\d)\.b(\d+)\.(.+)", module)
  if not m or int(m[2]) < 1:
    return None
  block, sub = f"block{m[1]}_{int(m[2]) - 1}", m[3]
  if s := re.fullmatch(r"(conv[123]|downsample)\.(conv|bn)", sub):
    return f"{block}/{_TIMM_CONV[s[1]]}_{s[2]}"
  if s := re.fullmatch(r"se\.(fc[12])", sub):
    return f"{block}/se/{s[1]}"
  if sub in _PREACT:
    return f"{block}/{_PREACT[sub]}"
  return None


def is_timm(sd: Mapping[str, np.ndarray]) -> bool:
  """timm's layout (`stem.conv.weight`, RegNetV `stem.weight`) rather than torchvision's
  (`stem.0.weight`)."""
  return "stem.conv.weight" in sd or "stem.weight" in sd


def timm_torch_module(module: str) -> Optional[str]:
  """flax module -> timm name ('block3_0/b_bn' -> 's3.b1.conv2.bn')."""
  if module == "head":
    return "head.fc"
  if m := re.fullmatch(r"(stem|final)_(conv|bn)", module):
    return f"{m[1] if m[1] == 'stem' else 'final_conv'}.{m[2]}"
  inverse = {v: k for k, v in _TIMM_CONV.items()}
  if m := re.fullmatch(r"block(\d)_(\d+)/(proj|a|b|c)_(conv|bn)", module):
    return f"s{m[1]}.b{int(m[2]) + 1}.{inverse[m[3]]}.{m[4]}"
  if m := re.fullmatch(r"block(\d)_(\d+)/se/(fc[12])", module):
    return f"s{m[1]}.b{int(m[2]) + 1}.se.{m[3]}"
  return None


def convert(sd: Mapping[str, np.ndarray], source: str = "checkpoint",
            hint: str = "", where: Optional[dict[str, str]] = None) -> dict[str, np.ndarray]:
  """torchvision or timm RegNet state dict -> flat {flax path: array}."""
  if is_timm(sd):
    return convert_resnet.convert_with(sd, _timm_module, "timm RegNet", source, hint, where)
  return convert_resnet.convert_with(sd, _module, "torchvision RegNet", source, hint,
                                     where)


def torch_module(module: str) -> Optional[str]:
  """flax module -> torchvision name ('block3_1/b_bn' -> 'trunk_output.block3.block3-1.f.b.1')."""
  if module == "head":
    return "fc"
  if m := re.fullmatch(r"stem_(conv|bn)", module):
    return f"stem.{'0' if m[1] == 'conv' else '1'}"
  if m := re.fullmatch(r"block(\d)_(\d+)/(proj|a|b|c)_(conv|bn)", module):
    sub = m[3] if m[3] == "proj" else f"f.{m[3]}"
    return f"trunk_output.block{m[1]}.block{m[1]}-{m[2]}.{sub}.{'0' if m[4] == 'conv' else '1'}"
  if m := re.fullmatch(r"block(\d)_(\d+)/se/(fc[12])", module):
    return f"trunk_output.block{m[1]}.block{m[1]}-{m[2]}.f.se.{m[3]}"
  return None
