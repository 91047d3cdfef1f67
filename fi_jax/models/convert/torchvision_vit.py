"""torchvision VisionTransformer state dict -> big_vision ViT tree (fi_jax.models.vit).

torchvision's layout: `conv_proj` (the patch conv), `class_token`, `encoder.pos_embedding`
(1, 1 + grid, D; its first slot belongs to the class token and is folded into `cls`, which
is exact: torchvision adds the posemb to the constant token), blocks
`encoder.layers.encoder_layer_{i}.{ln_1, self_attention (nn.MultiheadAttention: fused
in_proj_weight / in_proj_bias, out_proj), ln_2, mlp.0, mlp.3}` (files written before
torchvision 0.13 name the MLP `mlp.linear_1` / `mlp.linear_2`), `encoder.ln`, and
`heads.head` (with `heads.pre_logits` + tanh when built with a representation_size).
The model is vit.Model with pool_type='tok', exact GELU and LayerNorm eps 1e-6.
"""
from __future__ import annotations

from typing import Mapping, Optional

import numpy as np

from fi_jax.models._checkpoints import recover_tree
from fi_jax.models.convert import torch_layers as tl

BLOCK_NAMES = {"ln_1": "LayerNorm_0", "ln_2": "LayerNorm_1", "self_attention.in_proj": "qkv",
               "self_attention.out_proj": "out", "mlp.0": "MlpBlock_0/Dense_0",
               "mlp.3": "MlpBlock_0/Dense_1", "mlp.linear_1": "MlpBlock_0/Dense_0",
               "mlp.linear_2": "MlpBlock_0/Dense_1"}
BLOCKS = r"encoder\.layers\.encoder_layer_(\d+)\.(.+)"
BLOCK_KEY = "encoder.layers.encoder_layer_{}."

# torchvision Linear / LayerNorm -> flax module path.
_DENSE = {"heads.head": "head", "heads.pre_logits": "pre_logits"}
# flax path -> torchvision key of the params that only some models have (for tl.check_tree).
OPTIONAL = {f"{path}/{leaf}": f"{name}.{tleaf}" for name, path in _DENSE.items()
            for leaf, tleaf in (("kernel", "weight"), ("bias", "bias"))}


def is_torchvision(flat: Mapping[str, np.ndarray]) -> bool:
  """torchvision's ViT names its patch conv `conv_proj`."""
  return "conv_proj.weight" in flat


def vit(flat: Mapping[str, np.ndarray], num_heads: int, source: str = "torchvision checkpoint",
        hint: str = "", where: Optional[dict[str, str]] = None) -> dict:
  """torchvision VisionTransformer state dict -> big_vision ViT tree ('tok' pooling).

  `where`, if given, receives {flax path: torchvision key} for tl.check_tree. Any tensor
  the converter does not place raises a CheckpointError naming it."""
  get = tl.Tensors(flat, source, hint)
  where = {} if where is None else where
  paths: dict[str, np.ndarray] = {}

  def put(path: str, value: np.ndarray, key: str) -> None:
    paths[path] = value
    where[path] = key

  put("embedding/kernel", tl.torch_conv(get("conv_proj.weight"))["kernel"], "conv_proj.weight")
  put("embedding/bias", get("conv_proj.bias"), "conv_proj.bias")
  pe, cls = get("encoder.pos_embedding"), get("class_token")
  put("cls", cls + pe[:, :1].astype(cls.dtype), "class_token")
  put("pos_embedding", pe[:, 1:], "encoder.pos_embedding")
  put("Transformer/encoder_norm/scale", get("encoder.ln.weight"), "encoder.ln.weight")
  put("Transformer/encoder_norm/bias", get("encoder.ln.bias"), "encoder.ln.bias")
  block_where: dict[str, str] = {}
  blocks = tl.convert_blocks(flat, BLOCKS, num_heads, BLOCK_NAMES, "encoderblock", source,
                             hint, where=block_where)
  paths.update({f"Transformer/{k}": a for k, a in blocks.items()})
  where.update({f"Transformer/{k}": key for k, key in block_where.items()})
  for torch_name, path in _DENSE.items():
    if f"{torch_name}.weight" in flat:
      put(f"{path}/kernel", tl.torch_dense(get(f"{torch_name}.weight"))["kernel"],
          f"{torch_name}.weight")
      put(f"{path}/bias", get(f"{torch_name}.bias"), f"{torch_name}.bias")
  get.check_all_used(BLOCKS, "torchvision VisionTransformer")
  return recover_tree(paths)
