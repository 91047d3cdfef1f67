"""timm BEiT / BEiT v2 state dicts -> fi_jax.models.beit params.

timm keys: cls_token (1, 1, D); patch_embed.proj.{weight, bias}; blocks.<i>.{norm1, norm2,
attn.qkv.weight (3D, D) (no bias), attn.q_bias, attn.v_bias, attn.relative_position_bias_table
((2h-1)(2w-1)+3, heads), attn.proj, mlp.fc1, mlp.fc2, gamma_1, gamma_2}; fc_norm; head. The
official microsoft/unilm files wrap the same names in {"model": ...} and also store the
`relative_position_index` buffers: checked against the derived ones when the file's grid is
the model's, else dropped (timm re-derives them too).
"""
from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from fi_jax.models import _checkpoints as checkpoints
from fi_jax.models.convert import keymap

HINT = ("BEiT weights: https://huggingface.co/timm/beit_<size>_patch16_<res>.<tag> or "
        "https://huggingface.co/timm/beitv2_<size>_patch16_224.<tag> (model.safetensors)")

_LN = {"scale": "weight", "bias": "bias"}


def _window(n: int) -> int:
  """The square window side of a table with n = (2s-1)^2 + 3 entries."""
  side = int(round(np.sqrt(n - 3)))
  return (side + 1) // 2 if side * side == n - 3 else -1


