"""Position-embedding resizing, one place for every model family.

`resample_posemb`: big_vision's load-time rule (linear zoom of the square grid).
`resize_posemb` / `resize_grid` / `bicubic_matrix`: PyTorch's F.interpolate(mode='bicubic'),
with or without antialias, exactly, as CLIP and DINOv2 resize their posembs per call.
`resize_bilinear_antialias`: SigLIP 2 NaFlex's per-image resize of its learned posemb grid.
`posemb_param`: a `pos_embedding` param that keeps whatever grid was loaded.
"""
from __future__ import annotations

import logging
from typing import Optional, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from fi_jax.models._checkpoints import CheckpointError

_LOG = logging.getLogger(__name__)


def resample_posemb(old: np.ndarray, new_shape: Sequence[int]) -> np.ndarray:
  """(1, h*w, D) posemb -> (1, H*W, D), linear zoom on the square grid (big_vision's rule)."""
  import scipy.ndimage  # a slow import, needed only here
  old = np.asarray(old, np.float32)
  if tuple(old.shape) == tuple(new_shape):
    return old
  shapes = f"checkpoint {tuple(old.shape)}, model {tuple(new_shape)}"
  if old.shape[2] != new_shape[2]:
    raise CheckpointError(
        f"Cannot resample the posemb: its width (channels) differs ({shapes}): the checkpoint "
        f"is a model of width {old.shape[2]}, the config builds width {new_shape[2]}; set the "
        "model's width (e.g. the config argument width=, or variant=) to the checkpoint's.")
  gs_old, gs_new = int(round(np.sqrt(old.shape[1]))), int(round(np.sqrt(new_shape[1])))
  for name, n, gs in (("checkpoint", old.shape[1], gs_old), ("model", new_shape[1], gs_new)):
    if gs ** 2 != n:
      raise CheckpointError(
          f"Cannot resample the posemb: its grid (tokens) differs ({shapes}) and the {name}'s "
          f"{n} tokens are not a square h x w grid; only square grids are resampled. Use a "
          "square input size (res=) and a patch size that divides it.")
  grid = old[0].reshape(gs_old, gs_old, -1)
  zoom = (gs_new / gs_old, gs_new / gs_old, 1)
  grid = scipy.ndimage.zoom(grid, zoom, order=1)
  _LOG.warning("Resampled the posemb grid from %dx%d to %dx%d (the model's input size / "
               "patch size differ from the checkpoint's).", gs_old, gs_old, gs_new, gs_new)
  return grid.reshape(1, gs_new * gs_new, -1)


def posemb_param(module: nn.Module, shape: Sequence[int], std: float) -> jax.Array:
  """`pos_embedding` param of `shape` at init; afterwards whatever grid was loaded (the
  checkpoint's), since `resize_posemb` adapts it to the input per call."""
  if module.has_variable("params", "pos_embedding"):
    shape = module.get_variable("params", "pos_embedding").shape
  return module.param("pos_embedding", nn.initializers.normal(std), tuple(shape), jnp.float32)


def _cubic(x: np.ndarray, a: float) -> np.ndarray:
  x = np.abs(x)
  return np.where(x <= 1, ((a + 2) * x - (a + 3)) * x * x + 1,
                  np.where(x < 2, (((x - 5) * x + 8) * x - 4) * a, 0.))


def bicubic_matrix(n_in: int, n_out: int, antialias: bool,
                   scale_factor: Optional[float] = None) -> np.ndarray:
  """(n_out, n_in) weights of torch's F.interpolate(mode='bicubic', align_corners=False).

  Without antialias: Keys cubic a=-0.75, taps clamped at the border. With antialias: the
  Pillow-style filter torch uses (a=-0.5, support widened by the downscale factor, weights
  renormalised over in-range taps). `scale_factor` (as passed to F.interpolate) replaces
  n_out/n_in in the coordinate mapping, as torch does when it is given.
  """
  scale = 1.0 / scale_factor if scale_factor else n_in / n_out
  w = np.zeros((n_out, n_in))
  if not antialias:
    for i in range(n_out):
      src = scale * (i + 0.5) - 0.5
      i0 = int(np.floor(src))
      t = src - i0
      for tap, wt in zip(range(i0 - 1, i0 + 3), _cubic(np.array([t + 1, t, 1 - t, 2 - t]), -0.75)):
        w[i, min(max(tap, 0), n_in - 1)] += wt
    return w
  support = 2.0 * scale if scale >= 1.0 else 2.0
  invscale = 1.0 / scale if scale >= 1.0 else 1.0
  for i in range(n_out):
    center = scale * (i + 0.5)
    lo = max(int(center - support + 0.5), 0)
    hi = min(int(center + support + 0.5), n_in)
    taps = np.arange(lo, hi)
    wt = _cubic((taps - center + 0.5) * invscale, -0.5)
    total = wt.sum()
    w[i, lo:hi] = wt / total if total != 0 else wt
  return w


def resize_grid(grid: jax.Array, out_hw: Sequence[int], antialias: bool,
                scale_factor: Optional[Sequence[float]] = None) -> jax.Array:
  """Bicubic resize of a (H, W, C) grid, numerically as torch's F.interpolate."""
  h, w = grid.shape[:2]
  sf = scale_factor or (None, None)
  rh = bicubic_matrix(h, out_hw[0], antialias, sf[0])
  rw = bicubic_matrix(w, out_hw[1], antialias, sf[1])
  return jnp.einsum("yh,xw,hwc->yxc", jnp.asarray(rh, grid.dtype), jnp.asarray(rw, grid.dtype),
                    grid, precision=jax.lax.Precision.HIGHEST)


def resize_posemb(pos: jax.Array, grid_hw: Sequence[int], antialias: bool = True,
                  prefix: int = 1, offset: float = 0.0) -> jax.Array:
  """(1, prefix + M*M, C) posemb -> (1, prefix + h*w, C) for a (h, w) patch grid.

  Identity when the grid already matches. `offset` > 0 reproduces DINOv2's
  `interpolate_offset` (F.interpolate with scale_factor=(h + offset) / M)."""
  h, w = grid_hw
  n = pos.shape[1] - prefix
  m = int(round(np.sqrt(n)))
  if m * m != n:
    raise ValueError(f"Position embedding with {n} patch entries is not a square grid.")
  if (h, w) == (m, m):
    return pos
  sf = ((h + offset) / m, (w + offset) / m) if offset else None
  grid = resize_grid(pos[0, prefix:].reshape(m, m, -1), (h, w), antialias, sf)
  return jnp.concatenate([pos[:, :prefix], grid.reshape(1, h * w, -1)], axis=1)


def resize_bilinear_antialias(grid: np.ndarray, out_hw: Sequence[int]) -> np.ndarray:
  """(h, w, D) grid -> (H, W, D), bilinear with antialias in float32 (NaFlex's posemb resize)."""
  out_shape = (*out_hw, np.shape(grid)[-1])
  return np.asarray(jax.image.resize(jnp.asarray(grid, jnp.float32), out_shape, "bilinear",
                                     antialias=True))
