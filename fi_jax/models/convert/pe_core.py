"""PE-Core state dicts -> fi_jax.models.pe_core trees (flat, unrolled blocks).

Three layouts (facts from facebookresearch/perception_models @ 3e352cc `core/vision_encoder/pe.py`,
timm 1.0.31 `models/eva.py` `_convert_pe`, open_clip 3.3.0 `PE-Core-*` configs):

- official (`PE-Core-B16-224.pt`, the `CLIP` module's state dict): `visual.conv1.weight`,
  `visual.class_embedding` (W,), `visual.positional_embedding` (N, W), `visual.ln_pre`,
  `visual.transformer.resblocks.{i}.{ln_1, attn.in_proj_weight/bias, attn.out_proj, ls_1.gamma,
  ln_2, mlp.c_fc, mlp.c_proj, ls_2.gamma}`, `visual.ln_post`, `visual.attn_pool.{probe,
  attn.in_proj_weight/bias, attn.out_proj, layernorm, mlp.c_fc, mlp.c_proj}`, `visual.proj`
  (W, E); the text tower at the top level as CLIP's (`token_embedding`, `positional_embedding`,
  `transformer.resblocks.*`, `ln_final`, `text_projection`) and `logit_scale`.
- timm (`vit_pe_core_*`, the vision tower only): `patch_embed.proj.weight`, `cls_token`
  (1,1,W), `pos_embed` (1,N,W), `norm_pre`, `blocks.{i}.{norm1, attn.qkv, attn.proj, gamma_1,
  norm2, mlp.fc1, mlp.fc2, gamma_2}`, `norm`, `attn_pool.{latent, q, kv, proj, norm, mlp.fc1,
  mlp.fc2}`, `head.weight` (E, W) and `head.bias` (zeros: the official projection has no bias).
- open_clip (`PE-Core-*`): timm's names under `visual.trunk.`, the text tower under `text.`
  (CLIP's names) and `logit_scale`.
"""
from __future__ import annotations

import re
from typing import Mapping

import numpy as np

from fi_jax.models._checkpoints import CheckpointError
from fi_jax.models._releases import CLIP_DOWNLOAD_HINT, PE_CORE_DOWNLOAD_HINT
from fi_jax.models.convert import openclip
from fi_jax.models.convert import torch_layers as tl

_LN = {"weight": "scale", "bias": "bias"}
_POOL = "img/MAPHead_0"
_MHA = tl.MHA

# torch sub-module of one vision block -> vit.Encoder1DBlock-named target (tl.convert_block)
OFFICIAL_BLOCK = {"ln_1": "LayerNorm_0", "ln_2": "LayerNorm_1", "attn.in_proj": "qkv",
                  "attn.out_proj": "out", "mlp.c_fc": "MlpBlock_0/Dense_0",
                  "mlp.c_proj": "MlpBlock_0/Dense_1", "ls_1": "LayerScale_0", "ls_2": "LayerScale_1"}
TIMM_BLOCK = {"norm1": "LayerNorm_0", "norm2": "LayerNorm_1", "attn.qkv": "qkv",
              "attn.proj": "out", "mlp.fc1": "MlpBlock_0/Dense_0", "mlp.fc2": "MlpBlock_0/Dense_1"}


def _dense(prefix: str, w: np.ndarray, b: np.ndarray | None = None) -> dict:
  return {f"{prefix}/{k}": v for k, v in tl.torch_dense(w, b).items()}


def _pool_attention(q: tuple, k: tuple, v: tuple, o: tuple, heads: int) -> dict:
  att = tl.torch_attention(q, k, v, o, heads)
  return {f"{_POOL}/{_MHA}/{n}/{leaf}": a for n, d in att.items() for leaf, a in d.items()}


def _timm_gammas(flat: Mapping[str, np.ndarray]) -> dict:
  """timm's `blocks.{i}.gamma_{1,2}` -> `ls_{1,2}.gamma`-style keys convert_block places."""
  out = {}
  for k, v in flat.items():
    m = re.fullmatch(r"blocks\.(\d+)\.gamma_([12])", k)
    out[f"blocks.{m[1]}.ls_{m[2]}.gamma" if m else k] = v
  return out


def _vision_official(t: tl.Tensors, heads: Mapping[str, int]) -> dict:
  flat = tl.convert_blocks(t.flat, r"visual\.transformer\.resblocks\.(\d+)\.(.+)", heads["img"],
                           OFFICIAL_BLOCK, "img/Transformer/encoderblock", "PE-Core",
                           PE_CORE_DOWNLOAD_HINT)
  flat["img/embedding/kernel"] = tl.torch_conv(t("visual.conv1.weight"))["kernel"]
  if "visual.class_embedding" in t:
    flat["img/cls"] = t("visual.class_embedding").reshape(1, 1, -1)
  flat["img/pos_embedding"] = t("visual.positional_embedding")[None]
  for src, dst in (("ln_pre", "img/ln_pre"), ("ln_post", "img/Transformer/encoder_norm"),
                   ("attn_pool.layernorm", f"{_POOL}/LayerNorm_0")):
    for leaf in ("weight", "bias"):
      flat[f"{dst}/{_LN[leaf]}"] = t(f"visual.{src}.{leaf}")
  p = "visual.attn_pool."
  flat[f"{_POOL}/probe"] = t(p + "probe")
  qkv = tl.split_fused(t(p + "attn.in_proj_weight"), t(p + "attn.in_proj_bias"))
  flat.update(_pool_attention(*qkv, (t(p + "attn.out_proj.weight"), t(p + "attn.out_proj.bias")),
                              heads["pool"]))
  for i, name in enumerate(("c_fc", "c_proj")):
    flat.update(_dense(f"{_POOL}/MlpBlock_0/Dense_{i}", t(f"{p}mlp.{name}.weight"),
                       t(f"{p}mlp.{name}.bias")))
  flat["img/head/kernel"] = t("visual.proj")
  return flat


