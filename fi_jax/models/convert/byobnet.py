"""timm ByobNet (RegNetZ) state dicts -> fi_jax.models.byobnet params.

timm names: `stem.{conv,bn}` (the 3x3 stem) or `stem.conv{1,2,3}.{conv,bn}` (tiered / deep),
`stages.{s}.{b}.{conv1_1x1,conv2_kxk,conv3_1x1}.{conv,bn}`, `stages.{s}.{b}.attn.fc{1,2}`
(1x1 convs with bias), `final_conv.{conv,bn}`, `head.fc`. Flax: the same path with `/` for
`.` and `stages_{s}_{b}` for the block, `head` for `head.fc`. Leaves as in
convert.resnet.torch_leaf (BatchNorm / EvoNorm weight -> scale, running stats -> mean / var,
EvoNorm's `v`).
"""
from __future__ import annotations

import re
from typing import Mapping, Optional

import numpy as np

from fi_jax.models.convert import resnet as convert_resnet

_BLOCK = r"(?:conv1_1x1|conv2_kxk|conv3_1x1)\.(?:conv|bn)|attn\.fc[12]"
_OTHER = r"stem\.(?:conv|bn)|stem\.conv[1-3]\.(?:conv|bn)|final_conv\.(?:conv|bn)"


def _module(module: str, leaf: str, v: np.ndarray) -> Optional[str]:
  del leaf, v
  if module == "head.fc":
    return "head"
  if re.fullmatch(_OTHER, module):
    return module.replace(".", "/")
  if m := re.fullmatch(rf"stages\.(\d+)\.(\d+)\.({_BLOCK})", module):
    return f"stages_{m[1]}_{m[2]}/{m[3].replace('.', '/')}"
  return None


def convert(sd: Mapping[str, np.ndarray], source: str = "checkpoint",
            hint: str = "", where: Optional[dict[str, str]] = None) -> dict[str, np.ndarray]:
  """timm ByobNet (RegNetZ) state dict -> flat {flax path: array}."""
  return convert_resnet.convert_with(sd, _module, "timm ByobNet (RegNetZ)", source, hint, where)


def torch_module(module: str) -> Optional[str]:
  """flax module -> timm name ('stages_1_0/attn/fc1' -> 'stages.1.0.attn.fc1')."""
  if module == "head":
    return "head.fc"
  if m := re.fullmatch(r"stages_(\d+)_(\d+)/(.+)", module):
    return f"stages.{m[1]}.{m[2]}.{m[3].replace('/', '.')}"
  return module.replace("/", ".")
