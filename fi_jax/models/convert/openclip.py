"""OpenCLIP / OpenAI CLIP state dicts -> fi_jax.models.clip trees (flat, unrolled blocks)."""
from __future__ import annotations

import re
from typing import Mapping

import numpy as np

from fi_jax.models._checkpoints import CheckpointError
from fi_jax.models._releases import CLIP_DOWNLOAD_HINT
from fi_jax.models.convert import torch_layers as tl

# torch sub-module of one resblock -> vit.Encoder1DBlock target (see tl.convert_block).
BLOCK_NAMES = {"ln_1": "LayerNorm_0", "ln_2": "LayerNorm_1", "attn.in_proj": "qkv",
               "attn.out_proj": "out", "mlp.c_fc": "MlpBlock_0/Dense_0",
               "mlp.c_proj": "MlpBlock_0/Dense_1", "ls_1": "LayerScale_0", "ls_2": "LayerScale_1"}
_IGNORED = re.compile(r"^(attn_mask|input_resolution|context_length|vocab_size|"
                      r"visual\.attn_mask)$")
_LN = {"weight": "scale", "bias": "bias"}
_BLOCKS = {r"visual\.transformer\.resblocks\.(\d+)\.(.+)": ("img", "img/Transformer/encoderblock"),
           r"transformer\.resblocks\.(\d+)\.(.+)": ("txt", "txt/Encoder_0/encoderblock")}
# Every other tensor: regex -> fn(match, value) -> {flax path: array}.
_RULES = [
    (r"visual\.conv1\.weight", lambda m, v: {"img/embedding/kernel": tl.torch_conv(v)["kernel"]}),
    (r"visual\.class_embedding", lambda m, v: {"img/cls": v.reshape(1, 1, -1)}),
    (r"visual\.positional_embedding", lambda m, v: {"img/pos_embedding": v[None]}),
    (r"visual\.ln_pre\.(weight|bias)", lambda m, v: {f"img/ln_pre/{_LN[m[1]]}": v}),
    (r"visual\.ln_post\.(weight|bias)",
     lambda m, v: {f"img/Transformer/encoder_norm/{_LN[m[1]]}": v}),
    (r"visual\.proj", lambda m, v: {"img/head/kernel": v}),
    (r"token_embedding\.weight", lambda m, v: {"txt/Embed_0/embedding": v}),
    (r"positional_embedding", lambda m, v: {"txt/pos_embedding": v[None]}),
    (r"ln_final\.(weight|bias)", lambda m, v: {f"txt/Encoder_0/encoder_norm/{_LN[m[1]]}": v}),
    (r"text_projection", lambda m, v: {"txt/head/kernel": v}),
    (r"logit_scale", lambda m, v: {"t": np.reshape(v, (1,))}),
]


def clip(sd: Mapping[str, np.ndarray], num_heads: Mapping[str, int]) -> dict[str, np.ndarray]:
  """OpenCLIP / OpenAI state dict -> flat {flax path: array} (unrolled blocks); `num_heads`
  = {"img": heads, "txt": heads}."""
  sd = dict(sd)
  if any(k.startswith("text.") for k in sd):   # CustomTextCLIP puts the text tower under text.
    sd = {k[len("text."):] if k.startswith("text.") else k: v for k, v in sd.items()}
  sd = {k: v for k, v in sd.items() if not _IGNORED.match(k)}
  flat = {}
  for pattern, (tower, out) in _BLOCKS.items():
    flat.update(tl.convert_blocks(sd, pattern, num_heads[tower], BLOCK_NAMES, out, "CLIP",
                                  CLIP_DOWNLOAD_HINT + "."))
  rules = [(re.compile(p), f) for p, f in _RULES]
  blocks = [re.compile(p) for p in _BLOCKS]
  for key, value in sd.items():
    if any(b.fullmatch(key) for b in blocks):
      continue
    for pattern, fn in rules:
      m = pattern.fullmatch(key)
      if m:
        flat.update(fn(m, value))
        break
    else:
      raise CheckpointError(
          f"Unexpected key {key!r} in the CLIP checkpoint (not a ViT CLIP model fi_jax "
          f"supports). {CLIP_DOWNLOAD_HINT}.")
  return flat
