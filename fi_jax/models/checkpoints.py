"""Checkpoint files shared by all model families: npz / safetensors in, Flax param trees out.

big_vision stores params as a flat `np.savez` archive whose keys are '/'-joined tree paths;
bfloat16 arrays come back from numpy as the 2-byte void dtype `|V2`. HF / timm weights come as
safetensors (read here with numpy only, so loading needs no torch). Every loader turns a bad
file into one `CheckpointError` (a ValueError) naming the file, the first mismatching key with
both shapes, and where to get the right file.
"""
from __future__ import annotations

import json
import os
import re
from typing import Any, Iterable, Mapping, Optional, Sequence

import ml_dtypes
import numpy as np

Flat = dict[str, np.ndarray]


class CheckpointError(ValueError):
  """A checkpoint that does not fit the model (wrong file, layout or config)."""


# ----------------------------------------------------------------------------- trees

def flatten(tree: Mapping[str, Any], sep: str = "/") -> Flat:
  """Nested dict -> {'a/b/c': leaf}, keys sorted (big_vision's tree_flatten_with_names)."""
  out = {}

  def visit(node, prefix):
    if isinstance(node, Mapping):
      for k in sorted(node):
        visit(node[k], f"{prefix}{sep}{k}" if prefix else str(k))
    elif isinstance(node, (list, tuple)):
      for i, v in enumerate(node):
        visit(v, f"{prefix}{sep}{i}" if prefix else str(i))
    else:
      out[prefix] = node
  visit(tree, "")
  return out


def recover_tree(flat: Mapping[str, Any], sep: str = "/") -> dict:
  """{'a/b/c': leaf} -> nested dict (inverse of `flatten`)."""
  tree: dict = {}
  for name, value in flat.items():
    *parents, leaf = name.split(sep)
    node = tree
    for p in parents:
      node = node.setdefault(p, {})
      if not isinstance(node, dict):
        raise CheckpointError(f"Key {name!r} nests below a leaf {p!r}: not a valid param tree.")
    node[leaf] = value
  return tree


def tree_get(tree: Mapping[str, Any], key: str) -> Any:
  """tree_get(t, 'img/embedding') = t['img']['embedding']; clear error on a missing part."""
  node = tree
  for part in filter(None, key.split("/")):
    if not isinstance(node, Mapping) or part not in node:
      have = sorted(node) if isinstance(node, Mapping) else []
      raise CheckpointError(f"Sub-key {key!r} not found (no {part!r}; this level has {have[:12]}).")
    node = node[part]
  return node


# ----------------------------------------------------------------------------- files

def recover_dtype(a: np.ndarray) -> np.ndarray:
  """numpy saves bfloat16 as void `|V2`; view such arrays as ml_dtypes.bfloat16 again."""
  if a.dtype.kind == "V" and a.dtype.itemsize == 2:
    return a.view(ml_dtypes.bfloat16)
  return a


def _check_exists(path: str, hint: str) -> None:
  if not os.path.exists(path):
    msg = f"Checkpoint file {path!r} does not exist."
    raise FileNotFoundError(f"{msg} {hint}" if hint else msg)


def load_npz(path: str, hint: str = "") -> Flat:
  """Flat {name: array} from a big_vision-style .npz (or .npy -> {'': array}), bf16 recovered."""
  _check_exists(path, hint)
  try:
    with np.load(path, allow_pickle=False) as z:
      return {k: recover_dtype(z[k]) for k in z.files}
  except AttributeError:  # .npy: np.load returned an array, which has no context manager
    return {"": recover_dtype(np.load(path, allow_pickle=False))}
  except (ValueError, OSError) as e:
    raise CheckpointError(f"Cannot read {path!r} as an npz archive ({e}). {hint}".strip()) from e


_ST_DTYPES = {
    "F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": ml_dtypes.bfloat16,
    "I64": np.int64, "I32": np.int32, "I16": np.int16, "I8": np.int8, "U8": np.uint8,
    "BOOL": np.bool_,
}


