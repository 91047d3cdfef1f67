"""BEiT and BEiT v2 in Flax, loading timm's `beit_*` / `beitv2_*` weights.

A ViT with a learned class token and no absolute position embedding: every block's attention
adds its own relative position bias (a table of (2h-1)(2w-1)+3 entries per head, indexed by the
patch offset; the 3 extra entries are class->patch, patch->class and class->class), the query
and value projections have biases but the key has none, and both residual branches are scaled
per channel (layer scale `gamma_1`, `gamma_2`). Pooling: mean over the patch tokens, LayerNorm
(`fc_norm`) = `out["pre_logits"]` (timm `forward_head(x, pre_logits=True)`), then `head`.
LayerNorm eps 1e-6, exact GELU. BEiT v1 and v2 are the same module; they differ in weights and
in the input normalisation (v1: mean = std = 0.5; v2: ImageNet mean / std; see PRETRAINED).

The table's size follows the patch grid the model is initialised at; a file made for another
grid is resized on load as timm does (`resize_rel_pos_bias_table`: a geometric progression of
source offsets, linear interpolation onto the integer target offsets; the 3 extra entries
are kept). Facts from timm 1.0.31 (`timm/models/beit.py`, `timm/layers/pos_embed_rel.py`,
`timm/layers/interpolate.py`).

`apply({"params": p}, images_nhwc)` returns `(logits, out)`: out["pre_logits"], out["encoded"]
(the tokens after the last block).
"""
from __future__ import annotations

from typing import Any, Mapping, Optional

import flax.linen as nn
import jax
import jax.numpy as jnp

from fi_jax.models import _blocks
from fi_jax.models import _pretrained as pretrained
from fi_jax.models.convert import beit as convert
from fi_jax.models.convert import readers

HIGHEST = jax.lax.Precision.HIGHEST


def layer_norm(name: str, eps: float = 1e-6) -> nn.LayerNorm:
  """torch's LayerNorm: two-pass variance, float32."""
  return nn.LayerNorm(epsilon=eps, use_fast_variance=False, dtype=jnp.float32, name=name)


def attention(q, k, v, bias=None, precision=HIGHEST):
  """softmax(q k^T / sqrt(d) + bias) v on [B, heads, N, d] arrays (softmax in float32)."""
  return _blocks.attention(q * (q.shape[-1] ** -0.5), k, v, bias=bias, precision=precision,
                           softmax_dtype=jnp.float32)


class Attention(nn.Module):
  """Fused qkv Dense without bias + `q_bias`, `v_bias` (the key has none) + a per-layer
  relative position bias table over a (h, w) patch grid with a class token in front."""
  num_heads: int
  grid: tuple[int, int]
  dtype: Any = jnp.float32
  precision: Any = HIGHEST

  @nn.compact
  def __call__(self, x):
    b, n, d = x.shape
    h, w = self.grid
    qkv = nn.Dense(3 * d, use_bias=False, dtype=self.dtype, precision=self.precision,
                   name="qkv")(x)
    q_bias = self.param("q_bias", nn.initializers.zeros, (d,), jnp.float32)
    v_bias = self.param("v_bias", nn.initializers.zeros, (d,), jnp.float32)
    qkv = qkv + jnp.concatenate([q_bias, jnp.zeros_like(q_bias), v_bias]).astype(qkv.dtype)
    q, k, v = jnp.moveaxis(qkv.reshape(b, n, 3, self.num_heads, -1), (2, 3), (0, 2))
    table = self.param("relative_position_bias_table", nn.initializers.zeros,
                       ((2 * h - 1) * (2 * w - 1) + 3, self.num_heads), jnp.float32)
    if n != h * w + 1:
      raise ValueError(f"BEiT built for a {h}x{w} patch grid got {n - 1} patches: initialise "
                       f"(and load) the model at the resolution it is applied to.")
    bias = jnp.moveaxis(table[convert.relative_position_index(h, w)], -1, 0)[None]
    y = attention(q, k, v, bias, self.precision)
    y = jnp.moveaxis(y, 1, 2).reshape(b, n, d)
    return nn.Dense(d, dtype=self.dtype, precision=self.precision, name="proj")(y)


class Block(nn.Module):
  """x + gamma_1 * attn(norm1(x)); x + gamma_2 * mlp(norm2(x)) (exact GELU MLP)."""
  num_heads: int
  mlp_dim: int
  grid: tuple[int, int]
  dtype: Any = jnp.float32
  precision: Any = HIGHEST

  @nn.compact
  def __call__(self, x):
    d = x.shape[-1]
    kw = dict(dtype=self.dtype, precision=self.precision)
    gamma_1 = self.param("gamma_1", nn.initializers.constant(0.1), (d,), jnp.float32)
    gamma_2 = self.param("gamma_2", nn.initializers.constant(0.1), (d,), jnp.float32)
    y = layer_norm("norm1")(x).astype(self.dtype)
    x = x + gamma_1.astype(self.dtype) * Attention(self.num_heads, self.grid, name="attn",
                                                   **kw)(y)
    y = layer_norm("norm2")(x).astype(self.dtype)
    y = nn.Dense(self.mlp_dim, name="fc1", **kw)(y)
    y = nn.Dense(d, name="fc2", **kw)(_blocks.gelu_exact(y))
    return x + gamma_2.astype(self.dtype) * y


