"""timm VisionTransformer state dict -> big_vision ViT tree (fi_jax.models.vit).

Covers timm's options that change the parameter set: class token or none (`cls_token`),
register tokens (`reg_token` -> `reg`), a posemb with or without slots for those prefix
tokens (`no_embed_class`; the slots are folded into `cls` / `reg`, which is exact since timm
adds the posemb to the constant tokens), `norm_pre`, the final norm on the tokens (`norm`) or
on the pooled feature (`fc_norm`), a patch embedding without bias (CLIP ViTs), LayerScale
(`ls1` / `ls2`), the MAP head (`attn_pool`) and the classifier (`head`, absent for headless
models). Models built with qkv_bias=False (MIIL, the `gap` ViTs without qkv bias) have no
`attn.qkv.bias`: they load as zero biases, the same function. DeiT's distilled models
(`dist_token` -> `dist`, its posemb slot folded in as for `cls`; `head` and `head_dist` -> one
`head` on [cls | dist]: kernels stacked and both halved, bias (b + b_dist) / 2).
"""
from __future__ import annotations

from typing import Mapping, Optional

import numpy as np

from fi_jax.models._checkpoints import flatten, recover_tree
from fi_jax.models.convert import torch_layers as tl

# torch sub-module of one timm block -> vit.Encoder1DBlock target (see tl.convert_block).
BLOCK_NAMES = {"norm1": "LayerNorm_0", "norm2": "LayerNorm_1", "attn.qkv": "qkv",
               "attn.proj": "out", "mlp.fc1": "MlpBlock_0/Dense_0",
               "mlp.fc2": "MlpBlock_0/Dense_1", "ls1": "LayerScale_0", "ls2": "LayerScale_1"}
BLOCKS = r"blocks\.(\d+)\.(.+)"
BLOCK_KEY = "blocks.{}."
# flax path -> timm key of the params that only some models have (for tl.check_tree).
OPTIONAL = {"cls": "cls_token", "dist": "dist_token", "reg": "reg_token", "embedding/bias": "patch_embed.proj.bias",
            "Transformer/encoder_norm/scale": "norm.weight",
            "Transformer/encoder_norm/bias": "norm.bias", "norm_pre/scale": "norm_pre.weight",
            "norm_pre/bias": "norm_pre.bias", "fc_norm/scale": "fc_norm.weight",
            "fc_norm/bias": "fc_norm.bias", "head/kernel": "head.weight", "head/bias": "head.bias",
            "MAPHead_0/probe": "attn_pool.latent"}

# timm LayerNorm -> flax path.
_NORMS = {"norm": "Transformer/encoder_norm", "norm_pre": "norm_pre", "fc_norm": "fc_norm"}


def _is_square(n: int) -> bool:
  return n > 0 and int(round(np.sqrt(n))) ** 2 == n


def _fold_prefix_posemb(tree: dict, pe: np.ndarray, n_prefix: int) -> np.ndarray:
  """timm's default layout adds posemb slots to the cls / dist / register tokens: add them to
  the tokens (`cls`, `dist`, `reg`) and return the patch-only posemb (big_vision's layout)."""
  if not n_prefix or _is_square(pe.shape[1]) or not _is_square(pe.shape[1] - n_prefix):
    return pe
  i = 0
  if "cls" in tree:
    tree["cls"] = tree["cls"] + pe[:, :1].astype(tree["cls"].dtype)
    i = 1
  if "dist" in tree:
    tree["dist"] = tree["dist"] + pe[:, i:i + 1].astype(tree["dist"].dtype)
    i += 1
  if "reg" in tree:
    tree["reg"] = tree["reg"] + pe[:, i:n_prefix].astype(tree["reg"].dtype)
  return pe[:, n_prefix:]


