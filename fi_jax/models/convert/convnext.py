"""torchvision / timm ConvNeXt state dicts -> fi_jax.models.convnext params.

torchvision: features.0.{0: conv, 1: LayerNorm2d} stem; features.{1,3,5,7}.<j> stage blocks
(block.0 dwconv, block.2 LayerNorm, block.3 / block.5 Linear, layer_scale (C, 1, 1));
features.{2,4,6}.{0: LayerNorm2d, 1: conv} downsampling; classifier.{0: LayerNorm2d, 2: Linear}.
timm: stem.{0,1}; stages.<i>.downsample.{0,1} (i > 0); stages.<i>.blocks.<j>.{conv_dw, norm,
mlp.fc1, mlp.fc2, gamma (C,)}; head.norm, head.fc (norm_pre is an Identity for these models).
timm ConvNeXt V2: no `gamma`, `mlp.grn.{weight,bias}` (C,); the small models (atto..nano,
`conv_mlp=True`) store mlp.fc1 / mlp.fc2 as 1x1 convs (O, I, 1, 1). timm's options: overlapping
stems stem.{0: conv, [1: act], next: conv, next: norm}; `SimpleNorm` (`_rms`) norms hold only a
weight; head_norm_first keeps its norm as norm_pre.* (head.norm absent); the MLP head
(`convnext_large_mlp`) adds head.pre_logits.fc.
fb (the official facebookresearch/ConvNeXt and ConvNeXt-V2 files, `{"model": ...}`):
downsample_layers.0.{0,1} stem; downsample_layers.<i>.{0: norm, 1: conv}; stages.<i>.<j>.{dwconv,
norm, pwconv1, pwconv2, gamma (v1) or grn.gamma / grn.beta (1, 1, 1, C) (v2)}; norm, head.
DINOv3's ConvNeXt files (facebookresearch/dinov3 `dinov3/models/convnext.py`, a bare state dict)
use the fb layout without `head`; its `norms` list holds three Identities and `norm` itself, so
the file repeats `norm.*` as `norms.3.*` (checked equal, then dropped).
"""
from __future__ import annotations

import re
from typing import Any, Mapping, Optional

import numpy as np

from fi_jax.models import _checkpoints as checkpoints
from fi_jax.models.convert import keymap

HINT = ("ConvNeXt weights: torchvision https://download.pytorch.org/models/convnext_<size>-"
        "<hash>.pth or timm https://huggingface.co/timm/convnext_<size>.<tag>; ConvNeXt V2: "
        "https://huggingface.co/timm/convnextv2_<size>.<tag> or the official "
        "https://dl.fbaipublicfiles.com/convnext/convnextv2/; DINOv3 ConvNeXt: "
        "dinov3_convnext_<size>_pretrain_lvd1689m-<hash>.pth (https://github.com/"
        "facebookresearch/dinov3: download links on request from Meta)")

_LN = {"scale": "weight", "bias": "bias"}


SOURCES = ("torchvision", "timm", "fb")


def detect_source(sd: Mapping[str, Any]) -> str:
  """'torchvision' (features.* keys), 'fb' (downsample_layers.* keys) or 'timm' (stem.* /
  stages.* keys)."""
  if any(k.startswith("features.") for k in sd):
    return "torchvision"
  if any(k.startswith("downsample_layers.") for k in sd):
    return "fb"
  if any(k.startswith(("stem.", "stages.")) for k in sd):
    return "timm"
  raise checkpoints.CheckpointError(
      f"Not a ConvNeXt state dict (neither torchvision features.*, timm stem.*/stages.* nor "
      f"official downsample_layers.* keys; first keys {sorted(sd)[:4]}). {HINT}.")


def _linear(w: np.ndarray) -> np.ndarray:
  """A Linear weight (O, I) or a 1x1 conv weight (O, I, 1, 1) -> flax Dense (I, O)."""
  if w.ndim == 4 and w.shape[2:] == (1, 1):
    w = w[:, :, 0, 0]
  return keymap.dense(w)


def _vector(w: np.ndarray) -> np.ndarray:
  """A per-channel vector stored as (C,), (C, 1, 1) or (1, 1, 1, C) -> (C,)."""
  return np.reshape(w, (-1,)) if w.ndim > 1 and max(w.shape) == w.size else w


def _stages(init_params: Mapping[str, Any]) -> list[int]:
  depths = {}
  for name in init_params:
    if m := re.fullmatch(r"stage(\d+)_block(\d+)", name):
      depths[int(m[1])] = max(depths.get(int(m[1]), 0), int(m[2]) + 1)
  return [depths[i] for i in range(len(depths))]