class _Model(nn.Module):
  num_classes: Optional[int] = 1000
  patch_size: int = 16
  width: int = 768
  depth: int = 12
  num_heads: int = 12
  mlp_dim: int = 3072
  dtype: str = "float32"
  precision: Any = HIGHEST

  @nn.compact
  def __call__(self, image, *, train: bool = False):
    del train
    dt = jnp.dtype(self.dtype)
    kw = dict(dtype=dt, precision=self.precision)
    p = self.patch_size
    x = nn.Conv(self.width, (p, p), strides=(p, p), padding="VALID", name="patch_embed",
                **kw)(jnp.asarray(image, dt))
    b, h, w, d = x.shape
    cls = self.param("cls_token", nn.initializers.zeros, (1, 1, d), jnp.float32)
    x = jnp.concatenate([jnp.broadcast_to(cls.astype(dt), (b, 1, d)), x.reshape(b, h * w, d)],
                        axis=1)
    for i in range(self.depth):
      x = Block(self.num_heads, self.mlp_dim, (h, w), name=f"blocks_{i}", **kw)(x)
    out = {"encoded": x}
    x = out["pre_logits"] = layer_norm("fc_norm")(jnp.mean(x[:, 1:].astype(jnp.float32), 1))
    if self.num_classes:
      x = out["logits"] = nn.Dense(self.num_classes, name="head", **kw)(x.astype(dt)).astype(
          jnp.float32)
    return x, out


_B = dict(width=768, depth=12, num_heads=12, mlp_dim=3072)
_L = dict(width=1024, depth=24, num_heads=16, mlp_dim=4096)
# variant: module keyword arguments (timm's beit_* / beitv2_* model functions; the layer-scale
# init value differs between them but is not part of the architecture).
ARCHS: dict[str, dict] = {
    "beit_base_patch16_224": _B, "beit_base_patch16_384": _B,
    "beit_large_patch16_224": _L, "beit_large_patch16_384": _L, "beit_large_patch16_512": _L,
    "beitv2_base_patch16_224": _B, "beitv2_large_patch16_224": _L,
}

_timm = pretrained.timm
# timm's ImageNet classifiers; BEiT v1 normalises with mean = std = 0.5, BEiT v2 with ImageNet's
# mean / std (timm's pretrained_cfg), both bicubic.
PRETRAINED: dict[str, dict] = {
    **_timm("beit_base_patch16_224.in22k_ft_in22k_in1k", 224, 0.9, norm="inception"),
    **_timm("beit_base_patch16_224.in22k_ft_in22k", 224, 0.9, norm="inception",
            num_classes=21841),
    **_timm("beit_base_patch16_384.in22k_ft_in22k_in1k", 384, 1.0, norm="inception"),
    **_timm("beit_large_patch16_224.in22k_ft_in22k_in1k", 224, 0.9, norm="inception"),
    **_timm("beit_large_patch16_224.in22k_ft_in22k", 224, 0.9, norm="inception",
            num_classes=21841),
    **_timm("beit_large_patch16_384.in22k_ft_in22k_in1k", 384, 1.0, norm="inception"),
    **_timm("beit_large_patch16_512.in22k_ft_in22k_in1k", 512, 1.0, norm="inception"),
    **_timm("beitv2_base_patch16_224.in1k_ft_in1k", 224, 0.9),
    **_timm("beitv2_base_patch16_224.in1k_ft_in22k_in1k", 224, 0.9),
    **_timm("beitv2_base_patch16_224.in1k_ft_in22k", 224, 0.9, num_classes=21841),
    **_timm("beitv2_large_patch16_224.in1k_ft_in1k", 224, 0.95),
    **_timm("beitv2_large_patch16_224.in1k_ft_in22k_in1k", 224, 0.95),
    **_timm("beitv2_large_patch16_224.in1k_ft_in22k", 224, 0.9, num_classes=21841),
}


def Model(num_classes: Optional[int] = 1000, *, variant: str, **kw) -> _Model:
  """`Model(1000, variant="beitv2_base_patch16_224")`; `kw` overrides ARCHS (width, depth,
  num_heads, mlp_dim, patch_size, dtype). The patch grid (hence the bias tables) is that of
  the image the model is initialised with."""
  name = variant.split(".")[0]
  if name not in ARCHS:
    raise ValueError(f"Unknown BEiT variant {variant!r}; known: {sorted(ARCHS)}.")
  kw.pop("source", None)
  return _Model(num_classes, **{**ARCHS[name], **kw})


def load(init_params, init_file: str, model_cfg: Optional[Mapping] = None) -> dict:
  """timm (or microsoft/unilm, `{"model": ...}`) BEiT / BEiT v2 weights from .safetensors or
  .pth onto `init_params`; bias tables made for another patch grid are resized as timm does."""
  sd = readers.read_state_dict(init_file, hint=convert.HINT)
  return convert.convert(sd, init_params, file=init_file)
