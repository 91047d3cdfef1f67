"""timm EVA-02 state dicts -> fi_jax.models.eva params.

timm keys: cls_token; pos_embed (1, 1 + h*w, D); patch_embed.proj.{weight, bias};
blocks.<i>.{norm1, norm2, attn.qkv.weight + attn.q_bias + attn.v_bias (tiny / small) or
attn.{q_proj, k_proj (no bias), v_proj}, attn.norm (CLIP towers only), attn.proj,
mlp.fc1 (GluMlp) or mlp.{fc1_g, fc1_x, norm} (SwiGLU with sub-LN), mlp.fc2}; fc_norm; head.
The RoPE tables are derived, never stored (timm's are non-persistent buffers).
"""
from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from fi_jax.models import _checkpoints as checkpoints
from fi_jax.models.convert import keymap

HINT = ("EVA-02 weights: https://huggingface.co/timm/eva02_<size>_patch14_<res>.<tag> "
        "(model.safetensors)")

_LN = {"scale": "weight", "bias": "bias"}


def key_map(init_params: Mapping[str, Any]) -> dict[str, tuple[str, Any]]:
  """{flax leaf path: (timm key, transform)} for every leaf of `init_params`, following the
  module tree (fused or separate qkv, GluMlp or SwiGLU, optional norms)."""
  spec = {"cls_token": ("cls_token", keymap.same), "pos_embed": ("pos_embed", keymap.same),
          "patch_embed/kernel": ("patch_embed.proj.weight", keymap.conv),
          "patch_embed/bias": ("patch_embed.proj.bias", keymap.same)}

  def dense(path, key, tree):
    spec[f"{path}/kernel"] = (f"{key}.weight", keymap.dense)
    if "bias" in tree:
      spec[f"{path}/bias"] = (f"{key}.bias", keymap.same)

  def norm(path, key):
    for f, t in _LN.items():
      spec[f"{path}/{f}"] = (f"{key}.{t}", keymap.same)

  depth = sum(1 for k in init_params if k.startswith("blocks_"))
  for i in range(depth):
    p, t, block = f"blocks_{i}", f"blocks.{i}", init_params[f"blocks_{i}"]
    norm(f"{p}/norm1", f"{t}.norm1")
    norm(f"{p}/norm2", f"{t}.norm2")
    for name, sub in block["attn"].items():
      if name in ("q_bias", "v_bias"):
        spec[f"{p}/attn/{name}"] = (f"{t}.attn.{name}", keymap.same)
      elif name == "norm":
        norm(f"{p}/attn/norm", f"{t}.attn.norm")
      else:
        dense(f"{p}/attn/{name}", f"{t}.attn.{name}", sub)
    for name, sub in block["mlp"].items():
      if name == "norm":
        norm(f"{p}/mlp/norm", f"{t}.mlp.norm")
      else:
        dense(f"{p}/mlp/{name}", f"{t}.mlp.{name}", sub)
  norm("fc_norm", "fc_norm")
  if "head" in init_params:
    dense("head", "head", init_params["head"])
  return spec


def convert(sd: Mapping[str, np.ndarray], init_params: Mapping[str, Any], *,
            file: str = "checkpoint") -> dict:
  """A timm EVA-02 state dict -> params on `init_params`' tree (a model built without a head
  drops the file's). A position embedding for another patch grid is refused with the grids."""
  want, have = np.shape(init_params["pos_embed"]), np.shape(sd.get("pos_embed", ()))
  if len(have) == 3 and have != tuple(want):
    side = lambda n: int(round(np.sqrt(n - 1)))
    raise checkpoints.CheckpointError(
        f"{file} (EVA-02): pos_embed {have} is for a {side(have[1])}x{side(have[1])} patch "
        f"grid, the model was initialised for {side(want[1])}x{side(want[1])} ({want}): "
        f"initialise it at the weights' input size (zoo `input_size`). {HINT}.")
  skip = () if "head" in init_params else ("head.weight", "head.bias")
  return keymap.apply(sd, key_map(init_params), init_params, source=f"{file} (EVA-02)",
                      hint=HINT + ".", skip=skip)