def with_zero_qkv_bias(flat: Mapping[str, np.ndarray]) -> Mapping[str, np.ndarray]:
  """`flat` plus zero `blocks.{i}.attn.qkv.bias` for every block with a fused qkv weight and
  no bias (timm's qkv_bias=False); unchanged when every block has its bias."""
  missing = {}
  for key, w in flat.items():
    if key.startswith("blocks.") and key.endswith(".attn.qkv.weight"):
      bias = key[:-len("weight")] + "bias"
      if bias not in flat:
        missing[bias] = np.zeros(np.shape(w)[:1], np.asarray(w).dtype)
  return {**flat, **missing} if missing else flat


def vit(flat: Mapping[str, np.ndarray], num_heads: int, source: str = "timm checkpoint",
        hint: str = "", where: Optional[dict[str, str]] = None) -> dict:
  """timm VisionTransformer state dict -> big_vision ViT tree (patch-only `pos_embedding`).

  `where`, if given, receives {flax path: timm key} for tl.check_tree. Any tensor the
  converter does not place raises a CheckpointError naming it."""
  flat = with_zero_qkv_bias(flat)
  get = tl.Tensors(flat, source, hint)
  where = {} if where is None else where
  paths: dict[str, np.ndarray] = {}

  def put(path: str, value: np.ndarray, key: str) -> None:
    paths[path] = value
    where[path] = key

  emb = tl.torch_conv(get("patch_embed.proj.weight"),
                      get("patch_embed.proj.bias") if "patch_embed.proj.bias" in flat else None)
  put("embedding/kernel", emb["kernel"], "patch_embed.proj.weight")
  if "bias" in emb:
    put("embedding/bias", emb["bias"], "patch_embed.proj.bias")
  tokens: dict = {}
  if "cls_token" in flat:
    tokens["cls"] = get("cls_token")
  if "dist_token" in flat:
    tokens["dist"] = get("dist_token")
  if "reg_token" in flat:
    tokens["reg"] = get("reg_token")
  n_prefix = sum(np.shape(t)[1] for t in tokens.values())
  pe = _fold_prefix_posemb(tokens, get("pos_embed"), n_prefix)
  put("pos_embedding", pe, "pos_embed")
  for name, key in (("cls", "cls_token"), ("dist", "dist_token"), ("reg", "reg_token")):
    if name in tokens:
      put(name, tokens[name], key)
  for torch_name, path in _NORMS.items():
    if f"{torch_name}.weight" in flat:
      put(f"{path}/scale", get(f"{torch_name}.weight"), f"{torch_name}.weight")
      put(f"{path}/bias", get(f"{torch_name}.bias"), f"{torch_name}.bias")
  block_where: dict[str, str] = {}
  blocks = tl.convert_blocks(flat, BLOCKS, num_heads, BLOCK_NAMES, "encoderblock", source,
                             hint, where=block_where)
  paths.update({f"Transformer/{k}": a for k, a in blocks.items()})
  where.update({f"Transformer/{k}": key for k, key in block_where.items()})
  if "attn_pool.latent" in flat:
    k, v = tl.split_fused(get("attn_pool.kv.weight"), get("attn_pool.kv.bias"), 2)
    head = {
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
    paths.update({f"MAPHead_0/{k}": a for k, a in flatten(head).items()})
  if "head_dist.weight" in flat:   # distilled DeiT: (head(cls) + head_dist(dist)) / 2
    kernel = np.concatenate([tl.torch_dense(get("head.weight"))["kernel"],
                             tl.torch_dense(get("head_dist.weight"))["kernel"]], axis=0)
    put("head/kernel", kernel / 2, "head.weight")
    put("head/bias", (np.asarray(get("head.bias")) + np.asarray(get("head_dist.bias"))) / 2,
        "head.bias")
  elif "head.weight" in flat:
    put("head/kernel", tl.torch_dense(get("head.weight"))["kernel"], "head.weight")
    put("head/bias", get("head.bias"), "head.bias")
  get.check_all_used(BLOCKS, "timm VisionTransformer")
  return recover_tree(paths)

