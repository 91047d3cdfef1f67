"""HF transformers SigLIP / SigLIP 2 state dicts -> big_vision trees (vit, text_transformer,
two_towers)."""
from __future__ import annotations

import re
from typing import Mapping

import numpy as np

from fi_jax.models._checkpoints import CheckpointError, recover_tree
from fi_jax.models.convert import torch_layers as tl

# torch sub-module of one HF encoder layer -> vit.Encoder1DBlock target (see tl.convert_block).
BLOCK_NAMES = {"layer_norm1": "LayerNorm_0", "layer_norm2": "LayerNorm_1",
               "self_attn.q_proj": "q", "self_attn.k_proj": "k", "self_attn.v_proj": "v",
               "self_attn.out_proj": "out", "mlp.fc1": "MlpBlock_0/Dense_0",
               "mlp.fc2": "MlpBlock_0/Dense_1"}


def _encoder(flat: Mapping[str, np.ndarray], p: str, num_heads: int, source: str,
             hint: str) -> dict:
  return recover_tree(tl.convert_blocks(flat, rf"{re.escape(p)}encoder\.layers\.(\d+)\.(.+)",
                                        num_heads, BLOCK_NAMES, "encoderblock", source, hint))


def vision(flat: Mapping[str, np.ndarray], num_heads: int, prefix: str = "vision_model.",
           source: str = "HF checkpoint", hint: str = "") -> dict:
  """HF SigLIP / SigLIP 2 vision tower -> big_vision ViT (MAP head) tree.

  SigLIP 2 (NaFlex in transformers) comes out in big_vision's NaFlex layout: a Dense
  `embedding` on (row, col, channel)-flattened patches and a (g, g, D) posemb grid, which
  `naflex.to_fixed_resolution` turns into a fixed-resolution ViT on load.
  """
  get = tl.Tensors(flat, source, hint)
  p = prefix
  w = get(f"{p}embeddings.patch_embedding.weight")
  bias = get(f"{p}embeddings.patch_embedding.bias")
  pe = get(f"{p}embeddings.position_embedding.weight")
  if w.ndim == 4:
    tree: dict = {"embedding": tl.torch_conv(w, bias), "pos_embedding": pe[None]}
  else:  # SigLIP 2: Linear(P * P * 3 -> D) and a square grid of posembs
    g = int(round(np.sqrt(pe.shape[0])))
    tree = {"embedding": tl.torch_dense(w, bias), "pos_embedding": pe.reshape(g, g, -1)}
  enc = _encoder(flat, p, num_heads, source, hint)
  enc["encoder_norm"] = tl.torch_layernorm(get(f"{p}post_layernorm.weight"),
                                           get(f"{p}post_layernorm.bias"))
  tree["Transformer"] = enc
  h = f"{p}head."
  if f"{h}probe" in flat:
    q, k, v = tl.split_fused(get(f"{h}attention.in_proj_weight"), get(f"{h}attention.in_proj_bias"))
    tree["MAPHead_0"] = {
        "probe": get(f"{h}probe"),
        "MultiHeadDotProductAttention_0": tl.torch_attention(
            q, k, v, (get(f"{h}attention.out_proj.weight"), get(f"{h}attention.out_proj.bias")),
            num_heads),
        "LayerNorm_0": tl.torch_layernorm(get(f"{h}layernorm.weight"), get(f"{h}layernorm.bias")),
        "MlpBlock_0": {"Dense_0": tl.torch_dense(get(f"{h}mlp.fc1.weight"), get(f"{h}mlp.fc1.bias")),
                       "Dense_1": tl.torch_dense(get(f"{h}mlp.fc2.weight"), get(f"{h}mlp.fc2.bias"))}}
  return tree


def text(flat: Mapping[str, np.ndarray], num_heads: int, prefix: str = "text_model.",
         source: str = "HF checkpoint", hint: str = "") -> dict:
  """HF SigLIP / SigLIP 2 text tower -> big_vision text_transformer tree."""
  get = tl.Tensors(flat, source, hint)
  p = prefix
  enc = _encoder(flat, p, num_heads, source, hint)
  enc["encoder_norm"] = tl.torch_layernorm(get(f"{p}final_layer_norm.weight"),
                                           get(f"{p}final_layer_norm.bias"))
  tree = {"Embed_0": {"embedding": get(f"{p}embeddings.token_embedding.weight")},
          "pos_embedding": get(f"{p}embeddings.position_embedding.weight")[None],
          "Encoder_0": enc}
  if f"{p}head.weight" in get:
    tree["head"] = tl.torch_dense(get(f"{p}head.weight"), get(f"{p}head.bias"))
  return tree


def two_towers(flat: Mapping[str, np.ndarray], img_heads: int, txt_heads: int,
               source: str = "HF checkpoint", hint: str = "") -> dict:
  """HF SiglipModel / Siglip2Model state dict -> big_vision two-tower tree."""
  get = tl.Tensors(flat, source, hint)
  if "vision_model.embeddings.patch_embedding.weight" not in get:
    raise CheckpointError(
        f"{source}: not an HF SigLIP checkpoint (no 'vision_model.embeddings.patch_embedding."
        f"weight'; first keys {sorted(flat)[:4]}). {hint}".strip())
  tree = {"img": vision(flat, img_heads, "vision_model.", source, hint),
          "txt": text(flat, txt_heads, "text_model.", source, hint),
          "t": get("logit_scale").reshape(1)}
  if "logit_bias" in get:
    tree["b"] = get("logit_bias").reshape(1)
  return tree
