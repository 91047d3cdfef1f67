"""timm `Eva` state dicts (EVA-02, EVA-01 giant, NAVER / SBB RoPE ViTs) -> fi_jax.models.eva
params.

timm keys: cls_token; reg_token (1, R, D); pos_embed (1, [prefix +] h*w, D); rope.freqs
(2, depth, heads, head_dim/2; RoPE-Mixed only); patch_embed.proj.{weight, bias};
blocks.<i>.{norm1, norm2, gamma_1, gamma_2 (layer scale), attn.qkv.weight + attn.q_bias +
attn.v_bias (EvaAttention) or attn.qkv.{weight, bias} (AttentionRope) or
attn.{q_proj, k_proj (no bias), v_proj}, attn.norm (CLIP towers only), attn.proj, mlp.fc1
(GluMlp / Mlp) or mlp.{fc1_g, fc1_x, norm} (SwiGLU with sub-LN), mlp.fc2}; norm (token
pooling) or fc_norm (mean pooling); head. The fixed RoPE tables are derived, never stored
(timm's are non-persistent buffers).

A `pos_embed` for another patch grid than the model's is resampled as timm's
`resample_abs_pos_embed` does when it loads a checkpoint at another `img_size` (timm 1.0.31
`layers/pos_embed.py`): the class / register slots kept, the patch grid resized with torch's
bicubic `F.interpolate(antialias=True)` (`fi_jax.models._posemb.resize_posemb`).
"""
from __future__ import annotations

import logging
from typing import Any, Mapping

import numpy as np

from fi_jax.models import _checkpoints as checkpoints
from fi_jax.models import _posemb as posemb
from fi_jax.models.convert import keymap

HINT = ("timm Eva weights: https://huggingface.co/timm/<model>.<tag> (model.safetensors)")

_LN = {"scale": "weight", "bias": "bias"}
_LOG = logging.getLogger(__name__)


def key_map(init_params: Mapping[str, Any]) -> dict[str, tuple[str, Any]]:
  """{flax leaf path: (timm key, transform)} for every leaf of `init_params`, following the
  module tree (fused or separate qkv, GluMlp / SwiGLU / GELU Mlp, optional norms, layer scale,
  tokens, posemb and learned RoPE frequencies when the model has them)."""
  spec = {"patch_embed/kernel": ("patch_embed.proj.weight", keymap.conv),
          "patch_embed/bias": ("patch_embed.proj.bias", keymap.same)}
  for name, key in (("cls_token", "cls_token"), ("reg_token", "reg_token"),
                    ("pos_embed", "pos_embed"), ("rope_freqs", "rope.freqs")):
    if name in init_params:
      spec[name] = (key, keymap.same)

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
    for name in ("gamma_1", "gamma_2"):
      if name in block:
        spec[f"{p}/{name}"] = (f"{t}.{name}", keymap.same)
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
  for name in ("norm", "fc_norm"):
    if name in init_params:
      norm(name, name)
  if "head" in init_params:
    dense("head", "head", init_params["head"])
  return spec


def _square_side(n: int) -> int:
  side = int(round(np.sqrt(max(n, 0))))
  return side if side * side == n else -1


def resample_pos_embed(pe: np.ndarray, want: tuple, num_prefix: int, file: str) -> np.ndarray:
  """A (1, [prefix +] m*m, D) `pos_embed` onto the model's (1, [prefix +] g*g, D): timm's
  `resample_abs_pos_embed` (bicubic, antialias, prefix slots kept). Which layout the model has
  (slots for its `num_prefix` class / register tokens or patches only) is read from the two
  token counts; a non-square grid or a width mismatch is refused."""
  have = tuple(np.shape(pe))
  if len(have) != 3 or have[2] != want[2]:
    raise checkpoints.CheckpointError(
        f"{file} (Eva): pos_embed {have} does not fit the model's {want}: a model of another "
        f"width? {HINT}.")
  for p in dict.fromkeys((num_prefix, 0)):
    m, g = _square_side(have[1] - p), _square_side(want[1] - p)
    if m > 0 and g > 0:
      break
  else:
    raise checkpoints.CheckpointError(
        f"{file} (Eva): pos_embed {have} and the model's {want} are not both square patch "
        f"grids (with {num_prefix} or 0 class / register slots), so the posemb cannot be "
        f"resampled: initialise the model at a square input size. {HINT}.")
  out = posemb.resize_posemb(np.asarray(pe, np.float32), (g, g), antialias=True, prefix=p)
  _LOG.warning("%s: resampled pos_embed from a %dx%d to a %dx%d patch grid (timm's bicubic "
               "resample_abs_pos_embed).", file, m, m, g, g)
  return np.asarray(out, np.float32)


def convert(sd: Mapping[str, np.ndarray], init_params: Mapping[str, Any], *,
            file: str = "checkpoint") -> dict:
  """A timm Eva state dict -> params on `init_params`' tree (a model built without a head
  drops the file's). A position embedding for another patch grid is resampled to the model's
  (`resample_pos_embed`)."""
  sd = dict(sd)
  if "pos_embed" in init_params and "pos_embed" in sd:
    want = tuple(np.shape(init_params["pos_embed"]))
    if tuple(np.shape(sd["pos_embed"])) != want:
      num_prefix = int("cls_token" in init_params) + (
          np.shape(init_params["reg_token"])[1] if "reg_token" in init_params else 0)
      sd["pos_embed"] = resample_pos_embed(sd["pos_embed"], want, num_prefix, file)
  skip = () if "head" in init_params else ("head.weight", "head.bias")
  return keymap.apply(sd, key_map(init_params), init_params, source=f"{file} (Eva)",
                      hint=HINT + ".", skip=skip)
