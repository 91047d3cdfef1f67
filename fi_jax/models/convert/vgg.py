"""timm VGG state dicts -> fi_jax.models.vgg params.

timm (`vgg*`, `vgg*_bn`): features.<i>.{weight, bias} (3x3 conv) and, for `_bn`,
features.<i+1>.{weight, bias, running_mean, running_var, num_batches_tracked} (BatchNorm);
pre_logits.fc1 (a 7x7 conv, O x 512 x 7 x 7), pre_logits.fc2 (1x1 conv), head.fc (Linear).
Flax: features_<i>/{kernel, bias} or {scale, bias, mean, var}, pre_logits_fc{1,2}, head.
"""
from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from fi_jax.models.convert import keymap

HINT = ("VGG weights: timm https://huggingface.co/timm/vgg<depth>[_bn].tv_in1k "
        "(model.safetensors)")
BN = {"scale": "weight", "bias": "bias", "mean": "running_mean", "var": "running_var"}


def key_map(init_params: Mapping[str, Any]) -> dict[str, tuple[str, Any]]:
  """{flax leaf path: (timm key, transform)} for every leaf of `init_params`."""
  spec = {}
  for name, leaves in init_params.items():
    key = name.replace("features_", "features.").replace("pre_logits_", "pre_logits.")
    key = "head.fc" if name == "head" else key
    for leaf in leaves:
      if leaf == "kernel":
        spec[f"{name}/kernel"] = (f"{key}.weight",
                                  keymap.dense if name == "head" else keymap.conv)
      else:
        spec[f"{name}/{leaf}"] = (f"{key}.{BN.get(leaf, leaf)}", keymap.same)
  return spec


def convert(sd: Mapping[str, np.ndarray], init_params: Mapping[str, Any], *,
            file: str = "checkpoint") -> dict:
  """A timm VGG state dict -> params on `init_params`' tree; a headless model drops
  head.fc."""
  skip = [k for k in sd if k.endswith(".num_batches_tracked")]
  if "head" not in init_params:
    skip += ["head.fc.weight", "head.fc.bias"]
  return keymap.apply(sd, key_map(init_params), init_params, source=f"{file} (timm VGG)",
                      hint=HINT + ".", skip=skip)
