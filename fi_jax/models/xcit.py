"""XCiT (El-Nouby et al. 2021, "XCiT: Cross-Covariance Image Transformers") in Flax, loading
timm's `xcit_*` weights.

timm's `Xcit` (timm 1.0.31 `timm/models/xcit.py`, after facebookresearch/xcit): a
convolutional patch stem (3x3 stride-2 convs without bias + BatchNorm, GELU between: 4 for
patch 16, 3 for patch 8; widths D/8, D/4, D/2, D), a **Fourier positional encoding** added to
the patches (sin / cos of the 1-based row / column index over (size + 1e-6) * 2*pi, 32 bands
each at temperature 10000, projected by a 1x1 conv `token_projection`), `depth` XCA blocks,
then a class token and 2 class-attention blocks, a final LayerNorm, and the class token =
`out["pre_logits"]` -> `head`. LayerNorm eps 1e-6, exact GELU, MLP 4x, layer scale everywhere.
- XCA block: x + gamma1 * XCA(norm1(x)); x + gamma3 * LPI(norm3(x)); x + gamma2 * MLP(norm2(x)).
  XCA is attention across channels: per head, q and k (d x N) L2-normalised over the tokens,
  softmax(q k^T * `temperature`[head]) (d x d) applied to v. LPI: depthwise 3x3 conv -> GELU ->
  BatchNorm -> depthwise 3x3 conv on the token grid.
- Class-attention block (timm `ClassAttentionBlock`): u = norm1(x); x = x + gamma1 * [CA(u) |
  u_patches] (CA: the class token's query over all tokens' keys / values, CaiT's `ClassAttn`);
  then norm2 on all tokens (`tokens_norm`, every size but nano) or on the class token only;
  the class token gets + gamma2 * MLP(it), and the patch tokens are doubled (timm adds the
  block's input to [MLP output | patches]; reproduced as is).
The positional encoding follows the input grid, so the model runs at any input size it is
initialised at (BatchNorm in eval mode: running statistics).
"""
from __future__ import annotations

import re
from typing import Any, Mapping, Optional

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from fi_jax.models import _blocks, _timm_tags
from fi_jax.models import _pretrained as pretrained
from fi_jax.models.beit import layer_norm
from fi_jax.models.cait import ClassAttn
from fi_jax.models.convert import readers
from fi_jax.models.convert import xcit as convert
from fi_jax.models.dinov3 import GeluMlp

HIGHEST = jax.lax.Precision.HIGHEST


