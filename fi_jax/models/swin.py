"""Swin Transformer v1 and v2 in Flax, loading torchvision's and timm's ImageNet weights.

`Model(1000, variant="swin_t")` (torchvision names: swin_t/s/b, swin_v2_t/s/b) or
`Model(1000, variant="swin_tiny_patch4_window7_224")` (timm names: swin_*, swinv2_*) builds:
a 4x4/4 patch conv + LayerNorm, four stages of (shifted-)window attention blocks with patch
merging between stages, a final LayerNorm, global average pooling and the linear `head`.

v1 blocks are pre-norm, scaled dot-product attention plus a learned relative position bias
table indexed by the (derived, not stored) relative_position_index. v2 blocks are post-norm
(x + norm(attn(x))), cosine attention scaled by exp(min(logit_scale, log 100)), and the bias
16 * sigmoid(cpb_mlp(log-spaced relative coordinates)); v2 patch merging normalises after the
reduction. LayerNorm eps 1e-5, exact GELU, shift = window // 2 in every odd block with the
reference's -100 attention mask.

Inputs whose feature maps are not a multiple of the window follow each library:
  source="torchvision": pad bottom/right to a multiple of the window, then shift (a shift is
      dropped where the window covers the padded map); any input size works.
  source="timm": windows and shifts are fixed from `img_size` (a window larger than a stage's
      map shrinks to the map and loses its shift, as timm's constructor does); at run time the
      map is shifted, then padded (timm's dynamic_img_size behaviour at other sizes).

`apply({"params": p}, images_nhwc)` returns `(logits, out)`: out["pre_logits"] is the pooled,
normalised feature the head reads (torchvision: `head`'s input; timm: forward_head(x,
pre_logits=True)); out["stem"], out["stage0".."stage3"] are NHWC maps.
"""
from __future__ import annotations

import math
from typing import Any, Mapping, Optional, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from fi_jax.data import preprocess
from fi_jax.models import _blocks
from fi_jax.models import _pretrained as pretrained
from fi_jax.models.convert import readers
from fi_jax.models.convert import swin as convert

_T = dict(embed_dim=96, depths=(2, 2, 6, 2), num_heads=(3, 6, 12, 24))
_S = dict(embed_dim=96, depths=(2, 2, 18, 2), num_heads=(3, 6, 12, 24))
_B = dict(embed_dim=128, depths=(2, 2, 18, 2), num_heads=(4, 8, 16, 32))
_L = dict(embed_dim=192, depths=(2, 2, 18, 2), num_heads=(6, 12, 24, 48))
_PT12 = (12, 12, 12, 6)   # timm's pretrained_window_sizes of the 12to16 / 12to24 fine-tunes

# variant: module keyword arguments (torchvision's builders and timm's model_args).
ARCHS: dict[str, dict] = {
    "swin_t": dict(**_T, window_size=7, version=1, source="torchvision"),
    "swin_s": dict(**_S, window_size=7, version=1, source="torchvision"),
    "swin_b": dict(**_B, window_size=7, version=1, source="torchvision"),
    "swin_v2_t": dict(**_T, window_size=8, version=2, source="torchvision"),
    "swin_v2_s": dict(**_S, window_size=8, version=2, source="torchvision"),
    "swin_v2_b": dict(**_B, window_size=8, version=2, source="torchvision"),
    "swin_tiny_patch4_window7_224": dict(**_T, window_size=7, img_size=224, version=1),
    "swin_small_patch4_window7_224": dict(**_S, window_size=7, img_size=224, version=1),
    "swin_base_patch4_window7_224": dict(**_B, window_size=7, img_size=224, version=1),
    "swin_base_patch4_window12_384": dict(**_B, window_size=12, img_size=384, version=1),
    "swin_large_patch4_window7_224": dict(**_L, window_size=7, img_size=224, version=1),
    "swin_large_patch4_window12_384": dict(**_L, window_size=12, img_size=384, version=1),
    "swinv2_tiny_window8_256": dict(**_T, window_size=8, img_size=256, version=2),
    "swinv2_tiny_window16_256": dict(**_T, window_size=16, img_size=256, version=2),
    "swinv2_small_window8_256": dict(**_S, window_size=8, img_size=256, version=2),
    "swinv2_small_window16_256": dict(**_S, window_size=16, img_size=256, version=2),
    "swinv2_base_window8_256": dict(**_B, window_size=8, img_size=256, version=2),
    "swinv2_base_window16_256": dict(**_B, window_size=16, img_size=256, version=2),
    "swinv2_base_window12_192": dict(**_B, window_size=12, img_size=192, version=2),
    "swinv2_base_window12to16_192to256": dict(**_B, window_size=16, img_size=256, version=2,
                                              pretrained_window_sizes=_PT12),
    "swinv2_base_window12to24_192to384": dict(**_B, window_size=24, img_size=384, version=2,
                                              pretrained_window_sizes=_PT12),
    "swinv2_large_window12_192": dict(**_L, window_size=12, img_size=192, version=2),
    "swinv2_large_window12to16_192to256": dict(**_L, window_size=16, img_size=256, version=2,
                                               pretrained_window_sizes=_PT12),
    "swinv2_large_window12to24_192to384": dict(**_L, window_size=24, img_size=384, version=2,
                                               pretrained_window_sizes=_PT12),
}


