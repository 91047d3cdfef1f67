"""torchvision / timm Swin v1 and v2 state dicts -> fi_jax.models.swin params.

torchvision: features.0.{0: conv, 2: LayerNorm} patch embedding; features.{1,3,5,7}.<j> stage
blocks (norm1, attn.qkv, attn.proj, norm2, mlp.0, mlp.3; v1 attn.relative_position_bias_table,
v2 attn.logit_scale (H, 1, 1), attn.cpb_mlp.{0,2}, the k third of attn.qkv.bias unused);
features.{2,4,6}.{reduction, norm} patch merging; norm; head. The buffers
attn.relative_position_index (and v2 attn.relative_coords_table) are stored but derived here.
timm: patch_embed.{proj, norm}; layers.<i>.downsample.{reduction, norm} (i > 0);
layers.<i>.blocks.<j>.{norm1, attn.*, norm2, mlp.fc1, mlp.fc2} (v2: attn.qkv without bias plus
attn.q_bias / attn.v_bias); norm; head.fc.
"""
from __future__ import annotations

import re
from typing import Any, Mapping, Optional, Sequence

import numpy as np

from fi_jax.models import _checkpoints as checkpoints
from fi_jax.models.convert import keymap

HINT = ("Swin weights: torchvision https://download.pytorch.org/models/swin_<t|s|b|v2_t|...>-"
        "<hash>.pth or timm https://huggingface.co/timm/<swin_*|swinv2_*>.<tag>")

_LN = {"scale": "weight", "bias": "bias"}
_BUFFERS = ("relative_position_index", "relative_coords_table")


def detect_source(sd: Mapping[str, Any]) -> str:
  """'torchvision' (features.* keys) or 'timm' (patch_embed.* / layers.* keys)."""
  if any(k.startswith("features.") for k in sd):
    return "torchvision"
  if any(k.startswith(("patch_embed.", "layers.")) for k in sd):
    return "timm"
  raise checkpoints.CheckpointError(
      f"Not a Swin state dict (neither torchvision features.* nor timm patch_embed.*/layers.* "
      f"keys; first keys {sorted(sd)[:4]}). {HINT}.")


def _stages(init_params: Mapping[str, Any]) -> list[int]:
  depths: dict[int, int] = {}
  for name in init_params:
    if m := re.fullmatch(r"stage(\d+)_block(\d+)", name):
      depths[int(m[1])] = max(depths.get(int(m[1]), 0), int(m[2]) + 1)
  return [depths[i] for i in range(len(depths))]


def _block_prefix(source: str, i: int, j: int) -> str:
  return f"features.{2 * i + 1}.{j}" if source == "torchvision" else f"layers.{i}.blocks.{j}"


def key_map(init_params: Mapping[str, Any], source: str) -> dict[str, tuple[str, Any]]:
  """{flax leaf path: (torch key, transform)} for every leaf of `init_params`."""
  tv = source == "torchvision"
  spec = {}

  def dense(path, key, bias=True):
    spec[f"{path}/kernel"] = (f"{key}.weight", keymap.dense)
    if bias:
      spec[f"{path}/bias"] = (f"{key}.bias", keymap.same)

  def norm(path, key):
    for f, t in _LN.items():
      spec[f"{path}/{f}"] = (f"{key}.{t}", keymap.same)

  spec["patch_embed/kernel"] = ("features.0.0.weight" if tv else "patch_embed.proj.weight",
                                keymap.conv)
  spec["patch_embed/bias"] = ("features.0.0.bias" if tv else "patch_embed.proj.bias", keymap.same)
  norm("patch_norm", "features.0.2" if tv else "patch_embed.norm")
  for i, depth in enumerate(_stages(init_params)):
    if i > 0:
      down = f"features.{2 * i}" if tv else f"layers.{i}.downsample"
      dense(f"stage{i}_downsample/reduction", f"{down}.reduction", bias=False)
      norm(f"stage{i}_downsample/norm", f"{down}.norm")
    for j in range(depth):
      p, t = f"stage{i}_block{j}", _block_prefix(source, i, j)
      v2 = "logit_scale" in init_params[p]["attn"]
      norm(f"{p}/norm1", f"{t}.norm1")
      norm(f"{p}/norm2", f"{t}.norm2")
      dense(f"{p}/mlp_fc1", f"{t}.mlp.0" if tv else f"{t}.mlp.fc1")
      dense(f"{p}/mlp_fc2", f"{t}.mlp.3" if tv else f"{t}.mlp.fc2")
      dense(f"{p}/attn/proj", f"{t}.attn.proj")
      dense(f"{p}/attn/qkv", f"{t}.attn.qkv", bias=not v2)
      if not v2:
        spec[f"{p}/attn/relative_position_bias_table"] = (
            f"{t}.attn.relative_position_bias_table", keymap.same)
        continue
      spec[f"{p}/attn/logit_scale"] = (f"{t}.attn.logit_scale", keymap.flat)
      dense(f"{p}/attn/cpb_mlp_0", f"{t}.attn.cpb_mlp.0")
      dense(f"{p}/attn/cpb_mlp_1", f"{t}.attn.cpb_mlp.2", bias=False)
      if tv:   # one fused qkv bias whose key third torchvision zeroes at run time
        third = lambda k: (lambda b: b[k * (len(b) // 3):(k + 1) * (len(b) // 3)])
        spec[f"{p}/attn/q_bias"] = (f"{t}.attn.qkv.bias", third(0))
        spec[f"{p}/attn/v_bias"] = (f"{t}.attn.qkv.bias", third(2))
      else:
        spec[f"{p}/attn/q_bias"] = (f"{t}.attn.q_bias", keymap.same)
        spec[f"{p}/attn/v_bias"] = (f"{t}.attn.v_bias", keymap.same)
  norm("norm", "norm")
  if "head" in init_params:
    dense("head", "head" if tv else "head.fc")
  return spec


def convert(sd: Mapping[str, np.ndarray], init_params: Mapping[str, Any], *,
            source: Optional[str] = None, file: str = "checkpoint",
            buffers: Optional[Sequence[Mapping[str, np.ndarray]]] = None) -> dict:
  """A torchvision or timm Swin (v1 / v2) state dict -> params on `init_params`' tree.

  `buffers`: per stage, the model's own relative_position_index / relative_coords_table; the
  file's copies (torchvision stores them) must match, which catches a wrong window size. Without
  it stored buffers are ignored. A model built without a head drops the file's classifier.
  """
  source = source or detect_source(sd)
  if source not in ("torchvision", "timm"):
    raise ValueError(f"Swin source must be 'torchvision' or 'timm', got {source!r}.")
  want, skip = {}, []
  for i, depth in enumerate(_stages(init_params)):
    for j in range(depth):
      t = _block_prefix(source, i, j)
      for b in _BUFFERS:
        if buffers is None:
          skip.append(f"{t}.attn.{b}")
        else:
          want[f"{t}.attn.{b}"] = buffers[i][b]
      skip.append(f"{t}.attn_mask")   # original Microsoft checkpoints store the shift mask
  if "head" not in init_params:
    skip += ["head.weight", "head.bias"] if source == "torchvision" else ["head.fc.weight",
                                                                          "head.fc.bias"]
  return keymap.apply(sd, key_map(init_params, source), init_params,
                      source=f"{file} ({source} Swin)", hint=HINT + ".", buffers=want, skip=skip)
