"""DINOv2 state dicts (official torch hub files or timm's port) -> fi_jax.models.dinov2 trees
(flat, unrolled blocks)."""
from __future__ import annotations

import re
from typing import Mapping

import numpy as np

from fi_jax.models._checkpoints import CheckpointError
from fi_jax.models._releases import DINOV2_DOWNLOAD_HINT
from fi_jax.models.convert import readers
from fi_jax.models.convert import torch_layers as tl

# torch sub-module of one block -> vit.Encoder1DBlock target (see tl.convert_block); w12 / w3
# are the fused SwiGLU projections of the giant model.
BLOCK_NAMES = {"norm1": "LayerNorm_0", "norm2": "LayerNorm_1", "attn.qkv": "qkv",
               "attn.proj": "out", "ls1": "LayerScale_0", "ls2": "LayerScale_1",
               "mlp.fc1": "MlpBlock_0/Dense_0", "mlp.fc2": "MlpBlock_0/Dense_1",
               "mlp.w12": "MlpBlock_0/Dense_0", "mlp.w3": "MlpBlock_0/Dense_1"}
_LN = {"weight": "scale", "bias": "bias"}
_IGNORED = {"mask_token"}
_BLOCK = r"blocks\.(\d+)\.(.+)"


def _is_timm_registers(sd: Mapping[str, np.ndarray]) -> bool:
  """timm stores register models with `reg_token`, the cls posemb folded into `cls_token`
  and a patch-only `pos_embed` (no_embed_class)."""
  return "reg_token" in sd


def backbone(sd: Mapping[str, np.ndarray], num_heads: int) -> dict[str, np.ndarray]:
  """Official or timm DINOv2 state dict -> flat {flax path: array} (unrolled blocks)."""
  sd = dict(sd)
  if _is_timm_registers(sd):
    pos = sd["pos_embed"]
    sd["pos_embed"] = np.concatenate([np.zeros_like(pos[:, :1]), pos], axis=1)
    sd["register_tokens"] = sd.pop("reg_token")
  flat = tl.convert_blocks(sd, _BLOCK, num_heads, BLOCK_NAMES, "Transformer/encoderblock",
                           "DINOv2", DINOV2_DOWNLOAD_HINT + ".")
  for key, v in sd.items():
    if key in _IGNORED or re.fullmatch(_BLOCK, key):
      continue
    if key in ("patch_embed.proj.weight", "patch_embed.proj.bias"):
      flat[f"embedding/{'kernel' if key.endswith('weight') else 'bias'}"] = (
          tl.torch_conv(v)["kernel"] if key.endswith("weight") else v)
    elif key == "cls_token":
      flat["cls"] = v.reshape(1, 1, -1)
    elif key == "pos_embed":
      flat["pos_embedding"] = v.reshape(1, v.shape[-2], v.shape[-1])
    elif key == "register_tokens":
      flat["registers"] = v.reshape(1, -1, v.shape[-1])
    elif m := re.fullmatch(r"norm\.(weight|bias)", key):
      flat[f"encoder_norm/{_LN[m[1]]}"] = v
    elif m := re.fullmatch(r"(?:head|linear_head)\.(weight|bias)", key):
      flat.update(head({m[1]: v}))
    else:
      raise CheckpointError(
          f"Unexpected key {key!r} in the DINOv2 checkpoint. {DINOV2_DOWNLOAD_HINT}.")
  return flat


def head(sd: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
  """A linear head's {weight, bias} -> {'head/kernel', 'head/bias'}."""
  out = {}
  for k, v in sd.items():
    if k not in ("weight", "bias"):
      raise CheckpointError(
          f"Unexpected key {k!r} in a DINOv2 linear head file (expected weight, bias). "
          f"{DINOV2_DOWNLOAD_HINT}.")
    out[f"head/{'kernel' if k == 'weight' else 'bias'}"] = v.T if k == "weight" else v
  return out


def strip(sd: Mapping[str, np.ndarray], prefix: str) -> dict[str, np.ndarray]:
  """The tensors under `prefix`, with the prefix removed."""
  return {k[len(prefix):]: v for k, v in sd.items() if k.startswith(prefix)}


def read_combined(path: str) -> dict[str, np.ndarray]:
  """A backbone (+ head) file; a hub classifier's state dict has backbone.* / linear_head.*
  (returned as the backbone's names and head.*)."""
  sd = readers.read_state_dict(path, hint=DINOV2_DOWNLOAD_HINT)
  if any(k.startswith("backbone.") for k in sd):
    rest = [k for k in sd if not k.startswith(("backbone.", "linear_head."))]
    if rest:
      raise CheckpointError(
          f"{path}: unexpected key {rest[0]!r} next to backbone.*/linear_head.*. "
          f"{DINOV2_DOWNLOAD_HINT}.")
    return {**strip(sd, "backbone."), **{f"head.{k}": v for k, v in strip(sd, "linear_head.").items()}}
  return sd


def read_head(path: str) -> dict[str, np.ndarray]:
  """A linear-head file -> {'head/kernel', 'head/bias'} (with or without 'linear_head.')."""
  sd = readers.read_state_dict(path, hint=DINOV2_DOWNLOAD_HINT)
  return head(strip(sd, "linear_head.") or sd)