def _pretrained() -> dict[str, dict]:
  table = {}
  for name, sha, crop, resize in (("swin_t", "704ceda3", 224, 232), ("swin_s", "5e29d889", 224, 246),
                                  ("swin_b", "68c6b09e", 224, 238),
                                  ("swin_v2_t", "b137f0e2", 256, 260),
                                  ("swin_v2_s", "637d8ceb", 256, 260),
                                  ("swin_v2_b", "781e5279", 256, 272)):
    table[f"torchvision/{name}.IMAGENET1K_V1"] = dict(
        variant=name, source="torchvision", num_classes=1000, input_size=crop,
        # torchvision ImageClassification: Resize(resize, bicubic, antialias) + CenterCrop.
        pp=preprocess.torchvision_pp(resize, crop, "bicubic"),
        url=f"https://download.pytorch.org/models/{name}-{sha}.pth")
  # every timm tag of the timm architectures (ms_in1k, ms_in22k[_ft_in1k], ...)
  table.update(pretrained.timm_tags([a for a, kw in ARCHS.items()
                                     if kw.get("source") != "torchvision"]))
  return table


# Published weights: torchvision's IMAGENET1K_V1 and every timm tag of the timm ARCHS.
PRETRAINED: dict[str, dict] = _pretrained()


# ----------------------------------------------------------------------------- geometry

def relative_position_index(wh: int, ww: int) -> np.ndarray:
  """(wh*ww, wh*ww) index into the ((2wh-1)(2ww-1), heads) bias table: for tokens p, q of a
  window, (dy + wh - 1) * (2ww - 1) + (dx + ww - 1) with (dy, dx) = p - q."""
  ys, xs = np.meshgrid(np.arange(wh), np.arange(ww), indexing="ij")
  ys, xs = ys.reshape(-1), xs.reshape(-1)
  dy = ys[:, None] - ys[None, :] + wh - 1
  dx = xs[:, None] - xs[None, :] + ww - 1
  return (dy * (2 * ww - 1) + dx).astype(np.int64)


def relative_coords_table(wh: int, ww: int, pretrained: Sequence[int] = (0, 0)) -> np.ndarray:
  """v2's (2wh-1, 2ww-1, 2) CPB input: offsets / (window - 1) (timm: pretrained window - 1)
  * 8, then sign(t) * log2(|t| + 1) / 3."""
  div = [max(p - 1, 1) for p in pretrained] if pretrained[0] > 0 else [max(wh - 1, 1),
                                                                      max(ww - 1, 1)]
  h = np.arange(-(wh - 1), wh, dtype=np.float32) / np.float32(div[0])
  w = np.arange(-(ww - 1), ww, dtype=np.float32) / np.float32(div[1])
  t = np.stack(np.meshgrid(h, w, indexing="ij"), axis=-1) * np.float32(8)
  return (np.sign(t) * np.log2(np.abs(t) + np.float32(1)) / np.float32(3)).astype(np.float32)


def shift_mask(hp: int, wp: int, window: Sequence[int], shift: Sequence[int]) -> np.ndarray:
  """(num_windows, N, N) additive mask (0 / -100) of a shifted window partition of an
  (hp, wp) map: tokens from different regions of the rolled map do not attend to each other.
  Region slices exactly as the references (Python slices, so a zero shift spans the map)."""
  img = np.zeros((hp, wp), np.float32)
  cnt = 0
  for h in ((0, -window[0]), (-window[0], -shift[0]), (-shift[0], None)):
    for w in ((0, -window[1]), (-window[1], -shift[1]), (-shift[1], None)):
      img[h[0]:h[1], w[0]:w[1]] = cnt
      cnt += 1
  m = _partition(img[None, :, :, None], window)[0, :, :, 0]   # (nW, N)
  diff = m[:, None, :] - m[:, :, None]
  return np.where(diff != 0, np.float32(-100.0), np.float32(0.0))