def fourier_features(h: int, w: int, hidden: int = 32, temperature: float = 10_000.
                     ) -> np.ndarray:
  """(h, w, 2 * hidden) float32: [row features | column features], each [sin(p0), cos(p1),
  sin(p2), ...] of position / temperature^(2 floor(i/2) / hidden) (timm
  `PositionalEncodingFourier` before its 1x1 conv)."""
  eps, scale = np.float32(1e-6), np.float32(2 * np.pi)
  y = np.arange(1, h + 1, dtype=np.float32) / (np.float32(h) + eps) * scale
  x = np.arange(1, w + 1, dtype=np.float32) / (np.float32(w) + eps) * scale
  dim_t = np.float32(temperature) ** (2 * (np.arange(hidden) // 2).astype(np.float32)
                                      / np.float32(hidden))

  def feats(t):
    a = t[:, None] / dim_t
    return np.stack([np.sin(a[:, 0::2]), np.cos(a[:, 1::2])], axis=-1).reshape(len(t), -1)
  fy, fx = feats(y), feats(x)
  out = np.concatenate([np.broadcast_to(fy[:, None], (h, w, hidden)),
                        np.broadcast_to(fx[None, :], (h, w, hidden))], axis=-1)
  return out.astype(np.float32)


class XCA(nn.Module):
  num_heads: int
  dtype: Any = jnp.float32
  precision: Any = HIGHEST

  @nn.compact
  def __call__(self, x):
    b, n, c = x.shape
    kw = dict(dtype=self.dtype, precision=self.precision)
    temperature = self.param("temperature", nn.initializers.ones, (self.num_heads, 1, 1),
                             jnp.float32)
    qkv = nn.Dense(3 * c, name="qkv", **kw)(x).reshape(b, n, 3, self.num_heads, -1)
    q, k, v = (jnp.transpose(qkv[:, :, i], (0, 2, 3, 1)) for i in range(3))   # (B, H, d, N)
    unit = lambda t: t / jnp.maximum(jnp.linalg.norm(t.astype(jnp.float32), axis=-1,
                                                     keepdims=True), 1e-12).astype(t.dtype)
    logits = jnp.einsum("bhin,bhjn->bhij", unit(q), unit(k), precision=self.precision)
    weights = jax.nn.softmax((logits * temperature).astype(jnp.float32), axis=-1)
    y = jnp.einsum("bhij,bhjn->bhin", weights.astype(self.dtype), v, precision=self.precision)
    return nn.Dense(c, name="proj", **kw)(jnp.transpose(y, (0, 3, 1, 2)).reshape(b, n, c))


class LPI(nn.Module):
  dtype: Any = jnp.float32
  precision: Any = HIGHEST

  @nn.compact
  def __call__(self, x, hw):
    b, n, c = x.shape
    dw = lambda name: _blocks.DepthwiseConv((3, 3), padding=((1, 1), (1, 1)), dtype=self.dtype,
                                            precision=self.precision, name=name)
    y = dw("conv1")(x.reshape(b, *hw, c))
    y = _blocks.BatchNorm(name="bn")(_blocks.gelu_exact(y))
    return dw("conv2")(y).reshape(b, n, c)


class XCABlock(nn.Module):
  num_heads: int
  mlp_hidden: int
  dtype: Any = jnp.float32
  precision: Any = HIGHEST

  @nn.compact
  def __call__(self, x, hw):
    kw = dict(dtype=self.dtype, precision=self.precision)
    d = x.shape[-1]
    gamma = lambda name: self.param(name, nn.initializers.ones, (d,), jnp.float32).astype(
        self.dtype)
    ln = lambda name, t: layer_norm(name)(t).astype(self.dtype)
    x = x + gamma("gamma1") * XCA(self.num_heads, name="attn", **kw)(ln("norm1", x))
    x = x + gamma("gamma3") * LPI(name="local_mp", **kw)(ln("norm3", x), hw)
    return x + gamma("gamma2") * GeluMlp(self.mlp_hidden, name="mlp", **kw)(ln("norm2", x))


class ClassAttentionBlock(nn.Module):
  num_heads: int
  mlp_hidden: int
  tokens_norm: bool = True
  dtype: Any = jnp.float32
  precision: Any = HIGHEST

  @nn.compact
  def __call__(self, x):
    kw = dict(dtype=self.dtype, precision=self.precision)
    d = x.shape[-1]
    gamma = lambda name: self.param(name, nn.initializers.ones, (d,), jnp.float32).astype(
        self.dtype)
    u = layer_norm("norm1")(x).astype(self.dtype)
    x = x + gamma("gamma1") * jnp.concatenate(
        [ClassAttn(self.num_heads, name="attn", **kw)(u), u[:, 1:]], axis=1)
    norm2 = layer_norm("norm2")
    if self.tokens_norm:
      x = norm2(x).astype(self.dtype)
    else:
      x = jnp.concatenate([norm2(x[:, :1]).astype(self.dtype), x[:, 1:]], axis=1)
    cls = gamma("gamma2") * GeluMlp(self.mlp_hidden, name="mlp", **kw)(x[:, :1])
    return x + jnp.concatenate([cls, x[:, 1:]], axis=1)


class _Model(nn.Module):
  num_classes: Optional[int] = 1000
  patch_size: int = 16
  width: int = 384
  depth: int = 12
  num_heads: int = 8
  mlp_hidden: int = 1536
  tokens_norm: bool = True
  cls_attn_layers: int = 2
  dtype: str = "float32"
  precision: Any = HIGHEST

  @nn.compact
  def __call__(self, image, *, train: bool = False):
    del train
    dt = jnp.dtype(self.dtype)
    kw = dict(dtype=dt, precision=self.precision)
    d = self.width
    if self.patch_size not in (8, 16):
      raise ValueError(f"XCiT's convolutional stem needs patch_size 8 or 16, got {self.patch_size}.")
    widths = [d // 8, d // 4, d // 2, d] if self.patch_size == 16 else [d // 4, d // 2, d]
    x = jnp.asarray(image, dt)
    for i, c in enumerate(widths):
      if i:
        x = _blocks.gelu_exact(x)
      x = _blocks.conv(c, 3, 2, dtype=dt, precision=self.precision, name=f"stem_{i}_conv")(x)
      x = _blocks.BatchNorm(name=f"stem_{i}_bn")(x)
    b, h, w, _ = x.shape
    pos = nn.Conv(d, (1, 1), name="pos_embed", **kw)(jnp.asarray(fourier_features(h, w), dt))
    x = (x + pos[None]).reshape(b, h * w, d)
    for i in range(self.depth):
      x = XCABlock(self.num_heads, self.mlp_hidden, name=f"blocks_{i}", **kw)(x, (h, w))
    cls = self.param("cls_token", nn.initializers.zeros, (1, 1, d), jnp.float32)
    x = jnp.concatenate([jnp.broadcast_to(cls.astype(dt), (b, 1, d)), x], axis=1)
    for i in range(self.cls_attn_layers):
      x = ClassAttentionBlock(self.num_heads, self.mlp_hidden, self.tokens_norm,
                              name=f"cls_attn_blocks_{i}", **kw)(x)
    x = layer_norm("norm")(x)
    out = {"encoded": x}
    x = out["pre_logits"] = x[:, 0]
    if self.num_classes:
      x = out["logits"] = nn.Dense(self.num_classes, name="head", **kw)(x.astype(dt)).astype(
          jnp.float32)
    return x, out


_SIZES = {"nano": (128, 4), "tiny": (192, 4), "small": (384, 8), "medium": (512, 8),
          "large": (768, 16)}


def _arch(name: str) -> dict:
  size, depth, patch = re.fullmatch(r"xcit_(\w+?)_(\d+)_p(\d+)_\d+", name).groups()
  width, heads = _SIZES[size]
  return dict(patch_size=int(patch), width=width, depth=int(depth), num_heads=heads,
              mlp_hidden=4 * width, tokens_norm=size != "nano")


# timm's xcit_* model functions: every size / depth / patch / resolution timm has tags for
ARCHS: dict[str, dict] = {m: _arch(m) for m in sorted(_timm_tags.DEFAULT_TAGS)
                          if m.startswith("xcit_")}

PRETRAINED: dict[str, dict] = pretrained.timm_tags(list(ARCHS))


def Model(num_classes: Optional[int] = 1000, *, variant: str, **kw) -> _Model:
  """`Model(1000, variant="xcit_small_12_p16_224")`; `kw` overrides ARCHS (width, depth,
  num_heads, mlp_hidden, tokens_norm, patch_size, dtype, ...)."""
  name = variant.split(".")[0]
  if name not in ARCHS:
    raise ValueError(f"Unknown XCiT variant {variant!r}; known: {sorted(ARCHS)}.")
  kw.pop("source", None)
  return _Model(num_classes, **{**ARCHS[name], **kw})


def load(init_params, init_file: str, model_cfg: Optional[Mapping] = None) -> dict:
  """timm / official XCiT weights (`model.safetensors`, a .pth state dict) onto `init_params`."""
  sd = readers.read_state_dict(init_file, hint=convert.HINT)
  return convert.convert(sd, init_params, file=init_file)
