"""Vision Transformer in big_vision's layout (parameter names, pooling, posemb).

`Model(num_classes, variant="B/16", pool_type="gap", ...)` builds the same parameter tree
as big_vision's `models/vit.py`, so its `.npz` checkpoints map one to one (see `load`).
`apply({'params': p}, images)` takes NHWC float32 images and returns `(logits, out)`;
`out["pre_logits"]` holds the penultimate features the OOD detectors use.

The building blocks (`MlpBlock`, `Encoder1DBlock`, `Encoder`, `MAPHead`) take a few extra
knobs (activation, LayerNorm epsilon, LayerScale, attention mask) so that the PyTorch-born
families (CLIP, DINOv2) reuse them instead of re-implementing a transformer.
"""
from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

_VARIANTS = {
    # name: (width, depth, mlp_dim, num_heads), Table 2 of arXiv 2106.04560 + big_vision extras.
    "mu": (32, 1, 128, 2),
    "Ti": (192, 12, 768, 3),
    "S": (384, 12, 1536, 6),
    "M": (512, 12, 2048, 8),
    "B": (768, 12, 3072, 12),
    "L": (1024, 24, 4096, 16),
    "So400m": (1152, 27, 4304, 16),
    "H": (1280, 32, 5120, 16),
    "g": (1408, 40, 6144, 16),
    "g-opt": (1536, 40, 6144, 16),
    "G": (1664, 48, 8192, 16),
    "G-opt": (1536, 48, 8192, 16),
    "e": (1792, 56, 15360, 16),
}


def decode_variant(variant: Optional[str]) -> dict:
  """'B/16' -> dict(width=768, depth=12, mlp_dim=3072, num_heads=12, patch_size=(16, 16))."""
  if variant is None:
    return {}
  name, _, patch = variant.partition("/")
  if name not in _VARIANTS:
    raise ValueError(f"Unknown ViT variant {variant!r}; known: {sorted(_VARIANTS)} (optionally '/<patch>').")
  width, depth, mlp_dim, heads = _VARIANTS[name]
  out = dict(width=width, depth=depth, mlp_dim=mlp_dim, num_heads=heads)
  if patch:
    out["patch_size"] = (int(patch), int(patch))
  return out


def activation(name: str) -> Callable[[jax.Array], jax.Array]:
  """Named activations: big_vision uses tanh-GELU; PyTorch models use exact GELU or QuickGELU."""
  acts = {
      "gelu": lambda x: nn.gelu(x, approximate=True),
      "gelu_exact": lambda x: nn.gelu(x, approximate=False),
      "quick_gelu": lambda x: x * jax.nn.sigmoid(1.702 * x),
      "relu": nn.relu,
      "silu": nn.silu,
  }
  if name not in acts:
    raise ValueError(f"Unknown activation {name!r}; known: {sorted(acts)}.")
  return acts[name]


