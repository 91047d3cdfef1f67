"""Vision Transformer in big_vision's layout (parameter names, pooling, posemb).

`Model(num_classes, variant="B/16", pool_type="gap", ...)` builds the same parameter tree
as big_vision's `models/vit.py`, so its `.npz` checkpoints map one to one (see `load`).
`apply({'params': p}, images)` takes NHWC float32 images and returns `(logits, out)`;
`out["pre_logits"]` holds the penultimate features the OOD detectors use.

torchvision's ViTs and timm's (DeiT, DeiT-III, AugReg, CLIP fine-tunes, register models) are
the same module with a few optional fields (class token, registers, norm_pre, fc_norm, no
patch-conv bias): `Model(1000, variant="vit_b_16")` builds one by its library name (ARCHS),
`load` reads their .pth / .safetensors files, and PRETRAINED lists the published weights
with their eval transforms.

The building blocks (`MlpBlock`, `Encoder1DBlock`, `Encoder`, `MAPHead`) take a few extra
knobs (activation, LayerNorm epsilon, LayerScale, attention mask) so that the PyTorch-born
families (CLIP, DINOv2) reuse them instead of re-implementing a transformer.
"""
from __future__ import annotations

from typing import Any, Callable, Mapping, Optional, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from fi_jax.data import preprocess
from fi_jax.models import _blocks
from fi_jax.models import _checkpoints as ckpt
from fi_jax.models import _posemb as posemb
from fi_jax.models import _pretrained as pretrained
from fi_jax.models import _releases as releases
from fi_jax.models.convert import hf_siglip, naflex, readers, timm_vit, torchvision_vit
from fi_jax.models.convert import torch_layers as tl

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
      "gelu_exact": _blocks.gelu_exact,
      "quick_gelu": lambda x: x * jax.nn.sigmoid(1.702 * x),
      "relu": nn.relu,
      "silu": nn.silu,
      # SwiGLU on a fused [x1 | x2] projection (DINOv2 giant): silu(x1) * x2 halves the width.
      "swiglu": lambda x: nn.silu(x[..., :x.shape[-1] // 2]) * x[..., x.shape[-1] // 2:],
  }
  if name not in acts:
    raise ValueError(f"Unknown activation {name!r}; known: {sorted(acts)}.")
  return acts[name]


def l2_normalize(z, eps: float = 1e-8):
  """z / (|z| + eps) along the last axis; numpy in -> numpy out (in its dtype), else jax."""
  xp = np if isinstance(z, np.ndarray) else jnp
  return z / (xp.linalg.norm(z, axis=-1, keepdims=True) + eps)


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
  precision: Any = None    # matmul precision (None: JAX's default; the zoo models use HIGHEST)

  @nn.compact
  def __call__(self, x, deterministic=True):
    inits = dict(kernel_init=nn.initializers.xavier_uniform(),
                 bias_init=nn.initializers.normal(stddev=1e-6), precision=self.precision)
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
    scale = self.param("scale", nn.initializers.constant(self.init_value), (x.shape[-1],),
                       jnp.float32)   # explicit: the initializer's default is float64 under x64
    return x * scale


def heads_first_attention(query, key, value, bias=None, mask=None, broadcast_dropout=True,
                          dropout_rng=None, dropout_rate=0., deterministic=True, dtype=None,
                          precision=None, force_fp32_for_softmax=False):
  """flax's dot_product_attention with the heads axis moved before the sequence axes.

  Same math (query scaled by 1/sqrt(d) first, masked logits set to finfo.min), computed by
  `_blocks.attention` (layout "bnhd"); XLA:CPU runs the [b, h, q, d] contractions about twice
  as fast as flax's [b, q, h, d] ones. Training with attention dropout falls back to flax's
  function.
  """
  if dropout_rate > 0. and not deterministic:
    return nn.dot_product_attention(
        query, key, value, bias=bias, mask=mask, broadcast_dropout=broadcast_dropout,
        dropout_rng=dropout_rng, dropout_rate=dropout_rate, deterministic=deterministic,
        dtype=dtype, precision=precision, force_fp32_for_softmax=force_fp32_for_softmax)
  dtype = dtype or query.dtype
  q = query / jnp.sqrt(query.shape[-1]).astype(dtype)
  return _blocks.attention(q, key, value.astype(dtype), bias=bias, mask=mask,
                           precision=precision, layout="bnhd",
                           softmax_dtype=jnp.float32 if force_fp32_for_softmax else None)


_ATTENTION = {"flax": nn.dot_product_attention, "heads_first": heads_first_attention}


class Encoder1DBlock(nn.Module):
  """Pre-LN transformer block: x + MHA(LN(x)); x + MLP(LN(x)) (optionally LayerScaled).

  `value_path`: also out["value_path"], the block with each token attending to itself only
  (x + MHA's value and output projections of LN(x), then the MLP residual): the local
  features of GL-MCM (AtsuMiyai/GL-MCM @ 8708a08, clip/model.py), no extra parameters."""
  mlp_dim: Optional[int] = None
  num_heads: int = 12
  dropout: float = 0.0
  act: str = "gelu"
  ln_eps: float = 1e-6
  layerscale: Optional[float] = None
  dtype_mm: str = "float32"
  attention: str = "heads_first"    # or "flax" (same math; heads_first is faster on XLA:CPU)
  precision: Any = None
  value_path: bool = False

  @nn.compact
  def __call__(self, x, deterministic=True, mask=None):
    out, x_in = {}, x
    ln0 = nn.LayerNorm(epsilon=self.ln_eps)
    attn = nn.MultiHeadDotProductAttention(
        num_heads=self.num_heads, kernel_init=nn.initializers.xavier_uniform(),
        deterministic=deterministic, dtype=self.dtype_mm, precision=self.precision,
        attention_fn=_ATTENTION[self.attention])
    ls0 = LayerScale(self.layerscale, name="LayerScale_0") if self.layerscale is not None else None
    y = ln0(x)
    y = out["sa"] = attn(y, y, mask=mask)
    if ls0 is not None:
      y = ls0(y)
    y = nn.Dropout(rate=self.dropout)(y, deterministic)
    x = out["+sa"] = x + y

    ln1 = nn.LayerNorm(epsilon=self.ln_eps)
    mlp = MlpBlock(mlp_dim=self.mlp_dim, dropout=self.dropout, act=self.act,
                   dtype_mm=self.dtype_mm, precision=self.precision)
    ls1 = LayerScale(self.layerscale, name="LayerScale_1") if self.layerscale is not None else None
    y = ln1(x)
    y = out["mlp"] = mlp(y, deterministic)
    if ls1 is not None:
      y = ls1(y)
    y = nn.Dropout(rate=self.dropout)(y, deterministic)
    x = out["+mlp"] = x + y

    if self.value_path:
      n = x_in.shape[-2]
      self_only = jnp.eye(n, dtype=bool)[None, None]
      h = ln0(x_in)
      y = attn(h, h, mask=self_only if mask is None else jnp.logical_and(mask, self_only))
      v = x_in + (ls0(y) if ls0 is not None else y)
      y = mlp(ln1(v), deterministic)
      out["value_path"] = v + (ls1(y) if ls1 is not None else y)
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
  attention: str = "heads_first"
  precision: Any = None
  value_path: bool = False     # the last block's out["value_path"] (GL-MCM), encoder_norm'ed

  @nn.compact
  def __call__(self, x, deterministic=True, mask=None):
    out = {}
    if self.value_path and self.scan:
      raise ValueError("The value path (GL-MCM's local features) needs the unrolled encoder "
                       "(scan=False); the scanned checkpoint layout loads into it unchanged.")
    kw = dict(mlp_dim=self.mlp_dim, num_heads=self.num_heads, dropout=self.dropout, act=self.act,
              ln_eps=self.ln_eps, layerscale=self.layerscale, dtype_mm=self.dtype_mm,
              attention=self.attention, precision=self.precision)
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
        last = self.value_path and lyr == self.depth - 1
        x, out[f"block{lyr:02d}"] = Encoder1DBlock(name=f"encoderblock_{lyr}", value_path=last,
                                                   **kw)(x, deterministic, mask)
    out["pre_ln"] = x
    value = out[f"block{self.depth - 1:02d}"].pop("value_path") if self.value_path else None
    if self.final_norm:
      norm = nn.LayerNorm(epsilon=self.ln_eps, name="encoder_norm")
      x = norm(x)
      value = norm(value) if value is not None else None
    if value is not None:
      out["value_path"] = value
    return x, out


class MAPHead(nn.Module):
  """Multihead attention pooling with one learned probe (big_vision `MAPHead_0`)."""
  mlp_dim: Optional[int] = None
  num_heads: int = 12
  act: str = "gelu"
  ln_eps: float = 1e-6
  precision: Any = None

  @nn.compact
  def __call__(self, x):
    n, _, d = x.shape
    probe = self.param("probe", nn.initializers.xavier_uniform(), (1, 1, d), x.dtype)
    probe = jnp.tile(probe, [n, 1, 1])
    x = nn.MultiHeadDotProductAttention(
        num_heads=self.num_heads, kernel_init=nn.initializers.xavier_uniform(),
        precision=self.precision)(probe, x)
    y = nn.LayerNorm(epsilon=self.ln_eps)(x)
    x = x + MlpBlock(mlp_dim=self.mlp_dim, act=self.act, precision=self.precision)(y)
    return x[:, 0]


class _Model(nn.Module):
  """ViT. Field names and defaults follow big_vision's `vit._Model`.

  The fields after `layerscale` cover the PyTorch-born ViTs (timm, torchvision); their
  defaults leave big_vision's model unchanged. `class_token`: a learned `cls` token in
  front (None: only for pool_type 'tok', big_vision's rule); `num_registers`: learned `reg`
  tokens after it (timm `reg_tokens`); neither gets a position embedding (a checkpoint whose
  posemb covers them has it folded in by the converter). `patch_bias`: the patch conv's bias
  (timm's CLIP ViTs have none); `pre_norm`: a LayerNorm `norm_pre` before the blocks (timm
  `norm_pre`, CLIP's ln_pre); `fc_norm`: the final LayerNorm moves from the tokens to the
  pooled feature (timm `fc_norm`). Pooling 'gap' and 'map' see the patch tokens only (timm
  excludes cls / register tokens), 'tok' and '0' take the first token. `precision`: matmul
  and conv precision (None: JAX's default). `dist_token` (timm's distilled DeiT, with 'tok'):
  a learned `dist` token after `cls`; pre_logits is [cls | dist] (2·width) and `head` the two
  heads stacked and halved, so logits = timm's (head(cls) + head_dist(dist)) / 2.
  """
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
  layerscale: Optional[float] = None
  class_token: Optional[bool] = None
  num_registers: int = 0
  patch_bias: bool = True
  pre_norm: bool = False
  fc_norm: bool = False
  precision: Any = None
  dist_token: bool = False   # timm's distilled DeiT (see the docstring)

  @nn.compact
  def __call__(self, image, *, train=False):
    out = {}
    image = jnp.asarray(image, self.dtype_mm)
    x = out["stem"] = nn.Conv(self.width, self.patch_size, strides=self.patch_size,
                              padding="VALID", use_bias=self.patch_bias, name="embedding",
                              dtype=self.dtype_mm, precision=self.precision)(image)
    n, h, w, c = x.shape
    x = jnp.reshape(x, [n, h * w, c])
    x = out["with_posemb"] = x + get_posemb(self, self.posemb, (h, w), c, "pos_embedding", x.dtype)

    prefix = []
    if self.pool_type == "tok" if self.class_token is None else self.class_token:
      cls = self.param("cls", nn.initializers.zeros, (1, 1, c), x.dtype)
      prefix.append(jnp.tile(cls, [n, 1, 1]))
    if self.dist_token:
      dist = self.param("dist", nn.initializers.zeros, (1, 1, c), x.dtype)
      prefix.append(jnp.tile(dist, [n, 1, 1]))
    if self.num_registers:
      reg = self.param("reg", nn.initializers.zeros, (1, self.num_registers, c), x.dtype)
      prefix.append(jnp.tile(reg, [n, 1, 1]))
    if prefix:
      x = jnp.concatenate(prefix + [x], axis=1)
    n_prefix = x.shape[1] - h * w
    if self.pre_norm:
      x = nn.LayerNorm(epsilon=self.ln_eps, name="norm_pre")(x)

    n, _, c = x.shape
    x = nn.Dropout(rate=self.dropout)(x, not train)
    x, out["encoder"] = Encoder(
        depth=self.depth, mlp_dim=self.mlp_dim, num_heads=self.num_heads, dropout=self.dropout,
        act=self.act, ln_eps=self.ln_eps, layerscale=self.layerscale, scan=self.scan,
        remat_policy=self.remat_policy, final_norm=not self.fc_norm, dtype_mm=self.dtype_mm,
        precision=self.precision, name="Transformer")(x, deterministic=not train)
    encoded = out["encoded"] = x
    if n_prefix:
      encoded = encoded[:, n_prefix:]

    if self.pool_type == "map":
      x = out["head_input"] = MAPHead(num_heads=self.num_heads, mlp_dim=self.mlp_dim,
                                      act=self.act, ln_eps=self.ln_eps,
                                      precision=self.precision)(encoded)
    elif self.pool_type == "gap":
      x = out["head_input"] = jnp.mean(encoded, axis=1)
    elif self.pool_type in ("0", "tok") and self.dist_token:
      # distilled DeiT: [cls | dist] (2·width), so that the head (timm's mean of `head` on cls
      # and `head_dist` on dist, stacked by the converter) is one Dense; timm's pre_logits
      # (cls + dist) / 2 is the mean of the two halves
      x = out["head_input"] = jnp.concatenate([x[:, 0], x[:, 1]], axis=-1)
    elif self.pool_type in ("0", "tok"):
      x = out["head_input"] = x[:, 0]
    elif self.pool_type == "none":
      pass
    else:
      raise ValueError(f"Unknown pool type {self.pool_type!r}; use tok, gap, 0, map or none.")

    x_2d = jnp.reshape(encoded, [n, h, w, -1])
    if self.dist_token:   # a patch token read by both heads: [t | t] through the stacked head
      x_2d = jnp.concatenate([x_2d, x_2d], axis=-1)
    if self.fc_norm:
      norm = nn.LayerNorm(epsilon=self.ln_eps, name="fc_norm")
      x_2d, x = norm(x_2d), norm(x)

    if self.rep_size:
      rep_size = self.width if self.rep_size is True else self.rep_size
      hid = nn.Dense(rep_size, precision=self.precision, name="pre_logits")
      x_2d = nn.tanh(hid(x_2d))
      x = nn.tanh(hid(x))

    out["pre_logits_2d"] = x_2d
    out["pre_logits"] = x

    if self.num_classes:
      kw = {"kernel_init": nn.initializers.zeros} if self.head_zeroinit else {}
      head = nn.Dense(self.num_classes, precision=self.precision, name="head", **kw)
      x_2d = out["logits_2d"] = head(x_2d)
      x = out["logits"] = head(x)

    return x, out


# ----------------------------------------------------------------------------- zoo

HIGHEST = jax.lax.Precision.HIGHEST
# torchvision and timm ViTs: class-token pooling, exact GELU, LayerNorm eps 1e-6, float32 at
# highest precision. DeiT-III / DINOv2: LayerScale, patch-only posemb; timm's CLIP
# fine-tunes: no patch-conv bias, norm_pre, eps 1e-5; the DINOv2 register models: 4 `reg`.
_TORCH = dict(pool_type="tok", act="gelu_exact", ln_eps=1e-6, precision=HIGHEST)
_LS = dict(_TORCH, layerscale=1e-5)
_CLIP = dict(_TORCH, ln_eps=1e-5, patch_bias=False, pre_norm=True)
_REG4 = dict(_LS, num_registers=4)

# architecture name (torchvision's / timm's) -> _Model fields.
ARCHS: dict[str, dict] = {name: {**decode_variant(v), **kw} for name, (v, kw) in {
    # torchvision
    "vit_b_16": ("B/16", _TORCH), "vit_b_32": ("B/32", _TORCH), "vit_l_16": ("L/16", _TORCH),
    "vit_l_32": ("L/32", _TORCH), "vit_h_14": ("H/14", _TORCH),
    # timm: AugReg / original ViT, DeiT (no distillation), DeiT-III, CLIP fine-tunes, DINOv2-reg
    "vit_tiny_patch16_224": ("Ti/16", _TORCH), "vit_small_patch16_224": ("S/16", _TORCH),
    "vit_small_patch32_224": ("S/32", _TORCH), "vit_base_patch16_224": ("B/16", _TORCH),
    "vit_base_patch32_224": ("B/32", _TORCH), "vit_large_patch16_224": ("L/16", _TORCH),
    "vit_base_patch16_384": ("B/16", _TORCH), "vit_large_patch16_384": ("L/16", _TORCH),
    "deit_tiny_patch16_224": ("Ti/16", _TORCH), "deit_small_patch16_224": ("S/16", _TORCH),
    "deit_base_patch16_224": ("B/16", _TORCH), "deit_base_patch16_384": ("B/16", _TORCH),
    "deit3_small_patch16_224": ("S/16", _LS), "deit3_base_patch16_224": ("B/16", _LS),
    "deit3_large_patch16_224": ("L/16", _LS), "deit3_base_patch16_384": ("B/16", _LS),
    "vit_base_patch32_clip_224": ("B/32", _CLIP), "vit_base_patch16_clip_224": ("B/16", _CLIP),
    "vit_base_patch16_clip_384": ("B/16", _CLIP), "vit_large_patch14_clip_224": ("L/14", _CLIP),
    "vit_small_patch14_reg4_dinov2": ("S/14", _REG4),
    "vit_base_patch14_reg4_dinov2": ("B/14", _REG4),
    # more patch sizes / resolutions of the original and AugReg ViTs; MIIL (no qkv bias)
    "vit_base_patch8_224": ("B/8", _TORCH), "vit_tiny_patch16_384": ("Ti/16", _TORCH),
    "vit_small_patch16_384": ("S/16", _TORCH), "vit_small_patch32_384": ("S/32", _TORCH),
    "vit_base_patch32_384": ("B/32", _TORCH), "vit_large_patch32_384": ("L/32", _TORCH),
    "vit_base_patch16_224_miil": ("B/16", _TORCH),
    # CLIP fine-tunes at more sizes
    "vit_base_patch32_clip_384": ("B/32", _CLIP), "vit_base_patch32_clip_448": ("B/32", _CLIP),
    "vit_large_patch14_clip_336": ("L/14", _CLIP), "vit_huge_patch14_clip_224": ("H/14", _CLIP),
    "vit_huge_patch14_clip_336": ("H/14", _CLIP),
}.items()}


def _dims(width: int, depth: int, heads: int, mlp_ratio: float = 4.0, patch: int = 16) -> dict:
  """timm's model_args (embed_dim, depth, num_heads, mlp_ratio, patch_size) as _Model fields;
  the MLP width is timm's int(embed_dim * mlp_ratio)."""
  return dict(width=width, depth=depth, num_heads=heads, mlp_dim=int(width * mlp_ratio),
              patch_size=(patch, patch))


# timm's global-average-pool ViTs (Searching for Better ViT Baselines, `sbb` tags, and the
# SigLIP fine-tunes): no class token, the mean of the patch tokens (register tokens excluded)
# through `fc_norm` (or the final norm on the tokens where timm sets fc_norm=False); most have
# LayerScale, registers without a position embedding (no_embed_class) and qkv biases. A file
# without qkv biases (qkv_bias=False models) loads as zero biases (the same function).
_GAP = dict(_TORCH, pool_type="gap", class_token=False, fc_norm=True)
_SBB = dict(_GAP, layerscale=1e-5)
_NO_FC_NORM = dict(fc_norm=False)
for _size in (256, 384):
  ARCHS[f"vit_medium_patch16_gap_{_size}"] = {**_dims(512, 12, 8), **_SBB, **_NO_FC_NORM}
for _name, _dim, _regs in (
    ("vit_wee_patch16_reg1_gap_256", _dims(256, 14, 4, 5), 1),
    ("vit_little_patch16_reg1_gap_256", _dims(320, 14, 5, 5.6), 1),
    ("vit_little_patch16_reg4_gap_256", _dims(320, 14, 5, 5.6), 4),
    ("vit_medium_patch16_reg1_gap_256", _dims(512, 12, 8), 1),
    ("vit_medium_patch16_reg4_gap_256", _dims(512, 12, 8), 4),
    ("vit_mediumd_patch16_reg4_gap_256", _dims(512, 20, 8), 4),
    ("vit_mediumd_patch16_reg4_gap_384", _dims(512, 20, 8), 4),
    ("vit_betwixt_patch16_reg1_gap_256", _dims(640, 12, 10), 1),
    ("vit_betwixt_patch16_reg4_gap_256", _dims(640, 12, 10), 4),
    ("vit_betwixt_patch16_reg4_gap_384", _dims(640, 12, 10), 4),
    ("vit_so150m_patch16_reg4_gap_256", _dims(896, 18, 14, 2.572), 4),
    ("vit_so150m_patch16_reg4_gap_384", _dims(896, 18, 14, 2.572), 4),
    ("vit_so150m2_patch16_reg1_gap_256", _dims(832, 21, 13, 34 / 13), 1),
    ("vit_so150m2_patch16_reg1_gap_384", _dims(832, 21, 13, 34 / 13), 1),
    ("vit_so150m2_patch16_reg1_gap_448", _dims(832, 21, 13, 34 / 13), 1)):
  # so150m: no LayerScale, fc_norm=False, posemb over the registers too (folded on load)
  ARCHS[_name] = {**_dim, **_SBB, "num_registers": _regs, **(
      dict(_NO_FC_NORM, layerscale=None) if _name.startswith("vit_so150m_") else {})}
# DeiT-III at more sizes; FlexiViT (class token without a posemb slot, at 240 px); EVA-L
# fine-tunes that are plain ViTs (class token kept, average pool of the patches + fc_norm)
for _name, _dim in (("deit3_small_patch16_384", _dims(384, 12, 6)),
                    ("deit3_medium_patch16_224", _dims(512, 12, 8)),
                    ("deit3_large_patch16_384", _dims(1024, 24, 16)),
                    ("deit3_huge_patch14_224", _dims(1280, 32, 16, patch=14))):
  ARCHS[_name] = {**_dim, **_LS}
for _name, _v in (("flexivit_small", "S/16"), ("flexivit_base", "B/16"),
                  ("flexivit_large", "L/16")):
  ARCHS[_name] = {**decode_variant(_v), **_TORCH}
for _size in (196, 336):
  ARCHS[f"eva_large_patch14_{_size}"] = {**decode_variant("L/14"), **_TORCH, "pool_type": "gap",
                                         "class_token": True, "fc_norm": True}
# DeiT's distilled models (timm `deit.py` VisionTransformerDistilled): class + distillation
# tokens (both with posemb slots, folded on load), the two heads averaged at eval.
for _name, _v in (("deit_tiny_distilled_patch16_224", "Ti/16"),
                  ("deit_small_distilled_patch16_224", "S/16"),
                  ("deit_base_distilled_patch16_224", "B/16"),
                  ("deit_base_distilled_patch16_384", "B/16")):
  ARCHS[_name] = {**decode_variant(_v), **_TORCH, "dist_token": True}
ARCHS["vit_so400m_patch14_siglip_378"] = {**_dims(1152, 27, 16, 3.7362, 14), **_TORCH,
                                          "pool_type": "map", "class_token": False}
ARCHS["vit_so400m_patch14_siglip_gap_378"] = {**_dims(1152, 27, 16, 3.7362, 14), **_GAP,
                                              **_NO_FC_NORM}

TORCHVISION_ARCHS = ("vit_b_16", "vit_b_32", "vit_l_16", "vit_l_32", "vit_h_14")

# Published weights -> variant, eval transform (pp string), file; read off torchvision's
# weights enums (transforms(), url) and timm's pretrained_cfg. torchvision's DEFAULT is
# IMAGENET1K_V1, except vit_h_14 (IMAGENET1K_SWAG_E2E_V1).
_tv = pretrained.torchvision
PRETRAINED: dict[str, dict] = {
    **_tv("vit_b_16.IMAGENET1K_V1", "vit_b_16-c867db91.pth", 256, 224, "bilinear"),
    **_tv("vit_b_16.IMAGENET1K_SWAG_E2E_V1", "vit_b_16_swag-9ac1b537.pth", 384, 384, "bicubic"),
    **_tv("vit_b_16.IMAGENET1K_SWAG_LINEAR_V1", "vit_b_16_lc_swag-4e70ced5.pth", 224, 224,
          "bicubic"),
    **_tv("vit_b_32.IMAGENET1K_V1", "vit_b_32-d86f8d99.pth", 256, 224, "bilinear"),
    **_tv("vit_l_16.IMAGENET1K_V1", "vit_l_16-852ce7e3.pth", 242, 224, "bilinear"),
    **_tv("vit_l_16.IMAGENET1K_SWAG_E2E_V1", "vit_l_16_swag-4f3808c9.pth", 512, 512, "bicubic"),
    **_tv("vit_l_16.IMAGENET1K_SWAG_LINEAR_V1", "vit_l_16_lc_swag-4d563306.pth", 224, 224,
          "bicubic"),
    **_tv("vit_l_32.IMAGENET1K_V1", "vit_l_32-c7638314.pth", 256, 224, "bilinear"),
    **_tv("vit_h_14.IMAGENET1K_SWAG_E2E_V1", "vit_h_14_swag-80465313.pth", 518, 518, "bicubic"),
    **_tv("vit_h_14.IMAGENET1K_SWAG_LINEAR_V1", "vit_h_14_lc_swag-c1eb923e.pth", 224, 224,
          "bicubic"),
    # every timm tag of the timm architectures (ARCHS; the torchvision ones are vit_[bhl]_*)
    **pretrained.timm_tags([a for a in ARCHS if a not in TORCHVISION_ARCHS]),
}


# --- MAE (He et al. 2022): the official fine-tuned classifiers (facebookresearch/mae at
# be47fef, models_vit.py with global_pool=True): class token in front (posemb covers it),
# mean over the patch tokens, then `fc_norm` (the final token norm is deleted), LayerNorm eps
# 1e-6, exact GELU; files `{"model": <timm ViT state dict>}`. Eval transform
# (util/datasets.py): Resize(256, bicubic) -> CenterCrop(224), ImageNet mean/std. timm's
# `.mae` tags are the self-supervised encoders (token pooling, final norm, no head).
_MAE = dict(_TORCH, pool_type="gap", class_token=True, fc_norm=True)
ARCHS.update({f"mae_{name}": {**decode_variant(v), **_MAE} for name, v in (
    ("vit_base_patch16", "B/16"), ("vit_large_patch16", "L/16"), ("vit_huge_patch14", "H/14"))})
for _size in ("base", "large", "huge"):
  _model = f"vit_{_size}_patch{14 if _size == 'huge' else 16}"
  PRETRAINED[f"mae/{_model}.finetuned_in1k"] = dict(
      variant=f"mae_{_model}", source="mae", num_classes=1000, input_size=224,
      pp=preprocess.torchvision_pp(256, 224, "bicubic"),
      url=f"https://dl.fbaipublicfiles.com/mae/finetune/mae_finetuned_vit_{_size}.pth")


def Model(num_classes: Optional[int] = None, *, variant: Optional[str] = None, **kw) -> _Model:
  """Factory as in big_vision: `Model(1000, variant="B/16", pool_type="tok")`; `variant` may
  also name a torchvision / timm architecture (ARCHS, e.g. "vit_b_16", "deit3_base_patch16_224").
  `dtype` ('float32' / 'bfloat16', the zoo's name) sets `dtype_mm`."""
  if "dtype" in kw:
    kw["dtype_mm"] = kw.pop("dtype")
  arch = ARCHS[variant] if variant in ARCHS else decode_variant(variant)
  return _Model(num_classes, **{**arch, **kw})


# ----------------------------------------------------------------------------- loading

_TORCH_FILES = (".pth", ".pt", ".bin")


def fix_old_checkpoints(params: dict) -> dict:
  """Old big_vision / AugReg layouts -> current names (pre-Linen numbering, posemb location,
  cls slot folded into `cls`, inlined MAP head)."""
  params = ckpt.convert_pre_linen(dict(params))
  enc = dict(params.get("Transformer", {}))
  if "posembed_input" in enc:
    params["pos_embedding"] = enc.pop("posembed_input")["pos_embedding"]
  if "pos_embedding" in enc:
    params["pos_embedding"] = enc.pop("pos_embedding")
  if "Transformer" in params:
    params["Transformer"] = enc
  if "pos_embedding" in params:
    pe = np.asarray(params["pos_embedding"])
    n = pe.shape[1]
    if int(np.sqrt(n)) ** 2 + 1 == n:  # old layout: posemb also covered the cls token
      pe_cls, params["pos_embedding"] = pe[:, :1], pe[:, 1:]
      if "cls" in params:
        params["cls"] = np.asarray(params["cls"]) + pe_cls.astype(np.asarray(params["cls"]).dtype)
  if "probe" in params:
    params["MAPHead_0"] = {k: params.pop(k) for k in
                           ("probe", "MlpBlock_0", "MultiHeadDotProductAttention_0", "LayerNorm_0")
                           if k in params}
  return params


def _from_state_dict(flat: Mapping[str, np.ndarray], num_heads: int, source: str, hint: str,
                     where: dict[str, str], layout: Optional[str] = None) -> tuple[dict, Any]:
  """Detects the naming (torchvision ViT, timm ViT or HF SigLIP vision tower; `layout`
  'torchvision' / 'timm' forces one) and converts to big_vision. Returns the tree and the
  converter module when it is a key-checked one (torchvision / timm; `where` receives
  {flax path: torch key}), else None."""
  if layout == "torchvision" or (layout is None and torchvision_vit.is_torchvision(flat)):
    return torchvision_vit.vit(flat, num_heads, source, hint, where), torchvision_vit
  if layout == "timm" or "patch_embed.proj.weight" in flat:
    return timm_vit.vit(flat, num_heads, source, hint, where), timm_vit
  for prefix in ("vision_model.", ""):
    if f"{prefix}embeddings.patch_embedding.weight" in flat:
      return hf_siglip.vision(flat, num_heads, prefix, source, hint), None
  raise ckpt.CheckpointError(
      f"{source}: not a torchvision ViT (no 'conv_proj.weight'), a timm ViT (no "
      f"'patch_embed.proj.weight') nor an HF SigLIP vision tower (no "
      f"'vision_model.embeddings.patch_embedding.weight'); first keys: {sorted(flat)[:5]}. {hint}")


def check_converted(tree: dict, init_params: Mapping[str, Any], converter: Any,
                    where: Mapping[str, str], source: str, hint: str = "") -> None:
  """A torchvision / timm conversion against the init tree: a missing, unexpected or
  wrong-shaped tensor raises a CheckpointError naming its torch key."""
  tl.check_tree(tree, init_params, where, source, hint, optional=converter.OPTIONAL,
                block_names=converter.BLOCK_NAMES, block_key=converter.BLOCK_KEY,
                skip=("pos_embedding",))


def prepare(tree: dict, init_params: Mapping[str, Any]) -> dict:
  """Old-layout fixes, NaFlex -> fixed resolution, scan <-> unrolled to match init, posemb
  resampled to init's grid."""
  tree = naflex.to_fixed_resolution(fix_old_checkpoints(tree), init_params)
  if "Transformer" in tree and "Transformer" in init_params:
    tree["Transformer"] = ckpt.match_scan(dict(tree["Transformer"]), init_params["Transformer"])
  if "pos_embedding" in tree and "pos_embedding" in init_params:
    new_shape = np.shape(init_params["pos_embedding"])
    if np.shape(tree["pos_embedding"]) != new_shape:
      tree["pos_embedding"] = posemb.resample_posemb(tree["pos_embedding"], new_shape)
  return tree


def load(init_params: Mapping[str, Any], init_file: str, model_cfg: Optional[Mapping] = None,
         dont_load: Sequence[str] = ()) -> dict:
  """Loads a ViT checkpoint onto `init_params` (the model's init tree); returns params.

  `init_file`: a big_vision / AugReg `.npz` (optionally `file.npz:sub/key`, e.g. ':img' for a
  SigLIP image tower; a two-tower file without a sub-key picks 'img'), a vanity name, a
  timm / HF SigLIP `model.safetensors`, or a torchvision / timm PyTorch file (`.pth`, `.bin`,
  read weights-only). Handles the `params/` and `opt/target` prefixes, bfloat16 arrays,
  pre-Linen names, old posemb layouts, scanned or unrolled blocks, and resamples the posemb
  to the init resolution. The PyTorch layouts are told apart by their keys
  (`model_cfg["source"]` = 'torchvision' / 'timm' forces one); a missing, unexpected or
  wrong-shaped tensor raises a CheckpointError naming it. `dont_load`: regexes of params
  kept from init.
  """
  layout = (model_cfg or {}).get("source")
  layout = layout if layout in ("torchvision", "timm") else None
  path, hint = releases.resolve_vanity(init_file, {**releases.VANITY_NAMES,
                                                   **releases.SIGLIP_RELEASES})
  file, key = readers.split_subkey(path)
  if readers.is_safetensors(file) or file.endswith(_TORCH_FILES):
    flat = (readers.load_safetensors(file, hint) if readers.is_safetensors(file)
            else readers.read_state_dict(file, hint))
    where: dict[str, str] = {}
    tree, converter = _from_state_dict(flat, tl.num_heads(init_params), file, hint, where,
                                       layout)
    if converter is not None:
      check_converted(tree, init_params, converter, where, file, hint)
  else:
    tree = readers.load_params(path, hint)
    if not key and "img" in tree and "embedding" not in tree:
      tree = tree["img"]
  tree = prepare(tree, init_params)
  return ckpt.merge_params(tree, init_params, dont_load, source=file, hint=hint)