def is_safetensors(path: str) -> bool:
  """A .safetensors file, a sharded checkpoint's .safetensors.index.json, or an HF model
  directory holding either."""
  if path.endswith((".safetensors", ".safetensors.index.json")):
    return True
  return os.path.isdir(path) and any(
      os.path.exists(os.path.join(path, n)) for n in ("model.safetensors", "model.safetensors.index.json"))


def load_safetensors(path: str, hint: str = "") -> Flat:
  """Flat {name: array} from safetensors, read with numpy only (BF16 via ml_dtypes).

  `path`: a .safetensors file, a sharded checkpoint's `*.safetensors.index.json`, or an HF
  model directory (its model.safetensors or model.safetensors.index.json)."""
  if os.path.isdir(path):
    index = os.path.join(path, "model.safetensors.index.json")
    path = index if os.path.exists(index) else os.path.join(path, "model.safetensors")
  _check_exists(path, hint)
  if path.endswith(".index.json"):
    with open(path, encoding="utf-8") as f:
      shards = sorted(set(json.load(f)["weight_map"].values()))
    out: Flat = {}
    for shard in shards:
      out.update(load_safetensors(os.path.join(os.path.dirname(path), shard), hint))
    return out
  with open(path, "rb") as f:
    raw = f.read()
  try:
    n = int(np.frombuffer(raw[:8], "<u8")[0])
    header = json.loads(raw[8:8 + n])
  except (ValueError, IndexError, UnicodeDecodeError) as e:
    raise CheckpointError(f"{path!r} is not a safetensors file ({e}). {hint}".strip()) from e
  body = memoryview(raw)[8 + n:]
  out = {}
  for name, info in header.items():
    if name == "__metadata__":
      continue
    if info["dtype"] not in _ST_DTYPES:
      raise CheckpointError(f"{path!r}: tensor {name!r} has unsupported dtype {info['dtype']}.")
    start, end = info["data_offsets"]
    dt = np.dtype(_ST_DTYPES[info["dtype"]]).newbyteorder("<")
    out[name] = np.frombuffer(body[start:end], dt).reshape(info["shape"]).copy()
  return out


def save_npz(path: str, params: Mapping[str, Any]) -> None:
  """Writes a nested param tree the way big_vision does ('/'-joined names, np.savez)."""
  np.savez(path, **{k: np.asarray(v) for k, v in flatten(params).items()})


def split_subkey(path: str) -> tuple[str, Optional[str]]:
  """'file.npz:img/x' -> ('file.npz', 'img/x'); a colon is a sub-key only if followed by \\w/."""
  m = re.match(r"^(.*?)(?::([\w/]+))?$", path)
  assert m is not None
  if m.group(2) and os.path.exists(path):  # a real file whose name has a colon
    return path, None
  return m.group(1), m.group(2)


def load_params(path: str, hint: str = "") -> dict:
  """big_vision's `utils.load_params` for local files: nested params of "file.npz[:sub/key]".

  Strips the `params/` (big_vision) or `opt/target/` (old Flax optimizer) top level, then
  selects the optional sub-key (e.g. ':img' for a SigLIP image tower). `.safetensors` files
  are returned with their own (flat, dotted) names as the only level.
  """
  file, key = split_subkey(path)
  if is_safetensors(file):
    return load_safetensors(file, hint)
  tree = recover_tree(load_npz(file, hint))
  if "params" in tree and isinstance(tree["params"], dict):
    tree = tree["params"]
  elif "opt" in tree and isinstance(tree["opt"], dict) and "target" in tree["opt"]:
    tree = tree["opt"]["target"]
  if key:
    try:
      tree = tree_get(tree, key)
    except CheckpointError as e:
      raise CheckpointError(f"{file!r}: {e} {hint}".strip()) from None
  return tree