def posemb_sincos_2d(h: int, w: int, width: int, temperature: float = 10_000.,
                     dtype=jnp.float32) -> jax.Array:
  """MoCo-v3 / big_vision fixed 2-D sin-cos position embedding, shape (1, h*w, width)."""
  if width % 4:
    raise ValueError(f"sincos2d posemb needs width divisible by 4, got {width}.")
  y, x = np.mgrid[:h, :w]
  omega = np.arange(width // 4) / (width // 4 - 1)
  omega = 1. / (temperature ** omega)
  y = np.einsum("m,d->md", y.flatten(), omega)
  x = np.einsum("m,d->md", x.flatten(), omega)
  pe = np.concatenate([np.sin(x), np.cos(x), np.sin(y), np.cos(y)], axis=1)
  return jnp.asarray(pe, dtype)[None, :, :]


def get_posemb(module: nn.Module, typ: str, seqshape: Sequence[int], width: int, name: str,
               dtype=jnp.float32) -> jax.Array:
  if typ == "learn":
    return module.param(name, nn.initializers.normal(stddev=1 / np.sqrt(width)),
                        (1, int(np.prod(seqshape)), width), dtype)
  if typ == "sincos2d":
    return posemb_sincos_2d(*seqshape, width, dtype=dtype)
  raise ValueError(f"Unknown posemb type {typ!r}; use 'learn' or 'sincos2d'.")


class MlpBlock(nn.Module):
  """Dense -> activation -> dropout -> Dense (names Dense_0 / Dense_1 as in big_vision)."""
  mlp_dim: Optional[int] = None
  dropout: float = 0.0
  act: str = "gelu"
  dtype_mm: str = "float32"

  @nn.compact
  def __call__(self, x, deterministic=True):
    inits = dict(kernel_init=nn.initializers.xavier_uniform(),
                 bias_init=nn.initializers.normal(stddev=1e-6))
    d = x.shape[-1]
    x = nn.Dense(self.mlp_dim or 4 * d, dtype=self.dtype_mm, **inits)(x)
    x = activation(self.act)(x)
    x = nn.Dropout(rate=self.dropout)(x, deterministic)
    return nn.Dense(d, dtype=self.dtype_mm, **inits)(x)


class LayerScale(nn.Module):
  """Per-channel learned scale (DINOv2 / CaiT); parameter `scale` of shape (width,)."""
  init_value: float = 1e-5

  @nn.compact
  def __call__(self, x):
    scale = self.param("scale", nn.initializers.constant(self.init_value), (x.shape[-1],))
    return x * scale


class Encoder1DBlock(nn.Module):
  """Pre-LN transformer block: x + MHA(LN(x)); x + MLP(LN(x)) (optionally LayerScaled)."""
  mlp_dim: Optional[int] = None
  num_heads: int = 12
  dropout: float = 0.0
  act: str = "gelu"
  ln_eps: float = 1e-6
  layerscale: Optional[float] = None
  dtype_mm: str = "float32"

  @nn.compact
  def __call__(self, x, deterministic=True, mask=None):
    out = {}
    y = nn.LayerNorm(epsilon=self.ln_eps)(x)
    y = out["sa"] = nn.MultiHeadDotProductAttention(
        num_heads=self.num_heads, kernel_init=nn.initializers.xavier_uniform(),
        deterministic=deterministic, dtype=self.dtype_mm)(y, y, mask=mask)
    if self.layerscale is not None:
      y = LayerScale(self.layerscale, name="LayerScale_0")(y)
    y = nn.Dropout(rate=self.dropout)(y, deterministic)
    x = out["+sa"] = x + y

    y = nn.LayerNorm(epsilon=self.ln_eps)(x)
    y = out["mlp"] = MlpBlock(mlp_dim=self.mlp_dim, dropout=self.dropout, act=self.act,
                              dtype_mm=self.dtype_mm)(y, deterministic)
    if self.layerscale is not None:
      y = LayerScale(self.layerscale, name="LayerScale_1")(y)
    y = nn.Dropout(rate=self.dropout)(y, deterministic)
    x = out["+mlp"] = x + y
    return x, out


class Encoder(nn.Module):
  """`depth` blocks (unrolled `encoderblock_{i}` or scanned `encoderblock`) + `encoder_norm`."""
  depth: int
  mlp_dim: Optional[int] = None
  num_heads: int = 12
  dropout: float = 0.0
  act: str = "gelu"
  ln_eps: float = 1e-6
  layerscale: Optional[float] = None
  scan: bool = False
  remat_policy: str = "nothing_saveable"
  final_norm: bool = True
  dtype_mm: str = "float32"

  @nn.compact
  def __call__(self, x, deterministic=True, mask=None):
    out = {}
    kw = dict(mlp_dim=self.mlp_dim, num_heads=self.num_heads, dropout=self.dropout, act=self.act,
              ln_eps=self.ln_eps, layerscale=self.layerscale, dtype_mm=self.dtype_mm)
    if self.scan:
      block = nn.remat(Encoder1DBlock, prevent_cse=False, static_argnums=(2,),
                       policy=getattr(jax.checkpoint_policies, self.remat_policy, None))
      x, scan_out = nn.scan(
          block, variable_axes={"params": 0}, split_rngs={"params": True, "dropout": True},
          in_axes=(nn.broadcast, nn.broadcast), length=self.depth)(
              name="encoderblock", **kw)(x, deterministic, mask)
      for lyr in range(self.depth):
        out[f"block{lyr:02d}"] = jax.tree.map(lambda o, lyr=lyr: o[lyr], scan_out)
    else:
      for lyr in range(self.depth):
        x, out[f"block{lyr:02d}"] = Encoder1DBlock(name=f"encoderblock_{lyr}", **kw)(
            x, deterministic, mask)
    out["pre_ln"] = x
    if self.final_norm:
      x = nn.LayerNorm(epsilon=self.ln_eps, name="encoder_norm")(x)
    return x, out


class MAPHead(nn.Module):
  """Multihead attention pooling with one learned probe (big_vision `MAPHead_0`)."""
  mlp_dim: Optional[int] = None
  num_heads: int = 12
  act: str = "gelu"
  ln_eps: float = 1e-6

  @nn.compact
  def __call__(self, x):
    n, _, d = x.shape
    probe = self.param("probe", nn.initializers.xavier_uniform(), (1, 1, d), x.dtype)
    probe = jnp.tile(probe, [n, 1, 1])
    x = nn.MultiHeadDotProductAttention(
        num_heads=self.num_heads, kernel_init=nn.initializers.xavier_uniform())(probe, x)
    y = nn.LayerNorm(epsilon=self.ln_eps)(x)
    x = x + MlpBlock(mlp_dim=self.mlp_dim, act=self.act)(y)
    return x[:, 0]


class _Model(nn.Module):
  """ViT. Field names and defaults follow big_vision's `vit._Model`."""
  num_classes: Optional[int] = None
  patch_size: Sequence[int] = (16, 16)
  width: int = 768
  depth: int = 12
  mlp_dim: Optional[int] = None
  num_heads: int = 12
  posemb: str = "learn"
  rep_size: Any = False
  dropout: float = 0.0
  pool_type: str = "gap"
  head_zeroinit: bool = True
  scan: bool = False
  remat_policy: str = "nothing_saveable"
  dtype_mm: str = "float32"
  act: str = "gelu"
  ln_eps: float = 1e-6

  @nn.compact
  def __call__(self, image, *, train=False):
    out = {}
    image = jnp.asarray(image, self.dtype_mm)
    x = out["stem"] = nn.Conv(self.width, self.patch_size, strides=self.patch_size,
                              padding="VALID", name="embedding", dtype=self.dtype_mm)(image)
    n, h, w, c = x.shape
    x = jnp.reshape(x, [n, h * w, c])
    x = out["with_posemb"] = x + get_posemb(self, self.posemb, (h, w), c, "pos_embedding", x.dtype)

    if self.pool_type == "tok":
      cls = self.param("cls", nn.initializers.zeros, (1, 1, c), x.dtype)
      x = jnp.concatenate([jnp.tile(cls, [n, 1, 1]), x], axis=1)

    n, _, c = x.shape
    x = nn.Dropout(rate=self.dropout)(x, not train)
    x, out["encoder"] = Encoder(
        depth=self.depth, mlp_dim=self.mlp_dim, num_heads=self.num_heads, dropout=self.dropout,
        act=self.act, ln_eps=self.ln_eps, scan=self.scan, remat_policy=self.remat_policy,
        dtype_mm=self.dtype_mm, name="Transformer")(x, deterministic=not train)
    encoded = out["encoded"] = x

    if self.pool_type == "map":
      x = out["head_input"] = MAPHead(num_heads=self.num_heads, mlp_dim=self.mlp_dim,
                                      act=self.act, ln_eps=self.ln_eps)(x)
    elif self.pool_type == "gap":
      x = out["head_input"] = jnp.mean(x, axis=1)
    elif self.pool_type == "0":
      x = out["head_input"] = x[:, 0]
    elif self.pool_type == "tok":
      x = out["head_input"] = x[:, 0]
      encoded = encoded[:, 1:]
    elif self.pool_type == "none":
      pass
    else:
      raise ValueError(f"Unknown pool type {self.pool_type!r}; use tok, gap, 0, map or none.")

    x_2d = jnp.reshape(encoded, [n, h, w, -1])

    if self.rep_size:
      rep_size = self.width if self.rep_size is True else self.rep_size
      hid = nn.Dense(rep_size, name="pre_logits")
      x_2d = nn.tanh(hid(x_2d))
      x = nn.tanh(hid(x))

    out["pre_logits_2d"] = x_2d
    out["pre_logits"] = x

    if self.num_classes:
      kw = {"kernel_init": nn.initializers.zeros} if self.head_zeroinit else {}
      head = nn.Dense(self.num_classes, name="head", **kw)
      x_2d = out["logits_2d"] = head(x_2d)
      x = out["logits"] = head(x)

    return x, out


def Model(num_classes: Optional[int] = None, *, variant: Optional[str] = None, **kw) -> _Model:  # pylint: disable=invalid-name
  """Factory as in big_vision: `Model(1000, variant="B/16", pool_type="tok")`."""
  return _Model(num_classes, **{**decode_variant(variant), **kw})
