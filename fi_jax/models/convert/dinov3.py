"""timm / official DINOv3 ViT state dicts -> fi_jax.models.dinov3 params.

timm (`vit_*_dinov3[_qkvb]`, timm's Eva): cls_token, reg_token (1, 4, D), patch_embed.proj,
blocks.<i>.{norm1, attn.qkv.weight, [attn.q_bias, attn.v_bias], attn.proj, gamma_1, norm2,
mlp.fc1 / mlp.fc2 or mlp.fc1_g / fc1_x / fc2, gamma_2}, norm; the RoPE periods are derived.
Official (facebookresearch/dinov3 `DinoVisionTransformer`): storage_tokens, mask_token
(pre-training only, dropped), rope_embed.periods (bfloat16-rounded, used as stored),
blocks.<i>.attn.qkv.{weight, bias, bias_mask} (`LinearKMaskedBias`: bias * bias_mask, the key
third masked to 0; the 7B has no qkv bias at all), ls1.gamma / ls2.gamma, mlp.w1 / w2 / w3
(SwiGLU), norm; `local_cls_norm` (the 7B's untied norm for local-crop class tokens, used only in
training: at inference `norm` normalises every token) is dropped. The 7B's ImageNet-1k linear
classifier (`dinov3_vit7b16_lc`, facebookresearch/dinov3 `dinov3/hub/classifiers.py`): a bare
`nn.Linear(8192, 1000)` state dict (`weight`, `bias`) in its own file, mapped to `head`.
"""
from __future__ import annotations

import re
from typing import Any, Mapping

import numpy as np

from fi_jax.models import _checkpoints as checkpoints
from fi_jax.models.convert import keymap

HINT = ("DINOv3 weights: https://huggingface.co/timm/vit_<size>_patch16_dinov3.lvd1689m "
        "(model.safetensors) or the official dinov3_<arch>_pretrain_lvd1689m-<hash>.pth "
        "(https://github.com/facebookresearch/dinov3: download links on request from Meta)")

HEAD_HINT = ("DINOv3's ImageNet-1k linear head: https://dl.fbaipublicfiles.com/dinov3/"
             "dinov3_vit7b16/dinov3_vit7b16_imagenet1k_linear_head-90d8ed92.pth (hubconf "
             "`dinov3_vit7b16_lc`; download links on request from Meta)")

_LN = {"scale": "weight", "bias": "bias"}
_OFFICIAL = {"storage_tokens": "reg_token", "ls1.gamma": "gamma_1", "ls2.gamma": "gamma_2",
             "mlp.w1.": "mlp.fc1_g.", "mlp.w2.": "mlp.fc1_x.", "mlp.w3.": "mlp.fc2."}
PERIODS = "rope_embed.periods"


def _official_to_timm(sd: Mapping[str, np.ndarray], init_params: Mapping[str, Any],
                      file: str) -> dict[str, np.ndarray]:
  """The official names -> timm's, the masked qkv bias -> q_bias / v_bias (a non-zero key
  bias, or a non-zero bias for a model built without biases, is refused)."""
  out = {}
  for k, v in sd.items():
    if k in ("mask_token",) or k.startswith("local_cls_norm.") or k.endswith(".bias_mask"):
      continue
    if k.endswith("attn.qkv.bias"):
      mask_key = k + "_mask"
      mask = np.asarray(sd[mask_key], np.float32) if mask_key in sd else np.ones(v.shape,
                                                                                  np.float32)
      q, kb, vb = np.split(np.asarray(v, np.float32) * mask, 3)
      if np.any(kb != 0):
        raise checkpoints.CheckpointError(
            f"{file} (DINOv3): {k!r} has a non-zero key bias after its bias_mask; DINOv3's "
            f"attention has none (LinearKMaskedBias). {HINT}.")
      block = k.split(".")[1]
      if "q_bias" in init_params[f"blocks_{block}"]["attn"]:
        out[k.replace("qkv.bias", "q_bias")], out[k.replace("qkv.bias", "v_bias")] = q, vb
      elif np.any(q != 0) or np.any(vb != 0):
        raise checkpoints.CheckpointError(
            f"{file} (DINOv3): {k!r} holds non-zero query / value biases but the model was "
            f"built without (qkv_bias=False): use a *_qkvb / official variant. {HINT}.")
      continue
    for a, b in _OFFICIAL.items():
      k = k.replace(a, b)
    out[k] = v
  return out


