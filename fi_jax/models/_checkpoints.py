"""Parameter trees shared by all model families: nested dicts of arrays in big_vision's layout.

Flattening ('/'-joined names, as big_vision's npz files store them), merging a loaded tree onto
the model's init tree (one `CheckpointError` naming the file, the first mismatching key with both
shapes, and where to get the right file), and big_vision's layout changes (scanned <-> unrolled
blocks, pre-Linen names). Reading files is `fi_jax.models.convert.readers`.
"""
from __future__ import annotations

import re
from typing import Any, Callable, Mapping, Optional, Sequence

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


# ----------------------------------------------------------------------------- merge

def _shape(x) -> tuple:
  return tuple(x.shape) if hasattr(x, "shape") else np.shape(x)


def merge_params(loaded: Mapping[str, Any], init: Mapping[str, Any],
                 dont_load: Sequence[str] = (), *, source: str = "checkpoint",
                 hint: str = "", file_key: Optional[Callable[[str], Optional[str]]] = None,
                 file_shapes: Optional[Mapping[str, tuple]] = None) -> dict:
  """Loaded values on the init tree's structure, cast to the init dtypes.

  `init` may hold arrays or `jax.ShapeDtypeStruct`s (from `jax.eval_shape(model.init, ...)`,
  which avoids materialising a random init of a big model). Keys matching a `dont_load` regex
  keep their init value. Any missing, extra or differently-shaped key raises one
  CheckpointError that names `source`, the first offending key with both shapes, and `hint`
  (where to get the right file). With `file_key` (model path -> the key the file stores it
  under, e.g. 'layer3_1/bn2/var' -> 'layer3.1.bn2.running_var') and `file_shapes` ({file
  key: shape as stored}), the error names the file's key and shape first, then the model's.
  """
  flat_init, flat_loaded = flatten(init), flatten(loaded)
  skip = [re.compile(p) for p in dont_load]
  skipped = lambda k: any(p.fullmatch(k) for p in skip)
  missing = [k for k in flat_init if k not in flat_loaded and not skipped(k)]
  extra = [k for k in flat_loaded if k not in flat_init and not skipped(k)]
  bad = [k for k in flat_init if k in flat_loaded and not skipped(k)
         and _shape(flat_loaded[k]) != _shape(flat_init[k])]
  problems = []
  fkey = (lambda k: None) if file_key is None else file_key
  shapes = file_shapes or {}
  if bad:
    k, f = bad[0], fkey(bad[0])
    if f is None:
      problems.append(f"{len(bad)} shape mismatch(es), first {k!r}: file "
                      f"{_shape(flat_loaded[k])} vs model {_shape(flat_init[k])}")
    else:
      problems.append(
          f"{len(bad)} shape mismatch(es), first the file's {f!r} of shape "
          f"{tuple(shapes.get(f, _shape(flat_loaded[k])))}: the model's {k!r} needs "
          f"{_shape(flat_init[k])} (the file's gives {_shape(flat_loaded[k])} in the model's "
          f"layout)")
  if missing:
    k, f = missing[0], fkey(missing[0])
    what = repr(k) if f is None else f"{f!r} (the model's {k!r})"
    problems.append(f"{len(missing)} key(s) missing from the file, first {what} "
                    f"(model shape {_shape(flat_init[k])})")
  if extra:
    k, f = extra[0], fkey(extra[0])
    what = (f"{k!r} (shape {_shape(flat_loaded[k])})" if f is None else
            f"{f!r} (shape {tuple(shapes.get(f, _shape(flat_loaded[k])))}; the model has no "
            f"{k!r})")
    problems.append(f"{len(extra)} unexpected key(s) in the file, first {what}")
  if problems:
    raise CheckpointError(f"{source} does not match the model config: " + "; ".join(problems)
                          + (f". {hint}" if hint else "."))
  merged = {}
  for k, v in flat_init.items():
    if k in flat_loaded and not skipped(k):
      dtype = v.dtype if hasattr(v, "dtype") else np.asarray(v).dtype
      merged[k] = np.asarray(flat_loaded[k]).astype(dtype, copy=False)
      check_finite(merged[k], k, source, hint)
    else:
      merged[k] = v
  return recover_tree(merged)


def check_finite(value: Any, name: str, source: str = "checkpoint", hint: str = "") -> None:
  """A loaded parameter with NaN or Inf values is a damaged checkpoint: one CheckpointError
  naming the file and the tensor (it would otherwise give NaN outputs, or plausible numbers)."""
  a = np.asarray(value)
  if not np.issubdtype(a.dtype, np.inexact):
    return
  bad = int(a.size - np.count_nonzero(np.isfinite(a.astype(np.float32, copy=False))))
  if bad:
    raise CheckpointError(f"{source}: tensor {name!r} has {bad} non-finite (NaN/Inf) value(s) "
                          f"of {a.size}; the checkpoint is damaged." + (f" {hint}" if hint else ""))


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


def match_scan(loaded: dict, init: Mapping[str, Any], prefix: str = "encoderblock") -> dict:
  """Converts an encoder subtree between scanned and unrolled so it matches `init`'s layout."""
  if prefix in init and f"{prefix}_0" in loaded:
    return stack_blocks(loaded, prefix)
  if f"{prefix}_0" in init and prefix in loaded:
    return unstack_blocks(loaded, prefix)
  return loaded
