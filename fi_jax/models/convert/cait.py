"""timm `Cait` state dicts -> fi_jax.models.cait params.

timm keys: patch_embed.proj.{weight, bias}; pos_embed (1, h*w, D); cls_token;
blocks.<i>.{norm1, norm2, gamma_1, gamma_2, attn.qkv, attn.proj_l, attn.proj_w, attn.proj,
mlp.fc1, mlp.fc2}; blocks_token_only.<i>.{norm1, norm2, gamma_1, gamma_2, attn.q, attn.k,
attn.v, attn.proj, mlp.fc1, mlp.fc2}; norm; head. The official (facebookresearch/deit) files
hold the same names under `model`, possibly with a `module.` prefix (timm's
checkpoint_filter_fn strips both).
"""
from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from fi_jax.models.convert import keymap

HINT = "CaiT weights: https://huggingface.co/timm/<model>.<tag> (model.safetensors)"

_LEAF = {"kernel": ("weight", keymap.dense), "bias": ("bias", keymap.same),
         "scale": ("weight", keymap.same)}


def _flat(tree: Mapping[str, Any], prefix: str = "") -> list[str]:
  out = []
  for k, v in tree.items():
    out += _flat(v, f"{prefix}{k}/") if isinstance(v, Mapping) else [prefix + k]
  return out


def key_map(init_params: Mapping[str, Any]) -> dict[str, tuple[str, Any]]:
  """{flax leaf path: (timm key, transform)}: the module tree mirrors timm's names."""
  spec = {}
  for path in _flat(init_params):
    *mods, leaf = path.split("/")
    if mods == ["patch_embed"]:
      spec[path] = (f"patch_embed.proj.{'weight' if leaf == 'kernel' else 'bias'}",
                    keymap.conv if leaf == "kernel" else keymap.same)
    elif not mods or leaf in ("gamma_1", "gamma_2"):
      spec[path] = (".".join([*(_torch_name(m) for m in mods), leaf]), keymap.same)
    else:
      name, fn = _LEAF[leaf]
      spec[path] = (".".join([*(_torch_name(m) for m in mods), name]), fn)
  return spec


def _torch_name(module: str) -> str:
  """blocks_3 -> blocks.3, blocks_token_only_1 -> blocks_token_only.1."""
  head, _, index = module.rpartition("_")
  return f"{head}.{index}" if head.startswith("blocks") and index.isdigit() else module


def convert(sd: Mapping[str, np.ndarray], init_params: Mapping[str, Any], *,
            file: str = "checkpoint") -> dict:
  """A timm / official CaiT state dict -> params on `init_params`' tree (a model built without
  a head drops the file's)."""
  sd = {k.removeprefix("module."): v for k, v in sd.items()}
  skip = () if "head" in init_params else ("head.weight", "head.bias")
  return keymap.apply(sd, key_map(init_params), init_params, source=f"{file} (CaiT)",
                      hint=HINT + ".", skip=skip)