def _bracket_offsets(src: int, dst: int) -> np.ndarray:
  """timm's source offsets for resizing a table of `src` (= 2s-1) offsets to `dst`: the ratio q
  whose geometric progression 1 + q + ... reaches dst // 2 (bisection to 1e-6), then
  0, +-1, +-(1+q), +-(1+q+q^2), ... (the BEiT fine-tuning recipe)."""
  left, right = 1.01, 1.5
  while right - left > 1e-6:
    q = (left + right) / 2.0
    if (1.0 - q ** (src // 2)) / (1.0 - q) > dst // 2:
      right = q
    else:
      left = q
  dis, cur = [], 1.0
  for i in range(src // 2):
    dis.append(cur)
    cur += q ** (i + 1)
  return np.asarray([-d for d in reversed(dis)] + [0.0] + dis, np.float32)


def _interp_linear(points: np.ndarray, x: np.ndarray) -> tuple[np.ndarray, np.ndarray,
                                                                 np.ndarray, np.ndarray]:
  """Left / right neighbour indices and distances of `x` on the sorted grid `points`, with
  timm's RegularGridInterpolator conventions (clamped at the ends; an exact hit weighs 1:1)."""
  right = np.minimum(np.searchsorted(points, x, side="left"), len(points) - 1)
  left = np.clip(right - 1, 0, len(points) - 1)
  d_left = np.maximum(x - points[left], 0.0)
  d_right = np.maximum(points[right] - x, 0.0)
  both = (d_left == 0) & (d_right == 0)
  d_left, d_right = np.where(both, 1.0, d_left), np.where(both, 1.0, d_right)
  return left, right, d_left.astype(np.float32), d_right.astype(np.float32)


def resize_table(table: np.ndarray, window: tuple[int, int]) -> np.ndarray:
  """A square-window ((2s-1)^2 + 3, heads) bias table -> the one of `window` (h, w), as timm's
  `resize_rel_pos_bias_table` without scipy: the 3 extra entries kept, each head's (2s-1)^2
  grid linearly interpolated from the progression offsets onto the integer offsets."""
  dst = (2 * window[0] - 1, 2 * window[1] - 1)
  s = _window(table.shape[0])
  if s < 0:
    raise checkpoints.CheckpointError(
        f"A relative position bias table of {table.shape[0]} entries is not that of a square "
        f"window ((2s-1)^2 + 3 entries): cannot resize it to a {window[0]}x{window[1]} grid.")
  src = 2 * s - 1
  if (src, src) == dst:
    return table
  extra, grid = table[-3:], table[:-3].astype(np.float32).reshape(src, src, -1)
  ly, ry, dly, dry = _interp_linear(_bracket_offsets(src, dst[0]),
                                    np.arange(-(dst[0] // 2), dst[0] // 2 + 0.1, 1.0))
  lx, rx, dlx, drx = _interp_linear(_bracket_offsets(src, dst[1]),
                                    np.arange(-(dst[1] // 2), dst[1] // 2 + 0.1, 1.0))
  wy = (dry[:, None], dly[:, None])     # weight of the left / right neighbour along y
  wx = (drx[None, :], dlx[None, :])
  num = 0.0
  for iy, fy in ((ly, wy[0]), (ry, wy[1])):
    for ix, fx in ((lx, wx[0]), (rx, wx[1])):
      num = num + grid[iy[:, None], ix[None, :]] * (fy * fx)[..., None]
  den = ((dly + dry)[:, None] * (dlx + drx)[None, :])[..., None]
  out = (num / den).reshape(dst[0] * dst[1], -1)
  return np.concatenate([out, extra.astype(np.float32)]).astype(table.dtype)


def relative_position_index(h: int, w: int) -> np.ndarray:
  """(h*w + 1, h*w + 1) indices into a (2h-1)(2w-1)+3 table: patch i attends patch j through
  entry (dy + h-1) * (2w-1) + (dx + w-1) with (dy, dx) = pos(i) - pos(j); row 0 (class token
  as query) uses entry n-3, column 0 (class token as key) n-2, and (0, 0) n-1."""
  n = (2 * h - 1) * (2 * w - 1) + 3
  yy, xx = np.meshgrid(np.arange(h), np.arange(w), indexing="ij")
  y, x = yy.reshape(-1), xx.reshape(-1)
  dy = y[:, None] - y[None, :] + h - 1
  dx = x[:, None] - x[None, :] + w - 1
  index = np.zeros((h * w + 1,) * 2, np.int32)
  index[1:, 1:] = dy * (2 * w - 1) + dx
  index[0, :] = n - 3
  index[:, 0] = n - 2
  index[0, 0] = n - 1
  return index


def key_map(init_params: Mapping[str, Any], window: tuple[int, int]
            ) -> dict[str, tuple[str, Any]]:
  """{flax leaf path: (timm key, transform)} for every leaf of `init_params`."""
  spec = {"cls_token": ("cls_token", keymap.same),
          "patch_embed/kernel": ("patch_embed.proj.weight", keymap.conv),
          "patch_embed/bias": ("patch_embed.proj.bias", keymap.same)}

  def dense(path, key, bias=True):
    spec[f"{path}/kernel"] = (f"{key}.weight", keymap.dense)
    if bias:
      spec[f"{path}/bias"] = (f"{key}.bias", keymap.same)

  def norm(path, key):
    for f, t in _LN.items():
      spec[f"{path}/{f}"] = (f"{key}.{t}", keymap.same)

  depth = sum(1 for k in init_params if k.startswith("blocks_"))
  for i in range(depth):
    p, t = f"blocks_{i}", f"blocks.{i}"
    norm(f"{p}/norm1", f"{t}.norm1")
    norm(f"{p}/norm2", f"{t}.norm2")
    dense(f"{p}/attn/qkv", f"{t}.attn.qkv", bias=False)
    dense(f"{p}/attn/proj", f"{t}.attn.proj")
    spec[f"{p}/attn/q_bias"] = (f"{t}.attn.q_bias", keymap.same)
    spec[f"{p}/attn/v_bias"] = (f"{t}.attn.v_bias", keymap.same)
    spec[f"{p}/attn/relative_position_bias_table"] = (
        f"{t}.attn.relative_position_bias_table", lambda a: resize_table(a, window))
    dense(f"{p}/fc1", f"{t}.mlp.fc1")
    dense(f"{p}/fc2", f"{t}.mlp.fc2")
    spec[f"{p}/gamma_1"] = (f"{t}.gamma_1", keymap.same)
    spec[f"{p}/gamma_2"] = (f"{t}.gamma_2", keymap.same)
  norm("fc_norm", "fc_norm")
  if "head" in init_params:
    dense("head", "head")
  return spec


def window_of(init_params: Mapping[str, Any]) -> tuple[int, int]:
  """The (s, s) patch grid of the init tree, read off its first bias table ((2s-1)^2 + 3
  rows); a model initialised on a non-square grid is refused."""
  n = init_params["blocks_0"]["attn"]["relative_position_bias_table"].shape[0]
  s = _window(n)
  if s < 0:
    raise ValueError(f"BEiT init tree with a non-square bias table ({n} rows).")
  return s, s


def convert(sd: Mapping[str, np.ndarray], init_params: Mapping[str, Any], *,
            file: str = "checkpoint") -> dict:
  """A timm / unilm BEiT state dict -> params on `init_params`' tree (bias tables resized to
  its grid; a model built without a head drops the file's)."""
  window = window_of(init_params)
  index = relative_position_index(*window)
  buffers, skip = {}, []
  for k in sd:
    if k.endswith("relative_position_index"):
      if np.shape(sd[k]) == index.shape:
        buffers[k] = index
      else:
        skip.append(k)
  if "head" not in init_params:
    skip += ["head.weight", "head.bias"]
  return keymap.apply(sd, key_map(init_params, window), init_params,
                      source=f"{file} (BEiT)", hint=HINT + ".", skip=skip, buffers=buffers)
