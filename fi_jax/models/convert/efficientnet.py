"""torchvision / timm EfficientNet(V2) state dicts -> fi_jax.models.efficientnet param trees.

Both libraries' keys map onto one tree (timm's block vocabulary): `stem_conv`, `stem_bn`,
`blocks_<stage>_<block>/{conv_pw,conv_dw,conv_pwl,conv_exp,conv,bn1..3,se/conv_reduce,
se/conv_expand}`, `head_conv`, `head_bn`, `head`. torchvision numbers the layers of a block
(`features.S.J.block.M...`); which block kind that is follows from which layers it has.
"""
from __future__ import annotations

import re
from typing import Mapping, Optional

import numpy as np

from fi_jax.models._checkpoints import CheckpointError, recover_tree

_BN = {"weight": "scale", "bias": "bias", "running_mean": "mean", "running_var": "var",
       "v": "v"}   # (v: timm's EvoNorm2dS0 in a norm's place)
_SKIP = ("num_batches_tracked",)

# torchvision block layouts: (conv layer indices, SE index or None) -> names of those layers.
_TV_BLOCKS = {
    ((0, 1, 3), 2): {0: ("conv_pw", "bn1"), 1: ("conv_dw", "bn2"),      # MBConv
                     3: ("conv_pwl", "bn3")},
    ((0, 2), 1): {0: ("conv_dw", "bn1"), 2: ("conv_pw", "bn2")},       # MBConv, expand ratio 1
    ((0, 1), None): {0: ("conv_exp", "bn1"), 1: ("conv_pwl", "bn2")},  # FusedMBConv
    ((0,), None): {0: ("conv", "bn1")},                                # FusedMBConv, expand 1
}
# timm block layers (sub-layer paths; MixNet's split convs end in ".<i>")
_TIMM_BLOCK_LAYER = re.compile(
    r"(conv_pw|conv_dw|conv_pwl|conv_exp|conv)(\.\d+)?|bn[123]|se\.conv_(reduce|expand)|norm"
    r"|conv_s2d|bn_s2d"
    r"|se\.conv_attn|se\.mlp_scale\.(fc1|fc2|norm)"
    r"|(dw_start|pw_exp|dw_mid|pw_proj|dw_end)\.(conv|bn)"
    r"|attn\.(query|key|value|output)\.proj|attn\.(key|value)\.(down_conv|norm)|routing_fn")


def _conv(w: np.ndarray) -> np.ndarray:
  """torch conv weight (O, I, kh, kw) -> flax (kh, kw, I, O)."""
  return np.transpose(np.asarray(w), (2, 3, 1, 0))


def _layer(flat: dict, path: str, leaf: str, v: np.ndarray, key: str, where: str) -> None:
  """One torch conv / BN / SE-conv tensor into `flat` under `path`."""
  if leaf in _SKIP:
    return
  name = path.rsplit("/", 1)[-1]
  if name == "mlp_scale_norm":    # GlobalContext's LayerNorm
    flat[f"{path}/{ {'weight': 'scale', 'bias': 'bias'}[leaf]}"] = np.asarray(v)
  elif re.search(r"(^|_)(bn\d?|norm)$", name) or name == "bn_s2d":
    if leaf not in _BN:
      raise CheckpointError(f"Unexpected BatchNorm tensor {key!r} in {where}.")
    flat[f"{path}/{_BN[leaf]}"] = np.asarray(v)
  elif leaf == "weight" and name == "routing_fn":   # CondConv routing Linear
    flat[f"{path}/kernel"] = np.asarray(v).T
  elif leaf == "weight" and np.ndim(v) == 2:   # CondConv experts: timm's layout, as is
    flat[f"{path}/kernel"] = np.asarray(v)
  elif leaf == "weight":
    if np.ndim(v) != 4:
      raise CheckpointError(f"{key!r} in {where} has shape {np.shape(v)}; a conv weight is 4-D.")
    flat[f"{path}/kernel"] = _conv(v)
  elif leaf == "bias" and np.ndim(v) == 1:   # SE convs, timm MobileNetV3's head conv
    flat[f"{path}/bias"] = np.asarray(v)
  else:
    raise CheckpointError(f"Unexpected tensor {key!r} in {where}.")


def detect_source(sd: Mapping[str, np.ndarray], where: str = "the checkpoint") -> str:
  """'timm' (conv_stem/blocks/conv_head keys) or 'torchvision' (features.N... keys)."""
  if "conv_stem.weight" in sd:
    return "timm"
  if "features.0.0.weight" in sd:
    return "torchvision"
  raise CheckpointError(
      f"{where} is neither a timm EfficientNet state dict (no 'conv_stem.weight') nor a "
      f"torchvision one (no 'features.0.0.weight'); first keys: {sorted(sd)[:5]}.")


