"""PyTorch layers -> Flax params: the one converter of a pre-LN transformer block and its parts.

Every PyTorch-born family (timm ViT, HF SigLIP, open_clip, DINOv2) names a block's tensors
differently; a family's key map (`names`: torch sub-module -> Flax target) is all that differs,
and `convert_block` turns each tensor into the params of `vit.Encoder1DBlock`. torch Linear
weights are (out, in), Flax Dense kernels (in, out); attention kernels are split per head.
"""
from __future__ import annotations

import re
from typing import Any, Mapping, Optional, Sequence

import jax
import numpy as np

from fi_jax.models.checkpoints import (CheckpointError, flatten, match_scan, merge_params,
                                       recover_tree)

MHA = "MultiHeadDotProductAttention_0"


def torch_dense(w: np.ndarray, b: Optional[np.ndarray] = None) -> dict:
  """torch Linear (out, in) -> flax Dense {'kernel': (in, out), 'bias'}."""
  out = {"kernel": np.asarray(w).T}
  if b is not None:
    out["bias"] = np.asarray(b)
  return out


def torch_layernorm(w: np.ndarray, b: np.ndarray) -> dict:
  """torch LayerNorm (weight, bias) -> flax {'scale', 'bias'}."""
  return {"scale": np.asarray(w), "bias": np.asarray(b)}


def torch_conv(w: np.ndarray, b: Optional[np.ndarray] = None) -> dict:
  """torch Conv2d (out, in, kh, kw) -> flax Conv kernel (kh, kw, in, out)."""
  out = {"kernel": np.transpose(np.asarray(w), (2, 3, 1, 0))}
  if b is not None:
    out["bias"] = np.asarray(b)
  return out


