"""timm VisionTransformer state dict -> big_vision ViT tree (fi_jax.models.vit)."""
from __future__ import annotations

from typing import Mapping

import numpy as np

from fi_jax.models.checkpoints import CheckpointError, recover_tree
from fi_jax.models.convert import torch_layers as tl

# torch sub-module of one timm block -> vit.Encoder1DBlock target (see tl.convert_block).
BLOCK_NAMES = {"norm1": "LayerNorm_0", "norm2": "LayerNorm_1", "attn.qkv": "qkv",
               "attn.proj": "out", "mlp.fc1": "MlpBlock_0/Dense_0",
               "mlp.fc2": "MlpBlock_0/Dense_1", "ls1": "LayerScale_0", "ls2": "LayerScale_1"}


def vit(flat: Mapping[str, np.ndarray], num_heads: int, source: str = "timm checkpoint",
        hint: str = "") -> dict:
  """timm VisionTransformer state dict -> big_vision ViT tree (pos_embed keeps its cls slot;
  `vit.fix_old_checkpoints` folds it into `cls` like big_vision does for old files)."""
  for unsupported in ("fc_norm.weight", "reg_token", "norm_pre.weight"):
    if unsupported in flat:
      raise CheckpointError(
          f"{source}: timm option {unsupported.split('.')[0]!r} has no big_vision equivalent "
          "(use a timm ViT with class-token or MAP pooling, no registers, no pre-norm).")
  get = tl.Tensors(flat, source, hint)
  tree: dict = {"embedding": tl.torch_conv(get("patch_embed.proj.weight"),
                                           get("patch_embed.proj.bias")),
                "pos_embedding": get("pos_embed")}
  if "cls_token" in flat:
    tree["cls"] = get("cls_token")
  enc = recover_tree(tl.convert_blocks(flat, r"blocks\.(\d+)\.(.+)", num_heads, BLOCK_NAMES,
                                       "encoderblock", source, hint))
  enc["encoder_norm"] = tl.torch_layernorm(get("norm.weight"), get("norm.bias"))
  tree["Transformer"] = enc
  if "attn_pool.latent" in flat:
    k, v = tl.split_fused(get("attn_pool.kv.weight"), get("attn_pool.kv.bias"), 2)
    tree["MAPHead_0"] = {
        "probe": get("attn_pool.latent"),
        "MultiHeadDotProductAttention_0": tl.torch_attention(
            (get("attn_pool.q.weight"), get("attn_pool.q.bias")), k, v,
            (get("attn_pool.proj.weight"), get("attn_pool.proj.bias")), num_heads),
        "LayerNorm_0": tl.torch_layernorm(get("attn_pool.norm.weight"),
                                          get("attn_pool.norm.bias")),
        "MlpBlock_0": {"Dense_0": tl.torch_dense(get("attn_pool.mlp.fc1.weight"),
                                                 get("attn_pool.mlp.fc1.bias")),
                       "Dense_1": tl.torch_dense(get("attn_pool.mlp.fc2.weight"),
                                                 get("attn_pool.mlp.fc2.bias"))}}
  if "head.weight" in flat:
    tree["head"] = tl.torch_dense(get("head.weight"), get("head.bias"))
  return tree