# ----------------------------------------------------------------------------- merge

def _shape(x) -> tuple:
  return tuple(x.shape) if hasattr(x, "shape") else np.shape(x)


def merge_params(loaded: Mapping[str, Any], init: Mapping[str, Any],
                 dont_load: Sequence[str] = (), *, source: str = "checkpoint",
                 hint: str = "") -> dict:
  """Loaded values on the init tree's structure, cast to the init dtypes.

  `init` may hold arrays or `jax.ShapeDtypeStruct`s (from `jax.eval_shape(model.init, ...)`,
  which avoids materialising a random init of a big model). Keys matching a `dont_load` regex
  keep their init value. Any missing, extra or differently-shaped key raises one
  CheckpointError that names `source`, the first offending key with both shapes, and `hint`
  (where to get the right file).
  """
  flat_init, flat_loaded = flatten(init), flatten(loaded)
  skip = [re.compile(p) for p in dont_load]
  skipped = lambda k: any(p.fullmatch(k) for p in skip)
  missing = [k for k in flat_init if k not in flat_loaded and not skipped(k)]
  extra = [k for k in flat_loaded if k not in flat_init and not skipped(k)]
  bad = [k for k in flat_init if k in flat_loaded and not skipped(k)
         and _shape(flat_loaded[k]) != _shape(flat_init[k])]
  problems = []
  if bad:
    k = bad[0]
    problems.append(f"{len(bad)} shape mismatch(es), first {k!r}: file "
                    f"{_shape(flat_loaded[k])} vs model {_shape(flat_init[k])}")
  if missing:
    problems.append(f"{len(missing)} key(s) missing from the file, first {missing[0]!r} "
                    f"(model shape {_shape(flat_init[missing[0]])})")
  if extra:
    problems.append(f"{len(extra)} unexpected key(s) in the file, first {extra[0]!r} "
                    f"(shape {_shape(flat_loaded[extra[0]])})")
  if problems:
    raise CheckpointError(f"{source} does not match the model config: " + "; ".join(problems)
                          + (f". {hint}" if hint else "."))
  merged = {}
  for k, v in flat_init.items():
    if k in flat_loaded and not skipped(k):
      dtype = v.dtype if hasattr(v, "dtype") else np.asarray(v).dtype
      merged[k] = np.asarray(flat_loaded[k]).astype(dtype)
    else:
      merged[k] = v
  return recover_tree(merged)


# ----------------------------------------------------------------------------- posemb

def resample_posemb(old: np.ndarray, new_shape: Sequence[int]) -> np.ndarray:
  """(1, h*w, D) posemb -> (1, H*W, D), linear zoom on the square grid (big_vision's rule)."""
  import scipy.ndimage  # pylint: disable=g-import-not-at-top
  old = np.asarray(old, np.float32)
  if tuple(old.shape) == tuple(new_shape):
    return old
  gs_old, gs_new = int(round(np.sqrt(old.shape[1]))), int(round(np.sqrt(new_shape[1])))
  if gs_old ** 2 != old.shape[1] or gs_new ** 2 != new_shape[1] or old.shape[2] != new_shape[2]:
    raise CheckpointError(f"Cannot resample posemb {old.shape} to {tuple(new_shape)}: "
                          "only square grids of the same width are supported.")
  grid = old[0].reshape(gs_old, gs_old, -1)
  zoom = (gs_new / gs_old, gs_new / gs_old, 1)
  grid = scipy.ndimage.zoom(grid, zoom, order=1)
  return grid.reshape(1, gs_new * gs_new, -1)


# ----------------------------------------------------------------------------- layouts