def key_map(init_params: Mapping[str, Any]) -> dict[str, tuple[str, Any]]:
  """{flax leaf path: (timm key, transform)} for every leaf of `init_params`."""
  spec = {"cls_token": ("cls_token", keymap.same), "reg_token": ("reg_token", keymap.same),
          "rope_periods": (PERIODS, keymap.same),
          "patch_embed/kernel": ("patch_embed.proj.weight", keymap.conv),
          "patch_embed/bias": ("patch_embed.proj.bias", keymap.same)}
  for f, t in _LN.items():
    spec[f"norm/{f}"] = (f"norm.{t}", keymap.same)
  for path in checkpoints.flatten(init_params):
    m = re.fullmatch(r"blocks_(\d+)/(.+)/(kernel|bias|scale)", path)
    if m:
      key = f"blocks.{m[1]}.{m[2].replace('/', '.')}"
      if m[3] == "kernel":
        spec[path] = (f"{key}.weight", keymap.dense)
      else:
        spec[path] = (f"{key}.{'weight' if m[3] == 'scale' else 'bias'}", keymap.same)
    elif m := re.fullmatch(r"blocks_(\d+)/(.+)", path):
      spec[path] = (f"blocks.{m[1]}.{m[2].replace('/', '.')}", keymap.same)
  if "head" in init_params:
    spec["head/kernel"] = ("head.weight", keymap.dense)
    spec["head/bias"] = ("head.bias", keymap.same)
  return spec


def split_classifier(sd: Mapping[str, np.ndarray], head: Mapping[str, np.ndarray] | None,
                     init_params: Mapping[str, Any], file: str) -> dict[str, np.ndarray]:
  """The backbone state dict with the linear head as `head.weight` / `head.bias`: from `head`
  (the official head file, `weight` / `bias`) or from a combined file (`backbone.*`,
  `linear_head.*`: the official `_LinearClassifierWrapper`) or, as before, a file's own
  `head.*`. A model with a head needs one; a head for a headless model is refused."""
  if any(k.startswith("backbone.") for k in sd):
    combined = {k[len("linear_head."):]: v for k, v in sd.items()
                if k.startswith("linear_head.")}
    sd = {k[len("backbone."):]: v for k, v in sd.items() if k.startswith("backbone.")}
    if combined and head is not None:
      raise checkpoints.CheckpointError(
          f"{file} (DINOv3): the backbone file already holds a linear head (linear_head.*) and "
          f"a separate head file was given too: pass one of them.")
    head = combined or head
  sd = dict(sd)
  if head is not None:
    if set(head) != {"weight", "bias"}:
      raise checkpoints.CheckpointError(
          f"{file} (DINOv3): a linear head file holds exactly 'weight' and 'bias' (an "
          f"nn.Linear state dict), got keys {sorted(head)[:6]}. {HEAD_HINT}.")
    if "head" not in init_params:
      raise checkpoints.CheckpointError(
          f"{file} (DINOv3): a linear head was given but the model is headless (num_classes "
          f"0): use the classifier variant (dinov3_vit7b16_lc, num_classes=1000).")
    sd["head.weight"], sd["head.bias"] = head["weight"], head["bias"]
  elif "head" in init_params and "head.weight" not in sd:
    raise checkpoints.CheckpointError(
        f"{file} (DINOv3): the linear classifier needs its head file as well as the backbone: "
        f"pass {{'backbone': <backbone .pth>, 'head': <head .pth>}}. {HEAD_HINT}.")
  return sd


def convert(sd: Mapping[str, np.ndarray], init_params: Mapping[str, Any], *,
            file: str = "checkpoint", head: Mapping[str, np.ndarray] | None = None) -> dict:
  """A timm or official DINOv3 state dict (and, for the linear classifier, its head: see
  `split_classifier`) -> params on `init_params`' tree."""
  sd = split_classifier(sd, head, init_params, file)
  official = "storage_tokens" in sd
  sd = _official_to_timm(sd, init_params, file) if official else dict(sd)
  if PERIODS not in sd:   # timm derives them (float32); the official files store them
    sd[PERIODS] = _derived_periods(init_params)
  return keymap.apply(sd, key_map(init_params), init_params,
                      source=f"{file} ({'official' if official else 'timm'} DINOv3)",
                      hint=HINT + ".")


def _derived_periods(init_params: Mapping[str, Any]) -> np.ndarray:
  """timm's float32 periods 100^(2i / (head_dim / 2)) (base 100: every DINOv3 ViT)."""
  n = np.shape(init_params["rope_periods"])[0]   # head_dim // 4
  exponents = 2.0 * np.arange(n, dtype=np.float32) / np.float32(2 * n)
  return (np.float32(100.0) ** exponents).astype(np.float32)