def key_map(init_params: Mapping[str, Any], source: str,
            stem_act: bool = False) -> dict[str, tuple[str, Any]]:
  """{flax leaf path: (torch key, transform)} for every leaf of `init_params`; `stem_act`:
  timm's overlapping stem has an activation between its convs (shifting the indices)."""
  tv, fb = source == "torchvision", source == "fb"
  spec = {}

  def conv(path, key, bias=True):
    spec[f"{path}/kernel"] = (f"{key}.weight", keymap.conv)
    if bias:
      spec[f"{path}/bias"] = (f"{key}.bias", keymap.same)

  def dense(path, key):
    spec[f"{path}/kernel"] = (f"{key}.weight", _linear)
    spec[f"{path}/bias"] = (f"{key}.bias", keymap.same)

  def norm(path, key):   # LayerNorm (scale, bias) or timm's SimpleNorm (scale only)
    node = init_params
    for part in path.split("/"):
      node = node[part]
    for f, t in _LN.items():
      if f in node:
        spec[f"{path}/{f}"] = (f"{key}.{t}", keymap.same)

  stem = "features.0" if tv else "downsample_layers.0" if fb else "stem"
  if "stem_mid" in init_params:   # timm's overlapping stems: conv, [act], conv, norm
    conv("stem_mid", f"{stem}.0")
    conv("stem", f"{stem}.{1 + stem_act}")
    norm("stem_norm", f"{stem}.{2 + stem_act}")
  else:
    conv("stem", f"{stem}.0")
    norm("stem_norm", f"{stem}.1")
  for i, depth in enumerate(_stages(init_params)):
    if i > 0:
      down = (f"features.{2 * i}" if tv else f"downsample_layers.{i}" if fb
              else f"stages.{i}.downsample")
      norm(f"downsample{i}_norm", f"{down}.0")
      conv(f"downsample{i}", f"{down}.1")
    for j in range(depth):
      p = f"stage{i}_block{j}"
      t = (f"features.{2 * i + 1}.{j}" if tv else f"stages.{i}.{j}" if fb
           else f"stages.{i}.blocks.{j}")
      block = init_params[p]
      conv(f"{p}/dwconv", f"{t}.block.0" if tv else f"{t}.dwconv" if fb else f"{t}.conv_dw")
      norm(f"{p}/norm", f"{t}.block.2" if tv else f"{t}.norm")
      dense(f"{p}/fc1", f"{t}.block.3" if tv else f"{t}.pwconv1" if fb else f"{t}.mlp.fc1")
      dense(f"{p}/fc2", f"{t}.block.5" if tv else f"{t}.pwconv2" if fb else f"{t}.mlp.fc2")
      if "layer_scale" in block:
        spec[f"{p}/layer_scale"] = (f"{t}.layer_scale" if tv else f"{t}.gamma", keymap.flat)
      if "grn" in block:   # ConvNeXt V2 (timm / fb only)
        spec[f"{p}/grn/weight"] = (f"{t}.grn.gamma" if fb else f"{t}.mlp.grn.weight", _vector)
        spec[f"{p}/grn/bias"] = (f"{t}.grn.beta" if fb else f"{t}.mlp.grn.bias", _vector)
  if "norm_pre" in init_params:   # timm's head_norm_first
    norm("norm_pre", "norm_pre")
  else:
    norm("head_norm", "classifier.0" if tv else "norm" if fb else "head.norm")
  if "head_hidden" in init_params:   # timm's MLP head
    dense("head_hidden", "head.pre_logits.fc")
  if "head" in init_params:
    dense("head", "classifier.2" if tv else "head" if fb else "head.fc")
  return spec


def _drop_dinov3_norm_alias(sd: Mapping[str, np.ndarray], file: str) -> Mapping[str, np.ndarray]:
  """DINOv3 ConvNeXt: `norms.3.{weight,bias}` is `norm.{weight,bias}` saved twice; drop it
  after checking that (anything else under `norms.` is not this layout)."""
  alias = {k for k in sd if k.startswith("norms.")}
  if not alias:
    return sd
  for k in sorted(alias):
    twin = "norm." + k.removeprefix("norms.3.")
    if not k.startswith("norms.3.") or twin not in sd or not np.array_equal(
        np.asarray(sd[k]), np.asarray(sd[twin])):
      raise checkpoints.CheckpointError(
          f"{file} (fb ConvNeXt): {k!r} is not a copy of the final norm {twin!r} (DINOv3's "
          f"ConvNeXt saves `norm` again as `norms.3`, and nothing else under `norms.`). {HINT}.")
  return {k: v for k, v in sd.items() if k not in alias}


def convert(sd: Mapping[str, np.ndarray], init_params: Mapping[str, Any], *,
            source: Optional[str] = None, file: str = "checkpoint") -> dict:
  """A torchvision, timm or official (fb) ConvNeXt (v1 or V2) state dict -> params on
  `init_params`' tree.

  A model built without a head (num_classes=None) drops the file's classifier."""
  source = source or detect_source(sd)
  if source not in SOURCES:
    raise ValueError(f"ConvNeXt source must be one of {SOURCES}, got {source!r}.")
  if source == "fb":
    sd = _drop_dinov3_norm_alias(sd, file)
  head = {"torchvision": "classifier.2", "timm": "head.fc", "fb": "head"}[source]
  head = (f"{head}.weight", f"{head}.bias")
  skip = () if "head" in init_params else head
  stem_act = "stem_mid" in init_params and "stem.3.weight" in sd
  return keymap.apply(sd, key_map(init_params, source, stem_act), init_params,
                      source=f"{file} ({source} ConvNeXt)", hint=HINT + ".", skip=skip)