def convert_timm(sd: Mapping[str, np.ndarray], where: str = "the checkpoint") -> dict:
  """timm EfficientNet / EfficientNetV2 (incl. tf_ ports) state dict -> flat {path: array}."""
  flat: dict = {}
  top = {"conv_stem": "stem_conv", "bn1": "stem_bn", "conv_head": "head_conv", "bn2": "head_bn",
         "norm_head": "head_norm"}
  for key, v in sd.items():
    if m := re.fullmatch(r"blocks\.(\d+)\.(\d+)\.layer_scale\.gamma", key):
      flat[f"blocks_{m[1]}_{m[2]}/layer_scale"] = np.asarray(v)
    elif m := re.fullmatch(r"blocks\.(\d+)\.(\d+)\.(.+)\.(\w+)", key):
      if not _TIMM_BLOCK_LAYER.fullmatch(m[3]):
        raise CheckpointError(f"Unexpected key {key!r} in {where} (not an EfficientNet block "
                              f"layer; known: {_TIMM_BLOCK_LAYER.pattern}).")
      sub = m[3].replace("se.", "se/", 1).replace(".", "_")   # see efficientnet.MBBlock
      _layer(flat, f"blocks_{m[1]}_{m[2]}/{sub}", m[4], v, key, where)
    elif (m := re.fullmatch(r"(\w+)\.(\w+)", key)) and m[1] in top:
      _layer(flat, top[m[1]], m[2], v, key, where)
    elif key in ("classifier.weight", "classifier.bias"):
      flat[f"head/{'kernel' if key.endswith('weight') else 'bias'}"] = (
          np.asarray(v).T if key.endswith("weight") else np.asarray(v))
    else:
      raise CheckpointError(f"Unexpected key {key!r} in {where} (timm EfficientNet layout).")
  return flat


def convert_torchvision(sd: Mapping[str, np.ndarray], where: str = "the checkpoint") -> dict:
  """torchvision EfficientNet / EfficientNetV2 state dict -> flat {path: array}."""
  convs = {k for k in sd if re.fullmatch(r"features\.\d+\.0\.weight", k)}
  last = max(int(k.split(".")[1]) for k in convs) if convs else 0
  # Which layer indices (and SE index) each block has decides the block kind.
  layers: dict[tuple[int, int], dict[int, str]] = {}
  for key in sd:
    if m := re.fullmatch(r"features\.(\d+)\.(\d+)\.block\.(\d+)\.(0|1|fc1|fc2)\.\w+", key):
      layers.setdefault((int(m[1]), int(m[2])), {})[int(m[3])] = (
          "se" if m[4].startswith("fc") else "conv")
  names = {}
  for blk, kinds in layers.items():
    layout = (tuple(sorted(i for i, t in kinds.items() if t == "conv")),
              next((i for i, t in kinds.items() if t == "se"), None))
    if layout not in _TV_BLOCKS:
      raise CheckpointError(
          f"{where}: block features.{blk[0]}.{blk[1]} has layers {sorted(kinds)} (SE at "
          f"{layout[1]}), not an MBConv / FusedMBConv layout torchvision builds.")
    names[blk] = _TV_BLOCKS[layout]
  flat: dict = {}
  for key, v in sd.items():
    if m := re.fullmatch(r"features\.(\d+)\.(\d+)\.block\.(\d+)\.(0|1|fc1|fc2)\.(\w+)", key):
      s, j, i = int(m[1]), int(m[2]), int(m[3])
      base = f"blocks_{s - 1}_{j}"
      if m[4] in ("fc1", "fc2"):
        path = f"{base}/se/{'conv_reduce' if m[4] == 'fc1' else 'conv_expand'}"
      elif i in names[(s, j)]:
        path = f"{base}/{names[(s, j)][i][int(m[4])]}"
      else:
        raise CheckpointError(f"Unexpected key {key!r} in {where}.")
      _layer(flat, path, m[5], v, key, where)
    elif (m := re.fullmatch(r"features\.(\d+)\.([01])\.(\w+)", key)) and int(m[1]) in (0, last):
      path = ("stem_" if m[1] == "0" else "head_") + ("conv" if m[2] == "0" else "bn")
      _layer(flat, path, m[3], v, key, where)
    elif key in ("classifier.1.weight", "classifier.1.bias"):
      flat[f"head/{'kernel' if key.endswith('weight') else 'bias'}"] = (
          np.asarray(v).T if key.endswith("weight") else np.asarray(v))
    else:
      raise CheckpointError(f"Unexpected key {key!r} in {where} (torchvision EfficientNet layout).")
  return flat


def convert(sd: Mapping[str, np.ndarray], source: Optional[str] = None, file: str = "",
            hint: str = "") -> dict:
  """A torchvision or timm EfficientNet state dict -> nested fi_jax params; `source` is
  detected from the keys when None. Shapes are checked when merged onto the model's init."""
  where = repr(file) if file else "the checkpoint"
  try:
    source = source or detect_source(sd, where)
    if source == "timm":
      flat = convert_timm(sd, where)
    elif source == "torchvision":
      flat = convert_torchvision(sd, where)
    else:
      raise CheckpointError(f"Unknown EfficientNet checkpoint source {source!r}; use 'timm' or "
                            "'torchvision'.")
  except CheckpointError as e:
    raise CheckpointError(f"{e} {hint}".strip()) from None
  return recover_tree(flat)