def stack_blocks(tree: dict, prefix: str = "encoderblock") -> dict:
  """Unrolled `{prefix}_{i}` children -> one scanned `{prefix}` with a leading depth axis."""
  names = sorted((k for k in tree if re.fullmatch(rf"{prefix}_\d+", k)),
                 key=lambda k: int(k.rsplit("_", 1)[1]))
  if not names:
    return tree
  out = {k: v for k, v in tree.items() if k not in names}
  flats = [flatten(tree[n]) for n in names]
  out[prefix] = recover_tree({k: np.stack([np.asarray(f[k]) for f in flats]) for k in flats[0]})
  return out


def unstack_blocks(tree: dict, prefix: str = "encoderblock") -> dict:
  """Scanned `{prefix}` (leading depth axis) -> unrolled `{prefix}_{i}` children."""
  if prefix not in tree:
    return tree
  out = {k: v for k, v in tree.items() if k != prefix}
  flat = flatten(tree[prefix])
  depth = len(next(iter(flat.values())))
  for i in range(depth):
    out[f"{prefix}_{i}"] = recover_tree({k: np.asarray(v)[i] for k, v in flat.items()})
  return out


def convert_pre_linen(tree: Any) -> Any:
  """Pre-Linen names shared one counter across classes ('LayerNorm_0, MlpBlock_3');
  renumber per class in order ('LayerNorm_0, MlpBlock_0'), recursively."""
  if not isinstance(tree, dict):
    return tree
  by_class: dict[str, list[tuple[int, str]]] = {}
  out = {}
  for k, v in tree.items():
    m = re.fullmatch(r"(.+)_(\d+)", k)
    if m:
      by_class.setdefault(m.group(1), []).append((int(m.group(2)), k))
    else:
      out[k] = convert_pre_linen(v)
  for cls, items in by_class.items():
    for new_i, (_, k) in enumerate(sorted(items)):
      out[f"{cls}_{new_i}"] = convert_pre_linen(tree[k])
  return out


def first_of(names: Iterable[str], flat: Mapping[str, Any]) -> Optional[str]:
  """The first of `names` present in `flat` (for detecting checkpoint flavours)."""
  return next((n for n in names if n in flat), None)


# ----------------------------------------------------------------------------- torch -> flax

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


def torch_attention(q: tuple, k: tuple, v: tuple, o: tuple, num_heads: int) -> dict:
  """torch q/k/v/out projections, each (weight (out, in), bias) -> flax
  MultiHeadDotProductAttention params: query/key/value kernel (D, H, D/H), bias (H, D/H);
  out kernel (H, D/H, D), bias (D,)."""
  def qkv(w, b):
    w, b = np.asarray(w), np.asarray(b)
    d_out, d_in = w.shape
    if d_out % num_heads:
      raise CheckpointError(f"Attention width {d_out} is not divisible by num_heads={num_heads}.")
    return {"kernel": w.T.reshape(d_in, num_heads, d_out // num_heads),
            "bias": b.reshape(num_heads, d_out // num_heads)}
  w_o, b_o = np.asarray(o[0]), np.asarray(o[1])
  return {"query": qkv(*q), "key": qkv(*k), "value": qkv(*v),
          "out": {"kernel": w_o.T.reshape(num_heads, w_o.shape[1] // num_heads, w_o.shape[0]),
                  "bias": b_o}}


def split_fused(w: np.ndarray, b: np.ndarray, n: int = 3) -> list[tuple[np.ndarray, np.ndarray]]:
  """A fused (n*D, D) projection (timm qkv, torch in_proj) -> n (weight, bias) pairs."""
  return list(zip(np.split(np.asarray(w), n, axis=0), np.split(np.asarray(b), n, axis=0)))


def match_scan(loaded: dict, init: Mapping[str, Any], prefix: str = "encoderblock") -> dict:
  """Converts an encoder subtree between scanned and unrolled so it matches `init`'s layout."""
  if prefix in init and f"{prefix}_0" in loaded:
    return stack_blocks(loaded, prefix)
  if f"{prefix}_0" in init and prefix in loaded:
    return unstack_blocks(loaded, prefix)
  return loaded