def _vision_timm(t: tl.Tensors, heads: Mapping[str, int], pre: str) -> dict:
  flat = tl.convert_blocks(_timm_gammas({k[len(pre):]: v for k, v in t.flat.items()
                                         if k.startswith(pre + "blocks.")}),
                           r"blocks\.(\d+)\.(.+)", heads["img"], {**TIMM_BLOCK,
                           "ls_1": "LayerScale_0", "ls_2": "LayerScale_1"},
                           "img/Transformer/encoderblock", "PE-Core (timm)", PE_CORE_DOWNLOAD_HINT)
  flat["img/embedding/kernel"] = tl.torch_conv(t(pre + "patch_embed.proj.weight"))["kernel"]
  if pre + "cls_token" in t:
    flat["img/cls"] = t(pre + "cls_token").reshape(1, 1, -1)
  flat["img/pos_embedding"] = t(pre + "pos_embed").reshape(1, -1, t(pre + "pos_embed").shape[-1])
  for src, dst in (("norm_pre", "img/ln_pre"), ("norm", "img/Transformer/encoder_norm"),
                   ("attn_pool.norm", f"{_POOL}/LayerNorm_0")):
    for leaf in ("weight", "bias"):
      flat[f"{dst}/{_LN[leaf]}"] = t(f"{pre}{src}.{leaf}")
  p = pre + "attn_pool."
  flat[f"{_POOL}/probe"] = t(p + "latent")
  k, v = tl.split_fused(t(p + "kv.weight"), t(p + "kv.bias"), 2)
  flat.update(_pool_attention((t(p + "q.weight"), t(p + "q.bias")), k, v,
                              (t(p + "proj.weight"), t(p + "proj.bias")), heads["pool"]))
  for i in (1, 2):
    flat.update(_dense(f"{_POOL}/MlpBlock_0/Dense_{i - 1}", t(f"{p}mlp.fc{i}.weight"),
                       t(f"{p}mlp.fc{i}.bias")))
  flat["img/head/kernel"] = t(pre + "head.weight").T
  if pre + "head.bias" in t and np.any(t(pre + "head.bias") != 0):
    raise CheckpointError(
        f"{t.source}: {pre}head.bias is not zero; PE-Core's projection has no bias (timm's "
        f"converted files store zeros), so this is not a PE-Core file. {PE_CORE_DOWNLOAD_HINT}")
  return flat


def to_flat(sd: Mapping[str, np.ndarray], heads: Mapping[str, int], source: str) -> dict:
  """A PE-Core state dict in any of the three layouts -> flat {flax path: array}; `heads` =
  {"img": vision heads, "txt": text heads, "pool": attention-pooling heads}. A key the layout
  does not have raises one CheckpointError naming it."""
  sd = dict(sd)
  for wrapper in ("weights.",):   # the official loader also unwraps "weights"
    if sd and all(k.startswith(wrapper) for k in sd):
      sd = {k[len(wrapper):]: v for k, v in sd.items()}
  if "visual.conv1.weight" in sd:
    vision_keys = [k for k in sd if k.startswith("visual.")]
    t = tl.Tensors({k: sd[k] for k in vision_keys}, source, PE_CORE_DOWNLOAD_HINT)
    flat = _vision_official(t, heads)
    block = r"visual\.transformer\.resblocks\.\d+\..+"
  else:
    pre = "visual.trunk." if "visual.trunk.patch_embed.proj.weight" in sd else ""
    if pre + "patch_embed.proj.weight" not in sd:
      raise CheckpointError(
          f"{source}: not a PE-Core checkpoint (neither the official 'visual.conv1.weight' nor "
          f"timm's 'patch_embed.proj.weight' is in it; it has e.g. {sorted(sd)[:4]}). "
          f"{PE_CORE_DOWNLOAD_HINT}")
    vision_keys = [k for k in sd if k.startswith(pre)] if pre else [
        k for k in sd if not k.startswith(("text.", "logit_scale"))]
    t = tl.Tensors({k: sd[k] for k in vision_keys}, source, PE_CORE_DOWNLOAD_HINT)
    flat = _vision_timm(t, heads, pre)
    t.used.update(k for k in vision_keys if k.startswith(pre + "blocks."))
    if pre + "head.bias" in t:
      t.used.add(pre + "head.bias")
    block = ""
  t.check_all_used(block, "PE-Core vision tower")
  rest = {k: v for k, v in sd.items() if k not in set(vision_keys)}
  if rest:   # the text tower and logit_scale: CLIP's names (open_clip: under "text.")
    try:
      flat.update(openclip.clip(rest, {"img": heads["img"], "txt": heads["txt"]}))
    except CheckpointError as e:   # CLIP's converter names CLIP's downloads: name PE-Core's
      raise CheckpointError(f"{source}: " + str(e).replace("the CLIP checkpoint", "the PE-Core "
                            "checkpoint").replace(CLIP_DOWNLOAD_HINT, PE_CORE_DOWNLOAD_HINT)) from None
  return flat
