"""timm DenseNet state dicts -> fi_jax.models.densenet params.

timm (`densenet121/161/169/201`, `densenetblur121d`): features.conv0 [conv1, conv2 (deep
stem)], features.norm0 [norm1, norm2] (BatchNorm: weight, bias, running_mean, running_var,
num_batches_tracked), features.denseblock<b>.denselayer<j>.{norm1, conv1, norm2, conv2},
features.transition<b>.{norm, conv}, features.norm5, classifier (Linear). The blur pool's
filter is a non-persistent buffer (not in the file). Flax: the module path after `features.`
with "." -> "_", and `head` for `classifier`.
"""
from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from fi_jax.models.convert import keymap

HINT = ("DenseNet weights: timm https://huggingface.co/timm/densenet<depth>.<tag> or "
        "timm/densenetblur121d.ra_in1k (model.safetensors)")
BN = {"scale": "weight", "bias": "bias", "mean": "running_mean", "var": "running_var"}


def key_map(init_params: Mapping[str, Any]) -> dict[str, tuple[str, Any]]:
  """{flax leaf path: (timm key, transform)} for every leaf of `init_params`."""
  spec = {}
  for name, leaves in init_params.items():
    key = "classifier" if name == "head" else "features." + name.replace("_", ".")
    for leaf in leaves:
      if leaf == "kernel":
        spec[f"{name}/kernel"] = (f"{key}.weight",
                                  keymap.dense if name == "head" else keymap.conv)
      else:
        spec[f"{name}/{leaf}"] = (f"{key}.{BN.get(leaf, leaf)}", keymap.same)
  return spec


def convert(sd: Mapping[str, np.ndarray], init_params: Mapping[str, Any], *,
            file: str = "checkpoint") -> dict:
  """A timm DenseNet state dict -> params on `init_params`' tree; a headless model drops
  the classifier."""
  skip = [k for k in sd if k.endswith(".num_batches_tracked")]
  if "head" not in init_params:
    skip += ["classifier.weight", "classifier.bias"]
  return keymap.apply(sd, key_map(init_params), init_params,
                      source=f"{file} (timm DenseNet)", hint=HINT + ".", skip=skip)
