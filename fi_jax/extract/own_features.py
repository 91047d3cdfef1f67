"""Your own features: sets read from arrays extracted elsewhere (e.g. by a PyTorch model).

A set spec `dict(source="features", path=PATH, prefix="")` reads the set's arrays from

  * a folder of .npy files: features.npy [N, D], logits.npy [N, C], label.npy [N] (ID class,
    -1 = unknown / OOD), group.npy [N] (OOD class id for per-class metrics, -1 = none);
  * an entry of fi_jax's own feature cache (`<workdir>/cache/<model key>/<set>-<key>`: a folder
    with a checksummed `meta.json` manifest), read through `fi_jax.extract.cache` (checksums verified);
  * one .npz or .safetensors file with those keys, each optionally behind `prefix` (one file
    holding every set: prefix="id_fit/" reads "id_fit/features", ...).

`features` is required; `logits` too unless the head is given (then logits = features @ w + b);
`label` and `group` default to -1. The classifier head `Head(w [D, C], b [C])`, which some
detectors need (ViM, ReAct, ...), comes from `config.head`: a .npz / .safetensors file with keys
`w` and `b`, or the folder of .npy files w.npy and b.npy. Files are read without pickle.
"""
from __future__ import annotations

import os
from typing import Mapping, Optional

import jax.numpy as jnp
import numpy as np

from fi_jax.common import columns as columns_lib
from fi_jax.common import outputs
from fi_jax.extract import cache
from fi_jax.models.convert import readers

_KEYS = columns_lib.FILE_KEYS


def is_features_spec(spec: Mapping) -> bool:
  return dict(spec).get("source") == "features"


def _read(path: str, keys, prefix: str = "") -> dict[str, np.ndarray]:
  """{key: array} of the keys present under `prefix` at `path`."""
  if os.path.isdir(path) and os.path.exists(os.path.join(path, "meta.json")):
    arrays = cache.load(path)
    if arrays is None:
      raise ValueError(f"{path} is a damaged fi_jax cache entry (see the warning above); "
                       "rerun the pipeline that wrote it.")
    return {k: arrays[prefix + k] for k in keys if prefix + k in arrays}
  if os.path.isdir(path) and cache.parts(path):   # one entry per process (multi-host run)
    arrays = cache.load_parts(path)
    if arrays is None:
      raise ValueError(f"{path}: a process's part of this fi_jax cache entry is missing or "
                       "damaged (see any warning above); rerun the pipeline that wrote it.")
    return {k: arrays[prefix + k] for k in keys if prefix + k in arrays}
  if os.path.isdir(path):
    return {k: np.load(os.path.join(path, prefix + k + ".npy"), allow_pickle=False)
            for k in keys if os.path.exists(os.path.join(path, prefix + k + ".npy"))}
  if path.endswith(".npz"):
    with np.load(path, allow_pickle=False) as z:
      return {k: z[prefix + k] for k in keys if prefix + k in z.files}
  if path.endswith(".safetensors"):
    arrays = readers.load_safetensors(path)
    return {k: arrays[prefix + k] for k in keys if prefix + k in arrays}
  if path.endswith(".npy"):
    raise ValueError(f"{path}: one .npy holds one array; give a folder of features.npy, "
                     "logits.npy, label.npy (and group.npy), or one .npz / .safetensors file.")
  raise ValueError(f"{path}: expected a folder of .npy files, a .npz or a .safetensors file.")


def load_head(path: str) -> outputs.Head:
  """The classifier head (w [D, C], b [C]) from a .npz / .safetensors file or a folder."""
  if not os.path.exists(path):
    raise FileNotFoundError(f"Head file {path} does not exist (config.head).")
  arrays = _read(path, ("w", "b"))
  if set(arrays) != {"w", "b"}:
    raise ValueError(f"Head file {path} needs arrays 'w' [D, C] and 'b' [C]; it has "
                     f"{sorted(arrays)}.")
  w, b = arrays["w"], arrays["b"]
  if w.ndim != 2 or b.shape != (w.shape[1],):
    raise ValueError(f"Head file {path}: w must be [D, C] and b [C]; got {w.shape}, {b.shape}.")
  return outputs.Head(jnp.asarray(w), jnp.asarray(b))


def load_set(name: str, spec: Mapping, head: Optional[outputs.Head] = None
             ) -> dict[str, np.ndarray]:
  """The arrays {features, logits, label, group} of one features spec, checked."""
  spec = dict(spec)
  path, prefix = spec.get("path", ""), spec.get("prefix", "")
  if not path or not os.path.exists(path):
    raise FileNotFoundError(f"{name}: feature path {path!r} does not exist.")
  arrays = _read(path, _KEYS, prefix)
  where = f"{name} ({path}{', prefix ' + repr(prefix) if prefix else ''})"
  if "features" not in arrays:
    raise ValueError(f"{where}: no 'features' array [N, D].")
  f = arrays["features"]
  if f.ndim != 2:
    raise ValueError(f"{where}: features must be [N, D], got shape {f.shape}.")
  if "logits" not in arrays:
    if head is None:
      raise ValueError(f"{where}: no 'logits' array [N, C]; save the logits too, or give the "
                       "head (config.head) to compute them.")
    arrays["logits"] = np.asarray(jnp.asarray(f) @ head.w + head.b)
  n = len(f)
  for k in ("label", "group"):
    arrays[k] = np.asarray(arrays.get(k, np.full(n, -1)), np.int64)
  for k, v in arrays.items():
    if len(v) != n:
      raise ValueError(f"{where}: {k} has {len(v)} rows, features {n}.")
  if arrays["logits"].ndim != 2:
    raise ValueError(f"{where}: logits must be [N, C], got shape {arrays['logits'].shape}.")
  return arrays


def load_sets(specs: Mapping[str, Mapping], head: Optional[outputs.Head] = None
              ) -> dict[str, dict[str, np.ndarray]]:
  """{set name: arrays} of features specs (all of them must be)."""
  return {name: load_set(name, spec, head) for name, spec in specs.items()}