def _heads_kernel(w: np.ndarray, num_heads: int) -> np.ndarray:
  """torch (out, in) q/k/v weight -> Flax (in, heads, out / heads)."""
  return w.T.reshape(w.shape[1], num_heads, w.shape[0] // num_heads)


def _heads_bias(b: np.ndarray, num_heads: int) -> np.ndarray:
  return b.reshape(num_heads, b.shape[0] // num_heads)


def _out_kernel(w: np.ndarray, num_heads: int) -> np.ndarray:
  """torch (out, in) output projection -> Flax (heads, in / heads, out)."""
  return w.T.reshape(num_heads, w.shape[1] // num_heads, w.shape[0])


def torch_attention(q: tuple, k: tuple, v: tuple, o: tuple, num_heads: int) -> dict:
  """torch q/k/v/out projections, each (weight (out, in), bias) -> flax
  MultiHeadDotProductAttention params: query/key/value kernel (D, H, D/H), bias (H, D/H);
  out kernel (H, D/H, D), bias (D,)."""
  def qkv(w, b):
    w, b = np.asarray(w), np.asarray(b)
    if w.shape[0] % num_heads:
      raise CheckpointError(f"Attention width {w.shape[0]} is not divisible by num_heads={num_heads}.")
    return {"kernel": _heads_kernel(w, num_heads), "bias": _heads_bias(b, num_heads)}
  w_o, b_o = np.asarray(o[0]), np.asarray(o[1])
  return {"query": qkv(*q), "key": qkv(*k), "value": qkv(*v),
          "out": {"kernel": _out_kernel(w_o, num_heads), "bias": b_o}}


def split_fused(w: np.ndarray, b: np.ndarray, n: int = 3) -> list[tuple[np.ndarray, np.ndarray]]:
  """A fused (n*D, D) projection (timm qkv, torch in_proj) -> n (weight, bias) pairs."""
  return list(zip(np.split(np.asarray(w), n, axis=0), np.split(np.asarray(b), n, axis=0)))


class Tensors:
  """Flat torch-named tensors; `t(name)` returns one or raises a CheckpointError naming it."""

  def __init__(self, flat: Mapping[str, np.ndarray], source: str, hint: str = ""):
    self.flat, self.source, self.hint = flat, source, hint

  def __contains__(self, name: str) -> bool:
    return name in self.flat

  def __call__(self, name: str) -> np.ndarray:
    if name not in self.flat:
      raise CheckpointError(
          f"{self.source}: expected tensor {name!r} is missing (the file has e.g. "
          f"{sorted(self.flat)[:4]}). {self.hint}".strip())
    return np.asarray(self.flat[name])


# ----------------------------------------------------------------------------- blocks

_QKV = {"q": "query", "k": "key", "v": "value"}


def convert_block(sub: str, v: np.ndarray, num_heads: int, names: Mapping[str, str]
                  ) -> Optional[dict[str, np.ndarray]]:
  """One torch transformer-block tensor -> {flax sub-path: array} for vit.Encoder1DBlock.

  `sub`: the tensor's name inside the block ('attn.qkv.weight'); `names`: torch sub-module ->
  target, one of 'LayerNorm_{0,1}', 'qkv' (fused, incl. nn.MultiheadAttention's in_proj_*),
  'q' / 'k' / 'v' (separate projections), 'out', 'MlpBlock_0/Dense_{0,1}', 'LayerScale_{0,1}'.
  None for a tensor the block does not have or whose width `num_heads` does not divide.
  """
  v = np.asarray(v)
  module, _, leaf = sub.rpartition(".")
  if leaf in ("in_proj_weight", "in_proj_bias"):       # nn.MultiheadAttention fused qkv
    module, leaf = f"{module}.in_proj", leaf[len("in_proj_"):]
  target = names.get(module)
  if target is None or leaf not in ("weight", "bias", "gamma"):
    return None
  if target in ("qkv", "q", "k", "v"):
    fused = target == "qkv"
    if v.shape[0] % ((3 if fused else 1) * num_heads):
      return None
    parts = np.split(v, 3, axis=0) if fused else [v]
    outs = ("query", "key", "value") if fused else (_QKV[target],)
    if leaf == "weight":
      return {f"{MHA}/{n}/kernel": _heads_kernel(p, num_heads) for n, p in zip(outs, parts)}
    return {f"{MHA}/{n}/bias": _heads_bias(p, num_heads) for n, p in zip(outs, parts)}
  if target == "out":
    if leaf == "bias":
      return {f"{MHA}/out/bias": v}
    if v.shape[1] % num_heads:
      return None
    return {f"{MHA}/out/kernel": _out_kernel(v, num_heads)}
  if target.startswith("LayerScale"):
    return {f"{target}/scale": v}
  if target.startswith("LayerNorm"):
    return {f"{target}/{'scale' if leaf == 'weight' else 'bias'}": v}
  return {f"{target}/{'kernel' if leaf == 'weight' else 'bias'}": v.T if leaf == "weight" else v}


def convert_blocks(flat: Mapping[str, np.ndarray], pattern: str, num_heads: int,
                   names: Mapping[str, str], out: str, what: str, hint: str = ""
                   ) -> dict[str, np.ndarray]:
  """Every tensor whose key fullmatches `pattern` (groups: block index, sub-name) ->
  {f"{out}_{i}/{flax sub-path}": array}; a tensor `convert_block` cannot place raises one
  CheckpointError naming it, the `what` checkpoint and `hint`."""
  rx = re.compile(pattern)
  converted = {}
  for key, v in flat.items():
    m = rx.fullmatch(key)
    if not m:
      continue
    conv = convert_block(m[2], v, num_heads, names)
    if conv is None:
      raise CheckpointError(
          f"{what} checkpoint tensor {key!r} (shape {np.shape(v)}) does not fit the model: an "
          f"unknown block tensor, or a width that {num_heads} heads do not divide (wrong "
          f"variant or sizes?). {hint}".strip())
    converted.update({f"{out}_{m[1]}/{k}": a for k, a in conv.items()})
  return converted


def num_heads(init_params: Mapping[str, Any]) -> int:
  """Number of attention heads, read from an init tree (any attention query kernel, shape
  (..., H, D/H); scanned or unrolled)."""
  for name, leaf in flatten(init_params).items():
    if name.endswith("query/kernel"):
      return int(np.shape(leaf)[-2])
  raise ValueError("init_params has no attention layer; cannot infer num_heads.")


# ----------------------------------------------------------------------------- merging

def _adopt_posemb(init_params, path: str, loaded: np.ndarray, source: str, hint: str):
  """Init tree whose posemb leaf (1, 1 + grid, C) takes the checkpoint's square grid: the
  models resize posembs to the input's patch grid per call."""
  flat = flatten(init_params)
  init = flat[path]            # an array or a jax.ShapeDtypeStruct (from jax.eval_shape)
  if loaded.ndim != 3 or loaded.shape[2] != init.shape[2]:
    return init_params          # a different model: merge_params reports the shape mismatch
  n = loaded.shape[1] - 1
  if n < 1 or int(round(np.sqrt(n))) ** 2 != n:
    raise CheckpointError(
        f"{source}: {path!r} has shape {loaded.shape} in the checkpoint but the model expects "
        f"(1, 1 + a square grid, {init.shape[2]}); check the model config. {hint}.")
  flat[path] = jax.ShapeDtypeStruct(loaded.shape, init.dtype)
  return recover_tree(flat)


def merge_unrolled(init_params, flat: Mapping[str, np.ndarray], source: str, hint: str,
                   dont_load: Sequence[str] = (), posemb: Optional[str] = None) -> dict:
  """Converted (unrolled) arrays onto the init tree: stacks blocks where the model is scanned
  (`scan=True`), lets the `posemb` leaf follow the checkpoint's grid, then
  merge_params (casts to the init dtypes, one clear error on any mismatch)."""
  tree = recover_tree(dict(flat))
  if posemb and posemb in flat:
    init_params = _adopt_posemb(init_params, posemb, np.asarray(flat[posemb]), source, hint)

  def restack(loaded, init):    # every encoder subtree to the init's scan layout
    for k, v in init.items():
      if isinstance(v, Mapping) and isinstance(loaded.get(k), Mapping):
        loaded[k] = match_scan(loaded[k], v)
        restack(loaded[k], v)
  restack(tree, init_params)
  return merge_params(tree, init_params, dont_load, source=source, hint=hint)
