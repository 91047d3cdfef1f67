"""CaiT (Touvron et al. 2021, "Going deeper with Image Transformers") in Flax, loading timm's
`cait_*` weights.

timm's `Cait` (timm 1.0.31 `timm/models/cait.py`): patch conv (16x16), a learned posemb on the
patches (`pos_embed`, (1, h*w, D); no class slot), `depth` self-attention blocks on the patch
tokens only, then 2 **class-attention** blocks that update a class token (`cls_token`) from
[class token | patches] while the patches stay fixed, a final LayerNorm, and the class token =
`out["pre_logits"]` -> `head`. Blocks are pre-LN with **layer scale** (`gamma_1`, `gamma_2`)
and an exact-GELU MLP 4x; LayerNorm eps 1e-6.
- Self-attention is **talking-heads** attention: fused `qkv` (bias), logits q·k / sqrt(d)
  mixed across heads by `proj_l` (a heads x heads Dense) before the softmax and by `proj_w`
  after it, then `proj`.
- Class attention: the query is the class token's (`q`), keys / values all tokens' (`k`, `v`,
  biases), then `proj`; the MLP acts on the class token only.
The posemb is a parameter of the initialised grid; a file for another grid does not load
(timm does not resample CaiT's either): initialise at the weights' input size.
"""
from __future__ import annotations

from typing import Any, Mapping, Optional

import flax.linen as nn
import jax
import jax.numpy as jnp

from fi_jax.models import _pretrained as pretrained
from fi_jax.models.beit import layer_norm
from fi_jax.models.convert import cait as convert
from fi_jax.models.convert import readers
from fi_jax.models.dinov3 import GeluMlp

HIGHEST = jax.lax.Precision.HIGHEST


