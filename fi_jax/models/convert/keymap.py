"""A PyTorch state dict onto a Flax param tree through an explicit per-leaf key map.

The family converters (convnext, swin) describe, for every leaf of the model's init tree, which
torch key feeds it and how the array is rearranged. Driving the conversion from the init tree
means a missing, wrong-shaped or unexpected torch key is reported by its torch name (the one the
user can look for in the file), together with the file.
"""
from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import numpy as np

from fi_jax.models import _checkpoints as checkpoints

Transform = Callable[[np.ndarray], np.ndarray]


def conv(w: np.ndarray) -> np.ndarray:
  """torch Conv2d weight (O, I, kh, kw) -> flax (kh, kw, I, O)."""
  return np.transpose(w, (2, 3, 1, 0))


def dense(w: np.ndarray) -> np.ndarray:
  """torch Linear weight (O, I) -> flax (I, O)."""
  return np.transpose(w)


def same(w: np.ndarray) -> np.ndarray:
  return w


def flat(w: np.ndarray) -> np.ndarray:
  """torch (C, 1, 1) scales (layer scale, logit scale) -> (C,)."""
  return np.reshape(w, (w.shape[0],)) if w.ndim == 3 and w.shape[1:] == (1, 1) else w


def _leaves(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
  return checkpoints.flatten(tree) if not prefix else {
      f"{prefix}/{k}": v for k, v in checkpoints.flatten(tree).items()}


def apply(sd: Mapping[str, np.ndarray], spec: Mapping[str, tuple[str, Transform]],
          init_params: Mapping[str, Any], *, source: str, hint: str = "",
          buffers: Mapping[str, np.ndarray] | None = None,
          skip: Sequence[str] = ()) -> dict:
  """Params on `init_params`' tree from `sd` via `spec` {flax path: (torch key, transform)}.

  `buffers`: torch buffers the file may hold that the model derives itself (e.g. Swin's
  relative_position_index): when present they must hold the derived values (in any shape). `skip`: torch keys
  dropped silently (e.g. a classifier the model was built without). Raises one CheckpointError
  naming the torch key and `source` on a missing, wrong-shaped, mismatching or unexpected key.
  """
  tail = f" {hint}".rstrip()
  init_flat = _leaves(init_params)
  if set(init_flat) != set(spec):   # a programming error in the family's key map
    raise AssertionError(f"key map / model mismatch: {sorted(set(init_flat) ^ set(spec))[:5]}")
  out = {}
  for path, (key, fn) in spec.items():
    if key not in sd:
      raise checkpoints.CheckpointError(
          f"{source}: key {key!r} is missing (the model needs it for {path!r}, shape "
          f"{tuple(init_flat[path].shape)}): a different architecture or variant?{tail}")
    a = fn(np.asarray(sd[key]))
    want = tuple(init_flat[path].shape)
    if tuple(a.shape) != want:
      raise checkpoints.CheckpointError(
          f"{source}: key {key!r} has shape {tuple(np.shape(sd[key]))}, but the model needs "
          f"{want} for {path!r} (after the layout change): a different variant or "
          f"config?{tail}")
    out[path] = a.astype(init_flat[path].dtype, copy=False)
  for key, want in (buffers or {}).items():
    have = np.asarray(sd[key], np.float64).reshape(-1) if key in sd else None
    if have is not None and (have.size != np.size(want) or not np.allclose(
        have, np.asarray(want, np.float64).reshape(-1), atol=1e-6)):
      raise checkpoints.CheckpointError(
          f"{source}: buffer {key!r} (shape {tuple(np.shape(sd[key]))}) differs from the one "
          f"this model derives (shape {tuple(np.shape(want))}): the checkpoint was built with "
          f"another window size.{tail}")
  used = {k for k, _ in spec.values()} | set(buffers or {}) | set(skip)
  extra = sorted(k for k in sd if k not in used)
  if extra:
    raise checkpoints.CheckpointError(
        f"{source}: unexpected key {extra[0]!r} (shape {tuple(np.shape(sd[extra[0]]))}; "
        f"{len(extra)} unexpected in all): a different architecture or variant?{tail}")
  return checkpoints.recover_tree(out)
