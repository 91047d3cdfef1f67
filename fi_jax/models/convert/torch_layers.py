"""PyTorch layers -> Flax params: the one converter of a pre-LN transformer block and its parts.

Every PyTorch-born family (timm ViT, HF SigLIP, open_clip, DINOv2) names a block's tensors
differently; a family's key map (`names`: torch sub-module -> Flax target) is all that differs,
and `convert_block` turns each tensor into the params of `vit.Encoder1DBlock`. torch Linear
weights are (out, in), Flax Dense kernels (in, out); attention kernels are split per head.
"""
from __future__ import annotations

import logging
import re
from typing import Any, Mapping, Optional, Sequence

import jax
import numpy as np

from fi_jax.models._checkpoints import (
  CheckpointError,
  flatten,
  match_scan,
  merge_params,
  recover_tree,
)

_LOG = logging.getLogger(__name__)
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
  """Flat torch-named tensors; `t(name)` returns one or raises a CheckpointError naming it.

  Remembers the names it handed out (`used`), so `check_all_used` can name a tensor the
  converter did not expect."""

  def __init__(self, flat: Mapping[str, np.ndarray], source: str, hint: str = ""):
    self.flat, self.source, self.hint = flat, source, hint
    self.used: set[str] = set()

  def __contains__(self, name: str) -> bool:
    return name in self.flat

  def __call__(self, name: str) -> np.ndarray:
    if name not in self.flat:
      raise CheckpointError(
          f"{self.source}: expected tensor {name!r} is missing (the file has e.g. "
          f"{sorted(self.flat)[:4]}). {self.hint}".strip())
    self.used.add(name)
    return np.asarray(self.flat[name])

  def check_all_used(self, pattern: str = "", what: str = "model") -> None:
    """Raises a CheckpointError naming the first tensor neither handed out nor matching the
    regex `pattern` (the block tensors, which convert_blocks checks itself)."""
    rx = re.compile(pattern) if pattern else None
    extra = sorted(k for k in self.flat
                   if k not in self.used and not (rx and rx.fullmatch(k)))
    if extra:
      raise CheckpointError(
          f"{self.source}: unexpected tensor {extra[0]!r} (shape {np.shape(self.flat[extra[0]])}"
          f"; {len(extra)} unexpected in all) for a {what}: a different architecture or "
          f"option? {self.hint}".strip())


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
                   names: Mapping[str, str], out: str, what: str, hint: str = "",
                   where: Optional[dict[str, str]] = None) -> dict[str, np.ndarray]:
  """Every tensor whose key fullmatches `pattern` (groups: block index, sub-name) ->
  {f"{out}_{i}/{flax sub-path}": array}; a tensor `convert_block` cannot place raises one
  CheckpointError naming it, the `what` checkpoint and `hint`. `where`, if given, receives
  {flax path: torch key} (for `check_tree`)."""
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
    if where is not None:
      where.update({f"{out}_{m[1]}/{k}": key for k in conv})
  return converted


def _block_torch_key(sub: str, names: Mapping[str, str]) -> Optional[str]:
  """A vit.Encoder1DBlock param path ('MultiHeadDotProductAttention_0/key/bias') -> the torch
  sub-name that feeds it under `names` ('attn.qkv.bias'), or None."""
  parts = sub.split("/")
  if parts[0] == MHA:
    targets = ["out"] if parts[1] == "out" else ["qkv", {v: k for k, v in _QKV.items()}[parts[1]]]
  else:
    targets = ["/".join(parts[:-1])]
  for module, target in names.items():
    if target in targets:
      if module.endswith(".in_proj"):          # nn.MultiheadAttention: in_proj_weight / _bias
        return f"{module}_{'weight' if parts[-1] == 'kernel' else 'bias'}"
      leaf = {"kernel": "weight", "scale": "weight", "bias": "bias"}[parts[-1]]
      return f"{module}.{'gamma' if target.startswith('LayerScale') else leaf}"
  return None


def check_tree(tree: Mapping[str, Any], init_params: Mapping[str, Any],
               where: Mapping[str, str], source: str, hint: str = "", *,
               optional: Optional[Mapping[str, str]] = None,
               block_names: Optional[Mapping[str, str]] = None, block_key: str = "",
               skip: Sequence[str] = ()) -> None:
  """Converted `tree` against the (unrolled) init tree before merging, naming torch keys:
  a leaf whose shape differs (`where`: {flax path: torch key}), a leaf the model lacks, a
  model param the file did not provide (`optional`: {flax path: torch key} of the
  top-level params; blocks `encoderblock_{i}` via `block_names` and `block_key`, the torch
  prefix of block i as a format string). A scanned init tree (one stacked `encoderblock`)
  and the `skip` paths (a posemb that is resampled) are left to merge_params."""
  tail = f" {hint}".rstrip()
  init_flat, flat = flatten(init_params), flatten(tree)
  optional, block_names = optional or {}, block_names or {}

  def fail(key, what):
    raise CheckpointError(f"{source}: tensor {key!r} {what}.{tail}")

  for path, a in flat.items():
    if path in skip or path not in where:
      continue
    if path not in init_flat:
      if re.sub(r"encoderblock_\d+", "encoderblock", path) not in init_flat:
        fail(where[path], f"(shape {tuple(np.shape(a))}) is unexpected: the model has no "
             f"{path!r} (built without this option, or a different variant?)")
      continue
    want = tuple(np.shape(init_flat[path]))
    if tuple(np.shape(a)) != want:
      fail(where[path], f"does not fit the model: it gives {path!r} the shape "
           f"{tuple(np.shape(a))} but the model has {want} (a different variant or config?)")
  for path in init_flat:
    if path in flat or path in skip:
      continue
    m = re.fullmatch(r"Transformer/encoderblock_(\d+)/(.+)", path)
    key = optional.get(path)
    if m and block_key:
      sub = _block_torch_key(m[2], block_names)
      key = block_key.format(m[1]) + sub if sub else None
    if key:
      fail(key, f"is missing (the model needs it for {path!r}; a different architecture "
           "or option?)")


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
  if loaded.shape != init.shape:
    g_old, g_new = int(round(np.sqrt(n))), int(round(np.sqrt(init.shape[1] - 1)))
    # INFO, not WARNING: the usual case for DINOv2 (37x37 grid, 224 input), nothing resampled.
    _LOG.info("%s: the posemb keeps the checkpoint's %dx%d grid (the model was initialised "
              "with %dx%d); it is resized to each input's patch grid per call.",
              source, g_old, g_old, g_new, g_new)
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
