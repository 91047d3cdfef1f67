"""timm VisionTransformer / VisionTransformerRelPos state dicts -> fi_jax.models.vit_timm.

The Flax module keeps timm's names, so the map is mechanical: the module path `a.b.3.c` ->
`a/b_3/c` (`blocks.3` -> `blocks_3`, `stages.1.blocks.0` -> `stages_1/blocks_0`); the leaf as
in convert.resnet.torch_leaf (Linear / Conv `weight` -> `kernel`, transposed; a 1-D norm
`weight` -> `scale`; `bias`), and the raw parameters (`gamma`, `lambda_q1`, `mlp_bias`,
`cls_token`, `reg_token`, `pos_embed`, the attention pool's `latent`) under their own names.
"""
from __future__ import annotations

import re
from typing import Mapping, Optional

import numpy as np

from fi_jax.models._checkpoints import CheckpointError
from fi_jax.models.convert import resnet as convert_resnet

RAW_LEAVES = ("gamma", "lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2", "mlp_bias",
              "cls_token", "reg_token", "pos_embed", "latent")


def flax_module(module: str) -> str:
  """'blocks.3.attn.qkv' -> 'blocks_3/attn/qkv'."""
  return re.sub(r"\.(\d+)", r"_\1", module).replace(".", "/")


def torch_module(module: str) -> Optional[str]:
  """flax module path -> timm module name ('blocks_3/attn/qkv' -> 'blocks.3.attn.qkv')."""
  return re.sub(r"_(\d+)", r".\1", module).replace("/", ".")


def convert(sd: Mapping[str, np.ndarray], source: str = "checkpoint", hint: str = "",
            where: Optional[dict[str, str]] = None) -> dict[str, np.ndarray]:
  """timm state dict -> flat {flax path: array}; `where` receives {flax path: timm key}.
  A tensor of none of the known kinds raises CheckpointError naming it."""
  flat: dict[str, np.ndarray] = {}
  for key, v in sd.items():
    module, _, leaf = key.rpartition(".")
    if leaf in RAW_LEAVES:
      path = f"{flax_module(module)}/{leaf}" if module else leaf
      value = np.asarray(v)
    else:
      conv = convert_resnet.torch_leaf(leaf, v) if module else None
      if conv is None or leaf in ("running_mean", "running_var"):
        raise CheckpointError(
            f"{source}: unexpected key {key!r} (shape {tuple(np.shape(v))}) for a timm "
            f"ViT checkpoint (wrong file or model family?). {hint}".strip())
      path, value = f"{flax_module(module)}/{conv[0]}", conv[1]
    flat[path] = value
    if where is not None:
      where[path] = key
  return flat