def _heads(t, n_heads):
  b, n, d = t.shape
  return jnp.swapaxes(t.reshape(b, n, n_heads, d // n_heads), 1, 2)   # (B, H, N, d)


class TalkingHeadAttn(nn.Module):
  num_heads: int
  dtype: Any = jnp.float32
  precision: Any = HIGHEST

  @nn.compact
  def __call__(self, x):
    b, n, d = x.shape
    kw = dict(dtype=self.dtype, precision=self.precision)
    q, k, v = (_heads(t, self.num_heads) for t in jnp.split(
        nn.Dense(3 * d, name="qkv", **kw)(x), 3, axis=-1))
    logits = jnp.einsum("bhqd,bhkd->bhqk", q * (d // self.num_heads) ** -0.5, k,
                        precision=self.precision)
    mix = lambda name, a: jnp.moveaxis(nn.Dense(self.num_heads, name=name, **kw)(
        jnp.moveaxis(a, 1, -1)), -1, 1)
    weights = jax.nn.softmax(mix("proj_l", logits).astype(jnp.float32), axis=-1)
    weights = mix("proj_w", weights.astype(self.dtype))
    y = jnp.einsum("bhqk,bhkd->bhqd", weights, v, precision=self.precision)
    return nn.Dense(d, name="proj", **kw)(jnp.swapaxes(y, 1, 2).reshape(b, n, d))


class ClassAttn(nn.Module):
  num_heads: int
  dtype: Any = jnp.float32
  precision: Any = HIGHEST

  @nn.compact
  def __call__(self, u):
    b, n, d = u.shape
    kw = dict(dtype=self.dtype, precision=self.precision)
    q = _heads(nn.Dense(d, name="q", **kw)(u[:, :1]), self.num_heads)
    k = _heads(nn.Dense(d, name="k", **kw)(u), self.num_heads)
    v = _heads(nn.Dense(d, name="v", **kw)(u), self.num_heads)
    logits = jnp.einsum("bhqd,bhkd->bhqk", q * (d // self.num_heads) ** -0.5, k,
                        precision=self.precision)
    weights = jax.nn.softmax(logits.astype(jnp.float32), axis=-1).astype(self.dtype)
    y = jnp.einsum("bhqk,bhkd->bhqd", weights, v, precision=self.precision)
    return nn.Dense(d, name="proj", **kw)(jnp.swapaxes(y, 1, 2).reshape(b, 1, d))


class Block(nn.Module):
  """Layer-scale block: talking-heads self-attention (`class_attn=False`, input: the patch
  tokens) or class attention (input: (patches, class token); output: the class token)."""
  num_heads: int
  mlp_hidden: int
  class_attn: bool = False
  dtype: Any = jnp.float32
  precision: Any = HIGHEST

  @nn.compact
  def __call__(self, x, cls=None):
    kw = dict(dtype=self.dtype, precision=self.precision)
    d = x.shape[-1]
    g1 = self.param("gamma_1", nn.initializers.ones, (d,), jnp.float32).astype(self.dtype)
    g2 = self.param("gamma_2", nn.initializers.ones, (d,), jnp.float32).astype(self.dtype)
    if self.class_attn:
      u = layer_norm("norm1")(jnp.concatenate([cls, x], axis=1)).astype(self.dtype)
      x = cls + g1 * ClassAttn(self.num_heads, name="attn", **kw)(u)
    else:
      x = x + g1 * TalkingHeadAttn(self.num_heads, name="attn", **kw)(
          layer_norm("norm1")(x).astype(self.dtype))
    y = layer_norm("norm2")(x).astype(self.dtype)
    return x + g2 * GeluMlp(self.mlp_hidden, name="mlp", **kw)(y)


class _Model(nn.Module):
  num_classes: Optional[int] = 1000
  patch_size: int = 16
  width: int = 384
  depth: int = 24
  num_heads: int = 8
  mlp_hidden: int = 1536
  depth_token_only: int = 2
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
    pos = self.param("pos_embed", nn.initializers.normal(0.02), (1, h * w, d), jnp.float32)
    x = x.reshape(b, h * w, d) + pos.astype(dt)
    for i in range(self.depth):
      x = Block(self.num_heads, self.mlp_hidden, name=f"blocks_{i}", **kw)(x)
    cls = self.param("cls_token", nn.initializers.zeros, (1, 1, d), jnp.float32)
    cls = jnp.broadcast_to(cls.astype(dt), (b, 1, d))
    for i in range(self.depth_token_only):
      cls = Block(self.num_heads, self.mlp_hidden, class_attn=True,
                  name=f"blocks_token_only_{i}", **kw)(x, cls)
    x = layer_norm("norm")(jnp.concatenate([cls, x], axis=1))
    out = {"encoded": x}
    x = out["pre_logits"] = x[:, 0]
    if self.num_classes:
      x = out["logits"] = nn.Dense(self.num_classes, name="head", **kw)(x.astype(dt)).astype(
          jnp.float32)
    return x, out


_SIZES = {"xxs24": (192, 24, 4), "xxs36": (192, 36, 4), "xs24": (288, 24, 6),
          "s24": (384, 24, 8), "s36": (384, 36, 8), "m36": (768, 36, 16), "m48": (768, 48, 16)}
# timm's cait_* model functions (mlp_ratio 4 in both kinds of block, 2 class-attention blocks)
ARCHS: dict[str, dict] = {
    f"cait_{s}_{r}": dict(width=_SIZES[s][0], depth=_SIZES[s][1], num_heads=_SIZES[s][2],
                          mlp_hidden=4 * _SIZES[s][0])
    for s, r in (("xxs24", 224), ("xxs24", 384), ("xxs36", 224), ("xxs36", 384),
                 ("xs24", 384), ("s24", 224), ("s24", 384), ("s36", 384), ("m36", 384),
                 ("m48", 448))}

PRETRAINED: dict[str, dict] = pretrained.timm_tags(list(ARCHS))


def Model(num_classes: Optional[int] = 1000, *, variant: str, **kw) -> _Model:
  """`Model(1000, variant="cait_s24_224")`; `kw` overrides ARCHS (width, depth, num_heads,
  mlp_hidden, depth_token_only, dtype, ...)."""
  name = variant.split(".")[0]
  if name not in ARCHS:
    raise ValueError(f"Unknown CaiT variant {variant!r}; known: {sorted(ARCHS)}.")
  kw.pop("source", None)
  return _Model(num_classes, **{**ARCHS[name], **kw})


def load(init_params, init_file: str, model_cfg: Optional[Mapping] = None) -> dict:
  """timm / official CaiT weights (`model.safetensors`, a .pth state dict) onto `init_params`."""
  sd = readers.read_state_dict(init_file, hint=convert.HINT)
  return convert.convert(sd, init_params, file=init_file)