def _partition(x, window):
  """(B, H, W, C) -> (B, num_windows, wh*ww, C), windows in row-major order."""
  b, h, w, c = x.shape
  x = x.reshape(b, h // window[0], window[0], w // window[1], window[1], c)
  return x.transpose(0, 1, 3, 2, 4, 5).reshape(b, -1, window[0] * window[1], c)


def _unpartition(x, window, h: int, w: int):
  b, _, _, c = x.shape
  x = x.reshape(b, h // window[0], w // window[1], window[0], window[1], c)
  return x.transpose(0, 1, 3, 2, 4, 5).reshape(b, h, w, c)


def stage_windows(depths: Sequence[int], window_size: Any, source: str,
                  img_size: Optional[int], patch_size: int) -> list[tuple[tuple, tuple]]:
  """Per stage (window (h, w), odd-block shift (h, w)). timm shrinks a window to a stage's
  map (from `img_size`) and drops its shift there; torchvision keeps them as given."""
  n = len(depths)
  ws = window_size if isinstance(window_size, (list, tuple)) else [window_size] * n
  out = []
  grid = None if img_size is None else (img_size // patch_size,) * 2
  for i in range(n):
    win = (ws[i], ws[i])
    shift = (ws[i] // 2, ws[i] // 2)
    if source == "timm" and grid is not None:
      res = tuple(-(-g // 2 ** i) for g in grid)  # ceil: timm's patch merging pads odd maps
      win = tuple(r if r <= w else w for r, w in zip(res, win))
      shift = tuple(0 if r <= w else s for r, w, s in zip(res, win, shift))
    out.append((win, shift))
  return out


# ----------------------------------------------------------------------------- modules

def _layer_norm(name: str, eps: float) -> nn.LayerNorm:
  # Two-pass variance as torch computes it; always in float32.
  return nn.LayerNorm(epsilon=eps, use_fast_variance=False, dtype=jnp.float32, name=name)


class WindowAttention(nn.Module):
  """Multi-head attention inside each window, plus relative position bias (v1: table, v2: CPB
  MLP with cosine attention). Input (B, nW, N, C) windows and an optional (nW, N, N) mask."""
  dim: int
  num_heads: int
  window: tuple
  version: int = 1
  pretrained_window: tuple = (0, 0)
  dtype: Any = jnp.float32
  precision: Any = jax.lax.Precision.HIGHEST

  def position_bias(self):
    """(heads, N, N) bias for one window."""
    wh, ww = self.window
    idx = relative_position_index(wh, ww).reshape(-1)
    n = wh * ww
    if self.version == 1:
      table = self.param("relative_position_bias_table", nn.initializers.normal(0.02),
                         ((2 * wh - 1) * (2 * ww - 1), self.num_heads), jnp.float32)
    else:
      coords = jnp.asarray(relative_coords_table(wh, ww, self.pretrained_window))
      h = nn.relu(nn.Dense(512, precision=self.precision, name="cpb_mlp_0")(coords))
      table = nn.Dense(self.num_heads, use_bias=False, precision=self.precision,
                       name="cpb_mlp_1")(h).reshape(-1, self.num_heads)
    bias = table[idx].reshape(n, n, self.num_heads).transpose(2, 0, 1)
    return 16 * jax.nn.sigmoid(bias) if self.version == 2 else bias

  @nn.compact
  def __call__(self, x, mask=None):
    b, nw, n, c = x.shape
    hd = c // self.num_heads
    kw = dict(dtype=self.dtype, precision=self.precision)
    if self.version == 1:
      qkv = nn.Dense(3 * c, name="qkv", **kw)(x)
    else:   # v2: q and v biases; the key bias is fixed at zero
      qkv = nn.Dense(3 * c, use_bias=False, name="qkv", **kw)(x)
      q_bias = self.param("q_bias", nn.initializers.zeros, (c,), jnp.float32)
      v_bias = self.param("v_bias", nn.initializers.zeros, (c,), jnp.float32)
      qkv = qkv + jnp.concatenate([q_bias, jnp.zeros_like(q_bias), v_bias]).astype(qkv.dtype)
    qkv = qkv.reshape(b, nw, n, 3, self.num_heads, hd).transpose(3, 0, 1, 4, 2, 5)
    q, k, v = qkv[0], qkv[1], qkv[2]                   # (B, nW, heads, N, hd)
    if self.version == 1:
      logits = jnp.einsum("bwhqd,bwhkd->bwhqk", q * hd ** -0.5, k, precision=self.precision)
    else:
      def unit(t):   # F.normalize: t / max(|t|, 1e-12)
        t = t.astype(jnp.float32)
        return t / jnp.maximum(jnp.linalg.norm(t, axis=-1, keepdims=True), 1e-12)
      logits = jnp.einsum("bwhqd,bwhkd->bwhqk", unit(q), unit(k), precision=self.precision)
      scale = self.param("logit_scale", nn.initializers.constant(math.log(10.0)),
                         (self.num_heads,), jnp.float32)
      logits = logits * jnp.exp(jnp.minimum(scale, math.log(100.0)))[:, None, None]
    logits = logits.astype(jnp.float32) + self.position_bias()
    if mask is not None:
      logits = logits + jnp.asarray(mask)[None, :, None]
    attn = jax.nn.softmax(logits, axis=-1).astype(v.dtype)
    y = jnp.einsum("bwhqk,bwhkd->bwqhd", attn, v, precision=self.precision).reshape(b, nw, n, c)
    return nn.Dense(c, name="proj", **kw)(y)


class Block(nn.Module):
  """Swin block: (shifted) window attention and an MLP, pre-norm (v1) or post-norm (v2)."""
  dim: int
  num_heads: int
  window: tuple
  shift: tuple
  version: int = 1
  source: str = "torchvision"
  mlp_ratio: float = 4.0
  pretrained_window: tuple = (0, 0)
  eps: float = 1e-5
  dtype: Any = jnp.float32
  precision: Any = jax.lax.Precision.HIGHEST

  def _attention(self, x, attn: WindowAttention):
    _, h, w, _ = x.shape
    win = self.window
    pad = ((0, 0), (0, (-h) % win[0]), (0, (-w) % win[1]), (0, 0))
    if self.source == "torchvision":   # pad, then shift; no shift where a window spans the map
      x = jnp.pad(x, pad)
      hp, wp = x.shape[1:3]
      shift = tuple(0 if wi >= s else sh for wi, s, sh in zip(win, (hp, wp), self.shift))
      x = jnp.roll(x, (-shift[0], -shift[1]), axis=(1, 2)) if any(shift) else x
    else:                              # timm: shift, then pad
      shift = self.shift
      x = jnp.roll(x, (-shift[0], -shift[1]), axis=(1, 2)) if any(shift) else x
      x = jnp.pad(x, pad)
      hp, wp = x.shape[1:3]
    mask = shift_mask(hp, wp, win, shift) if any(shift) else None
    y = _unpartition(attn(_partition(x, win), mask), win, hp, wp)
    if self.source == "torchvision":
      y = jnp.roll(y, shift, axis=(1, 2)) if any(shift) else y
      return y[:, :h, :w]
    y = y[:, :h, :w]
    return jnp.roll(y, shift, axis=(1, 2)) if any(shift) else y

  @nn.compact
  def __call__(self, x):
    kw = dict(dtype=self.dtype, precision=self.precision)
    attn = WindowAttention(self.dim, self.num_heads, self.window, self.version,
                           self.pretrained_window, name="attn", **kw)
    hidden = int(self.dim * self.mlp_ratio)

    def mlp(y):
      y = _blocks.gelu_exact(nn.Dense(hidden, name="mlp_fc1", **kw)(y))
      return nn.Dense(self.dim, name="mlp_fc2", **kw)(y)

    norm1, norm2 = _layer_norm("norm1", self.eps), _layer_norm("norm2", self.eps)
    if self.version == 1:
      x = x + self._attention(norm1(x).astype(self.dtype), attn)
      return x + mlp(norm2(x).astype(self.dtype))
    x = x + norm1(self._attention(x, attn)).astype(self.dtype)
    return x + norm2(mlp(x)).astype(self.dtype)


class PatchMerging(nn.Module):
  """2x2 neighbours -> channels (zero-padding odd maps), then LayerNorm + Linear 4C -> 2C
  (v1) or Linear + LayerNorm (v2)."""
  dim: int
  version: int = 1
  eps: float = 1e-5
  dtype: Any = jnp.float32
  precision: Any = jax.lax.Precision.HIGHEST

  @nn.compact
  def __call__(self, x):
    _, h, w, _ = x.shape
    x = jnp.pad(x, ((0, 0), (0, h % 2), (0, w % 2), (0, 0)))
    x = jnp.concatenate([x[:, 0::2, 0::2], x[:, 1::2, 0::2], x[:, 0::2, 1::2], x[:, 1::2, 1::2]],
                        axis=-1)
    reduction = nn.Dense(2 * self.dim, use_bias=False, dtype=self.dtype,
                         precision=self.precision, name="reduction")
    norm = _layer_norm("norm", self.eps)
    if self.version == 1:
      return reduction(norm(x).astype(self.dtype))
    return norm(reduction(x)).astype(self.dtype)


class _Model(nn.Module):
  """Swin v1 / v2; the param tree is the same whichever library the weights come from."""
  num_classes: Optional[int] = 1000
  patch_size: int = 4
  embed_dim: int = 96
  depths: Sequence[int] = (2, 2, 6, 2)
  num_heads: Sequence[int] = (3, 6, 12, 24)
  window_size: Any = 7                   # int, or one per stage
  mlp_ratio: float = 4.0
  version: int = 1
  source: str = "timm"                   # window / padding semantics: "timm" or "torchvision"
  img_size: Optional[int] = 224          # timm: the size windows are fitted to
  pretrained_window_sizes: Sequence[int] = (0, 0, 0, 0)   # timm v2 CPB coordinate scaling
  eps: float = 1e-5
  dtype: str = "float32"
  precision: Any = jax.lax.Precision.HIGHEST

  def windows(self) -> list[tuple[tuple, tuple]]:
    """Per stage (window, shift) as built (see `stage_windows`)."""
    if self.source not in ("timm", "torchvision"):
      raise ValueError(f"Swin source must be 'timm' or 'torchvision', got {self.source!r}.")
    if self.version not in (1, 2):
      raise ValueError(f"Swin version must be 1 or 2, got {self.version!r}.")
    return stage_windows(self.depths, self.window_size, self.source, self.img_size,
                         self.patch_size)

  @nn.compact
  def __call__(self, image, *, train: bool = False):
    del train   # inference only: no dropout / stochastic depth
    dt = jnp.dtype(self.dtype)
    kw = dict(dtype=dt, precision=self.precision)
    p = self.patch_size
    out = {}
    x = nn.Conv(self.embed_dim, (p, p), strides=(p, p), padding="VALID", name="patch_embed",
                **kw)(jnp.asarray(image, dt))
    x = out["stem"] = _layer_norm("patch_norm", self.eps)(x).astype(dt)
    pt = list(self.pretrained_window_sizes) + [0] * len(self.depths)
    for i, ((win, shift), depth) in enumerate(zip(self.windows(), self.depths)):
      dim = self.embed_dim * 2 ** i
      if i > 0:
        x = PatchMerging(dim // 2, self.version, self.eps, name=f"stage{i}_downsample", **kw)(x)
      for j in range(depth):
        x = Block(dim, self.num_heads[i], win, shift if j % 2 else (0, 0), self.version,
                  self.source, self.mlp_ratio, (pt[i], pt[i]), self.eps,
                  name=f"stage{i}_block{j}", **kw)(x)
      out[f"stage{i}"] = x
    x = _layer_norm("norm", self.eps)(x)
    x = out["pre_logits"] = jnp.mean(x, axis=(1, 2))
    if self.num_classes:
      x = out["logits"] = nn.Dense(self.num_classes, name="head", **kw)(x.astype(dt)).astype(
          jnp.float32)
    return x, out


def _arch(variant: str) -> dict:
  name = variant.split(".")[0]   # timm names may carry a pretrained tag: ....ms_in1k
  if name not in ARCHS:
    raise ValueError(f"Unknown Swin variant {variant!r}; known: {sorted(ARCHS)}.")
  return ARCHS[name]


def Model(num_classes: Optional[int] = 1000, *, variant: str, **kw) -> _Model:
  """`Model(1000, variant="swin_t")`; `kw` overrides ARCHS (embed_dim, depths, window_size,
  img_size, source, dtype...)."""
  return _Model(num_classes, **{**_arch(variant), **kw})


def load(init_params, init_file: str, model_cfg: Optional[Mapping] = None) -> dict:
  """torchvision (features.* / head.*) or timm (patch_embed.* / layers.* / head.fc.*) Swin v1
  or v2 weights from .pth or .safetensors onto `init_params` (arrays or ShapeDtypeStructs).

  The layout is read off the keys unless `model_cfg["source"]` names it. With `model_cfg`
  (the Model kwargs) the file's position buffers, where stored, are checked against the
  model's windows.
  """
  sd = readers.read_state_dict(init_file, hint=convert.HINT)
  cfg = dict(model_cfg or {})
  model = Model(**cfg) if "variant" in cfg else None
  buffers = None
  if model is not None:   # what the model derives, per stage
    pt = list(model.pretrained_window_sizes) + [0] * len(model.depths)
    buffers = [dict(relative_position_index=relative_position_index(*win),
                    relative_coords_table=relative_coords_table(*win, (pt[i], pt[i])))
               for i, (win, _) in enumerate(model.windows())]
  return convert.convert(sd, init_params, source=cfg.get("source"), file=init_file,
                         buffers=buffers)
