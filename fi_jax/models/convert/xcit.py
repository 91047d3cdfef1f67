"""timm `Xcit` state dicts -> fi_jax.models.xcit params.

timm keys: patch_embed.proj.<2i>.{0.weight (conv), 1.{weight, bias, running_mean,
running_var, num_batches_tracked} (BatchNorm)}; pos_embed.token_projection.{weight, bias};
cls_token; blocks.<i>.{norm1, attn.{qkv, temperature, proj}, norm3, local_mp.{conv1, bn,
conv2}, norm2, mlp.{fc1, fc2}, gamma1, gamma3, gamma2}; cls_attn_blocks.<i>.{norm1,
attn.{q, k, v, proj}, norm2, mlp, gamma1, gamma2}; norm; head. The official
(facebookresearch/xcit) files name the encoding `pos_embeder` and fuse the class attention's
q / k / v into `qkv`: both are converted as timm's checkpoint_filter_fn does.
"""
from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from fi_jax.models.convert import keymap

HINT = "XCiT weights: https://huggingface.co/timm/<model>.<tag> (model.safetensors)"

_LEAF = {"kernel": ("weight", keymap.dense), "bias": ("bias", keymap.same),
         "scale": ("weight", keymap.same), "mean": ("running_mean", keymap.same),
         "var": ("running_var", keymap.same)}


def _flat(tree: Mapping[str, Any], prefix: str = "") -> list[str]:
  out = []
  for k, v in tree.items():
    out += _flat(v, f"{prefix}{k}/") if isinstance(v, Mapping) else [prefix + k]
  return out


def _module(m: str) -> str:
  """flax module name -> timm's: blocks_3 -> blocks.3, stem_1_conv -> patch_embed.proj.2.0,
  stem_1_bn -> patch_embed.proj.2.1, pos_embed -> pos_embed.token_projection."""
  if m.startswith("stem_"):
    _, i, kind = m.split("_")
    return f"patch_embed.proj.{2 * int(i)}.{0 if kind == 'conv' else 1}"
  if m == "pos_embed":
    return "pos_embed.token_projection"
  head, _, index = m.rpartition("_")
  return f"{head}.{index}" if head in ("blocks", "cls_attn_blocks") else m


def key_map(init_params: Mapping[str, Any]) -> dict[str, tuple[str, Any]]:
  """{flax leaf path: (timm key, transform)}: the module tree mirrors timm's names."""
  spec = {}
  for path in _flat(init_params):
    *mods, leaf = path.split("/")
    prefix = ".".join(_module(m) for m in mods)
    if not mods or leaf in ("gamma1", "gamma2", "gamma3", "temperature"):
      spec[path] = (f"{prefix}.{leaf}" if mods else leaf, keymap.same)
    elif leaf == "kernel" and (mods[-1].startswith(("stem_", "conv")) or mods[-1] == "pos_embed"):
      spec[path] = (f"{prefix}.weight", keymap.conv)
    else:
      name, fn = _LEAF[leaf]
      spec[path] = (f"{prefix}.{name}", fn)
  return spec


def _from_official(sd: Mapping[str, np.ndarray]) -> dict:
  """`pos_embeder.` -> `pos_embed.`; class attention `attn.qkv` -> `attn.{q, k, v}`."""
  out = {}
  for k, v in sd.items():
    k = k.replace("pos_embeder.", "pos_embed.")
    if k.startswith("cls_attn_blocks.") and ".attn.qkv." in k:
      for part, name in zip(np.split(np.asarray(v), 3, axis=0), "qkv"):
        out[k.replace(".attn.qkv.", f".attn.{name}.")] = part
    else:
      out[k] = v
  return out


def convert(sd: Mapping[str, np.ndarray], init_params: Mapping[str, Any], *,
            file: str = "checkpoint") -> dict:
  """A timm / official XCiT state dict -> params on `init_params`' tree (a model built
  without a head drops the file's; BatchNorm `num_batches_tracked` counters are dropped)."""
  sd = _from_official(sd)
  skip = tuple(k for k in sd if k.endswith("num_batches_tracked"))
  if "head" not in init_params:
    skip += ("head.weight", "head.bias")
  return keymap.apply(sd, key_map(init_params), init_params, source=f"{file} (XCiT)",
                      hint=HINT + ".", skip=skip)
